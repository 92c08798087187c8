//! [`PackedTable`]: a sorted table of distinct `u64` values as fixed-width low bits under a
//! directory on the top bits, the layout of the fastest configuration.
//!
//! A Huffman-XOR block must be decoded from its first value up to the one a lookup wants:
//! with 64-byte blocks that is about 25 instructions a value and most of a query's work. Here
//! the top `d` bits of a value are its bucket, which the [`Directory`] maps to the position of
//! the bucket's first value; only the `64 - d` bits below are stored, `64 - d` bits a value,
//! end to end. Value `i` is then one unaligned load and a shift away, and a lookup reads the
//! directory entry and the few values of one bucket (`d` is chosen so that a bucket holds 0.375
//! to 0.75 values on average). More than half the buckets are then empty, which the
//! directory entry alone tells, so most lookups of a query without a near neighbour read no
//! value at all.
//!
//! At 10M values `d` is 24, so a value takes 40 bits plus 14.3 bits of directory, 54.3 in all
//! against a floor of 42.2 (the Huffman-XOR code in 64-byte blocks takes about 58). Side by
//! side at 10M (same process, alternating passes), one directory bit fewer (48.1 bits a
//! value, buckets of 0.75 to 1.5) answered about 7% fewer queries, one bit more about 6%
//! fewer; 22 bits had answered about a quarter fewer than 23. The values
//! within a bucket are not compressed further, which is what the Huffman-XOR code's gap
//! coding would buy; the default layout keeps it.
//!
//! A packed table lives in memory only: what is stored on disk is always the Huffman-XOR table
//! of the same values ([`crate::codec::HxTable`]), with its checksums and format version, from
//! which a packed table is rebuilt when it is loaded.

use crate::codec::TableHit;
use crate::codec::aligned::AlignedBytes;
use crate::codec::directory::Directory;
use crate::error::{Error, Result};
use crate::util::prefetch;

/// Zero bytes after the last value, so the 16-byte load of any value stays in bounds.
const SLACK: usize = 16;
/// A bucket with more values than this is searched by bisection before it is scanned.
const SCAN_LIMIT: usize = 16;
/// Most directory bits (a directory of `2^d + 1` entries of about a byte each).
const MAX_DIR_BITS: u32 = 30;

/// A sorted table of distinct values: fixed-width low bits under a top-bits directory. See the
/// module documentation.
#[derive(Debug, Clone)]
pub struct PackedTable {
    len: usize,
    /// Bits stored per value: those below its bucket (`64 - d` for `d` directory bits).
    width: u32,
    /// The low `width` bits.
    mask: u64,
    /// Value `i`'s low bits at bits `i * width ..` (little-endian), then [`SLACK`] zero bytes.
    data: AlignedBytes,
    /// Entry `t`: the position of the first value whose top bits are `t` or more; `2^d + 1`
    /// entries.
    dir: Directory,
}

/// Directory bits for `n` values: the most that leave at least 0.375 values a bucket on
/// average (so between 0.375 and 0.75).
pub(crate) fn dir_bits(n: usize) -> u32 {
    let t = (n as u64).saturating_mul(8) / 3;
    if t < 2 { 0 } else { (63 - t.leading_zeros()).min(MAX_DIR_BITS) }
}

/// Bits a packed table of `n` values holds a value: the low bits it stores and its share of
/// the directory (an offset byte a bucket, a 32-bit base a group of buckets).
pub(crate) fn bits_per_value(n: usize) -> f64 {
    let d = dir_bits(n);
    let entries = (1u64 << d) as f64 + 1.0;
    let dir_bits_per_entry = 8.0 + 32.0 / crate::codec::directory::GROUP as f64;
    f64::from(64 - d) + entries * dir_bits_per_entry / n.max(1) as f64
}

