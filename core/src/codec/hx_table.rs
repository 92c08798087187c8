//! [`HxTable`]: one sorted table of distinct `u64` values in Huffman-XOR blocks, and its
//! lookups: the block search, range scans and ranks.
//!
//! The other concerns of the same type live beside it: encoding (`hx_encode`), the stored
//! format (`hx_format`), decoding inside a block (`hx_block`) and the multi-lane scan of
//! queries (`hx_lanes`).

use crate::codec::aligned::AlignedBytes;
use crate::codec::directory::Directory;
use crate::codec::huffman::Huffman;
use crate::codec::hx_block::{Code, Cursor, GapCode, XorCode, block_count, prefetch_lines};
use crate::codec::options::{BlockSearch, Codec, TableOptions};
use crate::util::prefetch;

/// The rank reported for values of a table without ranks (see [`HxTable::drop_ranks`]).
pub const NO_RANK: u32 = u32::MAX;

/// A sorted table of distinct `u64` values, Huffman-XOR coded in fixed-size blocks.
#[derive(Debug, Clone)]
pub struct HxTable {
    pub(super) opts: TableOptions,
    pub(super) huffman: Huffman,
    pub(super) len: usize,
    /// `blocks * block_bytes` bytes, then [`SLACK`](super::hx_format::SLACK) zero bytes, from a 128-byte boundary. A
    /// block's first value, read from its first 8 bytes, is its search key.
    pub(super) data: AlignedBytes,
    /// Number of blocks.
    pub(super) nblocks: usize,
    /// Values before each block, and `len` at the end; empty after
    /// [`drop_ranks`](HxTable::drop_ranks).
    pub(super) ranks: Vec<u32>,
    /// Entry `t`: the block where a scan for keys with top bits `t` starts.
    pub(super) dir: Directory,
}

impl HxTable {
    /// A table of `len` values from its blocks and ranks (one more rank than blocks), with its
    /// directory built.
    pub(super) fn assemble(
        opts: TableOptions,
        huffman: Huffman,
        len: usize,
        data: AlignedBytes,
        ranks: Vec<u32>,
    ) -> HxTable {
        let mut table = HxTable {
            opts,
            huffman,
            len,
            data,
            nblocks: ranks.len() - 1,
            ranks,
            dir: Directory::default(),
        };
        table.build_directory();
        table
    }

