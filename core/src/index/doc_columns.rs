//! Per-document data of a run, stored once (not once per table).
//!
//! Tables hold each distinct fingerprint once. The run's identity-ordered table doubles as
//! the document store's key column: the rank of a fingerprint in it locates its documents.
//! Documents are kept in (fingerprint, insertion) order as bit-packed id and timestamp
//! columns; fingerprints shared by several documents (exact duplicates) are listed in a small
//! side table, so the common case of one document per fingerprint costs nothing extra.

use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Doc;
use super::packed_column::{PackedColumn, PackedColumnWriter, order_i64, unorder_i64};
use crate::util::{for_each_sorted_group, group_by_top_byte, top_byte_starts};

/// Document columns of one run.
#[derive(Debug)]
pub(crate) struct DocStore {
    ids: PackedColumn,
    ts: PackedColumn,
    /// `(distinct rank, extra documents at ranks <= this one)` for every fingerprint held by
    /// more than one document, by rank.
    dups: Vec<(u32, u32)>,
    deleted: Deleted,
}

/// The ranges of ids and timestamps of a set of documents, which fix the widths of their
/// packed columns.
#[derive(Debug, Clone)]
struct ColumnRanges {
    id: (u64, u64),
    /// Of the timestamps mapped to `u64` in order.
    ts: (u64, u64),
}

impl Default for ColumnRanges {
    fn default() -> Self {
        ColumnRanges { id: (u64::MAX, 0), ts: (u64::MAX, 0) }
    }
}

impl ColumnRanges {
    /// Widens the ranges to hold a document's id and timestamp.
    #[inline(always)]
    fn see(&mut self, id: u64, ts: i64) {
        let t = order_i64(ts);
        self.id = (self.id.0.min(id), self.id.1.max(id));
        self.ts = (self.ts.0.min(t), self.ts.1.max(t));
    }

    /// One word for a document's id and timestamp, when their ranges need at most 64 bits
    /// together (ids below 2^32 and timestamps within 136 years of seconds, say).
    fn packing(&self) -> Option<IdTs> {
        let width = |(min, max): (u64, u64)| 64 - max.saturating_sub(min).leading_zeros();
        let (id_bits, ts_bits) = (width(self.id), width(self.ts));
        (id_bits + ts_bits <= 64).then(|| IdTs {
            id_base: self.id.0,
            ts_base: self.ts.0,
            id_bits,
            id_mask: u64::MAX.checked_shr(64 - id_bits).unwrap_or(0),
        })
    }
}

/// A document's id and ordered timestamp as offsets from their ranges' minimums in one
/// word: the id in the low `id_bits`, the timestamp above. Sorting documents moves 16
/// bytes each instead of 24.
#[derive(Debug, Clone, Copy)]
struct IdTs {
    id_base: u64,
    ts_base: u64,
    id_bits: u32,
    id_mask: u64,
}

impl IdTs {
    #[inline(always)]
    fn pack(&self, id: u64, ts: i64) -> u64 {
        (id - self.id_base) | (order_i64(ts) - self.ts_base).checked_shl(self.id_bits).unwrap_or(0)
    }

    /// The id and the ordered timestamp.
    #[inline(always)]
    fn unpack(&self, w: u64) -> (u64, u64) {
        (self.id_base + (w & self.id_mask), self.ts_base + w.checked_shr(self.id_bits).unwrap_or(0))
    }
}

/// A [`DocStore`] and its distinct fingerprints under construction, from documents given in
/// fingerprint order (ties in insertion order), piece by piece.
struct Columns {
    ids: PackedColumnWriter,
    ts: PackedColumnWriter,
    distinct: Vec<u64>,
    dups: Vec<(u32, u32)>,
    extra: u32,
}

impl Columns {
    /// Room for `len` documents whose ids and timestamps lie in `ranges`.
    fn new(len: usize, ranges: &ColumnRanges) -> Columns {
        Columns {
            ids: PackedColumnWriter::new(len, ranges.id.0, ranges.id.1),
            ts: PackedColumnWriter::new(len, ranges.ts.0, ranges.ts.1),
            // Scanned in order, and dropped once the run's tables are built.
            distinct: Vec::with_capacity(len),
            dups: Vec::new(),
            extra: 0,
        }
    }

    /// Appends documents that follow those already given in fingerprint order; `fields`
    /// gives a document's fingerprint, id and ordered timestamp.
    #[inline(always)]
    fn extend<R>(&mut self, docs: &[R], fields: impl Fn(&R) -> (u64, u64, u64)) {
        for d in docs {
            let (fp, id, ts) = fields(d);
            if self.distinct.last() == Some(&fp) {
                self.extra += 1;
                let rank = (self.distinct.len() - 1) as u32;
                match self.dups.last_mut() {
                    Some(last) if last.0 == rank => last.1 = self.extra,
                    _ => self.dups.push((rank, self.extra)),
                }
            } else {
                self.distinct.push(fp);
            }
            self.ids.push(id);
            self.ts.push(ts);
        }
    }

