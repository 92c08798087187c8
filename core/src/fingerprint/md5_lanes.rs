//! MD5 of up to sixteen short messages at once (RFC 1321), for the feature hash.
//!
//! Almost every feature (a word 3-gram, a character bigram) is shorter than 56 bytes, so its
//! MD5 is a single 64-byte block. With AVX2 one register holds one 32-bit state word of
//! eight messages, and two such sets are stepped in alternation so that the CPU overlaps
//! their dependency chains (each MD5 step waits for the previous one): about 4 times the
//! throughput of the scalar `md-5` crate on short features. Longer features go to the
//! `md-5` crate; tests check the paths against each other and against RFC 1321.

/// Messages per batch.
pub(crate) const LANES: usize = 16;
/// The longest message that fits in one MD5 block (64 bytes less the 0x80 pad byte and the
/// 8-byte length).
pub(crate) const MAX_LEN: usize = 55;

type V = [u32; LANES];

#[inline(always)]
fn f1(b: u32, c: u32, d: u32) -> u32 {
    (b & c) | (!b & d)
}
#[inline(always)]
fn f2(b: u32, c: u32, d: u32) -> u32 {
    (d & b) | (!d & c)
}
#[inline(always)]
fn f3(b: u32, c: u32, d: u32) -> u32 {
    b ^ c ^ d
}
#[inline(always)]
fn f4(b: u32, c: u32, d: u32) -> u32 {
    c ^ (b | !d)
}

/// The low 64 bits, read little-endian, of the MD5 digests of `msgs` (each at most
/// [`MAX_LEN`] bytes; unused lanes may be empty slices).
pub(crate) fn md5_low64_lanes(msgs: &[&[u8]; LANES]) -> [u64; LANES] {
    let m = load_blocks(msgs);
    // SAFETY: this build targets CPUs with AVX2 (checked by the `cfg`).
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    let (a, b) = unsafe { avx2::compress(&m) };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    let (a, b) = compress_portable(&m);
    std::array::from_fn(|l| a[l] as u64 | ((b[l] as u64) << 32))
}

/// Pads each message into one 64-byte block and transposes: `m[w][lane]` is word `w` of
/// lane `lane`'s block.
fn load_blocks(msgs: &[&[u8]; LANES]) -> [[u32; LANES]; 16] {
    let mut m = [[0u32; LANES]; 16];
    for (lane, msg) in msgs.iter().enumerate() {
        let msg = &msg[..msg.len().min(MAX_LEN)];
        // Whole 4-byte words, then the last partial word with the 0x80 pad byte, then the
        // bit length in words 14 and 15 (at most 440 bits, so word 15 stays 0).
        let mut chunks = msg.chunks_exact(4);
        let mut w = 0;
        for c in chunks.by_ref() {
            m[w][lane] = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            w += 1;
        }
        let mut last = 0x80u32;
        for &b in chunks.remainder().iter().rev() {
            last = (last << 8) | b as u32;
        }
        m[w][lane] = last;
        m[14][lane] = (msg.len() as u32) * 8;
    }
    m
}

const A0: u32 = 0x6745_2301;
const B0: u32 = 0xefcd_ab89;
const C0: u32 = 0x98ba_dcfe;
const D0: u32 = 0x1032_5476;

