//! Encoding sorted values into Huffman-XOR blocks ([`HxTable::encode`]).
//!
//! A block keeps all its codes first and all its low bits after, and where the low bits start
//! is known only once the block is full: both streams are written into buffers of their own
//! as the values come ([`BitWriter`]) and copied into the block at the end ([`append_bits`]).

use crate::codec::aligned::AlignedBytes;
use crate::codec::huffman::{Huffman, SYMBOLS};
use crate::codec::hx_block::{Code, GapCode, XorCode, load_be64, symbol};
use crate::codec::hx_format::{BLOCK_HEAD, BLOCK_TAIL, MAX_BLOCK_ENTRIES, SLACK};
use crate::codec::hx_table::HxTable;
use crate::codec::options::{Codec, MAX_BLOCK, TableOptions};
use crate::error::{Error, Result};

/// Bytes of a buffer for one of a block's two streams: the largest block, and a word.
const STREAM: usize = MAX_BLOCK + 8;

/// Writes one of a block's streams, bits most-significant first, into a buffer.
///
/// Pending bits wait left-aligned in a register. Every write stores the whole register and
/// moves on by the bytes it completed, with no branch on how full it is (a branch that the
/// lengths of the low bits make unpredictable); no byte is read back. So every bit is in
/// the buffer as soon as it is written, and there is nothing to flush at the end.
struct BitWriter<'a> {
    out: &'a mut [u8; STREAM],
    /// Byte offset of the first pending bit.
    byte: usize,
    /// Pending bits, left-aligned.
    acc: u64,
    /// Number of pending bits (below 8 between calls).
    pending: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut [u8; STREAM]) -> Self {
        BitWriter { out, byte: 0, acc: 0, pending: 0 }
    }

    /// Appends the low `n` bits of `v` (`n <= 64`, `v < 2^n`).
    #[inline(always)]
    fn put(&mut self, v: u64, n: u32) {
        if n > 56 {
            self.put_short(v >> 32, n - 32);
            self.put_short(v & 0xFFFF_FFFF, 32);
        } else {
            self.put_short(v, n);
        }
    }

    /// Bits written so far.
    fn bits(&self) -> usize {
        self.byte * 8 + self.pending as usize
    }

    /// [`put`](Self::put) for `n <= 56`, which fits beside the at most 7 pending bits.
    #[inline(always)]
    fn put_short(&mut self, v: u64, n: u32) {
        // A shift of 64 happens only for n = 0, when v is 0 and wraps to a shift of 0.
        self.acc |= v.wrapping_shl(64 - self.pending - n);
        self.pending += n;
        // A stream never outgrows a block: the offset, taken modulo the largest block,
        // is unchanged and visibly leaves room for the store.
        debug_assert!(self.byte < MAX_BLOCK);
        let at = self.byte % MAX_BLOCK;
        let word = self.out[at..].first_chunk_mut::<8>().expect("8 bytes of room");
        *word = self.acc.to_be_bytes();
        let done = self.pending / 8;
        self.byte += done as usize;
        self.acc <<= done * 8;
        self.pending %= 8;
    }
}

/// Copies the first `len` bits of `src` to `out` from bit `at` on, a word at a time. The
/// bits of `out` before `at` in its byte are written as zeros, and so are those after the
/// last one copied up to the end of the last word written (8 bytes of room are needed
/// past it). `src` must have room for whole words over its `len` bits.
fn append_bits(out: &mut [u8], at: usize, src: &[u8], len: usize) {
    let (first, r) = (at / 8, (at % 8) as u32);
    let words = len.div_ceil(64);
    if words == 0 {
        out[first..first + 8].copy_from_slice(&[0; 8]);
        return;
    }
    // One bounds check each for the words read and written, none in the loop.
    let (src, out) = (&src[..8 * words], &mut out[first..first + 8 * words + 8]);
    let mut carry = 0u64; // bits of the last word read that went past the last word written
    let mut put = |dst: &mut [u8], w: u64| {
        dst.copy_from_slice(&(carry | w >> r).to_be_bytes());
        carry = w << (63 - r) << 1; // w << (64 - r), and nothing for r = 0
    };
    let (dst, last_dst) = out.split_at_mut(8 * (words - 1));
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        put(d, u64::from_be_bytes(s.try_into().expect("8 bytes")));
    }
    // Only the last word's first `len` bits; whatever follows is stale.
    let keep = match len % 64 {
        0 => u64::MAX,
        tail => !(u64::MAX >> tail),
    };
    put(&mut last_dst[..8], load_be64(src, 8 * (words - 1)) & keep);
    last_dst[8..].copy_from_slice(&carry.to_be_bytes());
}

