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

/// One message as the single padded MD5 block it fits in (16 little-endian words).
pub(crate) type Block = [u32; 16];

/// The padded block of a message of `len` bytes (at most [`MAX_LEN`]) that starts
/// `window`; the bytes of `window` after the message are ignored. Computed word by word
/// (keep the message bytes, add the 0x80 pad byte, the bit length in word 14) with no byte
/// stores, which would stall the following word loads, and no branch.
#[inline]
pub(crate) fn block_from_window(window: &[u8; 64], len: usize) -> Block {
    let len = len.min(MAX_LEN) as i32;
    let mut out: Block = std::array::from_fn(|w| {
        let word = u32::from_le_bytes([
            window[4 * w],
            window[4 * w + 1],
            window[4 * w + 2],
            window[4 * w + 3],
        ]);
        // Message bytes in this word: k, clamped to 0..=4.
        let k = len - 4 * w as i32;
        let keep = k.clamp(0, 4) as u32;
        let mask = ((1u64 << (8 * keep)) - 1) as u32;
        let pad = if (0..4).contains(&k) { 0x80u32 << (8 * k as u32) } else { 0 };
        (word & mask) | pad
    });
    out[14] = len as u32 * 8;
    out
}

/// The padded block of `msg` (at most [`MAX_LEN`] bytes are used).
pub(crate) fn block_from_msg(msg: &[u8]) -> Block {
    let len = msg.len().min(MAX_LEN);
    let mut window = [0u8; 64];
    window[..len].copy_from_slice(&msg[..len]);
    block_from_window(&window, len)
}

/// The low 64 bits, read little-endian, of the MD5 digests of the messages whose blocks
/// are `blocks`.
pub(crate) fn md5_low64_blocks(blocks: &[Block; LANES]) -> [u64; LANES] {
    // SAFETY: this build targets CPUs with AVX2 (checked by the `cfg`).
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    let (a, b) = unsafe { avx2::compress(blocks) };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
    let (a, b) = compress_portable(&transpose(blocks));
    std::array::from_fn(|l| a[l] as u64 | ((b[l] as u64) << 32))
}

/// The low 64 bits, read little-endian, of the MD5 digests of `msgs` (each at most
/// [`MAX_LEN`] bytes; unused lanes may be empty slices).
#[cfg(test)]
pub(crate) fn md5_low64_lanes(msgs: &[&[u8]; LANES]) -> [u64; LANES] {
    md5_low64_blocks(&std::array::from_fn(|l| block_from_msg(msgs[l])))
}

/// `m[w][lane]` is word `w` of lane `lane`'s block.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "avx2"), allow(dead_code))]
fn transpose(blocks: &[Block; LANES]) -> [[u32; LANES]; 16] {
    std::array::from_fn(|w| std::array::from_fn(|lane| blocks[lane][w]))
}

const A0: u32 = 0x6745_2301;
const B0: u32 = 0xefcd_ab89;
const C0: u32 = 0x98ba_dcfe;
const D0: u32 = 0x1032_5476;

