//! Sketches in a file of fixed-size slots, addressed by internal id.
//!
//! A verified admission reads the sketch of each candidate, a random document of the
//! shard, while it answers. In a sled tree those reads waited now and then for a quarter of
//! a second, when sled was busy rewriting pages or flushing a checkpoint's runs (the
//! `sketch_reads` stage of `neardup_admission_stage_seconds`), and every admission that
//! read a sketch in that moment waited with them. Sketches need nothing of a tree:
//! internal ids are dense and never reused, and a sketch is written once and removed once.
//! [`SlotFile`] keeps them where a read is one `pread`:
//!
//! - Slot `id` is at byte `id * SLOT_BYTES`: `[u8 tag][u32 LE CRC-32][value]`, the value
//!   padded to [`INLINE_BYTES`]. Tag 0 is an empty slot (never written, a hole of the
//!   sparse file, or removed: a removal rewrites the tag byte only, so a read racing it
//!   sees the slot whole or empty); tag 1 holds the value; tag 2 says the value is longer
//!   than a slot (a set sketch) and lives in the overflow keyspace under the same key.
//! - The CRC covers the id, the tag and the value: a damaged slot, or one read at the wrong
//!   place, is reported as [`Error::CorruptTablet`].
//! - Writes go straight to the file (`pwrite`); [`SlotFile::sync`] makes them durable
//!   (`fdatasync`), with the rest of the store ([`crate::storage::Store::sync_rest`]).
//! - [`Space::apply`] writes its entries one by one, not atomically. The shard needs no
//!   more: what a crash leaves half-written is written again from the log on recovery
//!   (sketches are durable before the log records that carry them are removed).
//! - Ids are dense, counted from 0 ([`MAX_ID`] bounds them): a shard's internal ids.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::{Entry, Space};

/// Value bytes a slot holds: a (version 1) sketch's encoding.
pub const INLINE_BYTES: usize = neardup_core::sketch::ENCODED_BYTES;
/// Bytes of one slot: tag, checksum, value.
pub const SLOT_BYTES: u64 = 1 + 4 + INLINE_BYTES as u64;
/// Slots read at once by a scan.
const SCAN_SLOTS: u64 = 4096;

const EMPTY: u8 = 0;
const INLINE: u8 = 1;
const OVERFLOW: u8 = 2;

/// Values by 8-byte big-endian id in slots of a file (see the module docs).
pub struct SlotFile {
    path: PathBuf,
    file: File,
    /// Values longer than a slot.
    overflow: Arc<dyn Space>,
}

impl std::fmt::Debug for SlotFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotFile").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Ids stay below this (a slot file is for dense ids counted from 0; the file would be
/// sparse beyond any use past it).
pub const MAX_ID: u64 = 1 << 48;

fn id_of(k: &[u8]) -> Result<u64> {
    let a: [u8; 8] = k
        .try_into()
        .map_err(|_| Error::Internal(format!("a sketch slot key has 8 bytes, not {}", k.len())))?;
    let id = u64::from_be_bytes(a);
    if id >= MAX_ID {
        return Err(Error::Internal(format!("id {id} is beyond what a slot file holds")));
    }
    Ok(id)
}

/// The smallest id whose key sorts at or after `bound` (`None`: none does).
fn first_at_or_after(bound: &[u8]) -> Option<u64> {
    let mut head = [0u8; 8];
    let n = bound.len().min(8);
    head[..n].copy_from_slice(&bound[..n]);
    let id = u64::from_be_bytes(head);
    if bound.len() > 8 && bound[8..].iter().any(|&b| b != 0) { id.checked_add(1) } else { Some(id) }
}

fn crc(id: u64, tag: u8, value: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&id.to_be_bytes());
    h.update(&[tag]);
    h.update(value);
    h.finalize()
}

/// What a slot says.
enum Slot {
    Empty,
    Inline(Vec<u8>),
    Overflow,
}

