//! Table designs: which bit blocks lead in each permuted table.
//!
//! Manku, Jain & Das Sarma (WWW 2007): split the `f` fingerprint bits into `r` blocks; if two
//! fingerprints differ in at most `k` bits, at least `r - k` blocks are identical
//! (pigeonhole). A table for each choice of `c <= r - k` blocks, permuted so the chosen
//! blocks lead and sorted, then finds every pair within `k` in at least one table by an exact
//! match on its leading bits (its *prefix*). A design may apply the idea again to the bits
//! left over (a *level*): the paper's 16-table design splits 64 bits into 4 blocks of 16,
//! chooses 1, splits the remaining 48 into 4 blocks of 12 and chooses 1 again.
//!
//! A [`Design`] is written as levels joined by `/`, each `BcC` (B blocks of near-equal width,
//! larger first, choose C) or `W1,W2,...cC` (explicit widths). The paper's four designs for
//! `k = 3` have names: `paper-20` (`6c3`), `paper-16` (`4c1/4c1`), `paper-10` (`5c2`) and
//! `paper-4` (`4c1`). [`Design::auto`] picks one from the expected number of fingerprints,
//! `k` and a memory budget, after the paper's `X(f, k, d)` recursion
//! ([`Design::fewest_tables`]).

use std::fmt;

use crate::error::{Error, Result};
use crate::permute::{BitRange, Permutation};
use crate::util::binomial;

/// Upper bound on the number of tables a design may have (memory grows with each).
pub const MAX_TABLES: u64 = 256;

/// The names of the paper's designs for k = 3, with their text form.
pub const NAMED: [(&str, &str); 4] =
    [("paper-20", "6c3"), ("paper-16", "4c1/4c1"), ("paper-10", "5c2"), ("paper-4", "4c1")];

/// One level of a design: how the bits not yet fixed are split, and how many blocks lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// Number of blocks the remaining bits are split into.
    pub blocks: u32,
    /// Explicit block widths, or `None` for a near-equal split (larger blocks first).
    pub widths: Option<Vec<u32>>,
    /// Number of blocks that lead in each table of this level.
    pub choose: u32,
}

impl Level {
    /// The block widths when this level splits `bits` bits.
    fn widths_for(&self, bits: u32) -> Result<Vec<u32>> {
        match &self.widths {
            Some(w) => {
                if w.iter().sum::<u32>() != bits {
                    return Err(Error::InvalidDesign(format!(
                        "block widths {w:?} do not sum to the {bits} bits left at this level"
                    )));
                }
                Ok(w.clone())
            }
            None => {
                if self.blocks == 0 || self.blocks > bits {
                    return Err(Error::InvalidDesign(format!(
                        "cannot split {bits} bits into {} blocks",
                        self.blocks
                    )));
                }
                let (q, extra) = (bits / self.blocks, bits % self.blocks);
                Ok((0..self.blocks).map(|i| q + u32::from(i < extra)).collect())
            }
        }
    }
}

/// One permuted table of a design.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Maps an original fingerprint to this table's order.
    pub perm: Permutation,
    /// Leading bits of the permuted value that a query must match exactly.
    pub prefix_bits: u32,
    /// The blocks chosen at each level (indices into that level's blocks).
    pub choice: Vec<Vec<u32>>,
}

/// A complete table design: levels, and the tables they generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Design {
    width: u32,
    levels: Vec<Level>,
    tables: Vec<TableSpec>,
    /// For a tablet design ([`Design::tablet`]): the largest k it answers.
    tablet_k: Option<u32>,
}

/// All `choose`-subsets of `0..n`, in lexicographic order.
fn combinations(n: u32, choose: u32) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut cur: Vec<u32> = (0..choose).collect();
    if choose > n {
        return out;
    }
    loop {
        out.push(cur.clone());
        // Advance the rightmost index that can move.
        let mut i = choose as usize;
        loop {
            if i == 0 {
                return out;
            }
            i -= 1;
            if cur[i] < n - choose + i as u32 {
                break;
            }
        }
        cur[i] += 1;
        for j in i + 1..choose as usize {
            cur[j] = cur[j - 1] + 1;
        }
    }
}

