//! Bit permutations of fingerprints, precomputed as block moves.
//!
//! A permuted table stores every fingerprint with some of its bit blocks moved to the front
//! (the most significant end), so that fingerprints agreeing on those blocks sort next to each
//! other. A [`Permutation`] is described by the source bit ranges in output order; it is
//! compiled once into a few shift-and-mask moves (adjacent ranges that stay adjacent are
//! merged), applied and inverted without any per-bit work. Where the CPU has BMI2 (the
//! project's builds for x86-64 enable it), a permutation of up to `GATHERS` runs of ranges in
//! source order is applied with one `PEXT` a run instead, and inverted with one `PDEP` (AMD
//! CPUs before Zen 3 run those in microcode: see `.cargo/config.toml`).
//!
//! Bit positions count from the most significant end of an `f`-bit value: position 0 is bit
//! `f - 1`. Values use the low `f` bits of a `u64`; `f` is 64 for real fingerprints and smaller
//! in exhaustive tests.

use crate::error::{Error, Result};

/// A contiguous range of bit positions, counted from the most significant end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BitRange {
    /// First position (0 = most significant bit).
    pub start: u32,
    /// Number of bits.
    pub len: u32,
}

/// One shift-and-mask move: `out |= ((x >> src) & mask) << dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    src: u32,
    dst: u32,
    mask: u64,
}

impl Move {
    #[inline(always)]
    fn apply(self, x: u64) -> u64 {
        ((x >> self.src) & self.mask) << self.dst
    }
}

/// Most runs of ranges in source order a permutation may have for [`Permutation::apply`] to
/// gather them with `PEXT`. Designs need two (the chosen blocks, then the rest in order) or
/// three (two levels of choice).
const GATHERS: usize = 3;

/// One run of ranges that keep their source order: `out |= pext(x, mask) << shift`, and
/// back, `x |= pdep(y >> shift, mask)`. Unused runs have an empty mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Gather {
    mask: u64,
    shift: u32,
}

/// The bit gathers of a permutation, when it has at most [`GATHERS`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gathers([Gather; GATHERS]);

impl Gathers {
    /// The runs of `ranges` (in output order over `width` bits) whose source positions keep
    /// increasing, if there are at most [`GATHERS`].
    fn of(width: u32, ranges: &[BitRange]) -> Option<Gathers> {
        let mut g = [Gather::default(); GATHERS];
        let (mut n, mut out_pos, mut last_end) = (0usize, 0u32, 0u32);
        for r in ranges {
            // A range that starts before the last one ended begins a new run.
            if n == 0 || r.start < last_end {
                if n == GATHERS {
                    return None;
                }
                n += 1;
            }
            out_pos += r.len;
            last_end = r.start + r.len;
            let run = &mut g[n - 1];
            run.mask |= low_mask(r.len) << (width - last_end);
            // The run's bits end at `out_pos` so far, counted from the top.
            run.shift = width - out_pos;
        }
        Some(Gathers(g))
    }

    /// The permutation of `x`.
    #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
    #[inline(always)]
    fn apply(&self, x: u64) -> u64 {
        use std::arch::x86_64::_pext_u64;
        let [a, b, c] = self.0;
        // SAFETY: compiled only where BMI2 is enabled.
        unsafe {
            (_pext_u64(x, a.mask) << a.shift)
                | (_pext_u64(x, b.mask) << b.shift)
                | (_pext_u64(x, c.mask) << c.shift)
        }
    }

    /// The inverse permutation of `y`.
    #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
    #[inline(always)]
    fn invert(&self, y: u64) -> u64 {
        use std::arch::x86_64::_pdep_u64;
        let [a, b, c] = self.0;
        // SAFETY: compiled only where BMI2 is enabled. PDEP reads only as many low bits of
        // its source as its mask has, so each run's bits above it are ignored.
        unsafe {
            _pdep_u64(y >> a.shift, a.mask)
                | _pdep_u64(y >> b.shift, b.mask)
                | _pdep_u64(y >> c.shift, c.mask)
        }
    }
}

