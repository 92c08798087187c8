//! [`EncodedTable`]: a sorted table of distinct values in either in-memory layout.

use std::borrow::Cow;

use crate::codec::TableHit;
use crate::codec::hx_table::HxTable;
use crate::codec::options::{Layout, TableOptions};
use crate::codec::packed_table::PackedTable;
use crate::error::Result;

/// A sorted table of distinct values, laid out as [`TableOptions::layout`] says. Lookups go
/// through the same stages in both layouts; `candidates` are blocks in one and value
/// positions in the other.
#[derive(Debug)]
// One per table, behind an `Arc`: the size of the smaller variant does not matter, and
// boxing the larger would put one more load on every lookup.
#[allow(clippy::large_enum_variant)]
pub enum EncodedTable {
    /// Huffman-XOR blocks.
    Blocks(HxTable),
    /// Fixed-width low bits under a top-bits directory.
    Packed(PackedTable),
}

impl EncodedTable {
    /// Lays out strictly increasing `values` as `opts` says.
    pub fn encode(values: &[u64], opts: TableOptions) -> Result<EncodedTable> {
        Ok(match opts.layout {
            Layout::Blocks => EncodedTable::Blocks(HxTable::encode(values, opts)?),
            Layout::Packed => {
                // The block options still say how the table is stored.
                opts.validate()?;
                EncodedTable::Packed(PackedTable::encode(values)?)
            }
        })
    }

    /// Frees what only rank lookups need, when the layout keeps it apart (a packed table's
    /// ranks are its positions and cost nothing).
    pub fn drop_ranks(&mut self) {
        if let EncodedTable::Blocks(hx) = self {
            hx.drop_ranks();
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            EncodedTable::Blocks(hx) => hx.len(),
            EncodedTable::Packed(p) => p.len(),
        }
    }

    /// Whether the table holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory held.
    pub fn heap_bytes(&self) -> usize {
        match self {
            EncodedTable::Blocks(hx) => hx.heap_bytes(),
            EncodedTable::Packed(p) => p.heap_bytes(),
        }
    }

    /// Stage 1 of a staged lookup of `lo..=hi`: starts loading the directory entries.
    #[inline(always)]
    pub fn prefetch_directory(&self, lo: u64) {
        match self {
            EncodedTable::Blocks(hx) => hx.prefetch_directory(lo),
            EncodedTable::Packed(p) => p.prefetch_directory(lo),
        }
    }

    /// Stage 2: where the lookup of `lo..=hi` searches (see [`HxTable::candidates`] and
    /// [`PackedTable::candidates`]), whose loading it starts.
    #[inline(always)]
    pub fn candidates(&self, lo: u64, hi: u64) -> (usize, usize) {
        match self {
            EncodedTable::Blocks(hx) => {
                let c = hx.candidates(lo);
                hx.prefetch_blocks(c);
                c
            }
            EncodedTable::Packed(p) => {
                let c = p.candidates(lo, hi);
                p.prefetch_candidates(c);
                c
            }
        }
    }

    /// Whether `candidates` shows by itself that the table holds nothing there: an empty
    /// bucket of a packed table. (Candidate blocks always hold something to search.)
    #[inline(always)]
    pub fn holds_none(&self, (from, to): (usize, usize)) -> bool {
        matches!(self, EncodedTable::Packed(_)) && from == to
    }

    /// Stage 3: appends a [`TableHit`] (reported with `probe`) for every value in `lo..=hi`
    /// within `k` of `pq`; the rank is [`NO_RANK`](crate::codec::NO_RANK) for blocks without
    /// ranks.
    #[inline(always)]
    pub(crate) fn probe(
        &self,
        candidates: (usize, usize),
        range: (u64, u64),
        pq: u64,
        k: u32,
        probe: u32,
        out: &mut Vec<TableHit>,
    ) {
        match self {
            EncodedTable::Blocks(hx) => hx.probe(candidates, range, pq, k, probe, out),
            EncodedTable::Packed(p) => p.probe(candidates, range, pq, k, probe, out),
        }
    }

    /// Stage 2 of a staged [`rank_of`](Self::rank_of), after `prefetch_directory(value)`:
    /// where the rank of `value` is searched, whose loading it starts.
    #[inline(always)]
    pub fn rank_candidates(&self, value: u64) -> (usize, usize) {
        let c = self.candidates(value, value);
        // A packed table's ranks are its positions; blocks keep theirs apart.
        if let EncodedTable::Blocks(hx) = self {
            hx.prefetch_rank(c);
        }
        c
    }

    /// Stage 3 of a staged [`rank_of`](Self::rank_of): the rank of `value`, searching where
    /// [`rank_candidates`](Self::rank_candidates) said.
    #[inline(always)]
    pub fn rank_in(&self, candidates: (usize, usize), value: u64) -> Option<usize> {
        match self {
            EncodedTable::Blocks(hx) => hx.rank_in(candidates, value),
            EncodedTable::Packed(p) => p.rank_in(candidates, value),
        }
    }

    /// The rank (position in sorted order) of `value`, if present and ranks are kept.
    pub fn rank_of(&self, value: u64) -> Option<usize> {
        match self {
            EncodedTable::Blocks(hx) => hx.rank_of(value),
            EncodedTable::Packed(p) => p.rank_of(value),
        }
    }

    /// The value of rank `rank`, if `rank < len` and ranks are kept.
    pub fn get(&self, rank: usize) -> Option<u64> {
        match self {
            EncodedTable::Blocks(hx) => hx.get(rank),
            EncodedTable::Packed(p) => p.get(rank),
        }
    }

    /// Calls `visit(value, rank)` for every value in `lo..=hi`, in increasing order.
    pub fn scan_range(&self, lo: u64, hi: u64, visit: impl FnMut(u64, usize)) {
        match self {
            EncodedTable::Blocks(hx) => hx.scan_range(lo, hi, visit),
            EncodedTable::Packed(p) => p.scan_range(lo, hi, visit),
        }
    }

    /// [`scan_range`](Self::scan_range) until `visit` returns false.
    pub fn scan_range_while(&self, lo: u64, hi: u64, visit: impl FnMut(u64, usize) -> bool) {
        match self {
            EncodedTable::Blocks(hx) => hx.scan_range_while(lo, hi, visit),
            EncodedTable::Packed(p) => p.scan_range_while(lo, hi, visit),
        }
    }

    /// Every value, in order.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            EncodedTable::Blocks(hx) => hx.to_vec(),
            EncodedTable::Packed(p) => p.to_vec(),
        }
    }

    /// The table as it is stored: its blocks as they are, or a packed table's values encoded in
    /// blocks with `opts`.
    pub fn stored(&self, opts: TableOptions) -> Result<Cow<'_, HxTable>> {
        match self {
            EncodedTable::Blocks(hx) => Ok(Cow::Borrowed(hx)),
            EncodedTable::Packed(p) => Ok(Cow::Owned(HxTable::encode(&p.to_vec(), opts)?)),
        }
    }
}

/// Decoded a chunk at a time, so that a build can read a table's values without a copy of
/// them all.
impl crate::util::Values for EncodedTable {
    fn len(&self) -> usize {
        EncodedTable::len(self)
    }

    fn for_each_chunk(&self, mut f: impl FnMut(&[u64])) {
        const CHUNK: usize = 4096;
        let mut chunk = Vec::with_capacity(CHUNK);
        self.scan_range(0, u64::MAX, |v, _| {
            chunk.push(v);
            if chunk.len() == CHUNK {
                f(&chunk);
                chunk.clear();
            }
        });
        if !chunk.is_empty() {
            f(&chunk);
        }
    }
}
