//! How runs, the manifest and document snapshots are laid out in the store.
//!
//! Keyspaces (sled trees):
//! - `log`: the write-ahead log, `seq` (u64 big-endian) -> record ([`crate::record`]).
//! - `run_meta`: storage id (u64 BE) -> the run's metadata record (the core's
//!   [`Run::meta_bytes`]: ids, counts, design, document columns, CRC).
//! - `run_tables`: storage id ++ table (u16 BE) -> block size (u32 LE) ++ the table's header,
//!   for the tables stored: the first `ShardConfig::stored_tables` of the design (the others
//!   hold the same fingerprints in another order and are rebuilt when the run is loaded).
//! - `run_blocks`: storage id ++ table ++ chunk (u32 BE) -> [`CHUNK_BYTES`] of
//!   Huffman-XOR blocks back to back, each carrying its own CRC-32.
//! - `run_deletes`: storage id -> the run's deleted positions, with a CRC.
//! - `docs`: snapshot id ++ chunk (u32 BE) -> a record of `Put` operations.
//! - `sketches`: internal id (u64 BE) -> the document's sketch (`neardup_core::sketch`
//!   encoding), for documents stored with one ([`Store::slots`](crate::storage::Store::slots):
//!   a file of slots in sled's store, [`crate::slots`]). Written after the log record that
//!   carries it and replayed from the log on recovery; read only for candidates being
//!   verified.
//! - `meta`: `manifest` (the runs that hold every operation up to a log sequence), `docsnap`
//!   (the document snapshot to start from), `format`.
//!
//! Runs are immutable, so a run is written once under a fresh storage id and the manifest,
//! one key, switches to it atomically; a run no longer in the manifest is garbage and removed
//! after the manifest that dropped it is durable. Only deletion marks change in place, and
//! an early mark is harmless (see [`crate::shard`]).

use std::sync::Arc;

use neardup_core::index::{Run, StoredTable};
use neardup_core::{Design, Index};

use crate::error::{Error, Result};
use crate::storage::Space;

/// Bytes of blocks per stored chunk (at least one block). Well over sled's blob threshold (a
/// quarter of its 512 KiB segment): a chunk, and a leaf holding chunks, is written as a file
/// of its own that sled deletes once it is replaced, where values inline in sled's log come
/// back only when a segment is at most half full and the file shrinks only from its end
/// (see `docs/service.md`, disk use).
pub const CHUNK_BYTES: usize = 1 << 20;
/// Current layout version, in `meta/format`.
pub const FORMAT: &[u8] = b"neardup-shard/1";

/// The keyspaces of a shard.
pub struct Spaces {
    /// Key `format`, `manifest`, `docsnap`.
    pub meta: Arc<dyn Space>,
    /// The write-ahead log.
    pub log: Arc<dyn Space>,
    /// Run metadata.
    pub run_meta: Arc<dyn Space>,
    /// Table headers.
    pub run_tables: Arc<dyn Space>,
    /// Table blocks.
    pub run_blocks: Arc<dyn Space>,
    /// Deletion marks.
    pub run_deletes: Arc<dyn Space>,
    /// Document snapshots.
    pub docs: Arc<dyn Space>,
    /// Sketches by internal id.
    pub sketches: Arc<dyn Space>,
}

impl Spaces {
    /// Every keyspace with its name, in a fixed order.
    pub fn named(&self) -> [(&'static str, &Arc<dyn Space>); 8] {
        [
            ("meta", &self.meta),
            ("log", &self.log),
            ("run_meta", &self.run_meta),
            ("run_tables", &self.run_tables),
            ("run_blocks", &self.run_blocks),
            ("run_deletes", &self.run_deletes),
            ("docs", &self.docs),
            ("sketches", &self.sketches),
        ]
    }
}

/// What one keyspace holds (see [`space_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceUsage {
    /// The keyspace's name.
    pub name: &'static str,
    /// Keys stored.
    pub keys: u64,
    /// Bytes of its keys.
    pub key_bytes: u64,
    /// Bytes of its values.
    pub value_bytes: u64,
    /// The largest value, bytes.
    pub max_value: u64,
}

/// Where a shard's bytes on disk go: every keyspace's live keys and values, and the store's
/// files ([`crate::storage::Store::disk_parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskUsage {
    /// Every keyspace.
    pub spaces: Vec<SpaceUsage>,
    /// The store's files by kind, bytes.
    pub files: Vec<(String, u64)>,
}