/// All of `moves` applied to `x`. The counts designs produce (up to five) are unrolled: a
/// loop with a data-dependent trip count cost a third of sorting a table by its prefix.
#[inline(always)]
fn apply_moves(moves: &[Move], x: u64) -> u64 {
    match moves {
        [a] => a.apply(x),
        [a, b] => a.apply(x) | b.apply(x),
        [a, b, c] => a.apply(x) | b.apply(x) | c.apply(x),
        [a, b, c, d] => a.apply(x) | b.apply(x) | c.apply(x) | d.apply(x),
        [a, b, c, d, e] => a.apply(x) | b.apply(x) | c.apply(x) | d.apply(x) | e.apply(x),
        moves => moves.iter().fold(0, |acc, m| acc | m.apply(x)),
    }
}

/// Work that takes a permutation as a closure: see [`Permutation::with_apply`].
pub(crate) trait VisitMap {
    /// What the work gives back.
    type Output;
    /// Does the work with `map`, the permutation.
    fn call(self, map: impl Fn(u64) -> u64 + Copy) -> Self::Output;
}

/// A bijection on `f`-bit values that reorders blocks of bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    width: u32,
    ranges: Vec<BitRange>,
    forward: Vec<Move>,
    inverse: Vec<Move>,
    /// The same permutation as PEXT/PDEP gathers, when it has few enough runs.
    #[cfg_attr(not(all(target_arch = "x86_64", target_feature = "bmi2")), allow(dead_code))]
    gathers: Option<Gathers>,
}

#[inline(always)]
fn low_mask(bits: u32) -> u64 {
    if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 }
}

impl Permutation {
    /// The identity on `width`-bit values.
    pub fn identity(width: u32) -> Self {
        Self::from_ranges(width, &[BitRange { start: 0, len: width }]).expect("valid identity")
    }

    /// The permutation whose output is the given source ranges, in order, from the most
    /// significant end. The ranges must partition `0..width` exactly.
    pub fn from_ranges(width: u32, ranges: &[BitRange]) -> Result<Self> {
        if width == 0 || width > 64 {
            return Err(Error::InvalidDesign(format!(
                "fingerprint width {width} is not in 1..=64"
            )));
        }
        let mut covered = vec![false; width as usize];
        for r in ranges {
            if r.len == 0 || r.start + r.len > width {
                return Err(Error::InvalidDesign(format!(
                    "bit range {}..{} is empty or outside 0..{width}",
                    r.start,
                    r.start + r.len
                )));
            }
            for p in r.start..r.start + r.len {
                if std::mem::replace(&mut covered[p as usize], true) {
                    return Err(Error::InvalidDesign(format!("bit position {p} is used twice")));
                }
            }
        }
        if let Some(p) = covered.iter().position(|c| !c) {
            return Err(Error::InvalidDesign(format!("bit position {p} is not covered")));
        }
        // Merge ranges that are adjacent in both source and output.
        let mut merged: Vec<BitRange> = Vec::with_capacity(ranges.len());
        for &r in ranges {
            match merged.last_mut() {
                Some(last) if last.start + last.len == r.start => last.len += r.len,
                _ => merged.push(r),
            }
        }
        let mut forward = Vec::with_capacity(merged.len());
        let mut inverse = Vec::with_capacity(merged.len());
        let mut out_pos = 0;
        for r in &merged {
            let src = width - r.start - r.len;
            let dst = width - out_pos - r.len;
            let mask = low_mask(r.len);
            forward.push(Move { src, dst, mask });
            inverse.push(Move { src: dst, dst: src, mask });
            out_pos += r.len;
        }
        let gathers = Gathers::of(width, &merged);
        Ok(Permutation { width, ranges: merged, forward, inverse, gathers })
    }