    /// The first value of block `b`.
    #[inline(always)]
    pub(super) fn key(&self, b: usize) -> u64 {
        let at = b * self.opts.block_bytes;
        u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Builds the top-bits directory: about one entry per block. `dir[t]` is the block a
    /// scan from the smallest key with top bits `t` starts in: the last block whose first
    /// value is at most that key (or block 0).
    fn build_directory(&mut self) {
        let blocks = self.blocks();
        let bits = if blocks <= 1 { 0 } else { (usize::BITS - 1 - blocks.leading_zeros()).min(24) };
        let shift = 64 - bits;
        let buckets = 1usize << bits;
        let mut dir = Vec::with_capacity(buckets + 1);
        let mut b = 0usize; // first block whose key has top bits >= t
        for t in 0..buckets {
            while b < blocks && ((self.key(b).checked_shr(shift).unwrap_or(0)) as usize) < t {
                b += 1;
            }
            // The bucket's smallest key is t << shift: it starts in block b if that block's
            // key is exactly there, else in the block before.
            let starts_here =
                b < blocks && self.key(b) == (t as u64).checked_shl(shift).unwrap_or(0);
            dir.push(if starts_here || b == 0 { b as u32 } else { (b - 1) as u32 });
        }
        dir.push(blocks.saturating_sub(1) as u32);
        self.dir = Directory::new(shift, &dir);
    }

    /// Frees the per-block ranks, which only [`get`](Self::get), [`rank_of`](Self::rank_of)
    /// and the ranks reported by scans need (those then report [`NO_RANK`]). Tables other
    /// than the document store's key column never use them.
    pub fn drop_ranks(&mut self) {
        self.ranks = Vec::new();
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.nblocks
    }

    /// The options the table was encoded with.
    pub fn options(&self) -> TableOptions {
        self.opts
    }

    /// Changes the block lookup method (no re-encoding needed).
    pub fn set_search(&mut self, search: BlockSearch) {
        self.opts.search = search;
    }

    /// The table's Huffman code.
    pub fn huffman(&self) -> &Huffman {
        &self.huffman
    }

    /// Smallest value, if any.
    pub fn first(&self) -> Option<u64> {
        (self.len > 0).then(|| self.key(0))
    }

    /// Bytes of memory this table holds (blocks, keys, ranks, directory, decoding table).
    pub fn heap_bytes(&self) -> usize {
        self.data.capacity()
            + self.ranks.capacity() * 4
            + self.dir.heap_bytes()
            + self.huffman.lut().len() * 2
            + std::mem::size_of::<Self>()
    }

    /// Index of the block where a scan for values `>= key` starts: the last block whose
    /// first value is `<= key`, or block 0.
    #[inline]
    pub fn block_for(&self, key: u64) -> usize {
        match self.opts.search {
            BlockSearch::Directory => self.block_by_directory(key),
            BlockSearch::Interpolation => self.block_by_interpolation(key),
        }
    }

    #[inline]
    fn block_by_directory(&self, key: u64) -> usize {
        let (first, last) = self.dir.blocks_for(key);
        self.search_from(first, last, key)
    }

    /// The last block in `first..=last` whose first value is `<= key`, given that block
    /// `first` qualifies (or is block 0).
    #[inline(always)]
    pub(super) fn search_from(&self, first: usize, last: usize, key: u64) -> usize {
        let mut b = first;
        while b < last && self.key(b + 1) <= key {
            b += 1;
        }
        b
    }

    #[inline]
    fn block_by_interpolation(&self, key: u64) -> usize {
        let n = self.blocks();
        if n <= 1 || key <= self.key(0) {
            return 0;
        }
        let (mut lo, mut hi) = (0usize, n - 1); // invariant: key(lo) <= key < key(hi)
        if self.key(hi) <= key {
            return hi;
        }
        let (mut klo, mut khi) = (self.key(lo), self.key(hi));
        // Now keys[lo] <= key < keys[hi].
        for _ in 0..3 {
            if hi - lo <= 8 {
                break;
            }
            let span = (khi - klo) as u128;
            let off = ((key - klo) as u128 * (hi - lo) as u128 / span) as usize;
            let guess = (lo + off).clamp(lo + 1, hi - 1);
            let kg = self.key(guess);
            if kg <= key {
                (lo, klo) = (guess, kg);
                // Probe a little ahead: a good guess is usually within a few blocks.
                let ahead = (guess + 2).min(hi);
                let ka = self.key(ahead);
                if ka > key {
                    (hi, khi) = (ahead, ka);
                } else {
                    (lo, klo) = (ahead, ka);
                }
            } else {
                (hi, khi) = (guess, kg);
                let back = guess.saturating_sub(2).max(lo);
                let kb = self.key(back);
                if kb <= key {
                    (lo, klo) = (back, kb);
                } else {
                    (hi, khi) = (back, kb);
                }
            }
        }
        // Binary search for the last block in lo..hi with key <= `key`.
        let (mut a, mut b) = (lo, hi);
        while b - a > 1 {
            let mid = a + (b - a) / 2;
            if self.key(mid) <= key { a = mid } else { b = mid }
        }
        a
    }

    /// Where a lookup of `key` will search: a range of candidate blocks (one load from
    /// the directory, or none with interpolation). With
    /// [`prefetch_directory`](Self::prefetch_directory),
    /// [`prefetch_blocks`](Self::prefetch_blocks) and [`lane_in`](Self::lane_in) it splits
    /// [`lane`](Self::lane) into stages, so that the cache misses of many lookups overlap.
    #[inline(always)]
    pub fn candidates(&self, key: u64) -> (usize, usize) {
        match self.opts.search {
            BlockSearch::Directory => self.dir.blocks_for(key),
            BlockSearch::Interpolation => {
                let g = ((key as u128 * self.blocks() as u128) >> 64) as usize;
                (g, g + 1)
            }
        }
    }

    /// Stage 1 of a staged lookup: starts loading the directory entries
    /// [`candidates`](Self::candidates) reads for `key`.
    #[inline(always)]
    pub fn prefetch_directory(&self, key: u64) {
        if self.opts.search == BlockSearch::Directory {
            self.dir.prefetch(key);
        }
    }

    /// Stage 2: starts loading what a lane over `candidates` reads: the whole first candidate
    /// block, and the key of the second when the search may need it.
    #[inline(always)]
    pub fn prefetch_blocks(&self, candidates: (usize, usize)) {
        let bb = self.opts.block_bytes;
        let first = candidates.0 * bb;
        prefetch_lines(&self.data, first, bb);
        if candidates.1 > candidates.0 {
            prefetch(&self.data, first + bb);
        }
    }

    /// [`block_for`](Self::block_for) `key`, searching only the blocks from
    /// [`candidates`](Self::candidates) when the directory gave them.
    #[inline(always)]
    pub(super) fn block_in(&self, candidates: (usize, usize), key: u64) -> usize {
        match self.opts.search {
            BlockSearch::Directory if self.len > 0 => {
                self.search_from(candidates.0, candidates.1, key)
            }
            _ => self.block_for(key),
        }
    }

    /// Calls `visit(value, rank)` for every value in `lo..=hi`, in increasing order.
    #[inline]
    pub fn scan_range(&self, lo: u64, hi: u64, mut visit: impl FnMut(u64, usize)) {
        self.scan_range_while(lo, hi, |v, r| {
            visit(v, r);
            true
        });
    }

    /// [`scan_range`](Self::scan_range) until `visit` returns false.
    #[inline]
    pub fn scan_range_while(&self, lo: u64, hi: u64, visit: impl FnMut(u64, usize) -> bool) {
        if self.len == 0 || lo > hi {
            return;
        }
        self.scan_from(self.block_for(lo), lo, hi, visit);
    }

    /// [`scan_range_while`](Self::scan_range_while) from block `b`, which must be where a
    /// scan for `lo` starts.
    #[inline]
    pub(super) fn scan_from(
        &self,
        b: usize,
        lo: u64,
        hi: u64,
        visit: impl FnMut(u64, usize) -> bool,
    ) {
        match self.opts.codec {
            Codec::Xor => self.scan_with::<XorCode>(b, lo, hi, visit),
            Codec::Gap => self.scan_with::<GapCode>(b, lo, hi, visit),
        }
    }

    /// [`scan_from`](Self::scan_from) with the codec fixed at compile time.
    #[inline(always)]
    fn scan_with<C: Code>(
        &self,
        mut b: usize,
        lo: u64,
        hi: u64,
        mut visit: impl FnMut(u64, usize) -> bool,
    ) {
        let bb = self.opts.block_bytes;
        let lut = self.huffman.lut();
        while b < self.blocks() {
            let block = &self.data[b * bb..];
            let count = block_count(block);
            let mut v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            if v > hi {
                return;
            }
            let rank0 = self.ranks.get(b).map_or(NO_RANK as usize, |&r| r as usize);
            if v >= lo && !visit(v, rank0) {
                return;
            }
            let mut cur = Cursor::new(block);
            for j in 1..count as usize {
                v = C::apply(v, cur.next(block, lut));
                if v > hi {
                    return;
                }
                if v >= lo && !visit(v, rank0.saturating_add(j)) {
                    return;
                }
            }
            b += 1;
        }
    }

    /// The value of rank `rank` (its position in sorted order), if `rank < len`.
    pub fn get(&self, rank: usize) -> Option<u64> {
        if rank >= self.len || self.ranks.is_empty() {
            return None;
        }
        let b = self.ranks.partition_point(|&r| r as usize <= rank) - 1;
        let block = &self.data[b * self.opts.block_bytes..];
        let mut v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        let mut cur = Cursor::new(block);
        for _ in self.ranks[b] as usize..rank {
            v = self.opts.codec.apply(v, cur.next(block, self.huffman.lut()));
        }
        Some(v)
    }

    /// The codec of this table.
    pub fn codec(&self) -> Codec {
        self.opts.codec
    }

    /// Stage 2 of a staged [`rank_of`](Self::rank_of), beside
    /// [`prefetch_blocks`](Self::prefetch_blocks) (after [`prefetch_directory`] and
    /// [`candidates`]): starts loading the rank of the first candidate block.
    ///
    /// [`prefetch_directory`]: Self::prefetch_directory
    /// [`candidates`]: Self::candidates
    #[inline(always)]
    pub fn prefetch_rank(&self, candidates: (usize, usize)) {
        prefetch(&self.ranks, candidates.0);
    }

    /// Stage 3 of a staged [`rank_of`](Self::rank_of): the rank of `value`, searching the
    /// blocks from [`candidates`](Self::candidates).
    pub fn rank_in(&self, candidates: (usize, usize), value: u64) -> Option<usize> {
        if self.len == 0 || self.ranks.is_empty() {
            return None;
        }
        let mut found = None;
        self.scan_from(self.block_in(candidates, value), value, value, |_, r| {
            found = Some(r);
            false
        });
        found
    }

    /// The rank (position in sorted order) of `value`, if present (`None` without ranks).
    pub fn rank_of(&self, value: u64) -> Option<usize> {
        self.rank_in(self.candidates(value), value)
    }

    /// Decodes every value, in order.
    pub fn to_vec(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len);
        self.scan_range(0, u64::MAX, |v, _| out.push(v));
        out
    }
}

