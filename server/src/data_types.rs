//! The types of a cluster node's data: fingerprint entries of tablets and documents of
//! partitions, as the node's store keeps them and the router sends them.
//!
//! A tablet holds entries `(gid, fp)`, nothing else; a document partition holds the
//! documents ([`DocInfo`]). A document is present when its partition holds it; an entry whose
//! gid no partition holds is ignored by readers. `docs/cluster.md` describes the model.

/// The partition a gid names: its low 8 bits (`gid = seq << 8 | partition`).
pub const GID_PARTITION_BITS: u32 = 8;

/// The partition of a gid.
pub fn gid_partition(gid: u64) -> u32 {
    (gid & ((1 << GID_PARTITION_BITS) - 1)) as u32
}

/// The gid of sequence number `seq` in partition `partition`.
pub fn make_gid(seq: u64, partition: u32) -> u64 {
    (seq << GID_PARTITION_BITS) | u64::from(partition)
}

/// One entry of a tablet within the distance of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TabletHit {
    /// The document's gid.
    pub gid: u64,
    /// Its fingerprint (in the caller's order, not permuted).
    pub fp: u64,
    /// Hamming distance to the probe.
    pub distance: u32,
}

/// A node's statistics for a router's Stats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    /// The node's figures as the public Stats has them (its replicas counted once each).
    pub stats: neardup_proto::v1::StatsResponse,
    /// `(partition, documents)` for every partition the node holds: a router counts each
    /// partition once, from a serving replica.
    pub partitions: Vec<(u32, u64)>,
}

/// What a probed node resolves of its hits besides the entries
/// ([`crate::NodeApi::tablet_probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Nothing: the entries alone.
    No,
    /// The documents of the hits whose partitions the node serves, without their sketches
    /// (from memory: a read that verifies nothing by sketches).
    Docs,
    /// The same documents with their stored sketches (a storage read each), for
    /// verification.
    DocsWithSketches,
}

impl Resolve {
    /// `Docs` or `DocsWithSketches` as `sketches` says.
    pub fn docs(sketches: bool) -> Resolve {
        if sketches { Resolve::DocsWithSketches } else { Resolve::Docs }
    }

    /// The documents are asked with their stored sketches.
    pub fn sketches(self) -> bool {
        self == Resolve::DocsWithSketches
    }

    /// From the wire's `TabletProbeRequest.resolve` and `.skip_sketches`.
    pub fn from_wire(resolve: bool, skip_sketches: bool) -> Resolve {
        if resolve { Resolve::docs(!skip_sketches) } else { Resolve::No }
    }

    /// As the wire's `(resolve, skip_sketches)`.
    pub fn to_wire(self) -> (bool, bool) {
        (self != Resolve::No, self == Resolve::Docs)
    }
}

/// Probes' hits, and the documents of those whose partitions the probed node resolved
/// ([`crate::NodeApi::tablet_probe`] with a [`Resolve`] other than `No`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeAnswer {
    /// Per probe, its hits and whether they were cut.
    pub results: Vec<(Vec<TabletHit>, bool)>,
    /// The stored documents of hits in `resolved`, once each.
    pub docs: Vec<DocInfo>,
    /// The partitions whose hits were resolved: a hit of this answer there without a
    /// document in `docs` has none (another node's hits there are not covered).
    pub resolved: Vec<u32>,
}

/// What a probed node resolves of `results`: the gids of hits in partitions it `serves`
/// (sorted, once each) and those partitions (sorted). Only the partitions of hits are
/// asked about.
pub fn hits_to_resolve(
    results: &[(Vec<TabletHit>, bool)],
    serves: impl Fn(u32) -> bool,
) -> (Vec<u64>, Vec<u32>) {
    let mut gids: Vec<u64> =
        results.iter().flat_map(|(hits, _)| hits.iter().map(|h| h.gid)).collect();
    gids.sort_unstable();
    gids.dedup();
    let mut parts: Vec<u32> = gids.iter().map(|&g| gid_partition(g)).collect();
    parts.sort_unstable();
    parts.dedup();
    parts.retain(|&p| serves(p));
    gids.retain(|&g| parts.binary_search(&gid_partition(g)).is_ok());
    (gids, parts)
}

/// A change to a table's entries; entries are named by gid and fingerprint, so applying it
/// needs no lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TabletOp {
    /// Store the entry (a no-op if it is there).
    Put {
        /// The document's gid.
        gid: u64,
        /// Its fingerprint (not permuted).
        fp: u64,
    },
    /// Remove the entry (a no-op if it is not there).
    Remove {
        /// The document's gid.
        gid: u64,
        /// Its fingerprint (not permuted).
        fp: u64,
    },
}

/// One document, as its partition holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocInfo {
    /// Its gid, unique in the cluster and never reused.
    pub gid: u64,
    /// The caller's id.
    pub name: String,
    /// Its fingerprint.
    pub fp: u64,
    /// Its timestamp, ms.
    pub ts_ms: i64,
    /// Its cluster: the gid of the document that founded it.
    pub cluster: u64,
    /// Its sketch's encoding (`neardup_core::sketch`), if it has one.
    pub sketch: Option<Vec<u8>>,
}

/// Bytes `n` tablet entries cost to copy: a gid and a fingerprint each.
pub fn entries_bytes(n: usize) -> u64 {
    n as u64 * 16
}

impl DocInfo {
    /// Bytes the document costs to copy, about: name, sketch and the fixed fields.
    pub fn approx_bytes(&self) -> u64 {
        (self.name.len() + self.sketch.as_ref().map_or(0, Vec::len) + 32) as u64
    }
}

/// A change to a partition's documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocOp {
    /// Store the document. When its name is held by another gid, the one with the larger
    /// `(ts_ms, gid)` stays (last writer wins, so replicas that see two writers in different
    /// orders agree).
    Put(DocInfo),
    /// Remove the document named `name` if it still has this gid.
    Remove {
        /// The gid it must have.
        gid: u64,
        /// Its name.
        name: String,
    },
}

impl DocOp {
    /// The removal of `d` (by its gid and name).
    pub fn remove_of(d: DocInfo) -> DocOp {
        DocOp::Remove { gid: d.gid, name: d.name }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_carry_their_partition() {
        for (seq, p) in [(1u64, 0u32), (7, 255), (1 << 40, 3)] {
            let g = make_gid(seq, p);
            assert_eq!(gid_partition(g), p);
            assert_eq!(g >> GID_PARTITION_BITS, seq);
        }
    }
}
