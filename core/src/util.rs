//! Small helpers shared by the modules and by tests and benchmarks: Hamming distance and a
//! seeded random generator (so test data and benchmark workloads are reproducible without a
//! dependency).

/// Hamming distance between two 64-bit fingerprints.
#[inline(always)]
pub fn hamming(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// SplitMix64: a tiny, fast, seeded generator (Steele, Lea & Flood 2014). Not for
/// cryptography; for reproducible test data and workloads.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-32 for
    /// the sizes used here).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// `fp` with exactly `bits` distinct random bit positions flipped (`bits <= 64`).
    pub fn flip_bits(&mut self, fp: u64, bits: u32) -> u64 {
        let mut mask = 0u64;
        while mask.count_ones() < bits.min(64) {
            mask |= 1u64 << self.below(64);
        }
        fp ^ mask
    }
}

/// `n choose r` for the small numbers that table designs use (saturating).
pub fn binomial(n: u32, r: u32) -> u64 {
    if r > n {
        return 0;
    }
    let r = r.min(n - r) as u64;
    let mut acc: u64 = 1;
    for i in 0..r {
        acc = acc.saturating_mul(n as u64 - i) / (i + 1);
    }
    acc
}

/// Sorts `v` as `sort_unstable` would, distributing it first on the top 16 bits of `key`
/// (two counting passes of 8 bits, through `tmp`) and then sorting each small bucket.
///
/// Tables are sorted lists of permuted fingerprints, which spread evenly over the top bits:
/// after the two passes a bucket of a 10M-value table holds about 150 values and sorts in
/// cache. On clustered data a large bucket is just sorted as a whole. `T`'s order must
/// agree with `key`: `a < b` whenever `key(a) < key(b)`.
pub(crate) fn radix_sort<T: Copy + Ord>(v: &mut [T], tmp: &mut Vec<T>, key: impl Fn(&T) -> u64) {
    const SMALL: usize = 1 << 10;
    if v.len() <= SMALL {
        v.sort_unstable();
        return;
    }
    tmp.clear();
    tmp.resize(v.len(), v[0]);
    let top = scatter(v, tmp, |x| (key(x) >> 56) as usize);
    for b in 0..256 {
        let r = top[b]..top[b + 1];
        let (src, dst) = (&tmp[r.clone()], &mut v[r]);
        if src.len() <= SMALL {
            dst.copy_from_slice(src);
            dst.sort_unstable();
            continue;
        }
        let sub = scatter(src, dst, |x| (key(x) >> 48) as u8 as usize);
        for s in 0..256 {
            dst[sub[s]..sub[s + 1]].sort_unstable();
        }
    }
}

/// Copies `src` into `dst` grouped by `digit` (stable), returning where each group starts
/// (and `src.len()` at index 256).
fn scatter<T: Copy>(src: &[T], dst: &mut [T], digit: impl Fn(&T) -> usize) -> [usize; 257] {
    let mut starts = [0usize; 257];
    for x in src {
        starts[digit(x) + 1] += 1;
    }
    for i in 0..256 {
        starts[i + 1] += starts[i];
    }
    let mut next = starts;
    for x in src {
        let d = digit(x);
        dst[next[d]] = *x;
        next[d] += 1;
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomials() {
        assert_eq!(binomial(6, 3), 20);
        assert_eq!(binomial(5, 2), 10);
        assert_eq!(binomial(4, 1), 4);
        assert_eq!(binomial(3, 4), 0);
        assert_eq!(binomial(64, 0), 1);
    }

    #[test]
    fn flips_exact_count() {
        let mut r = SplitMix64::new(7);
        for bits in 0..=64 {
            let x = r.next_u64();
            assert_eq!(hamming(x, r.flip_bits(x, bits)), bits);
        }
    }

    #[test]
    fn below_in_range() {
        let mut r = SplitMix64::new(1);
        for n in 1..200u64 {
            assert!(r.below(n) < n);
        }
    }

    #[test]
    fn radix_sort_sorts_like_sort_unstable() {
        let mut r = SplitMix64::new(5);
        let mut tmp = Vec::new();
        // Uniform; one crowded top byte; crowded 16-bit prefix; small; with ties.
        let shapes: Vec<Vec<u64>> = vec![
            (0..50_000).map(|_| r.next_u64()).collect(),
            (0..50_000)
                .map(|i| if i % 2 == 0 { r.next_u64() >> 8 } else { r.next_u64() })
                .collect(),
            (0..50_000).map(|_| 0xABCD_0000_0000_0000 | (r.next_u64() >> 16)).collect(),
            (0..100).map(|_| r.next_u64()).collect(),
            (0..20_000).map(|_| r.below(300) << 50).collect(),
        ];
        for v in shapes {
            let mut want = v.clone();
            want.sort_unstable();
            let mut got = v.clone();
            radix_sort(&mut got, &mut tmp, |&x| x);
            assert_eq!(got, want);
            // Pairs keep ties in their second field's order.
            let mut pairs: Vec<(u64, u32)> =
                v.iter().enumerate().map(|(i, &x)| (x, i as u32)).collect();
            let mut want: Vec<(u64, u32)> = pairs.clone();
            want.sort_unstable();
            radix_sort(&mut pairs, &mut Vec::new(), |p| p.0);
            assert_eq!(pairs, want);
        }
    }
}