impl SlotFile {
    /// Opens (creating if needed) the slot file at `path`; values longer than a slot go to
    /// `overflow`.
    pub fn open(path: &Path, overflow: Arc<dyn Space>) -> Result<SlotFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", path, e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io("opening", path, e))?;
        Ok(SlotFile { path: path.to_path_buf(), file, overflow })
    }

    /// Makes every write that returned before this call durable (the overflow keyspace is
    /// its store's to sync).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| io("syncing", &self.path, e))
    }

    /// Bytes the file takes on disk (it is sparse where no slot was written).
    pub fn disk_bytes(&self) -> u64 {
        self.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }

    fn slots(&self) -> Result<u64> {
        let len = self.file.metadata().map_err(|e| io("reading the size of", &self.path, e))?.len();
        Ok(len / SLOT_BYTES)
    }

    fn decode(&self, id: u64, raw: &[u8]) -> Result<Slot> {
        let tag = raw[0];
        let sum = u32::from_le_bytes(raw[1..5].try_into().expect("4 bytes"));
        let value = &raw[5..];
        let damaged = || {
            Error::CorruptTablet(format!(
                "sketch slot {id} in {} is damaged (tag {tag}, checksum does not match)",
                self.path.display()
            ))
        };
        match tag {
            EMPTY => Ok(Slot::Empty),
            INLINE if sum == crc(id, tag, value) => Ok(Slot::Inline(value.to_vec())),
            OVERFLOW if sum == crc(id, tag, &[]) => Ok(Slot::Overflow),
            _ => Err(damaged()),
        }
    }

    fn read_slot(&self, id: u64) -> Result<Slot> {
        let mut raw = [0u8; SLOT_BYTES as usize];
        match self.file.read_exact_at(&mut raw, id * SLOT_BYTES) {
            Ok(()) => self.decode(id, &raw),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Slot::Empty),
            Err(e) => Err(io("reading", &self.path, e)),
        }
    }

    /// Whether slot `id` names an overflow value (a slot that does not read is not one).
    fn is_overflow(&self, id: u64) -> bool {
        matches!(self.read_slot(id), Ok(Slot::Overflow))
    }

    fn write_slot(&self, id: u64, tag: u8, value: &[u8]) -> Result<()> {
        let mut raw = [0u8; SLOT_BYTES as usize];
        raw[0] = tag;
        raw[1..5].copy_from_slice(&crc(id, tag, value).to_le_bytes());
        raw[5..5 + value.len()].copy_from_slice(value);
        self.file.write_all_at(&raw, id * SLOT_BYTES).map_err(|e| io("writing", &self.path, e))
    }

    /// Empties a slot by its tag byte alone: a read at the same moment sees the slot whole
    /// or empty, never half of each (a removal can race a read of a candidate; a put never
    /// does, since a sketch is read from the queue until it is written).
    fn clear_slot(&self, id: u64) -> Result<()> {
        self.file.write_all_at(&[EMPTY], id * SLOT_BYTES).map_err(|e| io("writing", &self.path, e))
    }

    fn value(&self, id: u64, slot: Slot) -> Result<Option<Vec<u8>>> {
        match slot {
            Slot::Empty => Ok(None),
            Slot::Inline(v) => Ok(Some(v)),
            Slot::Overflow => self.overflow.get(&id.to_be_bytes()).and_then(|v| {
                v.map(Some).ok_or_else(|| {
                    Error::CorruptTablet(format!(
                        "sketch slot {id} in {} names an overflow value that is not stored",
                        self.path.display()
                    ))
                })
            }),
        }
    }

    /// The ids of `[from, to)` that have slots in the file.
    fn ids(&self, from: &[u8], to: &[u8]) -> Result<std::ops::Range<u64>> {
        let n = self.slots()?;
        let lo = first_at_or_after(from).unwrap_or(n).min(n);
        let hi = first_at_or_after(to).unwrap_or(n).min(n);
        Ok(lo..hi.max(lo))
    }

    /// The non-empty slots among `ids`, read a chunk at a time.
    fn entries(&self, ids: std::ops::Range<u64>, reverse: bool) -> SlotScan<'_> {
        SlotScan { file: self, ids, reverse, ready: Vec::new() }
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("sketch slots: {what} {}: {e}", path.display()))
}