/// The 64 MD5 steps on eight lanes held in arrays; returns the first two state words (the
/// low 64 bits of the digest) of each lane.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
fn compress_portable(m: &[[u32; LANES]; 16]) -> (V, V) {
    let mut a: V = [A0; LANES];
    let mut b: V = [B0; LANES];
    let mut c: V = [C0; LANES];
    let mut d: V = [D0; LANES];
    macro_rules! step {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $g:expr, $k:expr, $s:expr) => {
            for l in 0..LANES {
                let t = $a[l]
                    .wrapping_add($f($b[l], $c[l], $d[l]))
                    .wrapping_add(m[$g][l])
                    .wrapping_add($k);
                $a[l] = $b[l].wrapping_add(t.rotate_left($s));
            }
        };
    }
    step!(f1, a, b, c, d, 0, 0xd76aa478, 7);
    step!(f1, d, a, b, c, 1, 0xe8c7b756, 12);
    step!(f1, c, d, a, b, 2, 0x242070db, 17);
    step!(f1, b, c, d, a, 3, 0xc1bdceee, 22);
    step!(f1, a, b, c, d, 4, 0xf57c0faf, 7);
    step!(f1, d, a, b, c, 5, 0x4787c62a, 12);
    step!(f1, c, d, a, b, 6, 0xa8304613, 17);
    step!(f1, b, c, d, a, 7, 0xfd469501, 22);
    step!(f1, a, b, c, d, 8, 0x698098d8, 7);
    step!(f1, d, a, b, c, 9, 0x8b44f7af, 12);
    step!(f1, c, d, a, b, 10, 0xffff5bb1, 17);
    step!(f1, b, c, d, a, 11, 0x895cd7be, 22);
    step!(f1, a, b, c, d, 12, 0x6b901122, 7);
    step!(f1, d, a, b, c, 13, 0xfd987193, 12);
    step!(f1, c, d, a, b, 14, 0xa679438e, 17);
    step!(f1, b, c, d, a, 15, 0x49b40821, 22);
    step!(f2, a, b, c, d, 1, 0xf61e2562, 5);
    step!(f2, d, a, b, c, 6, 0xc040b340, 9);
    step!(f2, c, d, a, b, 11, 0x265e5a51, 14);
    step!(f2, b, c, d, a, 0, 0xe9b6c7aa, 20);
    step!(f2, a, b, c, d, 5, 0xd62f105d, 5);
    step!(f2, d, a, b, c, 10, 0x02441453, 9);
    step!(f2, c, d, a, b, 15, 0xd8a1e681, 14);
    step!(f2, b, c, d, a, 4, 0xe7d3fbc8, 20);
    step!(f2, a, b, c, d, 9, 0x21e1cde6, 5);
    step!(f2, d, a, b, c, 14, 0xc33707d6, 9);
    step!(f2, c, d, a, b, 3, 0xf4d50d87, 14);
    step!(f2, b, c, d, a, 8, 0x455a14ed, 20);
    step!(f2, a, b, c, d, 13, 0xa9e3e905, 5);
    step!(f2, d, a, b, c, 2, 0xfcefa3f8, 9);
    step!(f2, c, d, a, b, 7, 0x676f02d9, 14);
    step!(f2, b, c, d, a, 12, 0x8d2a4c8a, 20);
    step!(f3, a, b, c, d, 5, 0xfffa3942, 4);
    step!(f3, d, a, b, c, 8, 0x8771f681, 11);
    step!(f3, c, d, a, b, 11, 0x6d9d6122, 16);
    step!(f3, b, c, d, a, 14, 0xfde5380c, 23);
    step!(f3, a, b, c, d, 1, 0xa4beea44, 4);
    step!(f3, d, a, b, c, 4, 0x4bdecfa9, 11);
    step!(f3, c, d, a, b, 7, 0xf6bb4b60, 16);
    step!(f3, b, c, d, a, 10, 0xbebfbc70, 23);
    step!(f3, a, b, c, d, 13, 0x289b7ec6, 4);
    step!(f3, d, a, b, c, 0, 0xeaa127fa, 11);
    step!(f3, c, d, a, b, 3, 0xd4ef3085, 16);
    step!(f3, b, c, d, a, 6, 0x04881d05, 23);
    step!(f3, a, b, c, d, 9, 0xd9d4d039, 4);
    step!(f3, d, a, b, c, 12, 0xe6db99e5, 11);
    step!(f3, c, d, a, b, 15, 0x1fa27cf8, 16);
    step!(f3, b, c, d, a, 2, 0xc4ac5665, 23);
    step!(f4, a, b, c, d, 0, 0xf4292244, 6);
    step!(f4, d, a, b, c, 7, 0x432aff97, 10);
    step!(f4, c, d, a, b, 14, 0xab9423a7, 15);
    step!(f4, b, c, d, a, 5, 0xfc93a039, 21);
    step!(f4, a, b, c, d, 12, 0x655b59c3, 6);
    step!(f4, d, a, b, c, 3, 0x8f0ccc92, 10);
    step!(f4, c, d, a, b, 10, 0xffeff47d, 15);
    step!(f4, b, c, d, a, 1, 0x85845dd1, 21);
    step!(f4, a, b, c, d, 8, 0x6fa87e4f, 6);
    step!(f4, d, a, b, c, 15, 0xfe2ce6e0, 10);
    step!(f4, c, d, a, b, 6, 0xa3014314, 15);
    step!(f4, b, c, d, a, 13, 0x4e0811a1, 21);
    step!(f4, a, b, c, d, 4, 0xf7537e82, 6);
    step!(f4, d, a, b, c, 11, 0xbd3af235, 10);
    step!(f4, c, d, a, b, 2, 0x2ad7d2bb, 15);
    step!(f4, b, c, d, a, 9, 0xeb86d391, 21);
    (
        std::array::from_fn(|l| a[l].wrapping_add(A0)),
        std::array::from_fn(|l| b[l].wrapping_add(B0)),
    )
}