/// Splits a sequence of source ranges (in output order) at the given widths.
fn split_ranges(seq: &[BitRange], widths: &[u32]) -> Vec<Vec<BitRange>> {
    let mut out = Vec::with_capacity(widths.len());
    let mut it = seq.iter().copied();
    let mut cur: Option<BitRange> = None;
    for &w in widths {
        let mut need = w;
        let mut block = Vec::new();
        while need > 0 {
            let r = cur.take().or_else(|| it.next()).expect("widths sum to sequence length");
            if r.len <= need {
                block.push(r);
                need -= r.len;
            } else {
                block.push(BitRange { start: r.start, len: need });
                cur = Some(BitRange { start: r.start + need, len: r.len - need });
                need = 0;
            }
        }
        out.push(block);
    }
    out
}

impl Design {
    /// A design on `width`-bit fingerprints from its levels.
    pub fn new(width: u32, levels: Vec<Level>) -> Result<Design> {
        if width == 0 || width > 64 {
            return Err(Error::InvalidDesign(format!("width {width} is not in 1..=64")));
        }
        if levels.is_empty() {
            return Err(Error::InvalidDesign("a design needs at least one level".into()));
        }
        let count = levels
            .iter()
            .map(|l| binomial(l.blocks, l.choose))
            .fold(1u64, |a, b| a.saturating_mul(b));
        if count > MAX_TABLES {
            return Err(Error::InvalidDesign(format!(
                "{count} tables is more than the limit of {MAX_TABLES}"
            )));
        }
        for l in &levels {
            if l.choose == 0 || l.choose >= l.blocks {
                return Err(Error::InvalidDesign(format!(
                    "a level must choose between 1 and blocks - 1 blocks (got {} of {})",
                    l.choose, l.blocks
                )));
            }
            if let Some(w) = &l.widths
                && (w.len() as u32 != l.blocks || w.contains(&0))
            {
                return Err(Error::InvalidDesign(format!("bad explicit widths {w:?}")));
            }
        }
        let mut tables = Vec::new();
        let all = [BitRange { start: 0, len: width }];
        Self::expand(width, &levels, &[], &all, 0, &mut Vec::new(), &mut tables)?;
        Ok(Design { width, levels, tables, tablet_k: None })
    }

    /// A tablet design: one identity table whose prefix is `prefix_bits` long, answering
    /// every `k <= max_k`. Text form `p{prefix_bits}k{max_k}` (`p26k3`).
    ///
    /// A cluster node keeps table `t` of a design `D` as an index of this design over the
    /// permuted values `perm_t(fp)` with `prefix_bits_t` and `D`'s `max_k`: Hamming distance
    /// does not change under a permutation of bits, so a query of `perm_t(q)` there is
    /// exactly table `t`'s probe in `D`. The design itself does not guarantee that every
    /// pair within `max_k` shares a prefix: that is the guarantee of the design whose table
    /// it holds, probed over all of its tables.
    pub fn tablet(width: u32, prefix_bits: u32, max_k: u32) -> Result<Design> {
        if width == 0 || width > 64 {
            return Err(Error::InvalidDesign(format!("width {width} is not in 1..=64")));
        }
        if prefix_bits == 0 || prefix_bits > width {
            return Err(Error::InvalidDesign(format!(
                "a tablet's prefix must be 1..={width} bits (got {prefix_bits})"
            )));
        }
        if max_k >= 64 {
            return Err(Error::InvalidDesign(format!("a tablet's max k {max_k} is not below 64")));
        }
        let table =
            TableSpec { perm: Permutation::identity(width), prefix_bits, choice: Vec::new() };
        Ok(Design { width, levels: Vec::new(), tables: vec![table], tablet_k: Some(max_k) })
    }

    /// Whether this is a tablet design ([`Design::tablet`]).
    pub fn is_tablet(&self) -> bool {
        self.tablet_k.is_some()
    }

