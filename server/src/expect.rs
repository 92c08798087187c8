//! What a shard must find when it starts: a small checksummed file beside the database.
//!
//! sled checks its own pages, but a truncated or damaged file can make it drop whole
//! writes and still open: the documents of a checkpoint vanish, deletes come undone, and the
//! shard would serve what is left as if it were everything. So every checkpoint also writes
//! `DATA/expect`: the last log sequence it made durable and how many documents were live
//! then. Recovery checks what it found against it (see [`Expectation::check`]).
//!
//! The record lives outside sled on purpose: damage to the database cannot take the
//! expectation with it. It is replaced atomically (written to a temporary file, synced,
//! renamed, the directory synced), so it is always one whole record. A missing file means
//! a data directory written before this record existed, or through
//! [`Shard::open_with_store`](crate::Shard::open_with_store); that start is logged and the
//! record written after recovery. A file that is there but unreadable or fails its
//! checksum is damage.
//!
//! # Why the check holds
//! The record is written after the manifest of its checkpoint is durable, with the sequence
//! `seq` and live count read together under the state lock. Every log record up to `seq` is
//! durable then. The log is only truncated below what a manifest covers, and a manifest
//! never covers more than the sequence read with it, so the records after `seq` of the
//! newest record are never truncated (recovery writes a fresh record before anything is
//! truncated again, in case a crash fell between a manifest and its record). Replaying them
//! changes the live count by exactly their puts minus their removes: a write logs a
//! `Remove` only for a live document and a `Put` only under a fresh internal id. So a
//! recovered store must reach `seq`, and hold `live + puts - removes` documents.
//!
//! Writes acknowledged after the last checkpoint are covered by sled's own checksums only;
//! a clean shutdown writes a checkpoint, so after one the record covers every acknowledged
//! write.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The file's name in the data directory.
pub const FILE_NAME: &str = "expect";
const MAGIC: &[u8] = b"neardup-expect/1";

/// What the last checkpoint left on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expectation {
    /// Every log record up to this sequence was durable.
    pub seq: u64,
    /// Live documents after the record with sequence `seq`.
    pub live: u64,
}

/// What replaying the log after [`Expectation::seq`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogTail {
    /// `Put` operations in records after the expected sequence.
    pub puts: u64,
    /// `Remove` operations in records after the expected sequence.
    pub removes: u64,
}

impl Expectation {
    /// Encodes with a CRC-32.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&self.live.to_le_bytes());
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// Decodes, checking the layout and the CRC.
    pub fn decode(bytes: &[u8]) -> Result<Expectation> {
        let bad = |why: &str| Error::CorruptTablet(format!("expectation record: {why}"));
        if bytes.len() != MAGIC.len() + 20 || !bytes.starts_with(MAGIC) {
            return Err(bad("bad layout"));
        }
        let (body, crc) = bytes.split_last_chunk::<4>().ok_or_else(|| bad("truncated"))?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err(bad("checksum mismatch"));
        }
        let word = |i: usize| {
            let at = MAGIC.len() + 8 * i;
            u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"))
        };
        Ok(Expectation { seq: word(0), live: word(1) })
    }

    /// Whether a recovered store that ends at log sequence `last_seq`, holds `live`
    /// documents and replayed `tail` after [`seq`](Self::seq) is what this record expects;
    /// a [`Error::CorruptTablet`] saying what is missing if not.
    pub fn check(&self, last_seq: u64, live: u64, tail: LogTail) -> Result<()> {
        if last_seq < self.seq {
            return Err(Error::CorruptTablet(format!(
                "the database ends at log sequence {last_seq}, but sequence {} was durable at \
                 the last checkpoint: the database lost data",
                self.seq
            )));
        }
        let want = (self.live + tail.puts).checked_sub(tail.removes);
        if want != Some(live) {
            return Err(Error::CorruptTablet(format!(
                "recovered {live} live documents, but the last checkpoint and the log after it \
                 account for {} ({} then, {} put and {} removed since): the database lost or \
                 undid writes",
                want.map_or_else(|| "a negative number".to_string(), |w| w.to_string()),
                self.live,
                tail.puts,
                tail.removes
            )));
        }
        Ok(())
    }
}

/// The expectation file of a data directory.
#[derive(Debug, Clone)]
pub struct ExpectFile {
    path: PathBuf,
}

impl ExpectFile {
    /// The file in data directory `dir`.
    pub fn in_dir(dir: &Path) -> ExpectFile {
        ExpectFile { path: dir.join(FILE_NAME) }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record, `None` when there is no file; an error when it cannot be read or is
    /// damaged.
    pub fn read(&self) -> Result<Option<Expectation>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Expectation::decode(&bytes).map(Some).map_err(|e| match e {
                Error::CorruptTablet(m) => {
                    Error::CorruptTablet(format!("{}: {m}", self.path.display()))
                }
                e => e,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::CorruptTablet(format!(
                "{}: cannot read the expectation record: {e}",
                self.path.display()
            ))),
        }
    }

    /// Replaces the record atomically and durably.
    pub fn write(&self, e: &Expectation) -> Result<()> {
        let io = |what: &str, err: std::io::Error| {
            Error::Storage(format!("{}: {what}: {err}", self.path.display()))
        };
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|err| io("create", err))?;
        f.write_all(&e.encode()).map_err(|err| io("write", err))?;
        f.sync_all().map_err(|err| io("sync", err))?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(|err| io("rename", err))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|err| io("sync the directory", err))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let e = Expectation { seq: 17, live: 3 };
        assert_eq!(Expectation::decode(&e.encode()).unwrap(), e);
        for i in 0..e.encode().len() {
            let mut b = e.encode();
            b[i] ^= 0x10;
            assert!(Expectation::decode(&b).is_err(), "byte {i}");
        }
        assert!(Expectation::decode(&e.encode()[..20]).is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = ExpectFile::in_dir(dir.path());
        assert_eq!(f.read().unwrap(), None);
        f.write(&e).unwrap();
        assert_eq!(f.read().unwrap(), Some(e));
    }

    #[test]
    fn the_check() {
        let e = Expectation { seq: 10, live: 5 };
        e.check(10, 5, LogTail::default()).unwrap();
        e.check(12, 6, LogTail { puts: 2, removes: 1 }).unwrap();
        assert!(e.check(9, 5, LogTail::default()).is_err());
        assert!(e.check(12, 4, LogTail::default()).is_err());
        assert!(e.check(12, 7, LogTail { puts: 1, removes: 0 }).is_err());
        assert!(e.check(12, 0, LogTail { puts: 0, removes: 9 }).is_err());
    }
}
