//! The multi-lane scan a query runs: one [`Lane`] per table probed, prepared ahead (their
//! block lookups and prefetches overlap) and decoded by [`scan_lanes`], reporting every
//! value within `k` of the lane's query as a [`TableHit`].

use crate::codec::TableHit;
use crate::codec::hx_block::{Code, Cursor, GapCode, Lut, XorCode, block_count, prefetch_lines};
use crate::codec::hx_table::{HxTable, NO_RANK};
use crate::codec::options::Codec;

/// One range scan over a table, prepared ahead and run by [`scan_lanes`]. A query prepares
/// the scans of all its tables first (their block lookups and prefetches overlap), then
/// decodes.
#[derive(Debug)]
pub struct Lane<'a> {
    data: &'a [u8],
    lut: &'a Lut,
    ranks: &'a [u32],
    bb: usize,
    blocks: usize,
    block: usize,
    /// Values in the current block, and how many are left after `v`.
    count: u32,
    left: u32,
    cur: Cursor,
    v: u64,
    lo: u64,
    hi: u64,
    /// The query, permuted as the table is.
    pq: u64,
    /// Reported with every hit ([`TableHit::probe`]).
    probe: u32,
    done: bool,
}

impl Lane<'_> {
    /// Runs the scan to its end, reporting values within `k` of the lane's query.
    ///
    /// The inner loops stay within one block and carry only what decoding needs, so the
    /// state fits in registers: first values below the range are skipped with a compare,
    /// then values in the range are checked; block changes and hits are out of line.
    #[inline(always)]
    fn scan<C: Code>(&mut self, k: u32, out: &mut Vec<TableHit>) {
        let (lut, lo, hi, pq) = (self.lut, self.lo, self.hi, self.pq);
        while !self.done {
            let block = &self.data[self.block * self.bb..];
            let (mut v, mut cur, mut left) = (self.v, self.cur, self.left);
            while v < lo && left > 0 {
                v = C::apply(v, cur.next(block, lut));
                left -= 1;
            }
            if v >= lo {
                loop {
                    if v > hi {
                        self.done = true;
                        return;
                    }
                    if (v ^ pq).count_ones() <= k {
                        self.hit(v, left, out);
                    }
                    if left == 0 {
                        break;
                    }
                    v = C::apply(v, cur.next(block, lut));
                    left -= 1;
                }
            }
            self.next_block();
        }
    }

    /// Reports a matching value (rare: kept out of the decoding loop).
    #[cold]
    #[inline(never)]
    fn hit(&self, v: u64, left: u32, out: &mut Vec<TableHit>) {
        let rank = match self.ranks.get(self.block) {
            Some(r) => r + (self.count - 1 - left),
            None => NO_RANK,
        };
        out.push(TableHit { value: v, rank, probe: self.probe });
    }

    /// Moves to the first value of the next block, or ends the scan.
    #[inline(never)]
    fn next_block(&mut self) {
        self.block += 1;
        if self.block >= self.blocks {
            self.done = true;
            return;
        }
        let block = &self.data[self.block * self.bb..];
        self.v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        self.count = block_count(block);
        self.left = self.count - 1;
        self.cur = Cursor::new(block);
        self.done = self.v > self.hi;
    }
}