    /// Reads a tablet design's text `p{prefix}k{max_k}`; `None` if `text` is not of that
    /// shape.
    fn parse_tablet(width: u32, text: &str) -> Option<Result<Design>> {
        let rest = text.strip_prefix('p')?;
        let (prefix, k) = rest.split_once('k')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(prefix) || !digits(k) {
            return None;
        }
        let bad = || Error::InvalidDesign(format!("cannot read tablet design {text:?}"));
        Some(match (prefix.parse::<u32>(), k.parse::<u32>()) {
            (Ok(p), Ok(k)) => Design::tablet(width, p, k),
            _ => Err(bad()),
        })
    }

    fn expand(
        width: u32,
        levels: &[Level],
        lead: &[BitRange],
        rest: &[BitRange],
        prefix: u32,
        choice: &mut Vec<Vec<u32>>,
        out: &mut Vec<TableSpec>,
    ) -> Result<()> {
        let Some((level, deeper)) = levels.split_first() else {
            let ranges: Vec<BitRange> = lead.iter().chain(rest).copied().collect();
            let perm = Permutation::from_ranges(width, &ranges)?;
            out.push(TableSpec { perm, prefix_bits: prefix, choice: choice.clone() });
            return Ok(());
        };
        let bits: u32 = rest.iter().map(|r| r.len).sum();
        let widths = level.widths_for(bits)?;
        let blocks = split_ranges(rest, &widths);
        for chosen in combinations(level.blocks, level.choose) {
            let mut new_lead = lead.to_vec();
            let mut new_rest = Vec::new();
            let mut add = 0;
            for &b in &chosen {
                new_lead.extend_from_slice(&blocks[b as usize]);
                add += widths[b as usize];
            }
            for (b, blk) in blocks.iter().enumerate() {
                if !chosen.contains(&(b as u32)) {
                    new_rest.extend_from_slice(blk);
                }
            }
            if new_rest.is_empty() && !deeper.is_empty() {
                return Err(Error::InvalidDesign("no bits left for the next level".into()));
            }
            choice.push(chosen);
            Self::expand(width, deeper, &new_lead, &new_rest, prefix + add, choice, out)?;
            choice.pop();
        }
        Ok(())
    }

    /// Parses a design name (`paper-10`) or text (`5c2`, `4c1/4c1`, `16,16,16,16c1`) for
    /// 64-bit fingerprints.
    pub fn parse(text: &str) -> Result<Design> {
        Self::parse_width(64, text)
    }

    /// Like [`parse`](Self::parse), for `width`-bit fingerprints.
    pub fn parse_width(width: u32, text: &str) -> Result<Design> {
        let text = text.trim();
        if let Some(tablet) = Self::parse_tablet(width, text) {
            return tablet;
        }
        let body = NAMED.iter().find(|(n, _)| *n == text).map_or(text, |(_, t)| *t);
        let mut levels = Vec::new();
        for part in body.split('/') {
            let bad = || {
                Error::InvalidDesign(format!(
                    "cannot read level {part:?} of {text:?}: expected BcC like 5c2 or widths like 16,16,16,16c1, or a name: {}",
                    NAMED.map(|(n, _)| n).join(", ")
                ))
            };
            let (lhs, rhs) = part.trim().split_once('c').ok_or_else(bad)?;
            let choose: u32 = rhs.trim().parse().map_err(|_| bad())?;
            let nums: Vec<u32> = lhs
                .split(',')
                .map(|s| s.trim().parse::<u32>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| bad())?;
            let level = if nums.len() == 1 {
                Level { blocks: nums[0], widths: None, choose }
            } else {
                Level { blocks: nums.len() as u32, widths: Some(nums), choose }
            };
            levels.push(level);
        }
        Design::new(width, levels)
    }

    /// Fingerprint width in bits.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// The levels this design was built from (none for a tablet design).
    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// The tables, in a fixed order. Table 0 is always the identity permutation.
    pub fn tables(&self) -> &[TableSpec] {
        &self.tables
    }

