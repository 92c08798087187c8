//! Write-ahead log records: what one write did to the shard, in a form that can be replayed.
//!
//! A record lists operations on documents by their internal ids, already resolved (the
//! document a write replaced is named by id and fingerprint), so replaying it needs no
//! lookups and gives the same state whatever state it is replayed on top of: a record can be
//! replayed onto a document snapshot taken while it was being written (see
//! [`crate::doc_table::DocTable`]) and still give the right answer.
//!
//! Layout (little-endian): format `u8`, operation count `u32`, the operations, then a
//! CRC-32 of everything before it. A `Put` is tag 1, id, fingerprint, timestamp, cluster
//! (`u64` each), name length `u16` and the name's UTF-8 bytes; a `Remove` is tag 2, id and
//! fingerprint. Format 2 adds tag 3, a `Put` with a sketch: a `Put`'s fields, then the
//! sketch's length `u8` and its bytes (`neardup_core::sketch`). Format 3 adds tag 4, the same
//! with the sketch's length as a `u16` (a version 2 sketch that keeps its set is up to
//! 1,092 bytes). Format 4 adds tag 5, a `RemoveRange`: the range's first and last value and
//! how many entries it removed (`u64` each). Format 5 adds tag 6, an `AddRun`: the storage
//! id of a run stored apart and how many entries it holds (`u64` each). A record is written
//! in the lowest format its operations need (one with no sketch in format 1, byte for byte
//! as before sketches existed); all five are read.

use crate::error::{Error, Result};

const FORMAT: u8 = 1;
/// The format of records holding a `Put` with a sketch.
const FORMAT_SKETCH: u8 = 2;
const PUT: u8 = 1;
const REMOVE: u8 = 2;
const PUT_SKETCH: u8 = 3;
/// The format of records holding a `Put` with a sketch longer than 255 bytes.
const FORMAT_LONG_SKETCH: u8 = 3;
const PUT_LONG_SKETCH: u8 = 4;
/// The format of records holding a `RemoveRange`.
const FORMAT_RANGE: u8 = 4;
const REMOVE_RANGE: u8 = 5;
/// The format of records holding an `AddRun`.
const FORMAT_RUN: u8 = 5;
const ADD_RUN: u8 = 6;
/// Bytes of an `AddRun`.
pub const ADD_RUN_BYTES: usize = 1 + 8 * 2;
/// Bytes of a `RemoveRange`.
pub const REMOVE_RANGE_BYTES: usize = 1 + 8 * 3;
/// Bytes of a `Put` besides its name.
pub const PUT_FIXED_BYTES: usize = 1 + 8 * 4 + 2;
/// Bytes of a `Remove`.
pub const REMOVE_BYTES: usize = 1 + 8 * 2;
/// Bytes of a record besides its operations.
pub const RECORD_OVERHEAD: usize = 1 + 4 + 4;

/// One operation of a record, borrowing names from the record's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Store a document under a new internal id.
    Put {
        /// Internal id, never used before.
        id: u64,
        /// Fingerprint.
        fp: u64,
        /// Timestamp (ms).
        ts: i64,
        /// Cluster (internal id of the cluster's founding document).
        cluster: u64,
        /// The caller's id.
        name: &'a str,
        /// Its sketch's encoding, if it has one (at most `u16::MAX` bytes; validated before).
        sketch: Option<&'a [u8]>,
    },
    /// Remove the document with this internal id and fingerprint.
    Remove {
        /// Internal id.
        id: u64,
        /// Its fingerprint.
        fp: u64,
    },
    /// Remove every entry whose value is in `lo..=hi` (a shard without names only: a
    /// tablet's range that moved away); `count` is how many that removed when written, and
    /// replaying it must remove as many.
    RemoveRange {
        /// First value of the range.
        lo: u64,
        /// Last value of the range.
        hi: u64,
        /// Entries removed.
        count: u64,
    },
    /// Add the run stored under storage id `sid` (a shard without names only: a tablet's
    /// copy loaded in bulk), written and synced before this record; `count` is how many
    /// entries it holds. The run holds no entry the shard holds when it is added.
    AddRun {
        /// The run's storage id.
        sid: u64,
        /// Its entries.
        count: u64,
    },
}

