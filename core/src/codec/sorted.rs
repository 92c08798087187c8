//! [`SortedRun`]: a sorted run of distinct values in either in-memory layout.

use std::borrow::Cow;

use crate::codec::packed::PackedRun;
use crate::codec::run::{HxRun, Layout, RunOptions};
use crate::error::Result;

/// A sorted run of distinct values, laid out as [`RunOptions::layout`] says. Lookups go
/// through the same stages in both layouts; `candidates` are blocks in one and value
/// positions in the other.
#[derive(Debug)]
// One per table, behind an `Arc`: the size of the smaller variant does not matter, and
// boxing the larger would put one more load on every lookup.
#[allow(clippy::large_enum_variant)]
pub enum SortedRun {
    /// Huffman-XOR blocks.
    Blocks(HxRun),
    /// Fixed-width low bits under a top-bits directory.
    Packed(PackedRun),
}

impl SortedRun {
    /// Lays out strictly increasing `values` as `opts` says.
    pub fn encode(values: &[u64], opts: RunOptions) -> Result<SortedRun> {
        Ok(match opts.layout {
            Layout::Blocks => SortedRun::Blocks(HxRun::encode(values, opts)?),
            Layout::Packed => {
                // The block options still say how the run is stored.
                opts.validate()?;
                SortedRun::Packed(PackedRun::encode(values)?)
            }
        })
    }

    /// Frees what only rank lookups need, when the layout keeps it apart (a packed run's
    /// ranks are its positions and cost nothing).
    pub fn drop_ranks(&mut self) {
        if let SortedRun::Blocks(hx) = self {
            hx.drop_ranks();
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            SortedRun::Blocks(hx) => hx.len(),
            SortedRun::Packed(p) => p.len(),
        }
    }

    /// Whether the run holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory held.
    pub fn heap_bytes(&self) -> usize {
        match self {
            SortedRun::Blocks(hx) => hx.heap_bytes(),
            SortedRun::Packed(p) => p.heap_bytes(),
        }
    }

    /// Stage 1 of a staged lookup of `lo..=hi`: starts loading the directory entries.
    #[inline(always)]
    pub fn prefetch_directory(&self, lo: u64) {
        match self {
            SortedRun::Blocks(hx) => hx.prefetch_directory(lo),
            SortedRun::Packed(p) => p.prefetch_directory(lo),
        }
    }

    /// Stage 2: where the lookup of `lo..=hi` searches (see [`HxRun::candidates`] and
    /// [`PackedRun::candidates`]), whose loading it starts.
    #[inline(always)]
    pub fn candidates(&self, lo: u64, hi: u64) -> (usize, usize) {
        match self {
            SortedRun::Blocks(hx) => {
                let c = hx.candidates(lo);
                hx.prefetch_blocks(c);
                c
            }
            SortedRun::Packed(p) => {
                let c = p.candidates(lo, hi);
                p.prefetch_candidates(c);
                c
            }
        }
    }

    /// Whether `candidates` shows by itself that the run holds nothing there: an empty
    /// bucket of a packed run. (Candidate blocks always hold something to search.)
    #[inline(always)]
    pub fn holds_none(&self, (from, to): (usize, usize)) -> bool {
        matches!(self, SortedRun::Packed(_)) && from == to
    }

    /// Stage 3: appends `(value, rank, tag)` for every value in `lo..=hi` within `k` of
    /// `pq`; the rank is [`NO_RANK`](crate::codec::NO_RANK) for blocks without ranks.
    #[inline(always)]
    pub(crate) fn probe(
        &self,
        candidates: (usize, usize),
        range: (u64, u64),
        pq: u64,
        k: u32,
        tag: u32,
        out: &mut Vec<(u64, u32, u32)>,
    ) {
        match self {
            SortedRun::Blocks(hx) => hx.probe(candidates, range, pq, k, tag, out),
            SortedRun::Packed(p) => p.probe(candidates, range, pq, k, tag, out),
        }
    }

    /// Stage 2 of a staged [`rank_of`](Self::rank_of), after `prefetch_directory(value)`:
    /// where the rank of `value` is searched, whose loading it starts.
    #[inline(always)]
    pub fn rank_candidates(&self, value: u64) -> (usize, usize) {
        let c = self.candidates(value, value);
        // A packed run's ranks are its positions; blocks keep theirs apart.
        if let SortedRun::Blocks(hx) = self {
            hx.prefetch_rank(c);
        }
        c
    }

    /// Stage 3 of a staged [`rank_of`](Self::rank_of): the rank of `value`, searching where
    /// [`rank_candidates`](Self::rank_candidates) said.
    #[inline(always)]
    pub fn rank_in(&self, candidates: (usize, usize), value: u64) -> Option<usize> {
        match self {
            SortedRun::Blocks(hx) => hx.rank_in(candidates, value),
            SortedRun::Packed(p) => p.rank_in(candidates, value),
        }
    }

    /// The rank (position in sorted order) of `value`, if present and ranks are kept.
    pub fn rank_of(&self, value: u64) -> Option<usize> {
        match self {
            SortedRun::Blocks(hx) => hx.rank_of(value),
            SortedRun::Packed(p) => p.rank_of(value),
        }
    }

    /// The value of rank `rank`, if `rank < len` and ranks are kept.
    pub fn get(&self, rank: usize) -> Option<u64> {
        match self {
            SortedRun::Blocks(hx) => hx.get(rank),
            SortedRun::Packed(p) => p.get(rank),
        }
    }

    /// Calls `visit(value, rank)` for every value in `lo..=hi`, in increasing order.
    pub fn scan_range(&self, lo: u64, hi: u64, visit: impl FnMut(u64, usize)) {
        match self {
            SortedRun::Blocks(hx) => hx.scan_range(lo, hi, visit),
            SortedRun::Packed(p) => p.scan_range(lo, hi, visit),
        }
    }

    /// Every value, in order.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            SortedRun::Blocks(hx) => hx.to_vec(),
            SortedRun::Packed(p) => p.to_vec(),
        }
    }

    /// The run as it is stored: its blocks as they are, or a packed run's values encoded in
    /// blocks with `opts`.
    pub fn stored(&self, opts: RunOptions) -> Result<Cow<'_, HxRun>> {
        match self {
            SortedRun::Blocks(hx) => Ok(Cow::Borrowed(hx)),
            SortedRun::Packed(p) => Ok(Cow::Owned(HxRun::encode(&p.to_vec(), opts)?)),
        }
    }
}