    /// Width in bits of the values this permutation acts on.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// The source ranges in output order (adjacent ranges merged).
    pub fn ranges(&self) -> &[BitRange] {
        &self.ranges
    }

    /// Whether this permutation leaves every value unchanged.
    pub fn is_identity(&self) -> bool {
        self.ranges.len() == 1
    }

    /// Whether the output bits after the first `lead` keep their source order (their source
    /// positions increase). Then values in increasing order whose images agree on the first
    /// `lead` bits have images in increasing order too: sorting the images on those bits
    /// alone, stably, sorts them.
    pub fn keeps_order_after(&self, lead: u32) -> bool {
        let mut out_pos = 0;
        let mut last_end = 0; // one past the last source position seen after `lead`
        for r in &self.ranges {
            let skip = lead.saturating_sub(out_pos).min(r.len);
            out_pos += r.len;
            if skip == r.len {
                continue;
            }
            let start = r.start + skip;
            if start < last_end {
                return false;
            }
            last_end = r.start + r.len;
        }
        true
    }

    /// Number of shift-and-mask moves one application costs.
    pub fn moves(&self) -> usize {
        self.forward.len()
    }

    /// Permutes `x` (only its low `width` bits are read).
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
        if let Some(g) = &self.gathers {
            return g.apply(x);
        }
        apply_moves(&self.forward, x)
    }

    /// Calls `visit` with [`apply`](Self::apply) as a closure that holds the block moves
    /// themselves, their number fixed at compile time. A loop that maps many values through
    /// `apply` reloads the moves for every value (its stores might alias them) and branches
    /// on their number; through this closure it does neither.
    pub(crate) fn with_apply<V: VisitMap>(&self, visit: V) -> V::Output {
        /// The moves copied into an array of `N`, which [`apply_moves`] unrolls.
        fn fixed<const N: usize, V: VisitMap>(moves: &[Move], visit: V) -> V::Output {
            let moves: [Move; N] = moves.try_into().expect("N moves");
            visit.call(move |x| apply_moves(&moves, x))
        }
        #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
        if let Some(g) = self.gathers {
            return visit.call(move |x| g.apply(x));
        }
        let moves = self.forward.as_slice();
        match moves.len() {
            1 => fixed::<1, V>(moves, visit),
            2 => fixed::<2, V>(moves, visit),
            3 => fixed::<3, V>(moves, visit),
            4 => fixed::<4, V>(moves, visit),
            5 => fixed::<5, V>(moves, visit),
            _ => visit.call(|x| self.apply(x)),
        }
    }

    /// Undoes [`apply`](Self::apply): `invert(apply(x)) == x` for every `width`-bit `x`.
    #[inline]
    pub fn invert(&self, y: u64) -> u64 {
        #[cfg(all(target_arch = "x86_64", target_feature = "bmi2"))]
        if let Some(g) = &self.gathers {
            return g.invert(y);
        }
        apply_moves(&self.inverse, y)
    }

    /// The composition "first `self`, then `then`": `then.apply(self.apply(x))`.
    pub fn then(&self, then: &Permutation) -> Result<Permutation> {
        if self.width != then.width {
            return Err(Error::InvalidDesign("composing permutations of different widths".into()));
        }
        // Output position p of `then` reads position q of self's output, which reads source
        // position s of the original. Walk `then`'s ranges and split them along self's ranges.
        let mut self_out = Vec::new(); // (output start, source start, len)
        let mut pos = 0;
        for r in &self.ranges {
            self_out.push((pos, r.start, r.len));
            pos += r.len;
        }
        let mut ranges = Vec::new();
        for r in &then.ranges {
            let (mut q, end) = (r.start, r.start + r.len);
            while q < end {
                let &(o, s, l) = self_out
                    .iter()
                    .find(|&&(o, _, l)| o <= q && q < o + l)
                    .expect("ranges partition the width");
                let take = (o + l).min(end) - q;
                ranges.push(BitRange { start: s + (q - o), len: take });
                q += take;
            }
        }
        Permutation::from_ranges(self.width, &ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    fn blocks(width: u32, order: &[(u32, u32)]) -> Permutation {
        let r: Vec<_> = order.iter().map(|&(start, len)| BitRange { start, len }).collect();
        Permutation::from_ranges(width, &r).unwrap()
    }

    #[test]
    fn moves_block_to_front() {
        let p = blocks(64, &[(16, 16), (0, 16), (32, 32)]);
        let x = 0x1111_2222_3333_4444u64;
        assert_eq!(p.apply(x), 0x2222_1111_3333_4444);
        assert_eq!(p.invert(p.apply(x)), x);
        assert_eq!(p.moves(), 3);
    }

    #[test]
    fn order_after_the_lead() {
        // Block 1 to the front, then blocks 0, 2, 3 in order.
        let p = blocks(64, &[(16, 16), (0, 16), (32, 32)]);
        assert!(p.keeps_order_after(16));
        assert!(!p.keeps_order_after(8)); // 8 bits of block 1 would come after block 0's
        assert!(p.keeps_order_after(20) && p.keeps_order_after(64));
        // Blocks 2 and 0 lead, 1 and 3 follow in order.
        let q = blocks(64, &[(32, 16), (0, 16), (16, 16), (48, 16)]);
        assert!(q.keeps_order_after(32) && q.keeps_order_after(16));
        assert!(!q.keeps_order_after(8)); // bits 40..48 before bit 0
        assert!(blocks(64, &[(0, 64)]).keeps_order_after(0));
        // Checked against its definition on every lead, for a scrambled permutation.
        let s = blocks(64, &[(40, 8), (8, 16), (0, 8), (48, 16), (24, 16)]);
        for lead in 0..=64 {
            let mut src = Vec::new();
            let mut out_pos = 0;
            for r in s.ranges() {
                for b in r.start..r.start + r.len {
                    if out_pos >= lead {
                        src.push(b);
                    }
                    out_pos += 1;
                }
            }
            assert_eq!(s.keeps_order_after(lead), src.is_sorted(), "lead {lead}");
        }
    }

    #[test]
    fn with_apply_maps_as_apply_for_every_move_count() {
        struct Collect(Vec<u64>);
        impl VisitMap for Collect {
            type Output = Vec<u64>;
            fn call(self, map: impl Fn(u64) -> u64 + Copy) -> Vec<u64> {
                self.0.iter().map(|&x| map(x)).collect()
            }
        }
        let mut r = crate::util::SplitMix64::new(4);
        let xs: Vec<u64> = (0..200).map(|_| r.next_u64()).collect();
        // One to five moves (the unrolled closures) and seven (the general one).
        let shapes: [&[(u32, u32)]; 7] = [
            &[(0, 64)],
            &[(32, 32), (0, 32)],
            &[(16, 16), (0, 16), (32, 32)],
            &[(16, 16), (48, 16), (0, 16), (32, 16)],
            &[(8, 8), (24, 8), (0, 8), (16, 8), (32, 32)],
            &[(8, 8), (24, 8), (40, 8), (0, 8), (16, 8), (32, 8), (48, 16)],
            &[(56, 8), (48, 8), (40, 8), (32, 8), (24, 8), (16, 8), (0, 16)],
        ];
        for (i, shape) in shapes.iter().enumerate() {
            let p = blocks(64, shape);
            assert_eq!(p.moves(), [1, 2, 3, 4, 5, 7, 7][i], "shape {i}");
            let want: Vec<u64> = xs.iter().map(|&x| p.apply(x)).collect();
            assert_eq!(p.with_apply(Collect(xs.clone())), want, "shape {i}");
        }
    }

    /// The PEXT/PDEP gathers agree with the block moves, for permutations of one to three
    /// runs and at widths below 64; four runs fall back to the moves.
    #[test]
    fn gathers_agree_with_moves() {
        let mut r = SplitMix64::new(8);
        let shapes: [(u32, &[(u32, u32)]); 6] = [
            (64, &[(0, 64)]),
            (64, &[(13, 13), (39, 13), (0, 13), (26, 13), (52, 12)]),
            (64, &[(16, 16), (40, 12), (0, 16), (32, 8), (52, 12)]),
            (20, &[(5, 5), (15, 5), (0, 5), (10, 5)]),
            (12, &[(8, 4), (4, 4), (0, 4)]),
            (64, &[(48, 16), (32, 16), (16, 16), (0, 16)]),
        ];
        for (i, &(width, shape)) in shapes.iter().enumerate() {
            let p = blocks(width, shape);
            assert_eq!(p.gathers.is_some(), i < 5, "shape {i}");
            for _ in 0..1000 {
                let x = r.next_u64() & low_mask(width);
                let y = apply_moves(&p.forward, x);
                assert_eq!(p.apply(x), y, "shape {i}");
                assert_eq!(p.invert(y), x, "shape {i}");
                assert_eq!(apply_moves(&p.inverse, y), x, "shape {i}");
            }
        }
    }

    #[test]
    fn merges_adjacent_ranges() {
        let p = blocks(64, &[(0, 10), (10, 20), (30, 34)]);
        assert!(p.is_identity());
        assert_eq!(p.moves(), 1);
    }

    #[test]
    fn rejects_bad_ranges() {
        assert!(Permutation::from_ranges(64, &[BitRange { start: 0, len: 63 }]).is_err());
        assert!(
            Permutation::from_ranges(
                64,
                &[BitRange { start: 0, len: 40 }, BitRange { start: 30, len: 34 }]
            )
            .is_err()
        );
        assert!(Permutation::from_ranges(65, &[BitRange { start: 0, len: 65 }]).is_err());
    }

    #[test]
    fn bijection_exhaustive_small_width() {
        // Every value of a 12-bit space maps to a distinct value and back.
        let p = blocks(12, &[(8, 4), (0, 3), (5, 3), (3, 2)]);
        let mut seen = vec![false; 1 << 12];
        for x in 0..(1u64 << 12) {
            let y = p.apply(x);
            assert!(y < 1 << 12);
            assert!(!std::mem::replace(&mut seen[y as usize], true));
            assert_eq!(p.invert(y), x);
        }
    }

    #[test]
    fn composition_matches_sequential_application() {
        let a = blocks(64, &[(20, 11), (0, 20), (31, 33)]);
        let b = blocks(64, &[(11, 30), (0, 11), (41, 23)]);
        let ab = a.then(&b).unwrap();
        let mut r = SplitMix64::new(3);
        for _ in 0..1000 {
            let x = r.next_u64();
            assert_eq!(ab.apply(x), b.apply(a.apply(x)));
            assert_eq!(ab.invert(ab.apply(x)), x);
        }
    }

    proptest::proptest! {
        #[test]
        fn random_block_orders_are_bijections(
            cuts in proptest::collection::btree_set(1u32..64, 0..8),
            seed in 0u64..1000,
            x in proptest::num::u64::ANY,
        ) {
            let mut bounds: Vec<u32> = std::iter::once(0).chain(cuts).chain(std::iter::once(64)).collect();
            bounds.dedup();
            let mut r: Vec<BitRange> = bounds.windows(2).map(|w| BitRange { start: w[0], len: w[1] - w[0] }).collect();
            let mut rng = SplitMix64::new(seed);
            for i in (1..r.len()).rev() {
                r.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let p = Permutation::from_ranges(64, &r).unwrap();
            proptest::prop_assert_eq!(p.invert(p.apply(x)), x);
            proptest::prop_assert_eq!(p.apply(x).count_ones(), x.count_ones());
        }
    }
}