/// Runs `lanes` to completion, one after the other, appending `(value, rank, probe)`
/// for every value within `k` of its lane's query. All lanes must come from tables with
/// codec `codec`.
pub fn scan_lanes(codec: Codec, lanes: &mut [Lane<'_>], k: u32, out: &mut Vec<TableHit>) {
    match codec {
        Codec::Xor => scan_lanes_with::<XorCode>(lanes, k, out),
        Codec::Gap => scan_lanes_with::<GapCode>(lanes, k, out),
    }
}

fn scan_lanes_with<C: Code>(lanes: &mut [Lane<'_>], k: u32, out: &mut Vec<TableHit>) {
    for lane in lanes.iter_mut() {
        lane.scan::<C>(k, out);
    }
}

impl HxTable {
    /// Like [`lane`](Self::lane), searching the blocks from [`candidates`](Self::candidates)
    /// (after [`prefetch_blocks`](Self::prefetch_blocks)); prefetches the rest of the block
    /// it starts in when that is not the first candidate, which is already on its way.
    #[inline]
    pub fn lane_in(
        &self,
        candidates: (usize, usize),
        lo: u64,
        hi: u64,
        pq: u64,
        probe: u32,
    ) -> Lane<'_> {
        let b = self.block_in(candidates, lo);
        let bb = self.opts.block_bytes;
        if b != candidates.0 {
            prefetch_lines(&self.data, b * bb + 64, bb.saturating_sub(64));
        }
        self.lane_at(b, lo, hi, pq, probe)
    }

    /// Stage 3 of a staged lookup, after [`prefetch_blocks`](Self::prefetch_blocks): appends
    /// `(value, rank, probe)` for every value in `lo..=hi` within `k` of `pq`. The same as
    /// running the [`lane_in`](Self::lane_in) lane, which here never leaves the stack.
    #[inline(always)]
    pub(crate) fn probe(
        &self,
        candidates: (usize, usize),
        (lo, hi): (u64, u64),
        pq: u64,
        k: u32,
        probe: u32,
        out: &mut Vec<TableHit>,
    ) {
        let mut lane = self.lane_in(candidates, lo, hi, pq, probe);
        match self.opts.codec {
            Codec::Xor => lane.scan::<XorCode>(k, out),
            Codec::Gap => lane.scan::<GapCode>(k, out),
        }
    }

    /// Starts a scan of `lo..=hi` that reports values within `k` of `pq`, each with `probe`.
    /// See [`Lane`].
    #[inline]
    pub fn lane(&self, lo: u64, hi: u64, pq: u64, probe: u32) -> Lane<'_> {
        let b = if self.len == 0 { 0 } else { self.block_for(lo) };
        self.lane_at(b, lo, hi, pq, probe)
    }

    #[inline(always)]
    fn lane_at(&self, b: usize, lo: u64, hi: u64, pq: u64, probe: u32) -> Lane<'_> {
        let bb = self.opts.block_bytes;
        let mut lane = Lane {
            data: &self.data,
            lut: self.huffman.lut(),
            ranks: &self.ranks,
            bb,
            blocks: self.blocks(),
            block: 0,
            count: 1,
            left: 0,
            cur: Cursor { cbuf: 0, cbits: 0, cpos: 0, rpos: 0 },
            v: 0,
            lo,
            hi,
            pq,
            probe,
            done: true,
        };
        if self.len == 0 || lo > hi {
            return lane;
        }
        let block = &self.data[b * bb..];
        lane.block = b;
        lane.v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        lane.count = block_count(block);
        lane.left = lane.count - 1;
        lane.cur = Cursor::new(block);
        lane.done = lane.v > hi;
        lane
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::hx_table::samples::{clustered, sorted_random};
    use crate::codec::options::TableOptions;
    use crate::util::SplitMix64;

    #[test]
    fn lanes_match_plain_scans() {
        let data = [sorted_random(20_000, 31), clustered(20_000, 32)];
        for codec in [Codec::Xor, Codec::Gap] {
            let tables: Vec<HxTable> = data
                .iter()
                .map(|d| {
                    HxTable::encode(
                        d,
                        TableOptions { codec, block_bytes: 96, ..Default::default() },
                    )
                    .unwrap()
                })
                .collect();
            let mut r = SplitMix64::new(3);
            for _ in 0..300 {
                let k = r.below(40) as u32;
                let mut want = Vec::new();
                let mut lanes = Vec::new();
                for (t, table) in tables.iter().enumerate() {
                    for j in 0..3u32 {
                        let pq = r.next_u64();
                        let p = 4 + r.below(20) as u32;
                        let (lo, hi) = (pq & !(u64::MAX >> p), pq | (u64::MAX >> p));
                        let tag = t as u32 * 10 + j;
                        table.scan_range(lo, hi, |v, rank| {
                            if (v ^ pq).count_ones() <= k {
                                want.push(TableHit { value: v, rank: rank as u32, probe: tag });
                            }
                        });
                        lanes.push(table.lane(lo, hi, pq, tag));
                    }
                }
                let mut got = Vec::new();
                scan_lanes(codec, &mut lanes, k, &mut got);
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want);
            }
        }
    }
}