impl PackedTable {
    /// Packs strictly increasing `values`.
    pub fn encode(values: &[u64]) -> Result<PackedTable> {
        if values.len() > u32::MAX as usize - 1 {
            return Err(Error::InvalidConfig("a table holds at most 2^32 - 2 values".into()));
        }
        if values.windows(2).any(|w| w[1] <= w[0]) {
            return Err(Error::InvalidConfig("table values must be strictly increasing".into()));
        }
        let d = dir_bits(values.len());
        let width = 64 - d;
        let mask = u64::MAX >> d;
        let bytes = (values.len() * width as usize).div_ceil(8);
        let mut data = AlignedBytes::with_capacity(bytes + SLACK);
        data.resize_zeroed(bytes + SLACK);
        // Bits pending, right-aligned; whole words go out as they fill.
        let (mut acc, mut pending, mut at) = (0u128, 0u32, 0usize);
        for &v in values {
            acc |= ((v & mask) as u128) << pending;
            pending += width;
            if pending >= 64 {
                data[at..at + 8].copy_from_slice(&(acc as u64).to_le_bytes());
                at += 8;
                acc >>= 64;
                pending -= 64;
            }
        }
        let tail = pending.div_ceil(8) as usize;
        data[at..at + tail].copy_from_slice(&(acc as u64).to_le_bytes()[..tail]);
        // Entry t is how many values lie in buckets below t: counted, then summed, with no
        // branch on how full a bucket is (most hold 0, 1 or 2 values, at random).
        let buckets = 1usize << d;
        let mut entries = vec![0u32; buckets + 1];
        for &v in values {
            entries[(v.checked_shr(width).unwrap_or(0) as usize & (buckets - 1)) + 1] += 1;
        }
        for t in 1..=buckets {
            entries[t] += entries[t - 1];
        }
        let dir = Directory::new(width, &entries);
        Ok(PackedTable { len: values.len(), width, mask, data, dir })
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of memory this table holds (values and directory).
    pub fn heap_bytes(&self) -> usize {
        self.data.capacity() + self.dir.heap_bytes() + std::mem::size_of::<Self>()
    }

    /// The low bits of value `i` (`i < len`).
    #[inline(always)]
    fn low(&self, i: usize) -> u64 {
        let bit = i * self.width as usize;
        let at = bit >> 3;
        // Up to 57 bits (all but the smallest tables) fit in the 8 bytes from the first.
        let w = if self.width <= 57 {
            u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes")) >> (bit & 7)
        } else {
            let w = u128::from_le_bytes(self.data[at..at + 16].try_into().expect("16 bytes"));
            (w >> (bit & 7)) as u64
        };
        w & self.mask
    }

    /// The bits above the low ones of every value in bucket `t`.
    #[inline(always)]
    fn top(&self, t: usize) -> u64 {
        (t as u64).checked_shl(self.width).unwrap_or(0)
    }

    /// The first position in `from..to` whose low bits are at least `low` (or `to`).
    #[inline]
    fn lower_bound(&self, mut from: usize, mut to: usize, low: u64) -> usize {
        while to - from > SCAN_LIMIT {
            let mid = from + (to - from) / 2;
            if self.low(mid) < low { from = mid + 1 } else { to = mid }
        }
        while from < to && self.low(from) < low {
            from += 1;
        }
        from
    }

    /// The positions of the values whose buckets lie between those of `lo` and `hi`: one
    /// directory load when they share a bucket. With
    /// [`prefetch_directory`](Self::prefetch_directory) and
    /// [`prefetch_candidates`](Self::prefetch_candidates) it splits a lookup into stages, so
    /// that the cache misses of many lookups overlap.
    #[inline(always)]
    pub fn candidates(&self, lo: u64, hi: u64) -> (usize, usize) {
        self.dir.span(lo, hi)
    }

    /// Stage 1 of a staged lookup: starts loading the directory entries
    /// [`candidates`](Self::candidates) reads for `key`.
    #[inline(always)]
    pub fn prefetch_directory(&self, key: u64) {
        self.dir.prefetch(key);
    }

    /// Stage 2: starts loading the values at `candidates` (the lines of the first four);
    /// nothing for an empty bucket.
    #[inline(always)]
    pub fn prefetch_candidates(&self, (from, to): (usize, usize)) {
        if from == to {
            return;
        }
        let w = self.width as usize;
        let first = from * w / 8;
        let last = (to.min(from + 4) * w).div_ceil(8);
        prefetch(&self.data, first);
        if last / 64 != first / 64 {
            prefetch(&self.data, last);
        }
    }

    /// Stage 3: appends a [`TableHit`] (reported with `probe`) for every value in `lo..=hi`
    /// within `k` of `pq`, searching the positions `candidates` gave for `lo` and `hi`.
    #[inline(always)]
    pub(crate) fn probe(
        &self,
        (from, to): (usize, usize),
        (lo, hi): (u64, u64),
        pq: u64,
        k: u32,
        probe: u32,
        out: &mut Vec<TableHit>,
    ) {
        if self.dir.bucket(lo) != self.dir.bucket(hi) {
            self.scan_range(lo, hi, |v, i| {
                if (v ^ pq).count_ones() <= k {
                    out.push(TableHit { value: v, rank: i as u32, probe });
                }
            });
            return;
        }
        let top = lo & !self.mask;
        let mut i =
            if to - from > SCAN_LIMIT { self.lower_bound(from, to, lo & self.mask) } else { from };
        while i < to {
            let v = top | self.low(i);
            if v > hi {
                break;
            }
            if v >= lo && (v ^ pq).count_ones() <= k {
                out.push(TableHit { value: v, rank: i as u32, probe });
            }
            i += 1;
        }
    }

    /// Calls `visit(value, rank)` for every value in `lo..=hi`, in increasing order.
    pub fn scan_range(&self, lo: u64, hi: u64, mut visit: impl FnMut(u64, usize)) {
        self.scan_range_while(lo, hi, |v, i| {
            visit(v, i);
            true
        });
    }

    /// [`scan_range`](Self::scan_range) until `visit` returns false.
    #[inline]
    pub fn scan_range_while(&self, lo: u64, hi: u64, mut visit: impl FnMut(u64, usize) -> bool) {
        if self.len == 0 || lo > hi {
            return;
        }
        let (mut t, last) = (self.dir.bucket(lo), self.dir.bucket(hi));
        let (start, mut next) = self.dir.span(lo, lo);
        let mut i = self.lower_bound(start, next, lo & self.mask);
        while i < self.len {
            while i >= next {
                t += 1;
                if t > last {
                    return;
                }
                next = self.dir.get(t + 1).unwrap_or(self.len);
            }
            let v = self.top(t) | self.low(i);
            if v > hi || !visit(v, i) {
                return;
            }
            i += 1;
        }
    }

    /// The rank (position in sorted order) of `value`, searching the positions
    /// [`candidates`](Self::candidates) gave for it.
    #[inline]
    pub fn rank_in(&self, (from, to): (usize, usize), value: u64) -> Option<usize> {
        let low = value & self.mask;
        let i = self.lower_bound(from, to, low);
        (i < to && self.low(i) == low).then_some(i)
    }

    /// The rank of `value`, if present.
    pub fn rank_of(&self, value: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        self.rank_in(self.candidates(value, value), value)
    }

    /// The value of rank `rank`, if `rank < len`.
    pub fn get(&self, rank: usize) -> Option<u64> {
        if rank >= self.len {
            return None;
        }
        // The last bucket whose first position is at most `rank`.
        let (mut a, mut b) = (0usize, self.dir.bucket(u64::MAX));
        while a < b {
            let mid = (a + b).div_ceil(2);
            if self.dir.get(mid).is_some_and(|e| e <= rank) { a = mid } else { b = mid - 1 }
        }
        Some(self.top(a) | self.low(rank))
    }

    /// Every value, in order.
    pub fn to_vec(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len);
        self.scan_range(0, u64::MAX, |v, _| out.push(v));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    /// Random values, values crowded under one prefix, and tiny tables (down to none).
    fn samples() -> Vec<Vec<u64>> {
        let mut r = SplitMix64::new(11);
        let mut out = vec![vec![], vec![0], vec![u64::MAX], vec![0, u64::MAX], vec![5, 6, 7]];
        for n in [3, 10, 100, 1000, 20_000] {
            out.push((0..n).map(|_| r.next_u64()).collect());
        }
        // A tenth share their top 30 bits; some values repeat the same low bits.
        let mut v: Vec<u64> = (0..30_000).map(|_| r.next_u64()).collect();
        for x in v.iter_mut().step_by(10) {
            *x = 0xABCD_EF12_0000_0000 | (*x >> 30);
        }
        out.push(v);
        let small: Vec<u64> = (0..5000).map(|_| r.next_u64() >> 50).collect();
        out.push(small);
        for v in &mut out {
            v.sort_unstable();
            v.dedup();
        }
        out
    }

    #[test]
    fn values_read_back_and_rank() {
        for values in samples() {
            let table = PackedTable::encode(&values).unwrap();
            assert_eq!(table.len(), values.len());
            assert_eq!(table.to_vec(), values);
            for (i, &v) in values.iter().enumerate() {
                assert_eq!(table.get(i), Some(v));
                assert_eq!(table.rank_of(v), Some(i));
                // Neighbours that are not stored have no rank.
                for w in [v.wrapping_add(1), v.wrapping_sub(1)] {
                    assert_eq!(table.rank_of(w), values.binary_search(&w).ok());
                }
            }
            assert_eq!(table.get(values.len()), None);
        }
    }

    #[test]
    fn scans_and_probes_match_a_plain_filter() {
        let mut r = SplitMix64::new(12);
        for values in samples() {
            let table = PackedTable::encode(&values).unwrap();
            for _ in 0..300 {
                let pq = match values.len() {
                    0 => r.next_u64(),
                    n => {
                        let (at, bits) = (r.below(n as u64) as usize, r.below(4) as u32);
                        r.flip_bits(values[at], bits)
                    }
                };
                for p in [0u32, 3, 12, 20, 26, 40, 64] {
                    let low = u64::MAX.checked_shr(p).unwrap_or(0);
                    let (lo, hi) = (pq & !low, pq | low);
                    let mut got = Vec::new();
                    table.scan_range(lo, hi, |v, i| got.push((v, i)));
                    let want: Vec<(u64, usize)> = values
                        .iter()
                        .enumerate()
                        .filter(|&(_, &v)| (lo..=hi).contains(&v))
                        .map(|(i, &v)| (v, i))
                        .collect();
                    assert_eq!(got, want, "p {p}");
                    let mut hits = Vec::new();
                    table.probe(table.candidates(lo, hi), (lo, hi), pq, 3, 7, &mut hits);
                    let want: Vec<TableHit> = want
                        .iter()
                        .filter(|&&(v, _)| (v ^ pq).count_ones() <= 3)
                        .map(|&(v, i)| TableHit { value: v, rank: i as u32, probe: 7 })
                        .collect();
                    assert_eq!(hits, want, "p {p}");
                }
            }
        }
    }

    #[test]
    fn buckets_hold_few_values() {
        assert_eq!(dir_bits(0), 0);
        assert_eq!(dir_bits(1), 1);
        assert_eq!(dir_bits(2), 2);
        assert_eq!(dir_bits(3), 3);
        assert_eq!(dir_bits(10_000_000), 24);
        for n in [1usize, 3, 17, 1000, 1 << 20, 10_000_000] {
            let mean = n as f64 / (1u64 << dir_bits(n)) as f64;
            assert!((0.375..0.75).contains(&mean), "n {n}: {mean}");
        }
    }

    /// The estimate of a table's size agrees with the bytes a table holds (but for a few hundred
    /// bytes of fixed overhead, which small tables feel).
    #[test]
    fn bits_per_value_matches_a_run() {
        let mut r = SplitMix64::new(9);
        for n in [50_000usize, 300_000] {
            let mut v: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
            v.sort_unstable();
            v.dedup();
            let table = PackedTable::encode(&v).unwrap();
            let held = table.heap_bytes() as f64 * 8.0 / v.len() as f64;
            let est = bits_per_value(v.len());
            assert!((held - est).abs() < 0.5, "n {n}: held {held} estimated {est}");
            let mean = v.len() as f64 / (1u64 << dir_bits(v.len())) as f64;
            assert!((0.375..0.75).contains(&mean));
        }
    }

    #[test]
    fn unsorted_or_repeated_values_are_refused() {
        assert!(PackedTable::encode(&[3, 2]).is_err());
        assert!(PackedTable::encode(&[3, 3]).is_err());
    }
}