/// A scan over slots (see [`SlotFile::entries`]).
struct SlotScan<'a> {
    file: &'a SlotFile,
    ids: std::ops::Range<u64>,
    reverse: bool,
    /// Entries read and not yet returned, the next last.
    ready: Vec<Result<Entry>>,
}

impl SlotScan<'_> {
    fn fill(&mut self) {
        let take = (self.ids.end - self.ids.start).min(SCAN_SLOTS);
        let chunk = if self.reverse {
            let c = self.ids.end - take..self.ids.end;
            self.ids.end = c.start;
            c
        } else {
            let c = self.ids.start..self.ids.start + take;
            self.ids.start = c.end;
            c
        };
        let mut raw = vec![0u8; ((chunk.end - chunk.start) * SLOT_BYTES) as usize];
        if let Err(e) = self.file.file.read_exact_at(&mut raw, chunk.start * SLOT_BYTES) {
            self.ready.push(Err(io("reading", &self.file.path, e)));
            self.ids = 0..0;
            return;
        }
        let mut got: Vec<Result<Entry>> = Vec::new();
        for (i, id) in chunk.enumerate() {
            let s = &raw[i * SLOT_BYTES as usize..(i + 1) * SLOT_BYTES as usize];
            match self.file.decode(id, s).and_then(|slot| self.file.value(id, slot)) {
                Ok(Some(v)) => got.push(Ok((id.to_be_bytes().to_vec(), v))),
                Ok(None) => {}
                Err(e) => got.push(Err(e)),
            }
        }
        if !self.reverse {
            got.reverse();
        }
        self.ready = got;
    }
}

impl Iterator for SlotScan<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        while self.ready.is_empty() && !self.ids.is_empty() {
            self.fill();
        }
        self.ready.pop()
    }
}