    /// The largest Hamming distance for which every pair is found in some table.
    pub fn max_k(&self) -> u32 {
        if let Some(k) = self.tablet_k {
            return k;
        }
        self.levels.iter().map(|l| l.blocks - l.choose).min().unwrap_or(0)
    }

    /// Checks that a query distance is within what this design answers exactly.
    pub fn check_k(&self, k: u32) -> Result<()> {
        let max = self.max_k();
        if k > max { Err(Error::KOutOfRange { k, max }) } else { Ok(()) }
    }

    /// The tables a query at distance `k <= max_k` must probe. With `b` blocks choose `c` at
    /// a level, a pair within `k` agrees on at least `c` of the first `c + k` blocks, so only
    /// the tables whose choices at every level lie among those are needed: `C(c + k, c)` per
    /// level instead of `C(b, c)`. At `k = max_k` that is every table.
    ///
    /// A tablet design has one table: `[0]` for every `k <= max_k`.
    pub fn tables_for_k(&self, k: u32) -> Vec<usize> {
        if let Some(max) = self.tablet_k {
            return if k <= max { vec![0] } else { Vec::new() };
        }
        self.tables
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                t.choice
                    .iter()
                    .zip(&self.levels)
                    .all(|(chosen, level)| chosen.iter().all(|&b| b < level.choose + k))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Expected number of fingerprints sharing a query's prefix, summed over all tables, for
    /// `n` uniformly distributed fingerprints.
    pub fn expected_candidates(&self, n: u64) -> f64 {
        self.tables.iter().map(|t| n as f64 / 2f64.powi(t.prefix_bits as i32)).sum()
    }

    /// The smallest prefix length over all tables.
    pub fn min_prefix_bits(&self) -> u32 {
        self.tables.iter().map(|t| t.prefix_bits).min().unwrap_or(0)
    }

    /// The paper's `X(f, k, d)` recursion on whole bits: the design with the fewest tables
    /// such that, with `2^d` fingerprints, each table's prefix leaves fewer than `2^tau`
    /// expected candidates. At each level the `f` remaining bits are split into `r > k`
    /// blocks and `r - k` of them lead, giving `C(r, k)` tables; the level recurses on the
    /// `k` blocks left with `d` reduced by the bits fixed. Returns `None` when no design
    /// within [`MAX_TABLES`] reaches the target.
    pub fn fewest_tables(n: u64, k: u32, tau: u32) -> Option<Design> {
        let d = (n.max(1) as f64).log2().ceil() as i64;
        let levels = fewest_levels(64, k, d, tau as i64, 0)?.1;
        Design::new(64, levels).ok()
    }

    /// Every one- and two-level design answering `k` with up to [`MAX_TABLES`] tables,
    /// plus the paper's recursion's answers: the candidates [`auto`](Self::auto) and
    /// `IndexConfig::auto` choose from.
    pub fn candidates(n: u64, k: u32) -> Vec<Design> {
        let even = |blocks, choose| Level { blocks, widths: None, choose };
        let mut levels: Vec<Vec<Level>> = Vec::new();
        for r1 in k + 1..=(k + 10).min(32) {
            for c1 in 1..=r1 - k {
                levels.push(vec![even(r1, c1)]);
                for r2 in k + 1..=(k + 6).min(24) {
                    for c2 in 1..=r2 - k {
                        levels.push(vec![even(r1, c1), even(r2, c2)]);
                    }
                }
            }
        }
        for tau in 0..=12 {
            if let Some(d) = Self::fewest_tables(n, k, tau) {
                levels.push(d.levels.clone());
            }
        }
        let mut out: Vec<Design> = Vec::new();
        for l in levels {
            if let Ok(d) = Design::new(64, l)
                && d.max_k() >= k
                && !out.contains(&d)
            {
                out.push(d);
            }
        }
        out
    }

    /// Chooses a design for about `n` fingerprints and distance `k` that fits `budget_bytes`
    /// with the lowest estimated query cost, for the default table options
    /// ([`LayoutCost::default`]: XOR coding in 1 KiB blocks). Candidates are [`candidates`](Self::candidates). When
    /// nothing fits the budget, the smallest design is returned. `IndexConfig::auto` also
    /// chooses the layout: packed, or blocks of a size and coding.
    pub fn auto(n: u64, k: u32, budget_bytes: u64) -> Result<Design> {
        if k > 16 {
            return Err(Error::KOutOfRange { k, max: 16 });
        }
        let layout = LayoutCost::default();
        let mut best: Option<(f64, Design)> = None;
        let mut smallest: Option<(u64, Design)> = None;
        for d in Self::candidates(n, k) {
            let bytes = d.estimate_bytes(n, layout);
            if smallest.as_ref().is_none_or(|(b, _)| bytes < *b) {
                smallest = Some((bytes, d.clone()));
            }
            if bytes > budget_bytes {
                continue;
            }
            let cost = d.estimate_query_ns(n, layout);
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, d));
            }
        }
        best.map(|(_, d)| d)
            .or(smallest.map(|(_, d)| d))
            .ok_or_else(|| Error::InvalidDesign(format!("no design answers k = {k}")))
    }

    /// Estimated index bytes for `n` fingerprints in tables that cost `layout`: every table at
    /// [`LayoutCost::entry_bits`], plus the document columns (ids in `log2 n` bits, timestamps
    /// in 32).
    pub fn estimate_bytes(&self, n: u64, layout: LayoutCost) -> u64 {
        let tables = self.tables.len() as f64 * n as f64 * layout.entry_bits(n) / 8.0;
        let lg = (n.max(2) as f64).log2().ceil();
        (tables + n as f64 * (lg + 32.0) / 8.0) as u64
    }

    /// Estimated single-thread query cost in nanoseconds for `n` fingerprints laid out as
    /// `layout`: per table, one memory miss (overlapped with the other tables'), then the
    /// values read to reach and search the table's prefix: in blocks, half a block before it
    /// and every candidate in it, decoded; packed, the values of a directory bucket and the
    /// candidates, with a step through the directory for every bucket a short prefix spans.
    /// Calibrated on the 10M peer workload on 2-core development machines (packed:
    /// `paper-10` at 1.2-1.6 us a query, `paper-4`, 256 buckets a prefix, at 9-11 us).
    pub fn estimate_query_ns(&self, n: u64, layout: LayoutCost) -> f64 {
        const MISS_NS: f64 = 150.0;
        /// Decoding one Huffman-XOR value.
        const DECODE_NS: f64 = 3.6;
        /// Reading and testing one packed value.
        const PACKED_VALUE_NS: f64 = 3.0;
        /// Moving a packed scan on to the next directory bucket.
        const BUCKET_STEP_NS: f64 = 7.0;
        self.tables
            .iter()
            .map(|t| {
                let cand = n as f64 / 2f64.powi(t.prefix_bits as i32);
                match layout {
                    LayoutCost::Blocks { .. } => {
                        let half_block = layout.values_per_block(n) / 2.0;
                        MISS_NS + DECODE_NS * (half_block.min(n as f64) + cand)
                    }
                    LayoutCost::Packed => {
                        let bucket_bits = crate::codec::packed_dir_bits(n as usize);
                        let mean = n as f64 / 2f64.powi(bucket_bits as i32);
                        let steps = 2f64.powi(bucket_bits as i32 - t.prefix_bits as i32);
                        MISS_NS + PACKED_VALUE_NS * (mean + cand) + BUCKET_STEP_NS * steps.max(1.0)
                    }
                }
            })
            .sum()
    }
}

