//! MD5 of up to eight short messages at once (RFC 1321), for the feature hash.
//!
//! Almost every feature (a word 3-gram, a character bigram) is shorter than 56 bytes, so its
//! MD5 is a single 64-byte block. Hashing eight such blocks side by side lets the compiler
//! keep one 32-bit word of all eight states in one AVX2 register, which is several times
//! faster than eight scalar MD5 calls. Longer features go to the `md-5` crate; tests check
//! both against each other.

/// Messages per batch.
pub(crate) const LANES: usize = 8;
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
pub(crate) fn md5_low64_x8(msgs: &[&[u8]; LANES]) -> [u64; LANES] {
    // m[w][lane]: word w of each lane's single padded block.
    let mut m = [[0u32; LANES]; 16];
    for (lane, msg) in msgs.iter().enumerate() {
        let len = msg.len().min(MAX_LEN);
        let mut block = [0u8; 64];
        block[..len].copy_from_slice(&msg[..len]);
        block[len] = 0x80;
        block[56..].copy_from_slice(&((len as u64) * 8).to_le_bytes());
        for (w, word) in m.iter_mut().enumerate() {
            word[lane] = u32::from_le_bytes([
                block[4 * w],
                block[4 * w + 1],
                block[4 * w + 2],
                block[4 * w + 3],
            ]);
        }
    }
    let (a0, b0, c0, d0) = (
        0x6745_2301u32,
        0xefcd_ab89u32,
        0x98ba_dcfeu32,
        0x1032_5476u32,
    );
    let mut a: V = [a0; LANES];
    let mut b: V = [b0; LANES];
    let mut c: V = [c0; LANES];
    let mut d: V = [d0; LANES];
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
    {
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
    }
    let mut out = [0u64; LANES];
    for l in 0..LANES {
        let lo = a[l].wrapping_add(a0) as u64;
        let hi = b[l].wrapping_add(b0) as u64;
        out[l] = lo | (hi << 32);
    }
    out
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
        for (i, (m, _)) in cases.iter().enumerate() {
            msgs[i] = m;
        }
        let got = md5_low64_x8(&msgs);
        for (i, (m, hex)) in cases.iter().enumerate() {
            let bytes: Vec<u8> = (0..8)
                .map(|j| u8::from_str_radix(&hex[2 * j..2 * j + 2], 16).unwrap())
                .collect();
            let want = u64::from_le_bytes(bytes.try_into().unwrap());
            assert_eq!(got[i], want, "lane {i}");
            assert_eq!(md5_low64(m), want);
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
            let got = md5_low64_x8(&msgs);
            for l in 0..LANES {
                assert_eq!(got[l], md5_low64(&bufs[l]), "len {}", bufs[l].len());
            }
        }
    }
}