impl Op<'_> {
    /// Encoded size.
    pub fn encoded_len(&self) -> usize {
        match self {
            Op::Put { name, sketch, .. } => {
                PUT_FIXED_BYTES
                    + name.len()
                    + sketch.map_or(0, |s| if s.len() <= 255 { 1 } else { 2 } + s.len())
            }
            Op::Remove { .. } => REMOVE_BYTES,
            Op::RemoveRange { .. } => REMOVE_RANGE_BYTES,
            Op::AddRun { .. } => ADD_RUN_BYTES,
        }
    }
}

/// Builds one record.
#[derive(Debug, Default)]
pub struct RecordWriter {
    buf: Vec<u8>,
    count: u32,
}

impl RecordWriter {
    /// An empty record.
    pub fn new() -> RecordWriter {
        let mut buf = Vec::with_capacity(4096);
        buf.push(FORMAT);
        buf.extend_from_slice(&0u32.to_le_bytes());
        RecordWriter { buf, count: 0 }
    }

    /// Appends an operation. Names longer than `u16::MAX` bytes are refused earlier, by
    /// validation; here they are a bug.
    pub fn push(&mut self, op: &Op<'_>) {
        match *op {
            Op::Put { id, fp, ts, cluster, name, sketch } => {
                let len = u16::try_from(name.len()).expect("names are validated to fit a u16");
                let long = sketch.is_some_and(|s| s.len() > 255);
                self.buf.push(match sketch {
                    None => PUT,
                    Some(_) if long => PUT_LONG_SKETCH,
                    Some(_) => PUT_SKETCH,
                });
                for v in [id, fp, ts as u64, cluster] {
                    self.buf.extend_from_slice(&v.to_le_bytes());
                }
                self.buf.extend_from_slice(&len.to_le_bytes());
                self.buf.extend_from_slice(name.as_bytes());
                if let Some(sk) = sketch {
                    if long {
                        let n =
                            u16::try_from(sk.len()).expect("sketches are validated to fit a u16");
                        self.buf.extend_from_slice(&n.to_le_bytes());
                        self.buf[0] = self.buf[0].max(FORMAT_LONG_SKETCH);
                    } else {
                        self.buf.push(sk.len() as u8);
                        self.buf[0] = self.buf[0].max(FORMAT_SKETCH);
                    }
                    self.buf.extend_from_slice(sk);
                }
            }
            Op::Remove { id, fp } => {
                self.buf.push(REMOVE);
                self.buf.extend_from_slice(&id.to_le_bytes());
                self.buf.extend_from_slice(&fp.to_le_bytes());
            }
            Op::RemoveRange { lo, hi, count } => {
                self.buf.push(REMOVE_RANGE);
                for v in [lo, hi, count] {
                    self.buf.extend_from_slice(&v.to_le_bytes());
                }
                self.buf[0] = self.buf[0].max(FORMAT_RANGE);
            }
            Op::AddRun { sid, count } => {
                self.buf.push(ADD_RUN);
                for v in [sid, count] {
                    self.buf.extend_from_slice(&v.to_le_bytes());
                }
                self.buf[0] = self.buf[0].max(FORMAT_RUN);
            }
        }
        self.count += 1;
    }

    /// Operations so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether no operation was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes so far.
    pub fn bytes(&self) -> usize {
        self.buf.len() + 4
    }

    /// The finished record.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[1..5].copy_from_slice(&self.count.to_le_bytes());
        let crc = crc32fast::hash(&self.buf);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.buf
    }
}

fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = b.split_first_chunk::<N>()?;
    *b = rest;
    Some(*head)
}