    /// The document store and the distinct fingerprints, once every document was given.
    fn finish(mut self) -> (DocStore, Vec<u64>) {
        self.dups.shrink_to_fit();
        let store = DocStore {
            ids: self.ids.finish(),
            ts: self.ts.finish(),
            dups: self.dups,
            deleted: Deleted::default(),
        };
        (store, self.distinct)
    }
}

/// A lazily allocated, thread-safe set of deleted document positions.
#[derive(Debug, Default)]
struct Deleted {
    bits: OnceLock<Box<[AtomicU64]>>,
    count: AtomicUsize,
}

/// The second and last steps of [`DocStore::from_docs`]'s sort, with each document as
/// the record `record` gives (its fingerprint first), which `fields` reads back as
/// fingerprint, id and ordered timestamp. Returns the sort's array, flattened.
fn sort_into<const N: usize>(
    docs: &[Doc],
    starts: &[usize; 257],
    columns: &mut Columns,
    record: impl Fn(&Doc) -> [u64; N],
    fields: impl Fn(&[u64; N]) -> (u64, u64, u64),
) -> Vec<u64> {
    let mut grouped = Vec::new();
    group_by_top_byte(docs, |d| d.fp, starts, record, &mut grouped);
    for_each_sorted_group(
        &mut grouped,
        starts,
        |r| r[0],
        &mut Vec::new(),
        |g| columns.extend(g, &fields),
    );
    grouped.into_flattened()
}

impl DocStore {
    /// Builds the columns from documents in insertion order, and returns the distinct
    /// fingerprints in order beside them.
    ///
    /// The documents themselves are sorted, stably so that equal fingerprints keep their
    /// insertion order: every pass reads and writes in sequence, where sorting positions
    /// and then gathering the documents would miss the cache once per document. After one
    /// pass over all of them (which also takes the column ranges) and one scatter, the sort
    /// goes on group by group in cache, and each group sorted goes straight into the
    /// columns: the sorted whole is never held.
    ///
    /// Also returns the sort's emptied array, for the caller to reuse: its pages are
    /// already backed, where a new array's would each have to be faulted in again.
    pub(crate) fn from_docs(docs: &[Doc]) -> (DocStore, Vec<u64>, Vec<u64>) {
        let mut ranges = ColumnRanges::default();
        let starts = top_byte_starts(docs, |d| d.fp, |d| ranges.see(d.id, d.ts));
        let mut columns = Columns::new(docs.len(), &ranges);
        let mut spare = match ranges.packing() {
            Some(p) => sort_into(
                docs,
                &starts,
                &mut columns,
                |d| [d.fp, p.pack(d.id, d.ts)],
                |&[fp, w]| {
                    let (id, ts) = p.unpack(w);
                    (fp, id, ts)
                },
            ),
            None => sort_into(
                docs,
                &starts,
                &mut columns,
                |d| [d.fp, d.id, order_i64(d.ts)],
                |&[fp, id, ts]| (fp, id, ts),
            ),
        };
        spare.clear();
        let (store, distinct) = columns.finish();
        (store, distinct, spare)
    }

    /// Builds the columns from documents `(fp, id, ts)` sorted by fingerprint (then
    /// insertion order), and returns the distinct fingerprints in order beside them. Two
    /// passes over the documents: their ranges, then everything else at once.
    pub(crate) fn with_distinct(docs: &[(u64, u64, i64)]) -> (DocStore, Vec<u64>) {
        let mut ranges = ColumnRanges::default();
        for d in docs {
            ranges.see(d.1, d.2);
        }
        let mut columns = Columns::new(docs.len(), &ranges);
        columns.extend(docs, |&(fp, id, ts)| (fp, id, order_i64(ts)));
        columns.finish()
    }

    /// Appends the columns' bytes (deletion marks are not part of them).
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        self.ids.write(out);
        self.ts.write(out);
        out.extend_from_slice(&(self.dups.len() as u64).to_le_bytes());
        for &(r, c) in &self.dups {
            out.extend_from_slice(&r.to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
        }
    }

