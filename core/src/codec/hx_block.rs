//! Decoding inside one Huffman-XOR block: the codec as a compile-time type ([`Code`]), the
//! bit reads, and the [`Cursor`] that walks a block's two streams.
//!
//! Everything here is on the query path (a lookup decodes part of a block for every table
//! it probes), so each piece is a small `#[inline(always)]` function the scan loops of
//! [`HxTable`](super::HxTable) and its lanes compile into.

use crate::codec::huffman::MAX_CODE_LEN;
use crate::codec::hx_format::BLOCK_HEAD;
use crate::util::prefetch;

/// A codec fixed at compile time, so the encode and decode loops have no per-value branch
/// on it.
pub(super) trait Code {
    /// The word whose leading bit and lower bits are coded for `next` after `prev`.
    fn delta(prev: u64, next: u64) -> u64;
    /// Inverse of [`delta`](Self::delta).
    fn apply(prev: u64, delta: u64) -> u64;
}

pub(super) struct XorCode;
impl Code for XorCode {
    #[inline(always)]
    fn delta(prev: u64, next: u64) -> u64 {
        prev ^ next
    }
    #[inline(always)]
    fn apply(prev: u64, delta: u64) -> u64 {
        prev ^ delta
    }
}

pub(super) struct GapCode;
impl Code for GapCode {
    #[inline(always)]
    fn delta(prev: u64, next: u64) -> u64 {
        next.wrapping_sub(prev)
    }
    #[inline(always)]
    fn apply(prev: u64, delta: u64) -> u64 {
        prev.wrapping_add(delta)
    }
}

#[inline(always)]
pub(super) fn load_be64(data: &[u8], byte: usize) -> u64 {
    u64::from_be_bytes(data[byte..byte + 8].try_into().expect("8 bytes"))
}

/// Reads `n` bits (1 ..= 64) at bit position `pos`.
#[inline(always)]
pub(super) fn read_bits(data: &[u8], pos: usize, n: u32) -> u64 {
    let byte = pos >> 3;
    let w = u128::from_be_bytes(data[byte..byte + 16].try_into().expect("16 bytes")) << (pos & 7);
    (w >> (128 - n)) as u64
}

/// The symbol `h` for a non-zero delta word.
#[inline(always)]
pub(super) fn symbol(delta: u64) -> u32 {
    // Masked so that the result is visibly below 64 (indexing by it needs no check); for a
    // non-zero word the mask changes nothing.
    (63 - (delta.leading_zeros() & 63)) & 63
}

/// Decoding state inside one block: a bit buffer over the code stream and the position in
/// the low-bits stream.
///
/// A block stores the Huffman codes of all its values first and their low bits after. The
/// code stream is read through a 64-bit buffer kept in a register, so finding the next code
/// costs a table lookup and a shift; the low bits sit at positions that are running sums of
/// the decoded `h`, so reading them is off that chain.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cursor {
    /// Upcoming code bits, most significant first.
    pub(super) cbuf: u64,
    /// Valid bits in `cbuf`.
    pub(super) cbits: u32,
    /// Bit position (in the block) of the first bit of `cbuf`.
    pub(super) cpos: usize,
    /// Bit position (in the block) of the next value's low bits.
    pub(super) rpos: usize,
}

impl Cursor {
    /// A cursor at the second value of `block` (the first is stored whole).
    #[inline(always)]
    pub(super) fn new(block: &[u8]) -> Cursor {
        let code_bits = u16::from_le_bytes([block[10], block[11]]) as usize;
        Cursor { cbuf: 0, cbits: 0, cpos: BLOCK_HEAD * 8, rpos: BLOCK_HEAD * 8 + code_bits }
    }

    /// The next value's delta word.
    #[inline(always)]
    pub(super) fn next(&mut self, block: &[u8], lut: &Lut) -> u64 {
        if self.cbits < MAX_CODE_LEN {
            self.cbuf = load_be64(block, self.cpos >> 3) << (self.cpos & 7);
            self.cbits = 64 - (self.cpos & 7) as u32;
        }
        let e = lut[(self.cbuf >> (64 - MAX_CODE_LEN)) as usize];
        let len = (e >> 8) as u32;
        let h = (e & 0xFF) as u32;
        self.cbuf <<= len;
        self.cbits -= len;
        self.cpos += len as usize;
        let low = if h <= 57 {
            let w = load_be64(block, self.rpos >> 3) << (self.rpos & 7);
            (w >> 1) >> (63 - h)
        } else {
            read_bits(block, self.rpos, h)
        };
        self.rpos += h as usize;
        (1u64 << h) | low
    }
}

/// A table's decoding table: entry `len << 8 | h` for every [`MAX_CODE_LEN`]-bit window.
pub(super) type Lut = [u16; 1 << MAX_CODE_LEN];

/// Starts loading the cache lines of `data[at..at + len]`, one hint a line.
#[inline(always)]
pub(super) fn prefetch_lines(data: &[u8], at: usize, len: usize) {
    let mut line = 0;
    while line < len {
        prefetch(data, at + line);
        line += 64;
    }
}

/// The value count a block's header holds.
#[inline(always)]
pub(super) fn block_count(block: &[u8]) -> u32 {
    u16::from_le_bytes([block[8], block[9]]) as u32
}