/// Decodes a record, checking its checksum and layout.
pub fn decode(bytes: &[u8]) -> Result<Vec<Op<'_>>> {
    let bad = |why: &str| Error::CorruptTablet(format!("write-ahead log record: {why}"));
    let (body, crc) = bytes.split_last_chunk::<4>().ok_or_else(|| bad("truncated"))?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err(bad("checksum mismatch"));
    }
    let mut b = body;
    let format = take::<1>(&mut b).ok_or_else(|| bad("truncated"))?[0];
    if ![FORMAT, FORMAT_SKETCH, FORMAT_LONG_SKETCH, FORMAT_RANGE, FORMAT_RUN].contains(&format) {
        return Err(bad(&format!("unknown format {format}")));
    }
    let count = u32::from_le_bytes(take(&mut b).ok_or_else(|| bad("truncated"))?);
    let mut ops = Vec::with_capacity((count as usize).min(b.len() / REMOVE_BYTES + 1));
    for _ in 0..count {
        let tag = take::<1>(&mut b).ok_or_else(|| bad("truncated"))?[0];
        let mut u = || take::<8>(&mut b).map(u64::from_le_bytes).ok_or_else(|| bad("truncated"));
        match tag {
            PUT | PUT_SKETCH | PUT_LONG_SKETCH => {
                if (tag == PUT_SKETCH && format < FORMAT_SKETCH)
                    || (tag == PUT_LONG_SKETCH && format < FORMAT_LONG_SKETCH)
                {
                    return Err(bad(&format!("a sketch in a format {format} record")));
                }
                let (id, fp, ts, cluster) = (u()?, u()?, u()? as i64, u()?);
                let len = u16::from_le_bytes(take(&mut b).ok_or_else(|| bad("truncated"))?);
                let (name, rest) =
                    b.split_at_checked(len as usize).ok_or_else(|| bad("truncated"))?;
                b = rest;
                let name = std::str::from_utf8(name).map_err(|_| bad("name is not UTF-8"))?;
                let sketch = if tag != PUT {
                    let n = if tag == PUT_SKETCH {
                        usize::from(take::<1>(&mut b).ok_or_else(|| bad("truncated"))?[0])
                    } else {
                        usize::from(u16::from_le_bytes(
                            take(&mut b).ok_or_else(|| bad("truncated"))?,
                        ))
                    };
                    let (sk, rest) = b.split_at_checked(n).ok_or_else(|| bad("truncated"))?;
                    b = rest;
                    Some(sk)
                } else {
                    None
                };
                ops.push(Op::Put { id, fp, ts, cluster, name, sketch });
            }
            REMOVE => {
                let (id, fp) = (u()?, u()?);
                ops.push(Op::Remove { id, fp });
            }
            REMOVE_RANGE if format >= FORMAT_RANGE => {
                let (lo, hi, count) = (u()?, u()?, u()?);
                ops.push(Op::RemoveRange { lo, hi, count });
            }
            ADD_RUN if format >= FORMAT_RUN => {
                let (sid, count) = (u()?, u()?);
                ops.push(Op::AddRun { sid, count });
            }
            t => return Err(bad(&format!("unknown operation {t}"))),
        }
    }
    if !b.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let ops = [
            Op::Put { id: 7, fp: u64::MAX, ts: -3, cluster: 7, name: "https://a/é", sketch: None },
            Op::Remove { id: 5, fp: 9 },
            Op::Put { id: 8, fp: 0, ts: i64::MAX, cluster: 7, name: "", sketch: Some(&[1, 2, 3]) },
            Op::Put { id: 9, fp: 0, ts: 0, cluster: 9, name: "x", sketch: Some(&[]) },
        ];
        let mut w = RecordWriter::new();
        for op in &ops {
            w.push(op);
        }
        let expected_len = w.bytes();
        let bytes = w.finish();
        assert_eq!(bytes.len(), expected_len);
        assert_eq!(
            bytes.len(),
            RECORD_OVERHEAD + ops.iter().map(|o| o.encoded_len()).sum::<usize>()
        );
        assert_eq!(decode(&bytes).unwrap(), ops);
        // Every single-bit flip and every truncation is caught.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at {i}");
            assert!(decode(&bytes[..i]).is_err(), "truncated to {i}");
        }
        assert_eq!(bytes[0], FORMAT_SKETCH);
    }

    /// `ops` as one record, checked to be of `format`, of the size `encoded_len` says, and
    /// to decode back to them.
    fn encoded(ops: &[Op<'_>], format: u8) -> Vec<u8> {
        let mut w = RecordWriter::new();
        for op in ops {
            w.push(op);
        }
        let bytes = w.finish();
        assert_eq!(bytes[0], format);
        assert_eq!(
            bytes.len(),
            RECORD_OVERHEAD + ops.iter().map(|o| o.encoded_len()).sum::<usize>()
        );
        assert_eq!(decode(&bytes).unwrap(), ops);
        bytes
    }

    /// `ops` as one record of `format` ([`encoded`]), whose every bit flip is caught and
    /// which is damage when it claims the format before.
    fn check_new_format(ops: &[Op<'_>], format: u8) {
        let bytes = encoded(ops, format);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at {i}");
        }
        assert!(decode(&restamped(&bytes, format - 1)).is_err());
    }

    /// `bytes` claiming `format`, with its checksum made right again.
    fn restamped(bytes: &[u8], format: u8) -> Vec<u8> {
        let mut bad = bytes.to_vec();
        bad[0] = format;
        let n = bad.len() - 4;
        let crc = crc32fast::hash(&bad[..n]);
        bad[n..].copy_from_slice(&crc.to_le_bytes());
        bad
    }

    #[test]
    fn range_removals_take_format_4() {
        let ops = [
            Op::Remove { id: 5, fp: 9 },
            Op::RemoveRange { lo: 3, hi: u64::MAX, count: 17 },
            Op::Put { id: 8, fp: 1, ts: 2, cluster: 8, name: "", sketch: Some(&[4; 300]) },
        ];
        // A range in a record of an earlier format is damage.
        check_new_format(&ops, FORMAT_RANGE);
    }

    #[test]
    fn added_runs_take_format_5() {
        let ops = [
            Op::Remove { id: 5, fp: 9 },
            Op::AddRun { sid: 12, count: 65_536 },
            Op::RemoveRange { lo: 3, hi: 4, count: 1 },
        ];
        // An added run in a record of an earlier format is damage.
        check_new_format(&ops, FORMAT_RUN);
    }

    #[test]
    fn long_sketches_take_format_3() {
        let long = vec![7u8; 1092];
        let ops = [
            Op::Put { id: 1, fp: 2, ts: 3, cluster: 1, name: "a", sketch: Some(&[1, 2]) },
            Op::Put { id: 2, fp: 3, ts: 4, cluster: 1, name: "b", sketch: Some(&long) },
            Op::Put { id: 3, fp: 4, ts: 5, cluster: 3, name: "c", sketch: Some(&long[..255]) },
        ];
        let bytes = encoded(&ops, FORMAT_LONG_SKETCH);
        for i in (0..bytes.len()).step_by(7) {
            assert!(decode(&bytes[..i]).is_err(), "truncated to {i}");
        }
        // A long sketch in a format 2 record is damage.
        assert!(decode(&restamped(&bytes, FORMAT_SKETCH)).is_err());
    }

    #[test]
    fn records_without_sketches_keep_format_1() {
        // A record written before sketches existed (format 1, tag 1) reads as before, and a
        // record without a sketch is still written that way, byte for byte.
        let old: Vec<u8> = {
            let mut v = vec![1u8];
            v.extend_from_slice(&1u32.to_le_bytes());
            v.push(1);
            for x in [3u64, 4, 5, 3] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.extend_from_slice(&1u16.to_le_bytes());
            v.push(b'a');
            let crc = crc32fast::hash(&v);
            v.extend_from_slice(&crc.to_le_bytes());
            v
        };
        let op = Op::Put { id: 3, fp: 4, ts: 5, cluster: 3, name: "a", sketch: None };
        assert_eq!(decode(&old).unwrap(), [op]);
        let mut w = RecordWriter::new();
        w.push(&op);
        assert_eq!(w.finish(), old);
        // A sketch tag in a format 1 record is damage.
        let mut bad = old.clone();
        bad[5] = PUT_SKETCH;
        let n = bad.len() - 4;
        let crc = crc32fast::hash(&bad[..n]);
        bad[n..].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&bad).is_err());
    }
}