/// The same steps with one AVX2 register per state word (all eight lanes at once).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod avx2 {
    use super::{A0, B0, C0, D0, LANES, V};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(v: &[u32; LANES / 2]) -> __m256i {
        // SAFETY: `v` is 32 readable bytes; the unaligned load has no alignment requirement.
        unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn store(x: __m256i) -> [u32; LANES / 2] {
        let mut out = [0u32; LANES / 2];
        // SAFETY: `out` is 32 writable bytes; the unaligned store has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), x) };
        out
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn f1(b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_and_si256(b, c), _mm256_andnot_si256(b, d))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    fn f2(b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_and_si256(d, b), _mm256_andnot_si256(d, c))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    fn f3(b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        _mm256_xor_si256(_mm256_xor_si256(b, c), d)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    fn f4(b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        let not_d = _mm256_xor_si256(d, _mm256_set1_epi32(-1));
        _mm256_xor_si256(c, _mm256_or_si256(b, not_d))
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn compress(m: &[[u32; LANES]; 16]) -> (V, V) {
        const H: usize = LANES / 2;
        let half =
            |w: &[u32; LANES], i: usize| -> [u32; H] { std::array::from_fn(|l| w[i * H + l]) };
        let w0: [__m256i; 16] = std::array::from_fn(|i| load(&half(&m[i], 0)));
        let w1: [__m256i; 16] = std::array::from_fn(|i| load(&half(&m[i], 1)));
        let init = |x: u32| (_mm256_set1_epi32(x as i32), _mm256_set1_epi32(x as i32));
        let (mut a, mut b, mut c, mut d) = (init(A0), init(B0), init(C0), init(D0));
        macro_rules! step {
            ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $g:expr, $k:expr, $s:expr) => {
                let k = _mm256_set1_epi32($k as u32 as i32);
                let t0 = _mm256_add_epi32(
                    _mm256_add_epi32($a.0, $f($b.0, $c.0, $d.0)),
                    _mm256_add_epi32(w0[$g], k),
                );
                let t1 = _mm256_add_epi32(
                    _mm256_add_epi32($a.1, $f($b.1, $c.1, $d.1)),
                    _mm256_add_epi32(w1[$g], k),
                );
                let r0 = _mm256_or_si256(
                    _mm256_slli_epi32::<$s>(t0),
                    _mm256_srli_epi32::<{ 32 - $s }>(t0),
                );
                let r1 = _mm256_or_si256(
                    _mm256_slli_epi32::<$s>(t1),
                    _mm256_srli_epi32::<{ 32 - $s }>(t1),
                );
                $a.0 = _mm256_add_epi32($b.0, r0);
                $a.1 = _mm256_add_epi32($b.1, r1);
            };
        }
        step!(f1, a, b, c, d, 0, 0xd76aa478, 7);
        step!(f1, d, a, b, c, 1, 0xe8c7b756, 12);
        step!(f1, c, d, a, b, 2, 0x242070db, 17);
        step!(f1, b, c, d, a, 3, 0xc1bdceee, 22);
        step!(f1, a, b, c, d, 4, 0xf57c0faf, 7);
        step!(f1, d, a, b, c, 5, 0x4787c62a, 12);
        step!(f1, c, d, a, b, 6, 0xa8304613, 17);
        step!(f1, b, c, d, a, 7, 0xfd469501, 22);
        step!(f1, a, b, c, d, 8, 0x698098d8, 7);
        step!(f1, d, a, b, c, 9, 0x8b44f7af, 12);
        step!(f1, c, d, a, b, 10, 0xffff5bb1, 17);
        step!(f1, b, c, d, a, 11, 0x895cd7be, 22);
        step!(f1, a, b, c, d, 12, 0x6b901122, 7);
        step!(f1, d, a, b, c, 13, 0xfd987193, 12);
        step!(f1, c, d, a, b, 14, 0xa679438e, 17);
        step!(f1, b, c, d, a, 15, 0x49b40821, 22);
        step!(f2, a, b, c, d, 1, 0xf61e2562, 5);
        step!(f2, d, a, b, c, 6, 0xc040b340, 9);
        step!(f2, c, d, a, b, 11, 0x265e5a51, 14);
        step!(f2, b, c, d, a, 0, 0xe9b6c7aa, 20);
        step!(f2, a, b, c, d, 5, 0xd62f105d, 5);
        step!(f2, d, a, b, c, 10, 0x02441453, 9);
        step!(f2, c, d, a, b, 15, 0xd8a1e681, 14);
        step!(f2, b, c, d, a, 4, 0xe7d3fbc8, 20);
        step!(f2, a, b, c, d, 9, 0x21e1cde6, 5);
        step!(f2, d, a, b, c, 14, 0xc33707d6, 9);
        step!(f2, c, d, a, b, 3, 0xf4d50d87, 14);
        step!(f2, b, c, d, a, 8, 0x455a14ed, 20);
        step!(f2, a, b, c, d, 13, 0xa9e3e905, 5);
        step!(f2, d, a, b, c, 2, 0xfcefa3f8, 9);
        step!(f2, c, d, a, b, 7, 0x676f02d9, 14);
        step!(f2, b, c, d, a, 12, 0x8d2a4c8a, 20);
        step!(f3, a, b, c, d, 5, 0xfffa3942, 4);
        step!(f3, d, a, b, c, 8, 0x8771f681, 11);
        step!(f3, c, d, a, b, 11, 0x6d9d6122, 16);
        step!(f3, b, c, d, a, 14, 0xfde5380c, 23);
        step!(f3, a, b, c, d, 1, 0xa4beea44, 4);
        step!(f3, d, a, b, c, 4, 0x4bdecfa9, 11);
        step!(f3, c, d, a, b, 7, 0xf6bb4b60, 16);
        step!(f3, b, c, d, a, 10, 0xbebfbc70, 23);
        step!(f3, a, b, c, d, 13, 0x289b7ec6, 4);
        step!(f3, d, a, b, c, 0, 0xeaa127fa, 11);
        step!(f3, c, d, a, b, 3, 0xd4ef3085, 16);
        step!(f3, b, c, d, a, 6, 0x04881d05, 23);
        step!(f3, a, b, c, d, 9, 0xd9d4d039, 4);
        step!(f3, d, a, b, c, 12, 0xe6db99e5, 11);
        step!(f3, c, d, a, b, 15, 0x1fa27cf8, 16);
        step!(f3, b, c, d, a, 2, 0xc4ac5665, 23);
        step!(f4, a, b, c, d, 0, 0xf4292244, 6);
        step!(f4, d, a, b, c, 7, 0x432aff97, 10);
        step!(f4, c, d, a, b, 14, 0xab9423a7, 15);
        step!(f4, b, c, d, a, 5, 0xfc93a039, 21);
        step!(f4, a, b, c, d, 12, 0x655b59c3, 6);
        step!(f4, d, a, b, c, 3, 0x8f0ccc92, 10);
        step!(f4, c, d, a, b, 10, 0xffeff47d, 15);
        step!(f4, b, c, d, a, 1, 0x85845dd1, 21);
        step!(f4, a, b, c, d, 8, 0x6fa87e4f, 6);
        step!(f4, d, a, b, c, 15, 0xfe2ce6e0, 10);
        step!(f4, c, d, a, b, 6, 0xa3014314, 15);
        step!(f4, b, c, d, a, 13, 0x4e0811a1, 21);
        step!(f4, a, b, c, d, 4, 0xf7537e82, 6);
        step!(f4, d, a, b, c, 11, 0xbd3af235, 10);
        step!(f4, c, d, a, b, 2, 0x2ad7d2bb, 15);
        step!(f4, b, c, d, a, 9, 0xeb86d391, 21);
        let _ = (c, d);
        let fin = |x: (__m256i, __m256i), init: u32| -> V {
            let (lo, hi) = (
                store(_mm256_add_epi32(x.0, _mm256_set1_epi32(init as i32))),
                store(_mm256_add_epi32(x.1, _mm256_set1_epi32(init as i32))),
            );
            std::array::from_fn(|l| if l < H { lo[l] } else { hi[l - H] })
        };
        (fin(a, A0), fin(b, B0))
    }
}

/// The low 64 bits, read little-endian, of the MD5 digest of `msg` of any length (the
/// `md-5` crate).
pub(crate) fn md5_low64(msg: &[u8]) -> u64 {
    use md5::Digest;
    let digest = md5::Md5::digest(msg);
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(low)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    #[test]
    fn rfc1321_examples() {
        // RFC 1321 appendix A.5 test suite, first 8 bytes of each digest.
        let cases: [(&[u8], &str); 5] = [
            (b"", "d41d8cd98f00b204"),
            (b"a", "0cc175b9c0f1b6a8"),
            (b"abc", "900150983cd24fb0"),
            (b"message digest", "f96b697d7cb7938d"),
            (b"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e400"),
        ];
        let mut msgs: [&[u8]; LANES] = [b""; LANES];
        // Each case in a lane of both halves.
        for (i, (m, _)) in cases.iter().enumerate() {
            msgs[i] = m;
            msgs[i + 9] = m;
        }
        let got = md5_low64_lanes(&msgs);
        for (i, (m, hex)) in cases.iter().enumerate() {
            let bytes: Vec<u8> = (0..8)
                .map(|j| u8::from_str_radix(&hex[2 * j..2 * j + 2], 16).unwrap())
                .collect();
            let want = u64::from_le_bytes(bytes.try_into().unwrap());
            assert_eq!(got[i], want, "lane {i}");
            assert_eq!(got[i + 9], want, "lane {}", i + 9);
            assert_eq!(md5_low64(m), want);
        }
    }

    #[test]
    fn portable_and_vector_paths_agree() {
        let mut rng = SplitMix64::new(8);
        for _ in 0..100 {
            let m: [[u32; LANES]; 16] =
                std::array::from_fn(|_| std::array::from_fn(|_| rng.next_u64() as u32));
            #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
            // SAFETY: compiled only for CPUs with AVX2.
            assert_eq!(unsafe { avx2::compress(&m) }, compress_portable(&m));
            let msgs: [&[u8]; LANES] = [b"x"; LANES];
            let (a, b) = compress_portable(&load_blocks(&msgs));
            assert_eq!(a[0] as u64 | (b[0] as u64) << 32, md5_low64(b"x"));
        }
    }

    #[test]
    fn lanes_match_md5_crate_for_all_short_lengths() {
        let mut rng = SplitMix64::new(5);
        for round in 0..200 {
            let bufs: Vec<Vec<u8>> = (0..LANES)
                .map(|l| {
                    let len = (round * LANES + l) % (MAX_LEN + 1);
                    (0..len).map(|_| rng.next_u64() as u8).collect()
                })
                .collect();
            let msgs: [&[u8]; LANES] = std::array::from_fn(|l| bufs[l].as_slice());
            let got = md5_low64_lanes(&msgs);
            for l in 0..LANES {
                assert_eq!(got[l], md5_low64(&bufs[l]), "len {}", bufs[l].len());
            }
        }
    }
}
