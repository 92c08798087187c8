//! The shard's own types for what goes in and what comes out: plain Rust, no wire types,
//! so the shard is read and tested without the gRPC API. [`crate::service`] converts them
//! to and from `neardup.internal.v1` and `neardup.v1`, in one place.

use neardup_core::sketch::Sketch;

/// A document to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDocument {
    /// The caller's id.
    pub id: String,
    /// Its simhash.
    pub fingerprint: u64,
    /// Its timestamp (ms since the Unix epoch): the earliest of a cluster is its original.
    pub timestamp_ms: i64,
    /// Its similarity sketch, if the caller has one: stored on disk only, read back for
    /// verification when it is a candidate.
    pub sketch: Option<Sketch>,
}

/// How candidates are verified by their sketches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verify {
    /// Keep a candidate whose estimated Jaccard similarity reaches this; 0: no
    /// verification (distance alone decides).
    pub jaccard: f64,
    /// Candidates within this distance are verified (when both have sketches).
    pub candidate_k: u32,
}

impl Verify {
    /// No verification.
    pub const OFF: Verify = Verify { jaccard: 0.0, candidate_k: 0 };

    /// Whether verification is on.
    pub fn on(&self) -> bool {
        self.jaccard > 0.0
    }
}

/// What a write did; `seq` is the log sequence to wait for before acknowledging it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Documents stored.
    pub inserted: u64,
    /// Of those, replacements.
    pub replaced: u64,
    /// Documents removed.
    pub deleted: u64,
    /// Delete ids that were not stored.
    pub missing: Vec<String>,
    /// Wait for this sequence to be durable before acknowledging.
    pub seq: u64,
}

/// A stored document within the asked distance of a query.
#[derive(Debug, Clone, PartialEq)]
pub struct DocMatch {
    /// The caller's id.
    pub id: String,
    /// Its fingerprint.
    pub fingerprint: u64,
    /// Hamming distance to the query.
    pub distance: u32,
    /// Its timestamp (ms).
    pub timestamp_ms: i64,
    /// Its duplicate cluster.
    pub cluster_id: u64,
    /// When it was verified: the Jaccard similarity of its sketch and the query's (exact
    /// when both keep their shingle sets, else estimated; `neardup_core::sketch`). `None`:
    /// kept by distance alone.
    pub jaccard: Option<f64>,
}

/// The answer to one query of a probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeHits {
    /// The query.
    pub fingerprint: u64,
    /// The documents within `k`, by distance, timestamp and id; at most the limit.
    pub matches: Vec<DocMatch>,
    /// Whether more documents matched than the limit let through.
    pub truncated: bool,
}

/// What a crawl-frontier admission ([`Shard::admit`](super::Shard::admit)) decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// A stored document (other than one with the same id) is within `k`.
    pub duplicate: bool,
    /// Those documents, as a probe returns them.
    pub matches: Vec<DocMatch>,
    /// Whether more documents matched than the limit let through.
    pub truncated: bool,
    /// The document's cluster: its original's, or a new one.
    pub cluster_id: u64,
    /// The id of the cluster's original (the earliest document); its own if it founds it.
    pub original_id: String,
    /// Whether it was stored.
    pub inserted: bool,
    /// Whether storing it replaced a document with the same id.
    pub replaced: bool,
    /// Its fingerprint.
    pub fingerprint: u64,
}

/// One table's share of the index's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct TableFootprint {
    /// Bytes in memory.
    pub bytes: u64,
    /// Fingerprints held.
    pub entries: u64,
    /// Bits per fingerprint.
    pub bits_per_fingerprint: f64,
}

/// What the shard holds and how it is doing.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardStats {
    /// Documents stored.
    pub documents: u64,
    /// The table design.
    pub design: String,
    /// The largest k the design answers exactly.
    pub max_k: u32,
    /// Each table's memory.
    pub tables: Vec<TableFootprint>,
    /// Bytes of the index in memory.
    pub index_bytes: u64,
    /// Bytes of the document table in memory (0 for a shard without names).
    pub document_bytes: u64,
    /// Documents in the write buffer.
    pub buffered: u64,
    /// Runs in the index.
    pub runs: u64,
    /// Deleted documents that merges have not yet dropped.
    pub deleted_pending: u64,
    /// Merges done since start.
    pub merges: u64,
    /// Bytes of write-ahead log stored.
    pub wal_bytes: u64,
    /// Bytes the store takes on disk.
    pub disk_bytes: u64,
    /// The server's version.
    pub version: String,
    /// Whether the index in memory differs from the last checkpoint.
    pub checkpoint_pending: bool,
    /// Whether a merge is running.
    pub merging: bool,
}

/// How much one probe's answer may hold in all, over every query of its batch: a bound on
/// the memory a request can make the node spend, whatever the data. Queries are served in
/// order; once the budget is spent, later queries get fewer matches (possibly none) and say
/// so with `truncated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeBudget {
    /// Most matches in all.
    pub max_matches: usize,
    /// Most bytes of matches in all, counted as [`DocMatch::wire_bytes`].
    pub max_bytes: usize,
}

impl ProbeBudget {
    /// 100,000 matches or 3 MiB of them, whichever comes first: with the framing of a full
    /// batch's 10,000 results, an answer stays under the 4 MiB that gRPC clients accept by
    /// default.
    pub const DEFAULT: ProbeBudget = ProbeBudget { max_matches: 100_000, max_bytes: 3 << 20 };

    /// `max_matches` and `max_bytes` as asked, 0 meaning the default, and never above it.
    pub fn at_most(max_matches: usize, max_bytes: usize) -> ProbeBudget {
        let pick =
            |asked: usize, default: usize| if asked == 0 { default } else { asked.min(default) };
        ProbeBudget {
            max_matches: pick(max_matches, Self::DEFAULT.max_matches),
            max_bytes: pick(max_bytes, Self::DEFAULT.max_bytes),
        }
    }
}

impl Default for ProbeBudget {
    fn default() -> Self {
        ProbeBudget::DEFAULT
    }
}

impl DocMatch {
    /// An upper bound on the bytes this match takes in an encoded answer: its id and 40
    /// bytes for the numbers and the framing.
    pub fn wire_bytes(id: &str) -> usize {
        id.len() + 40
    }
}
