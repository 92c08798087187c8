//! Per-bit counting for the sign rule (section 7 of `docs/fingerprint.md`).
//!
//! With term-frequency weights almost every distinct feature has weight 1, so the bit sums
//! are counts. [`BitCounter`] keeps them bit-sliced in 64 byte-wide counters, which AVX2
//! updates in a handful of instructions per feature (broadcast the hash, spread each bit to
//! a byte, compare, subtract), and folds them into 64 wide counters every 255 features,
//! before a byte could overflow. Heavier features go straight to the wide counters.

/// Counts, for each of the 64 bit positions, the total weight of the hashes with that bit
/// set.
pub(crate) struct BitCounter {
    wide: [u64; 64],
    narrow: Narrow,
    pending: u32,
}

impl BitCounter {
    pub fn new() -> Self {
        BitCounter { wide: [0; 64], narrow: Narrow::new(), pending: 0 }
    }

    /// Adds one feature of weight 1.
    #[inline]
    pub fn add_one(&mut self, h: u64) {
        self.narrow.add(h);
        self.pending += 1;
        if self.pending == 255 {
            self.flush();
        }
    }

    /// Adds one feature of weight `w`.
    #[inline]
    pub fn add(&mut self, h: u64, w: u64) {
        for (i, p) in self.wide.iter_mut().enumerate() {
            *p += ((h >> i) & 1) * w;
        }
    }

    fn flush(&mut self) {
        let bytes = self.narrow.take();
        for (p, &b) in self.wide.iter_mut().zip(bytes.iter()) {
            *p += b as u64;
        }
        self.pending = 0;
    }

    /// The 64 per-bit weight sums.
    pub fn finish(mut self) -> [u64; 64] {
        self.flush();
        self.wide
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
use avx2::Narrow;
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
use portable::Narrow;

/// 64 byte counters in plain arrays.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
mod portable {
    pub(crate) struct Narrow([u8; 64]);

    impl Narrow {
        pub fn new() -> Self {
            Narrow([0; 64])
        }

        #[inline]
        pub fn add(&mut self, h: u64) {
            for (i, c) in self.0.iter_mut().enumerate() {
                *c += ((h >> i) & 1) as u8;
            }
        }

        pub fn take(&mut self) -> [u8; 64] {
            std::mem::replace(&mut self.0, [0; 64])
        }
    }
}

/// 64 byte counters in two AVX2 registers: byte i counts bit i.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod avx2 {
    use std::arch::x86_64::*;

    pub(crate) struct Narrow {
        lo: __m256i,
        hi: __m256i,
    }

    impl Narrow {
        pub fn new() -> Self {
            // SAFETY: this module is compiled only for CPUs with AVX2.
            unsafe { zero() }
        }

        #[inline]
        pub fn add(&mut self, h: u64) {
            // SAFETY: this module is compiled only for CPUs with AVX2.
            unsafe { add(self, h) }
        }

        pub fn take(&mut self) -> [u8; 64] {
            // SAFETY: this module is compiled only for CPUs with AVX2.
            unsafe { take(self) }
        }
    }

    #[target_feature(enable = "avx2")]
    fn zero() -> Narrow {
        Narrow { lo: _mm256_setzero_si256(), hi: _mm256_setzero_si256() }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn add(n: &mut Narrow, h: u64) {
        let x = _mm256_set1_epi64x(h as i64);
        // Byte lane L of `lo` takes byte L/8 of h (bits 0..31), of `hi` byte 4 + L/8.
        let spread_lo = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let spread_hi = _mm256_setr_epi8(
            4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, //
            6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7,
        );
        let select = _mm256_setr_epi8(
            1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, //
            1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128,
        );
        // 0xFF where the bit is set; subtracting -1 adds 1.
        let lo =
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(x, spread_lo), select), select);
        let hi =
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(x, spread_hi), select), select);
        n.lo = _mm256_sub_epi8(n.lo, lo);
        n.hi = _mm256_sub_epi8(n.hi, hi);
    }

    #[target_feature(enable = "avx2")]
    fn take(n: &mut Narrow) -> [u8; 64] {
        let mut out = [0u8; 64];
        // SAFETY: `out` is 64 writable bytes; unaligned stores have no alignment requirement.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().cast(), n.lo);
            _mm256_storeu_si256(out.as_mut_ptr().add(32).cast(), n.hi);
        }
        *n = zero();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    #[test]
    fn counts_match_a_plain_loop() {
        let mut rng = SplitMix64::new(12);
        for n in [0usize, 1, 254, 255, 256, 1000] {
            let mut c = BitCounter::new();
            let mut want = [0u64; 64];
            for k in 0..n {
                let h = rng.next_u64();
                let w = if k % 7 == 3 { 1 + rng.below(5) } else { 1 };
                if w == 1 {
                    c.add_one(h);
                } else {
                    c.add(h, w);
                }
                for (i, x) in want.iter_mut().enumerate() {
                    *x += ((h >> i) & 1) * w;
                }
            }
            assert_eq!(c.finish(), want, "n = {n}");
        }
    }

    #[test]
    fn portable_counters_match() {
        let mut rng = SplitMix64::new(13);
        let mut a = portable::Narrow::new();
        let mut b = Narrow::new();
        for _ in 0..200 {
            let h = rng.next_u64();
            a.add(h);
            b.add(h);
        }
        assert_eq!(a.take(), b.take());
    }
}