/// The 64 MD5 steps of RFC 1321 (round function, state words in their rotation, message
/// word, constant, shift), each handed to the caller's `$step` macro, so that the portable
/// and the AVX2 compression share one schedule.
macro_rules! md5_steps {
    ($step:ident, $a:ident, $b:ident, $c:ident, $d:ident) => {
        $step!(f1, $a, $b, $c, $d, 0, 0xd76aa478, 7);
        $step!(f1, $d, $a, $b, $c, 1, 0xe8c7b756, 12);
        $step!(f1, $c, $d, $a, $b, 2, 0x242070db, 17);
        $step!(f1, $b, $c, $d, $a, 3, 0xc1bdceee, 22);
        $step!(f1, $a, $b, $c, $d, 4, 0xf57c0faf, 7);
        $step!(f1, $d, $a, $b, $c, 5, 0x4787c62a, 12);
        $step!(f1, $c, $d, $a, $b, 6, 0xa8304613, 17);
        $step!(f1, $b, $c, $d, $a, 7, 0xfd469501, 22);
        $step!(f1, $a, $b, $c, $d, 8, 0x698098d8, 7);
        $step!(f1, $d, $a, $b, $c, 9, 0x8b44f7af, 12);
        $step!(f1, $c, $d, $a, $b, 10, 0xffff5bb1, 17);
        $step!(f1, $b, $c, $d, $a, 11, 0x895cd7be, 22);
        $step!(f1, $a, $b, $c, $d, 12, 0x6b901122, 7);
        $step!(f1, $d, $a, $b, $c, 13, 0xfd987193, 12);
        $step!(f1, $c, $d, $a, $b, 14, 0xa679438e, 17);
        $step!(f1, $b, $c, $d, $a, 15, 0x49b40821, 22);
        $step!(f2, $a, $b, $c, $d, 1, 0xf61e2562, 5);
        $step!(f2, $d, $a, $b, $c, 6, 0xc040b340, 9);
        $step!(f2, $c, $d, $a, $b, 11, 0x265e5a51, 14);
        $step!(f2, $b, $c, $d, $a, 0, 0xe9b6c7aa, 20);
        $step!(f2, $a, $b, $c, $d, 5, 0xd62f105d, 5);
        $step!(f2, $d, $a, $b, $c, 10, 0x02441453, 9);
        $step!(f2, $c, $d, $a, $b, 15, 0xd8a1e681, 14);
        $step!(f2, $b, $c, $d, $a, 4, 0xe7d3fbc8, 20);
        $step!(f2, $a, $b, $c, $d, 9, 0x21e1cde6, 5);
        $step!(f2, $d, $a, $b, $c, 14, 0xc33707d6, 9);
        $step!(f2, $c, $d, $a, $b, 3, 0xf4d50d87, 14);
        $step!(f2, $b, $c, $d, $a, 8, 0x455a14ed, 20);
        $step!(f2, $a, $b, $c, $d, 13, 0xa9e3e905, 5);
        $step!(f2, $d, $a, $b, $c, 2, 0xfcefa3f8, 9);
        $step!(f2, $c, $d, $a, $b, 7, 0x676f02d9, 14);
        $step!(f2, $b, $c, $d, $a, 12, 0x8d2a4c8a, 20);
        $step!(f3, $a, $b, $c, $d, 5, 0xfffa3942, 4);
        $step!(f3, $d, $a, $b, $c, 8, 0x8771f681, 11);
        $step!(f3, $c, $d, $a, $b, 11, 0x6d9d6122, 16);
        $step!(f3, $b, $c, $d, $a, 14, 0xfde5380c, 23);
        $step!(f3, $a, $b, $c, $d, 1, 0xa4beea44, 4);
        $step!(f3, $d, $a, $b, $c, 4, 0x4bdecfa9, 11);
        $step!(f3, $c, $d, $a, $b, 7, 0xf6bb4b60, 16);
        $step!(f3, $b, $c, $d, $a, 10, 0xbebfbc70, 23);
        $step!(f3, $a, $b, $c, $d, 13, 0x289b7ec6, 4);
        $step!(f3, $d, $a, $b, $c, 0, 0xeaa127fa, 11);
        $step!(f3, $c, $d, $a, $b, 3, 0xd4ef3085, 16);
        $step!(f3, $b, $c, $d, $a, 6, 0x04881d05, 23);
        $step!(f3, $a, $b, $c, $d, 9, 0xd9d4d039, 4);
        $step!(f3, $d, $a, $b, $c, 12, 0xe6db99e5, 11);
        $step!(f3, $c, $d, $a, $b, 15, 0x1fa27cf8, 16);
        $step!(f3, $b, $c, $d, $a, 2, 0xc4ac5665, 23);
        $step!(f4, $a, $b, $c, $d, 0, 0xf4292244, 6);
        $step!(f4, $d, $a, $b, $c, 7, 0x432aff97, 10);
        $step!(f4, $c, $d, $a, $b, 14, 0xab9423a7, 15);
        $step!(f4, $b, $c, $d, $a, 5, 0xfc93a039, 21);
        $step!(f4, $a, $b, $c, $d, 12, 0x655b59c3, 6);
        $step!(f4, $d, $a, $b, $c, 3, 0x8f0ccc92, 10);
        $step!(f4, $c, $d, $a, $b, 10, 0xffeff47d, 15);
        $step!(f4, $b, $c, $d, $a, 1, 0x85845dd1, 21);
        $step!(f4, $a, $b, $c, $d, 8, 0x6fa87e4f, 6);
        $step!(f4, $d, $a, $b, $c, 15, 0xfe2ce6e0, 10);
        $step!(f4, $c, $d, $a, $b, 6, 0xa3014314, 15);
        $step!(f4, $b, $c, $d, $a, 13, 0x4e0811a1, 21);
        $step!(f4, $a, $b, $c, $d, 4, 0xf7537e82, 6);
        $step!(f4, $d, $a, $b, $c, 11, 0xbd3af235, 10);
        $step!(f4, $c, $d, $a, $b, 2, 0x2ad7d2bb, 15);
        $step!(f4, $b, $c, $d, $a, 9, 0xeb86d391, 21);
    };
}

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
    md5_steps!(step, a, b, c, d);
    (std::array::from_fn(|l| a[l].wrapping_add(A0)), std::array::from_fn(|l| b[l].wrapping_add(B0)))
}