/// What a table costs a value in one [`Layout`](crate::codec::Layout), for the estimates
/// ([`Design::estimate_bytes`], [`Design::estimate_query_ns`]).
///
/// Not a second layout: the cost model of [`crate::codec::Layout`] with the options that
/// change it (the coding and block size), derived by [`LayoutCost::of`]. It is its own type
/// because an estimate takes a measured figure (the coding's excess bits) that no table
/// option holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LayoutCost {
    /// Huffman-XOR blocks ([`crate::codec::Layout::Blocks`]).
    Blocks {
        /// Bits a value costs above `64 - log2 n` before block overhead (see
        /// [`LayoutCost::of`]).
        coding_excess_bits: f64,
        /// Block size in bytes.
        block_bytes: usize,
    },
    /// Fixed-width low bits under a top-bits directory ([`crate::codec::Layout::Packed`]).
    Packed,
}

impl Default for LayoutCost {
    /// XOR coding in 1 KiB blocks ([`TableOptions::default`](crate::codec::TableOptions)).
    fn default() -> Self {
        LayoutCost::of(&crate::codec::TableOptions::default())
    }
}

impl LayoutCost {
    /// The cost of tables encoded with `opts` in memory: the coding's excess is about 1.95
    /// bits a value for XOR coding and 0.1 for gap coding (measured at 1M to 100M values).
    pub fn of(opts: &crate::codec::TableOptions) -> LayoutCost {
        use crate::codec::{Codec, Layout};
        match opts.layout {
            Layout::Packed => LayoutCost::Packed,
            Layout::Blocks => LayoutCost::Blocks {
                coding_excess_bits: match opts.codec {
                    Codec::Xor => 1.95,
                    Codec::Gap => 0.1,
                },
                block_bytes: opts.block_bytes,
            },
        }
    }