    /// Reads columns written by [`write`](Self::write), checking they describe `distinct`
    /// fingerprints.
    pub(crate) fn read(bytes: &[u8], distinct: usize) -> Option<(DocStore, &[u8])> {
        let (ids, rest) = PackedColumn::read(bytes)?;
        let (ts, rest) = PackedColumn::read(rest)?;
        let (n, mut rest) = super::packed_column::take_u64(rest)?;
        let n = usize::try_from(n).ok()?;
        if n > distinct || rest.len() < n.checked_mul(8)? {
            return None;
        }
        let mut dups = Vec::with_capacity(n);
        for _ in 0..n {
            let (r, tail) = rest.split_first_chunk::<4>()?;
            let (c, tail) = tail.split_first_chunk::<4>()?;
            dups.push((u32::from_le_bytes(*r), u32::from_le_bytes(*c)));
            rest = tail;
        }
        // Ranks strictly increase, cumulative extras strictly increase, and the documents
        // add up.
        let ordered = dups.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
        let extra = dups.last().map_or(0, |d| d.1 as usize);
        let fits = dups.last().is_none_or(|d| (d.0 as usize) < distinct)
            && dups.first().is_none_or(|d| d.1 > 0);
        // (A damaged count of distinct fingerprints may be near `usize::MAX`.)
        let docs = distinct.checked_add(extra);
        if !ordered || !fits || docs != Some(ids.len()) || ts.len() != ids.len() {
            return None;
        }
        Some((DocStore { ids, ts, dups, deleted: Deleted::default() }, rest))
    }

    /// Number of documents, deleted ones included.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Positions of the documents whose fingerprint has distinct rank `rank`.
    #[inline]
    pub(crate) fn range_of_rank(&self, rank: usize) -> Range<usize> {
        if self.dups.is_empty() {
            return rank..rank + 1;
        }
        let r = rank as u32;
        let i = self.dups.partition_point(|d| d.0 < r);
        let before = if i == 0 { 0 } else { self.dups[i - 1].1 } as usize;
        let start = rank + before;
        match self.dups.get(i) {
            Some(&(dr, cum)) if dr == r => start..start + 1 + (cum as usize - before),
            _ => start..start + 1,
        }
    }

    /// Starts loading what [`range_of_rank`](Self::range_of_rank) and the columns will read
    /// for the documents of rank `rank`, when that does not need a load first (no
    /// fingerprint has several documents).
    #[inline]
    pub(crate) fn prefetch_rank(&self, rank: usize) {
        if self.dups.is_empty() {
            self.ids.prefetch(rank);
            self.ts.prefetch(rank);
            if let Some(bits) = self.deleted.bits.get() {
                crate::util::prefetch(bits, rank / 64);
            }
        }
    }

    /// Id of the document at `pos`.
    #[inline]
    pub(crate) fn id(&self, pos: usize) -> u64 {
        self.ids.get(pos)
    }

    /// Timestamp of the document at `pos`.
    #[inline]
    pub(crate) fn ts(&self, pos: usize) -> i64 {
        unorder_i64(self.ts.get(pos))
    }

    /// Whether the document at `pos` is deleted.
    #[inline]
    pub(crate) fn is_deleted(&self, pos: usize) -> bool {
        match self.deleted.bits.get() {
            None => false,
            Some(bits) => bits[pos / 64].load(Ordering::Relaxed) & (1 << (pos % 64)) != 0,
        }
    }