/// The same steps with one AVX2 register per state word (all eight lanes at once).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod avx2 {
    use super::{A0, B0, Block, C0, D0, LANES, V};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(v: &[u32]) -> __m256i {
        assert!(v.len() >= 8);
        // SAFETY: `v` has at least 8 u32 (32 bytes); unaligned loads need no alignment.
        unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
    }

    /// Rows r[i] = (x[i][0], ..., x[i][7]) to columns out[j] = (x[0][j], ..., x[7][j]).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
        let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
        let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
        let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
        let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
        let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        let u0 = _mm256_unpacklo_epi64(t0, t2);
        let u1 = _mm256_unpackhi_epi64(t0, t2);
        let u2 = _mm256_unpacklo_epi64(t1, t3);
        let u3 = _mm256_unpackhi_epi64(t1, t3);
        let u4 = _mm256_unpacklo_epi64(t4, t6);
        let u5 = _mm256_unpackhi_epi64(t4, t6);
        let u6 = _mm256_unpacklo_epi64(t5, t7);
        let u7 = _mm256_unpackhi_epi64(t5, t7);
        [
            _mm256_permute2x128_si256::<0x20>(u0, u4),
            _mm256_permute2x128_si256::<0x20>(u1, u5),
            _mm256_permute2x128_si256::<0x20>(u2, u6),
            _mm256_permute2x128_si256::<0x20>(u3, u7),
            _mm256_permute2x128_si256::<0x31>(u0, u4),
            _mm256_permute2x128_si256::<0x31>(u1, u5),
            _mm256_permute2x128_si256::<0x31>(u2, u6),
            _mm256_permute2x128_si256::<0x31>(u3, u7),
        ]
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
    pub(super) fn compress(blocks: &[Block; LANES]) -> (V, V) {
        const H: usize = LANES / 2;
        // Word g of lanes 0..8 (w0) and of lanes 8..16 (w1): load each block's two halves as
        // rows and transpose 8x8 in registers.
        let rows = |first: usize, half: usize| -> [__m256i; 8] {
            std::array::from_fn(|i| load(&blocks[first + i][half * 8..half * 8 + 8]))
        };
        let mut w0 = [_mm256_setzero_si256(); 16];
        let mut w1 = [_mm256_setzero_si256(); 16];
        w0[..8].copy_from_slice(&transpose8(rows(0, 0)));
        w0[8..].copy_from_slice(&transpose8(rows(0, 1)));
        w1[..8].copy_from_slice(&transpose8(rows(H, 0)));
        w1[8..].copy_from_slice(&transpose8(rows(H, 1)));
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
        md5_steps!(step, a, b, c, d);
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
            let bytes: Vec<u8> =
                (0..8).map(|j| u8::from_str_radix(&hex[2 * j..2 * j + 2], 16).unwrap()).collect();
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
            let blocks: [Block; LANES] =
                std::array::from_fn(|_| std::array::from_fn(|_| rng.next_u64() as u32));
            // SAFETY: compiled only for CPUs with AVX2.
            #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
            assert_eq!(unsafe { avx2::compress(&blocks) }, compress_portable(&transpose(&blocks)));
            let (a, b) = compress_portable(&transpose(&[block_from_msg(b"x"); LANES]));
            assert_eq!(a[0] as u64 | (b[0] as u64) << 32, md5_low64(b"x"));
        }
    }

    #[test]
    fn window_blocks_ignore_bytes_after_the_message() {
        let mut rng = SplitMix64::new(9);
        for len in 0..=MAX_LEN {
            let window: [u8; 64] = std::array::from_fn(|_| rng.next_u64() as u8);
            assert_eq!(block_from_window(&window, len), block_from_msg(&window[..len]));
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