    /// Bits of one compressed value in blocks, block overhead excluded.
    fn raw_bits(coding_excess_bits: f64, n: u64) -> f64 {
        (64.0 - (n.max(2) as f64).log2() + coding_excess_bits).max(2.0)
    }

    /// Values one block holds (1 for the packed layout, which reads values one by one).
    pub fn values_per_block(&self, n: u64) -> f64 {
        match *self {
            LayoutCost::Blocks { coding_excess_bits, block_bytes } => {
                ((block_bytes.saturating_sub(16)) as f64 * 8.0
                    / Self::raw_bits(coding_excess_bits, n))
                .max(1.0)
            }
            LayoutCost::Packed => 1.0,
        }
    }

    /// Bits per table entry: in blocks, the coded value and the block overhead (header,
    /// checksum and directory, about 160 bits a block); packed, the stored low bits and
    /// the directory's share, as [`crate::codec::PackedTable`] lays them out.
    pub fn entry_bits(&self, n: u64) -> f64 {
        match *self {
            LayoutCost::Blocks { coding_excess_bits, .. } => {
                Self::raw_bits(coding_excess_bits, n) + 160.0 / self.values_per_block(n)
            }
            LayoutCost::Packed => crate::codec::packed_bits_per_value(n as usize),
        }
    }
}

/// `X(f, k, d)` on whole bits, memoised by the small argument space: returns the table count
/// and the levels achieving it.
fn fewest_levels(f: u32, k: u32, d: i64, tau: i64, depth: u32) -> Option<(u64, Vec<Level>)> {
    if d < tau {
        return Some((1, Vec::new()));
    }
    if depth >= 4 || f <= k + 1 {
        return None;
    }
    let mut best: Option<(u64, Vec<Level>)> = None;
    for r in k + 1..=f.min(k + 16) {
        let c = r - k;
        let here = binomial(r, k);
        if here > MAX_TABLES {
            break;
        }
        // Bits fixed by the smallest choice of c near-equal blocks (smaller blocks last).
        let (q, extra) = (f / r, f % r);
        let widths: Vec<u32> = (0..r).map(|i| q + u32::from(i < extra)).collect();
        let fixed: u32 = widths.iter().rev().take(c as usize).sum();
        if let Some((sub, mut levels)) =
            fewest_levels(f - fixed, k, d - fixed as i64, tau, depth + 1)
        {
            let total = here.saturating_mul(sub);
            if total <= MAX_TABLES && best.as_ref().is_none_or(|(b, _)| total < *b) {
                levels.insert(0, Level { blocks: r, widths: None, choose: c });
                best = Some((total, levels));
            }
        }
    }
    best
}