impl Space for SlotFile {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let id = id_of(key)?;
        let slot = self.read_slot(id)?;
        self.value(id, slot)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let id = id_of(key)?;
        let was_overflow = self.is_overflow(id);
        if value.len() == INLINE_BYTES {
            self.write_slot(id, INLINE, value)?;
            if was_overflow {
                self.overflow.remove(key)?;
            }
            Ok(())
        } else {
            // The value is stored before the slot names it.
            self.overflow.put(key, value)?;
            self.write_slot(id, OVERFLOW, &[])
        }
    }

    fn remove(&self, key: &[u8]) -> Result<()> {
        let id = id_of(key)?;
        if id >= self.slots()? {
            return Ok(());
        }
        let was_overflow = self.is_overflow(id);
        self.clear_slot(id)?;
        if was_overflow {
            self.overflow.remove(key)?;
        }
        Ok(())
    }

    /// Entry by entry, in order; not atomic (see the module docs).
    fn apply(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        for (k, v) in batch {
            match v {
                Some(v) => self.put(&k, &v)?,
                None => self.remove(&k)?,
            }
        }
        Ok(())
    }

    fn scan<'a>(&'a self, from: &[u8], to: &[u8]) -> Box<dyn Iterator<Item = Result<Entry>> + 'a> {
        match self.ids(from, to) {
            Ok(ids) => Box::new(self.entries(ids, false)),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }

    /// Removes the range; a range that reaches the end of the file shortens it.
    fn remove_range(&self, from: &[u8], to: &[u8]) -> Result<()> {
        let ids = self.ids(from, to)?;
        let n = self.slots()?;
        let overflowing: Vec<Vec<u8>> = {
            let mut keys = Vec::new();
            for id in ids.clone() {
                if self.is_overflow(id) {
                    keys.push(id.to_be_bytes().to_vec());
                }
            }
            keys
        };
        if ids.end >= n {
            self.file
                .set_len(ids.start * SLOT_BYTES)
                .map_err(|e| io("shortening", &self.path, e))?;
        } else {
            for id in ids {
                self.clear_slot(id)?;
            }
        }
        for k in overflowing {
            self.overflow.remove(&k)?;
        }
        Ok(())
    }

    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>> {
        let ids = self.ids(from, to)?;
        self.entries(ids, true).next().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{SledStore, Store};

    fn k(n: u64) -> [u8; 8] {
        n.to_be_bytes()
    }

    fn inline(n: u64) -> Vec<u8> {
        (0..INLINE_BYTES).map(|i| (n as usize * 31 + i) as u8).collect()
    }

    fn open(dir: &Path) -> (SledStore, SlotFile) {
        let store = SledStore::open(&dir.join("db"), 1 << 20).unwrap();
        let f = SlotFile::open(&dir.join("slots"), store.space("overflow").unwrap()).unwrap();
        (store, f)
    }

    /// Puts, replacements (inline to overflow and back), removals, scans and range
    /// removals agree with a map, before and after reopening.
    #[test]
    fn slots_agree_with_a_map_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = std::collections::BTreeMap::new();
        {
            let (_store, f) = open(dir.path());
            for n in [0u64, 1, 5, 9, 200, 4097, 9000] {
                let v = if n % 2 == 0 { inline(n) } else { vec![n as u8; 300] };
                f.put(&k(n), &v).unwrap();
                model.insert(n, v);
            }
            f.put(&k(5), &inline(55)).unwrap();
            model.insert(5, inline(55));
            f.put(&k(200), &[7u8; 10]).unwrap();
            model.insert(200, vec![7u8; 10]);
            f.apply(vec![(k(1).to_vec(), None), (k(12).to_vec(), Some(inline(12)))]).unwrap();
            model.remove(&1);
            model.insert(12, inline(12));
            f.remove(&k(123_456)).unwrap();
            f.sync().unwrap();
        }
        let (store, f) = open(dir.path());
        let all: Vec<(u64, Vec<u8>)> = f
            .scan(&[], &[0xFF; 9])
            .map(|e| e.map(|(k, v)| (u64::from_be_bytes(k.try_into().unwrap()), v)).unwrap())
            .collect();
        assert_eq!(all, model.clone().into_iter().collect::<Vec<_>>());
        for n in 0..10_000u64 {
            assert_eq!(f.get(&k(n)).unwrap(), model.get(&n).cloned(), "id {n}");
        }
        assert_eq!(f.last_in(&k(0), &k(4097)).unwrap().map(|e| e.1), Some(vec![7u8; 10]));
        // Removing from 9 on shortens the file and drops overflow values too.
        f.remove_range(&k(9), &[0xFF; 9]).unwrap();
        model.retain(|&n, _| n < 9);
        let left: Vec<u64> = f
            .scan(&[], &[0xFF; 9])
            .map(|e| u64::from_be_bytes(e.unwrap().0.try_into().unwrap()))
            .collect();
        assert_eq!(left, model.keys().copied().collect::<Vec<_>>());
        assert_eq!(f.slots().unwrap(), 9);
        let overflow = store.space("overflow").unwrap();
        assert_eq!(overflow.scan(&[], &[0xFF; 9]).count(), 0, "overflow values of removed ids");
        assert!(matches!(f.put(&[1, 2], &inline(1)), Err(Error::Internal(_))));
    }

    /// A flipped byte in a slot is reported as damage, not returned.
    #[test]
    fn a_damaged_slot_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, f) = open(dir.path());
        f.put(&k(3), &inline(3)).unwrap();
        f.put(&k(4), &inline(4)).unwrap();
        let mut b = [0u8; 1];
        f.file.read_exact_at(&mut b, 3 * SLOT_BYTES + 20).unwrap();
        f.file.write_all_at(&[b[0] ^ 1], 3 * SLOT_BYTES + 20).unwrap();
        assert!(matches!(f.get(&k(3)), Err(Error::CorruptTablet(_))));
        assert_eq!(f.get(&k(4)).unwrap(), Some(inline(4)));
        assert!(f.scan(&[], &[0xFF; 9]).any(|e| matches!(e, Err(Error::CorruptTablet(_)))));
        // A removal rewrites the tag alone: the slot reads as empty, its old bytes stay.
        f.remove(&k(4)).unwrap();
        assert_eq!(f.get(&k(4)).unwrap(), None);
        let mut raw = [0u8; SLOT_BYTES as usize];
        f.file.read_exact_at(&mut raw, 4 * SLOT_BYTES).unwrap();
        assert_eq!((raw[0], &raw[5..]), (EMPTY, inline(4).as_slice()));
    }
}