impl HxTable {
    /// Encodes strictly increasing `values`.
    pub fn encode(values: &[u64], opts: TableOptions) -> Result<HxTable> {
        opts.validate()?;
        if values.len() > u32::MAX as usize {
            return Err(Error::InvalidConfig("a table holds at most 2^32 - 1 values".into()));
        }
        match opts.codec {
            Codec::Xor => Self::encode_with::<XorCode>(values, opts),
            Codec::Gap => Self::encode_with::<GapCode>(values, opts),
        }
    }

    /// [`encode`](Self::encode) with the codec fixed at compile time.
    fn encode_with<C: Code>(values: &[u64], opts: TableOptions) -> Result<HxTable> {
        let mut counts = [0u64; SYMBOLS];
        for (&prev, &next) in values.iter().zip(values.iter().skip(1)) {
            if next <= prev {
                return Err(Error::InvalidConfig(
                    "table values must be strictly increasing".into(),
                ));
            }
            counts[symbol(C::delta(prev, next)) as usize] += 1;
        }
        let huffman = Huffman::from_counts(&counts);
        // Each symbol's code and its length, as `code << 8 | length`: one load a value.
        let table: [u32; SYMBOLS] = std::array::from_fn(|h| {
            let (code, len) = huffman.code(h as u32);
            code << 8 | len
        });
        let bb = opts.block_bytes;
        let cap_bits = (bb - BLOCK_HEAD - BLOCK_TAIL) * 8;
        // Room for every block the values can take, from their codes' exact lengths: a
        // block ends when its entries run out or the next value does not fit, so each is
        // filled but for the longest value's bits. (A larger reservation would cost no
        // memory the table touches, but it would be counted against the build.)
        let (payload, longest) = counts.iter().enumerate().filter(|&(_, &c)| c > 0).fold(
            (0u64, 0u64),
            |(sum, max), (h, &c)| {
                let bits = u64::from(table[h] & 0xFF) + h as u64;
                (sum + c * bits, max.max(bits))
            },
        );
        let fill = (cap_bits as u64).saturating_sub(longest).max(1);
        let blocks_bound =
            payload.div_ceil(fill) as usize + values.len().div_ceil(MAX_BLOCK_ENTRIES as usize) + 1;
        let mut data = AlignedBytes::with_capacity(blocks_bound * bb + SLACK);
        data.resize_zeroed(SLACK);
        let mut ranks = Vec::new();
        // A block holds its codes, then its low bits (each delta without its leading 1),
        // and where the low bits start is known only once the block is full. Both streams
        // are written as the values come, into buffers of their own, and copied in.
        let (mut code_buf, mut low_buf) = ([0u8; STREAM], [0u8; STREAM]);
        let mut i = 0;
        while i < values.len() {
            let start = data.len() - SLACK;
            data.resize_zeroed(start + bb + SLACK);
            let block = &mut data[start..];
            block[..8].copy_from_slice(&values[i].to_le_bytes());
            ranks.push(i as u32);
            let first = i;
            let mut used = 0usize;
            let mut j = i + 1;
            let mut codes = BitWriter::new(&mut code_buf);
            let mut lows = BitWriter::new(&mut low_buf);
            let end = values.len().min(first + MAX_BLOCK_ENTRIES as usize);
            let span = &values[first..end];
            for (&prev, &next) in span.iter().zip(span.iter().skip(1)) {
                let delta = C::delta(prev, next);
                let h = symbol(delta);
                let e = table[h as usize];
                let len = e & 0xFF;
                // Stop at the first value whose code and low bits do not both fit.
                if used + (len + h) as usize > cap_bits {
                    break;
                }
                used += (len + h) as usize;
                codes.put_short((e >> 8) as u64, len);
                lows.put(delta & !(1u64 << h), h);
                j += 1;
            }
            let code_bits = codes.bits();
            let out = &mut block[BLOCK_HEAD..];
            // The low bits go in first, from bit `code_bits` on; the codes' whole bytes are
            // copied in after, and their last bits ORed into the byte both share.
            append_bits(out, code_bits, &low_buf, used - code_bits);
            let (whole, part) = (code_bits / 8, code_bits % 8);
            out[..whole].copy_from_slice(&code_buf[..whole]);
            if part > 0 {
                out[whole] |= code_buf[whole];
            }
            let count = (j - first) as u16;
            block[8..10].copy_from_slice(&count.to_le_bytes());
            block[10..12].copy_from_slice(&(code_bits as u16).to_le_bytes());
            let crc = crc32fast::hash(&block[..bb - BLOCK_TAIL]);
            block[bb - BLOCK_TAIL..bb].copy_from_slice(&crc.to_le_bytes());
            i = j;
        }
        ranks.push(values.len() as u32);
        data.shrink_to_fit();
        ranks.shrink_to_fit();
        Ok(HxTable::assemble(opts, huffman, values.len(), data, ranks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::hx_table::samples::sorted_random;
    use crate::util::SplitMix64;

    #[test]
    fn appended_bits_land_where_asked_with_zeros_around() {
        let bit = |b: &[u8], i: usize| b[i / 8] >> (7 - i % 8) & 1;
        let mut r = SplitMix64::new(31);
        for at in 0..20 {
            for len in [0usize, 1, 7, 8, 9, 56, 63, 64, 65, 127, 128, 300] {
                // The source has stale bits past `len`, which must not be copied.
                let src: Vec<u8> =
                    (0..len.div_ceil(64) * 8 + 8).map(|_| r.next_u64() as u8).collect();
                let mut out = vec![0xFFu8; 80];
                append_bits(&mut out, at, &src, len);
                for i in 0..at {
                    if i >= at / 8 * 8 {
                        assert_eq!(bit(&out, i), 0, "at {at} len {len}: bit {i} before");
                    } else {
                        assert_eq!(bit(&out, i), 1, "at {at} len {len}: byte before touched");
                    }
                }
                for i in 0..len {
                    assert_eq!(bit(&out, at + i), bit(&src, i), "at {at} len {len}: bit {i}");
                }
                let written_end = (at / 8 + len.div_ceil(64) * 8 + 8) * 8;
                for i in at + len..written_end {
                    assert_eq!(bit(&out, i), 0, "at {at} len {len}: bit {i} after");
                }
            }
        }
    }
    #[test]
    fn rejects_unsorted_and_bad_options() {
        assert!(HxTable::encode(&[3, 2], TableOptions::default()).is_err());
        assert!(HxTable::encode(&[3, 3], TableOptions::default()).is_err());
        let bad = TableOptions { block_bytes: 8, ..Default::default() };
        assert!(HxTable::encode(&[1], bad).is_err());
    }

    #[test]
    fn compresses_near_the_floor() {
        let n = 200_000;
        let data = sorted_random(n, 11);
        let floor = 64.0 - (n as f64).log2() + 1.44;
        // Block headers, checksums, ranks, the directory and the 4 KiB decoding table add about
        // 1.2 bits a value at this size; XOR coding itself is about 2 bits above the floor.
        for (codec, slack) in [(Codec::Xor, 3.4), (Codec::Gap, 1.5)] {
            let table =
                HxTable::encode(&data, TableOptions { codec, ..Default::default() }).unwrap();
            let bits = table.heap_bytes() as f64 * 8.0 / n as f64;
            eprintln!("{codec:?}: {bits:.2} bits a value, floor {floor:.2}");
            assert!(bits < floor + slack, "{codec:?}: {bits:.2} bits vs floor {floor:.2}");
            assert!(bits > floor - 0.5, "{codec:?}: {bits:.2} is below the floor {floor:.2}?");
        }
    }
}