/// The live keys and values of every keyspace, counted by scanning them all (a report, not
/// for the request path): set against the store's size on disk, what the engine spends
/// beyond the data.
pub fn space_usage(s: &Spaces) -> Result<Vec<SpaceUsage>> {
    let mut out = Vec::new();
    for (name, space) in s.named() {
        let mut u = SpaceUsage { name, keys: 0, key_bytes: 0, value_bytes: 0, max_value: 0 };
        for e in space.scan(&[], &[0xFF; 32]) {
            let (k, v) = e?;
            u.keys += 1;
            u.key_bytes += k.len() as u64;
            u.value_bytes += v.len() as u64;
            u.max_value = u.max_value.max(v.len() as u64);
        }
        out.push(u);
    }
    Ok(out)
}

/// Big-endian key of a u64.
pub fn key64(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

/// The sequence a log key names ([`key64`] read back); a key of another length is damage.
pub fn log_seq(key: &[u8]) -> crate::error::Result<u64> {
    key.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| crate::error::Error::CorruptTablet("log key".into()))
}

fn table_key(sid: u64, t: usize) -> Vec<u8> {
    let mut k = key64(sid).to_vec();
    k.extend_from_slice(&(t as u16).to_be_bytes());
    k
}

fn chunk_key(sid: u64, t: usize, chunk: u32) -> Vec<u8> {
    let mut k = table_key(sid, t);
    k.extend_from_slice(&chunk.to_be_bytes());
    k
}

fn with_crc(mut v: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn check_crc<'a>(v: &'a [u8], what: &str) -> Result<&'a [u8]> {
    let (body, crc) = v
        .split_last_chunk::<4>()
        .ok_or_else(|| Error::CorruptTablet(format!("{what}: truncated")))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(Error::CorruptTablet(format!("{what}: checksum mismatch")));
    }
    Ok(body)
}

/// Which of a run's tables are stored: the first `stored` of the design's (at least one,
/// at most all). Every table holds the same fingerprints, so loading rebuilds the others
/// from an intact stored one (see [`load_run`]).
pub fn stored_tables(run: &Run, stored: usize) -> std::ops::Range<usize> {
    0..stored.clamp(1, run.tables().max(1))
}

/// Writes a run under storage id `sid`: metadata, deletion marks, and its first `stored`
/// tables ([`stored_tables`]). Returns the bytes written.
pub fn write_run(s: &Spaces, sid: u64, run: &Run, design: &Design, stored: usize) -> Result<u64> {
    let mut bytes = 0u64;
    for t in stored_tables(run, stored) {
        bytes += write_table(s, sid, run, t)?;
    }
    write_deletes(s, sid, run)?;
    let meta = run.meta_bytes(design);
    bytes += meta.len() as u64;
    s.run_meta.put(&key64(sid), &meta)?;
    Ok(bytes)
}

/// Writes table `t` of a run: its blocks in chunks, then its header. Returns the bytes.
fn write_table(s: &Spaces, sid: u64, run: &Run, t: usize) -> Result<u64> {
    let hx = run.stored_table(t)?;
    let blocks: Vec<&[u8]> = hx.block_slices().collect();
    let bb = blocks.first().map_or(0, |b| b.len());
    let mut bytes = 0u64;
    let per_chunk = (CHUNK_BYTES / bb.max(1)).max(1);
    for (chunk, group) in blocks.chunks(per_chunk).enumerate() {
        let v = group.concat();
        bytes += v.len() as u64;
        s.run_blocks.put(&chunk_key(sid, t, chunk as u32), &v)?;
    }
    let mut v = (bb as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&hx.header_bytes());
    bytes += v.len() as u64;
    s.run_tables.put(&table_key(sid, t), &v)?;
    Ok(bytes)
}

/// Writes a run's current deletion marks; returns how many.
pub fn write_deletes(s: &Spaces, sid: u64, run: &Run) -> Result<usize> {
    let positions = run.deleted_positions();
    let mut v = Vec::with_capacity(4 + positions.len() * 4 + 4);
    v.extend_from_slice(&(positions.len() as u32).to_le_bytes());
    for p in &positions {
        v.extend_from_slice(&p.to_le_bytes());
    }
    s.run_deletes.put(&key64(sid), &with_crc(v))?;
    Ok(positions.len())
}