/// Values the tests of the codec encode: random, and clustered with extremes.
#[cfg(test)]
pub(super) mod samples {
    use crate::codec::options::{BlockSearch, Codec, TableOptions};
    use crate::util::SplitMix64;

    pub(in crate::codec) fn sorted_random(n: usize, seed: u64) -> Vec<u64> {
        let mut r = SplitMix64::new(seed);
        let mut v: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub(in crate::codec) fn clustered(n: usize, seed: u64) -> Vec<u64> {
        // Values packed in a few narrow ranges, plus extremes.
        let mut r = SplitMix64::new(seed);
        let mut v: Vec<u64> = (0..n)
            .map(|i| match i % 4 {
                0 => r.next_u64() >> 40,
                1 => 0xABCD_0000_0000_0000 | (r.next_u64() >> 48),
                2 => u64::MAX - (r.next_u64() >> 50),
                _ => r.next_u64(),
            })
            .collect();
        v.extend([0, 1, 2, u64::MAX]);
        v.sort_unstable();
        v.dedup();
        v
    }

    pub(in crate::codec) fn all_options() -> Vec<TableOptions> {
        let mut out = Vec::new();
        for codec in [Codec::Xor, Codec::Gap] {
            for block_bytes in [32, 100, 1024, 4096] {
                for search in [BlockSearch::Directory, BlockSearch::Interpolation] {
                    out.push(TableOptions {
                        codec,
                        block_bytes,
                        search,
                        ..TableOptions::default()
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{all_options, clustered, sorted_random};
    use super::*;
    use crate::util::SplitMix64;

    #[test]
    fn round_trip_and_ranges() {
        for data in
            [sorted_random(5000, 1), clustered(5000, 2), vec![], vec![42], vec![0, u64::MAX]]
        {
            for opts in all_options() {
                let table = HxTable::encode(&data, opts).unwrap();
                assert_eq!(table.to_vec(), data, "{opts:?}");
                let back = HxTable::from_bytes(&table.to_bytes(), opts.search).unwrap();
                assert_eq!(back.to_vec(), data);
                assert_eq!(table.get(data.len()), None);
                // Range scans and ranks agree with the plain sorted list.
                let mut r = SplitMix64::new(9);
                for _ in 0..200 {
                    let (a, b) = (r.next_u64(), r.next_u64());
                    let (lo, hi) = (a.min(b), a.max(b) >> (r.below(60) as u32));
                    let mut got = Vec::new();
                    table.scan_range(lo, hi, |v, rank| {
                        assert_eq!(data[rank], v);
                        got.push(v);
                    });
                    let want: Vec<u64> =
                        data.iter().copied().filter(|&v| v >= lo && v <= hi).collect();
                    assert_eq!(got, want);
                }
                for (i, &v) in data.iter().enumerate().step_by(37) {
                    assert_eq!(table.rank_of(v), Some(i));
                    assert_eq!(table.get(i), Some(v));
                    if v > 0 && (i == 0 || data[i - 1] != v - 1) {
                        assert_eq!(table.rank_of(v - 1), None);
                    }
                }
            }
        }
    }

    #[test]
    fn block_search_methods_agree() {
        for data in [sorted_random(20_000, 3), clustered(20_000, 4)] {
            let a = HxTable::encode(&data, TableOptions { block_bytes: 64, ..Default::default() })
                .unwrap();
            let mut b = a.clone();
            b.set_search(BlockSearch::Interpolation);
            let mut r = SplitMix64::new(5);
            for _ in 0..20_000 {
                let key = match r.below(3) {
                    0 => r.next_u64(),
                    1 => data[r.below(data.len() as u64) as usize],
                    _ => data[r.below(data.len() as u64) as usize].wrapping_add(1),
                };
                assert_eq!(a.block_for(key), b.block_for(key), "key {key:#x}");
                let blk = a.block_for(key);
                assert!(blk == 0 || a.key(blk) <= key);
                assert!(blk + 1 >= a.blocks() || a.key(blk + 1) > key);
            }
        }
    }
}
