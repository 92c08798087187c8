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
}