impl fmt::Display for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(k) = self.tablet_k {
            return write!(f, "p{}k{k}", self.tables[0].prefix_bits);
        }
        for (i, l) in self.levels.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            match &l.widths {
                Some(w) => {
                    let w: Vec<String> = w.iter().map(u32::to_string).collect();
                    write!(f, "{}c{}", w.join(","), l.choose)?;
                }
                None => write!(f, "{}c{}", l.blocks, l.choose)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::{SplitMix64, hamming};

    #[test]
    fn paper_designs() {
        for (name, tables, prefixes) in [
            ("paper-20", 20, (31, 33)),
            ("paper-16", 16, (28, 28)),
            ("paper-10", 10, (25, 26)),
            ("paper-4", 4, (16, 16)),
        ] {
            let d = Design::parse(name).unwrap();
            assert_eq!(d.tables().len(), tables, "{name}");
            assert_eq!(d.max_k(), 3, "{name}");
            let min = d.tables().iter().map(|t| t.prefix_bits).min().unwrap();
            let max = d.tables().iter().map(|t| t.prefix_bits).max().unwrap();
            assert_eq!((min, max), prefixes, "{name}");
            assert!(d.tables()[0].perm.is_identity(), "{name}: table 0 is the identity");
            // Builds sort each table on its prefix alone, which needs this.
            for t in d.tables() {
                assert!(t.perm.keeps_order_after(t.prefix_bits), "{name}");
            }
        }
    }

    #[test]
    fn text_round_trip_and_errors() {
        for t in ["5c2", "4c1/4c1", "16,16,16,16c1", "9c1", "8c2/6c1"] {
            let d = Design::parse(t).unwrap();
            assert_eq!(Design::parse(&d.to_string()).unwrap(), d);
        }
        assert!(Design::parse("").is_err());
        let t = Design::parse("p26k3").unwrap();
        assert_eq!(t, Design::tablet(64, 26, 3).unwrap());
        assert_eq!(t.to_string(), "p26k3");
        assert!(t.is_tablet() && !Design::parse("5c2").unwrap().is_tablet());
        assert_eq!((t.tables().len(), t.max_k(), t.min_prefix_bits()), (1, 3, 26));
        assert!(t.tables()[0].perm.is_identity());
        assert_eq!(t.tables_for_k(0), [0]);
        assert_eq!(t.tables_for_k(3), [0]);
        assert!(t.check_k(4).is_err());
        assert_eq!(Design::parse_width(12, "p12k0").unwrap().to_string(), "p12k0");
        for bad in ["p0k3", "p65k3", "p26k64", "p26k", "pk3", "p26k3x", "p-1k3"] {
            assert!(Design::parse(bad).is_err(), "{bad}");
        }
        assert!(Design::parse_width(12, "p13k1").is_err());
        assert!(Design::parse("5x2").is_err());
        assert!(Design::parse("16,16,16c1").is_err()); // widths do not sum to 64
        assert!(Design::parse("4c4").is_err()); // choose all: no pigeonhole
        assert!(Design::parse("64c32").is_err()); // too many tables
        assert_eq!(
            Design::parse("4c1").unwrap().check_k(4),
            Err(Error::KOutOfRange { k: 4, max: 3 })
        );
    }

    #[test]
    fn designs_up_to_k8() {
        for k in 0..=8 {
            let d = Design::auto(10_000_000, k, 4 << 30).unwrap();
            assert!(d.max_k() >= k, "k={k} design {d}");
            let lean = Design::auto(10_000_000, k, 0).unwrap();
            assert!(lean.max_k() >= k);
            assert!(lean.tables().len() <= d.tables().len());
        }
    }

    #[test]
    fn fewest_tables_follows_the_recursion() {
        // With a generous scan budget one level of k+1 blocks choose 1 is best.
        let d = Design::fewest_tables(1 << 34, 3, 20).unwrap();
        assert_eq!(d.tables().len(), 4);
        // Tighter budgets need more tables, never fewer.
        let mut last = 0;
        for tau in (0..=20).rev() {
            if let Some(d) = Design::fewest_tables(1 << 34, 3, tau) {
                assert!(d.tables().len() >= last);
                last = d.tables().len();
                let worst = d.tables().iter().map(|t| t.prefix_bits).min().unwrap();
                assert!(34 - worst as i64 <= tau as i64, "tau {tau}: {d}");
            }
        }
    }

    /// The permuted prefix of table `t` for value `x`.
    fn prefix(t: &TableSpec, width: u32, x: u64) -> u64 {
        t.perm.apply(x) >> (width - t.prefix_bits)
    }

    /// Every pair within max_k shares its prefix in at least one table: exhaustive over all
    /// pairs of a small width.
    #[test]
    fn every_close_pair_shares_a_prefix_exhaustive() {
        for (width, text) in [(12, "4c1"), (12, "5c2"), (12, "3c1/3c1"), (10, "5c3"), (12, "6c2")] {
            let d = Design::parse_width(width, text).unwrap();
            let k = d.max_k();
            let masks: Vec<u64> = (0..1u64 << width).filter(|m| m.count_ones() <= k).collect();
            for x in 0..1u64 << width {
                for &m in &masks {
                    let y = x ^ m;
                    assert!(
                        d.tables().iter().any(|t| prefix(t, width, x) == prefix(t, width, y)),
                        "{text} width {width}: {x:#x} and {y:#x} share no prefix"
                    );
                }
            }
        }
    }

    /// For every k below max_k, the reduced table set still covers every pair within k
    /// (exhaustive on 12 bits) and is no larger than the full set.
    #[test]
    fn smaller_k_needs_fewer_tables_exhaustive() {
        for (width, text) in [(12, "4c1"), (12, "5c2"), (12, "3c1/3c1"), (12, "6c2")] {
            let d = Design::parse_width(width, text).unwrap();
            assert_eq!(d.tables_for_k(d.max_k()).len(), d.tables().len());
            for k in 0..=d.max_k() {
                let subset = d.tables_for_k(k);
                let masks: Vec<u64> = (0..1u64 << width).filter(|m| m.count_ones() <= k).collect();
                for x in 0..1u64 << width {
                    for &m in &masks {
                        let y = x ^ m;
                        assert!(
                            subset.iter().any(|&t| {
                                let t = &d.tables()[t];
                                prefix(t, width, x) == prefix(t, width, y)
                            }),
                            "{text} k={k}: {x:#x} and {y:#x} missed by {subset:?}"
                        );
                    }
                }
            }
        }
        assert_eq!(Design::parse("5c2").unwrap().tables_for_k(0).len(), 1);
        assert_eq!(Design::parse("5c2").unwrap().tables_for_k(1).len(), 3);
        assert_eq!(Design::parse("4c1/4c1").unwrap().tables_for_k(1).len(), 4);
    }

    /// The same on 64 bits, with random pairs at every distance up to max_k.
    #[test]
    fn every_close_pair_shares_a_prefix_random_64() {
        let mut rng = SplitMix64::new(42);
        for text in ["paper-20", "paper-16", "paper-10", "paper-4", "8c2", "7c1/5c1", "13c1"] {
            let d = Design::parse(text).unwrap();
            for _ in 0..20_000 {
                let x = rng.next_u64();
                let dist = rng.below(d.max_k() as u64 + 1) as u32;
                let y = rng.flip_bits(x, dist);
                assert_eq!(hamming(x, y), dist);
                assert!(
                    d.tables().iter().any(|t| prefix(t, 64, x) == prefix(t, 64, y)),
                    "{text}: pair at distance {dist} missed"
                );
            }
        }
    }

    /// A design is not exact beyond max_k: one differing bit in each of four 3-bit blocks
    /// (distance 4) shares no prefix in `4c1`, while three of them (distance 3) do.
    #[test]
    fn designs_are_tight() {
        let d = Design::parse_width(12, "4c1").unwrap();
        let three = 0b100_100_100_000u64;
        let four = 0b100_100_100_100u64;
        assert!(d.tables().iter().any(|t| prefix(t, 12, 0) == prefix(t, 12, three)));
        assert!(!d.tables().iter().any(|t| prefix(t, 12, 0) == prefix(t, 12, four)));
    }
}