/// What loading one stored run gave.
pub struct LoadedRun {
    /// The run, deletion marks restored.
    pub run: Run,
    /// Tables that were damaged or missing and were rebuilt from an intact one.
    pub rebuilt: Vec<usize>,
}

/// Loads the run stored under `sid`, verifying every checksum; tables not stored, and
/// damaged ones, are rebuilt by the core from an intact one. `stored` is how many tables
/// were written ([`write_run`]): a missing or damaged one among those is reported in
/// [`LoadedRun::rebuilt`]; tables past them that are on disk anyway (written under a larger
/// setting) are used. Fails with [`Error::CorruptTablet`] when the metadata or the deletion
/// marks are damaged or no table is intact.
pub fn load_run(s: &Spaces, sid: u64, index: &Index, stored: usize) -> Result<LoadedRun> {
    let meta = s
        .run_meta
        .get(&key64(sid))?
        .ok_or_else(|| Error::CorruptTablet(format!("run {sid}: metadata missing")))?;
    let tables = index.design().tables().len();
    let mut headers: Vec<Option<(usize, Vec<u8>)>> = Vec::with_capacity(tables);
    let mut chunks: Vec<Vec<Vec<u8>>> = Vec::with_capacity(tables);
    for t in 0..tables {
        let h = s.run_tables.get(&table_key(sid, t))?.and_then(|v| {
            let (bb, header) = v.split_first_chunk::<4>()?;
            Some((u32::from_le_bytes(*bb) as usize, header.to_vec()))
        });
        let from = table_key(sid, t);
        let mut to = from.clone();
        to.extend_from_slice(&[0xFF; 5]);
        let c: Vec<Vec<u8>> =
            s.run_blocks.scan(&from, &to).map(|e| e.map(|(_, v)| v)).collect::<Result<_>>()?;
        headers.push(h);
        chunks.push(c);
    }
    let blocks: Vec<Vec<&[u8]>> = headers
        .iter()
        .zip(&chunks)
        .map(|(h, c)| match h {
            Some((bb, _)) if *bb > 0 => c.iter().flat_map(|chunk| chunk.chunks(*bb)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let stored_parts: Vec<StoredTable<'_>> = headers
        .iter()
        .zip(&blocks)
        .map(|(h, b)| StoredTable { header: h.as_ref().map_or(&[][..], |(_, h)| h), blocks: b })
        .collect();
    let (run, mut rebuilt) = index
        .load_run(&meta, &stored_parts)
        .map_err(|e| Error::CorruptTablet(format!("run {sid}: {e}")))?;
    rebuilt.retain(|&t| t < stored.clamp(1, tables.max(1)));
    let deletes = s
        .run_deletes
        .get(&key64(sid))?
        .ok_or_else(|| Error::CorruptTablet(format!("run {sid}: deletion marks missing")))?;
    let body = check_crc(&deletes, &format!("run {sid} deletion marks"))?;
    let (n, rest) = body
        .split_first_chunk::<4>()
        .ok_or_else(|| Error::CorruptTablet(format!("run {sid}: deletion marks truncated")))?;
    if rest.len() != u32::from_le_bytes(*n) as usize * 4 {
        return Err(Error::CorruptTablet(format!("run {sid}: deletion marks truncated")));
    }
    let positions: Vec<u32> =
        rest.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    run.restore_deleted(&positions).map_err(|e| Error::CorruptTablet(format!("run {sid}: {e}")))?;
    Ok(LoadedRun { run, rebuilt })
}

/// Rewrites the given tables of a stored run (after they were rebuilt on load).
pub fn rewrite_tables(s: &Spaces, sid: u64, run: &Run, tables: &[usize]) -> Result<()> {
    for &t in tables {
        let from = table_key(sid, t);
        let mut to = from.clone();
        to.extend_from_slice(&[0xFF; 5]);
        s.run_blocks.remove_range(&from, &to)?;
        write_table(s, sid, run, t)?;
    }
    Ok(())
}

/// Removes everything stored for run `sid`.
pub fn remove_run(s: &Spaces, sid: u64) -> Result<()> {
    s.run_meta.remove(&key64(sid))?;
    s.run_deletes.remove(&key64(sid))?;
    let from = key64(sid).to_vec();
    let to = key64(sid + 1).to_vec();
    s.run_tables.remove_range(&from, &to)?;
    s.run_blocks.remove_range(&from, &to)?;
    Ok(())
}

/// Storage ids of every run with stored metadata or blocks (to find garbage).
pub fn stored_run_ids(s: &Spaces) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for space in [&s.run_meta, &s.run_tables] {
        for e in space.scan(&[], &[0xFF; 16]) {
            let (k, _) = e?;
            if let Some(sid) = k.first_chunk::<8>().map(|b| u64::from_be_bytes(*b)) {
                ids.push(sid);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The index checkpoint: which runs hold every operation up to log sequence `covered`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Every log record with a sequence `<= covered` is reflected in `runs`.
    pub covered: u64,
    /// The next storage id to hand out.
    pub next_sid: u64,
    /// Storage ids of the runs, oldest first.
    pub runs: Vec<u64>,
    /// The last log sequence ever appended when this was written.
    pub last_seq: u64,
}

impl Manifest {
    /// Encodes with a CRC.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8];
        for x in [self.covered, self.next_sid, self.last_seq, self.runs.len() as u64] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for r in &self.runs {
            v.extend_from_slice(&r.to_le_bytes());
        }
        with_crc(v)
    }

    /// Decodes, checking the CRC.
    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let body = check_crc(bytes, "manifest")?;
        let bad = || Error::CorruptTablet("manifest: bad layout".into());
        let (&version, rest) = body.split_first().ok_or_else(bad)?;
        if version != 1 || rest.len() < 32 || (rest.len() - 32) % 8 != 0 {
            return Err(bad());
        }
        let words: Vec<u64> = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if words[3] as usize != words.len() - 4 {
            return Err(bad());
        }
        Ok(Manifest {
            covered: words[0],
            next_sid: words[1],
            last_seq: words[2],
            runs: words[4..].to_vec(),
        })
    }
}

/// The document snapshot to start recovery from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocSnapshot {
    /// Snapshot id (key prefix of its chunks).
    pub id: u64,
    /// Every log record with a sequence `<= covered` is reflected in the snapshot; later
    /// ones may be in part (it was taken while writes went on) and are replayed.
    pub covered: u64,
    /// Chunks written.
    pub chunks: u32,
    /// The next internal document id when the snapshot started.
    pub next_id: u64,
}

impl DocSnapshot {
    /// Encodes with a CRC.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8];
        for x in [self.id, self.covered, u64::from(self.chunks), self.next_id] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        with_crc(v)
    }

    /// Decodes, checking the CRC.
    pub fn decode(bytes: &[u8]) -> Result<DocSnapshot> {
        let body = check_crc(bytes, "document snapshot header")?;
        if body.len() != 33 || body[0] != 1 {
            return Err(Error::CorruptTablet("document snapshot header: bad layout".into()));
        }
        let w = |i: usize| u64::from_le_bytes(body[1 + 8 * i..9 + 8 * i].try_into().expect("8"));
        // Stored as a u64; a count a u32 cannot hold is damage, not a count to cut short.
        let chunks = u32::try_from(w(2)).map_err(|_| {
            Error::CorruptTablet(format!("document snapshot header: {} chunks", w(2)))
        })?;
        Ok(DocSnapshot { id: w(0), covered: w(1), chunks, next_id: w(3) })
    }

    /// Key of chunk `c` of snapshot `id`.
    pub fn chunk_key(id: u64, c: u32) -> Vec<u8> {
        let mut k = key64(id).to_vec();
        k.extend_from_slice(&c.to_be_bytes());
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `manifest` fuzz target (`fuzz/`): a snapshot header whose chunk count
    /// (a u64) does not fit the u32 it is read into was accepted, the count cut short.
    #[test]
    fn fuzz_snapshot_chunk_count_past_u32_is_an_error() {
        let bytes: [u8; 37] = [
            1, 2, 0, 0, 0, 64, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 254, 46,
            69, 213, 0, 0, 0, 0, 140, 102, 244, 175,
        ];
        let err = DocSnapshot::decode(&bytes).unwrap_err();
        assert!(matches!(err, Error::CorruptTablet(_)), "{err}");
    }

    #[test]
    fn manifest_and_snapshot_round_trip() {
        let m = Manifest { covered: 9, next_sid: 4, runs: vec![1, 3], last_seq: 12 };
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        let mut bad = m.encode();
        bad[3] ^= 1;
        assert!(Manifest::decode(&bad).is_err());
        let d = DocSnapshot { id: 2, covered: 7, chunks: 3, next_id: 100 };
        assert_eq!(DocSnapshot::decode(&d.encode()).unwrap(), d);
    }
}