    /// Marks the document at `pos` deleted; true if it was not already.
    pub(crate) fn mark_deleted(&self, pos: usize) -> bool {
        let bits = self
            .deleted
            .bits
            .get_or_init(|| (0..self.len().div_ceil(64)).map(|_| AtomicU64::new(0)).collect());
        let mask = 1u64 << (pos % 64);
        let was = bits[pos / 64].fetch_or(mask, Ordering::Relaxed);
        if was & mask == 0 {
            self.deleted.count.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Number of deleted documents.
    pub(crate) fn deleted(&self) -> usize {
        self.deleted.count.load(Ordering::Relaxed)
    }

    /// Positions of deleted documents, ascending.
    pub(crate) fn deleted_positions(&self) -> Vec<u32> {
        self.deleted_since(&[])
    }

    /// The deletion marks as they are now, a bit a position (empty: none yet), for
    /// [`deleted_since`](Self::deleted_since).
    pub(crate) fn deletion_marks(&self) -> Vec<u64> {
        let Some(bits) = self.deleted.bits.get() else { return Vec::new() };
        bits.iter().map(|w| w.load(Ordering::Relaxed)).collect()
    }

    /// Positions of the documents deleted since `before` (from
    /// [`deletion_marks`](Self::deletion_marks)) was taken, ascending: a pass over the
    /// marks' words, however many were deleted before.
    pub(crate) fn deleted_since(&self, before: &[u64]) -> Vec<u32> {
        let Some(bits) = self.deleted.bits.get() else { return Vec::new() };
        let mut out = Vec::new();
        for (w, word) in bits.iter().enumerate() {
            let mut x = word.load(Ordering::Relaxed) & !before.get(w).copied().unwrap_or(0);
            while x != 0 {
                out.push((w * 64 + x.trailing_zeros() as usize) as u32);
                x &= x - 1;
            }
        }
        out
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ids.heap_bytes()
            + self.ts.heap_bytes()
            + self.dups.capacity() * 8
            + self.deleted.bits.get().map_or(0, |b| b.len() * 8)
    }

    /// Bits per id and per timestamp.
    pub(crate) fn column_bits(&self) -> (u32, u32) {
        (self.ids.bits(), self.ts.bits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_with_duplicates() {
        // fps: 5 (x1), 7 (x3), 9 (x1), 11 (x2)
        let docs = [
            (5, 50, 1),
            (7, 70, 2),
            (7, 71, 3),
            (7, 72, -4),
            (9, 90, 5),
            (11, 110, 6),
            (11, 111, 7),
        ];
        let (s, distinct) = DocStore::with_distinct(&docs);
        assert_eq!(distinct, [5, 7, 9, 11]);
        assert_eq!(s.range_of_rank(0), 0..1);
        assert_eq!(s.range_of_rank(1), 1..4);
        assert_eq!(s.range_of_rank(2), 4..5);
        assert_eq!(s.range_of_rank(3), 5..7);
        assert_eq!((0..7).map(|p| s.id(p)).collect::<Vec<_>>(), [50, 70, 71, 72, 90, 110, 111]);
        assert_eq!(s.ts(3), -4);
        assert!(!s.is_deleted(2));
        assert!(s.mark_deleted(2));
        assert!(!s.mark_deleted(2));
        assert!(s.is_deleted(2));
        assert_eq!(s.deleted(), 1);
        assert_eq!(s.deleted_positions(), [2]);
        // What was deleted since a snapshot of the marks, and nothing before it.
        let marks = s.deletion_marks();
        assert!(s.mark_deleted(6) && s.mark_deleted(0));
        assert_eq!(s.deleted_since(&marks), [0, 6]);
        assert_eq!(s.deleted_since(&[]), [0, 2, 6]);
        assert_eq!(s.deleted_since(&s.deletion_marks()), Vec::<u32>::new());
    }

    /// `from_docs` sorts documents stably by fingerprint whether their ids and timestamps
    /// share a word while sorted (narrow ranges, or one of the two constant) or not.
    #[test]
    fn from_docs_matches_a_stable_sort() {
        let mut r = crate::util::SplitMix64::new(3);
        type Gen<'a> = &'a dyn Fn(&mut crate::util::SplitMix64, usize) -> (u64, i64);
        // Ids of 40 bits beside timestamps of 24 fit in a word; beside 25 they do not.
        let shapes: [(&str, bool, Gen); 6] = [
            ("narrow", true, &|r, i| (i as u64 * 3, 1_700_000_000 + r.below(1000) as i64)),
            ("constant ts", true, &|r, _| (r.next_u64(), 0)),
            ("constant id", true, &|r, _| (7, r.next_u64() as i64)),
            ("wide", false, &|r, _| (r.next_u64(), r.next_u64() as i64)),
            ("just fits", true, &|r, _| (r.below(1 << 40), r.below(1 << 24) as i64 - (1 << 23))),
            ("just too wide", false, &|r, _| (r.below(1 << 40), r.below(1 << 25) as i64)),
        ];
        for (name, packs, make) in shapes {
            let docs: Vec<Doc> = (0..20_000)
                .map(|i| {
                    // Few distinct fingerprints in part: duplicates keep insertion order.
                    let fp = if i % 3 == 0 { r.below(500) << 50 } else { r.next_u64() };
                    let (id, ts) = make(&mut r, i);
                    Doc { id, fp, ts }
                })
                .collect();
            let mut ranges = ColumnRanges::default();
            docs.iter().for_each(|d| ranges.see(d.id, d.ts));
            assert_eq!(ranges.packing().is_some(), packs, "{name}");
            let (store, distinct, _) = DocStore::from_docs(&docs);
            let mut want = docs.clone();
            want.sort_by_key(|d| d.fp);
            let mut want_distinct: Vec<u64> = want.iter().map(|d| d.fp).collect();
            want_distinct.dedup();
            assert_eq!(distinct, want_distinct, "{name}");
            for (pos, d) in want.iter().enumerate() {
                assert_eq!((store.id(pos), store.ts(pos)), (d.id, d.ts), "{name} at {pos}");
            }
            for (rank, fp) in distinct.iter().enumerate() {
                for pos in store.range_of_rank(rank) {
                    assert_eq!(want[pos].fp, *fp, "{name} rank {rank}");
                }
            }
        }
    }
}
