//! [`HxRun`]: one sorted run of distinct `u64` values in Huffman-XOR blocks.

use crate::codec::aligned::AlignedBytes;
use crate::codec::directory::Directory;
use crate::codec::huffman::{Huffman, MAX_CODE_LEN, SYMBOLS};
use crate::error::{Error, Result};
use crate::util::prefetch;

/// The rank reported for values of a run without ranks (see [`HxRun::drop_ranks`]).
pub const NO_RANK: u32 = u32::MAX;

/// Format version written in every run header; readers refuse any other.
pub const FORMAT_VERSION: u16 = 1;
const MAGIC: [u8; 4] = *b"NDHX";
/// Size of a serialized run header.
pub const HEADER_BYTES: usize = 4 + 2 + 1 + 1 + 4 + 4 + 8 + SYMBOLS + 4;
/// Bytes at the start of a block: first value (u64), value count (u16), bits of the code
/// stream (u16).
const BLOCK_HEAD: usize = 12;
/// Most values one block holds (its count is a u16).
const MAX_BLOCK_ENTRIES: u32 = u16::MAX as u32;
/// Bytes at the end of a block: CRC-32 of everything before it.
const BLOCK_TAIL: usize = 4;
/// Extra zero bytes after the last block, so 16-byte loads near the end stay in bounds.
const SLACK: usize = 16;
/// Smallest and largest block sizes.
const MIN_BLOCK: usize = 32;
const MAX_BLOCK: usize = 8192;

/// How a value is coded relative to its predecessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    /// `h` is the leading 1-bit of `value XOR predecessor` (Manku et al.). The default.
    #[default]
    Xor,
    /// `h` is the leading 1-bit of `value - predecessor`: the same code applied to the gap,
    /// about two bits a value smaller on random data.
    Gap,
}

impl Codec {
    fn to_byte(self) -> u8 {
        match self {
            Codec::Xor => 0,
            Codec::Gap => 1,
        }
    }

    fn from_byte(b: u8) -> Result<Codec> {
        match b {
            0 => Ok(Codec::Xor),
            1 => Ok(Codec::Gap),
            _ => Err(Error::corrupt(format!("unknown codec {b}"))),
        }
    }

    /// The value after `prev` from its delta word (see [`Code::delta`]).
    #[inline(always)]
    fn apply(self, prev: u64, delta: u64) -> u64 {
        match self {
            Codec::Xor => prev ^ delta,
            Codec::Gap => prev.wrapping_add(delta),
        }
    }
}

/// The option named `s` among `choices`, or an error naming `what` and the two choices.
fn parse_choice<T: Copy>(what: &str, s: &str, choices: [(&str, T); 2]) -> Result<T> {
    match choices.iter().find(|c| c.0 == s) {
        Some(&(_, v)) => Ok(v),
        None => Err(Error::InvalidConfig(format!(
            "unknown {what} {s:?}: expected {} or {}",
            choices[0].0, choices[1].0
        ))),
    }
}

impl std::str::FromStr for Codec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Codec> {
        parse_choice("codec", s, [("xor", Codec::Xor), ("gap", Codec::Gap)])
    }
}

/// A codec fixed at compile time, so the encode and decode loops have no per-value branch
/// on it.
trait Code {
    /// The word whose leading bit and lower bits are coded for `next` after `prev`.
    fn delta(prev: u64, next: u64) -> u64;
    /// Inverse of [`delta`](Self::delta).
    fn apply(prev: u64, delta: u64) -> u64;
}

struct XorCode;
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

struct GapCode;
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

/// How a lookup finds the block that may hold a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BlockSearch {
    /// A table on the top bits of the key points at the first block of each bucket; the
    /// few blocks in a bucket are then searched. Robust on clustered data.
    #[default]
    Directory,
    /// Interpolation over the block keys, falling back to binary search.
    Interpolation,
}

impl std::str::FromStr for BlockSearch {
    type Err = Error;
    fn from_str(s: &str) -> Result<BlockSearch> {
        parse_choice(
            "block search",
            s,
            [("directory", BlockSearch::Directory), ("interpolation", BlockSearch::Interpolation)],
        )
    }
}

/// How a run is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// Huffman-XOR blocks ([`HxRun`]), coded with [`RunOptions::codec`]. The default.
    #[default]
    Blocks,
    /// Fixed-width low bits under a top-bits directory
    /// ([`PackedRun`](crate::codec::PackedRun)): a few bits a value larger than the
    /// blocks with the gap code, and several times fewer instructions a lookup. Stored on
    /// disk as blocks all the same.
    Packed,
}

impl std::str::FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Layout> {
        parse_choice("layout", s, [("blocks", Layout::Blocks), ("packed", Layout::Packed)])
    }
}

/// Options for encoding a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunOptions {
    /// Value coding of the blocks (stored runs, and in memory with [`Layout::Blocks`]).
    pub codec: Codec,
    /// Block size in bytes (32 ..= 8192).
    pub block_bytes: usize,
    /// Block lookup method.
    pub search: BlockSearch,
    /// In-memory layout of an index's tables.
    pub layout: Layout,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            codec: Codec::Xor,
            block_bytes: 1024,
            search: BlockSearch::Directory,
            layout: Layout::Blocks,
        }
    }
}

impl RunOptions {
    /// Checks the options are in range.
    pub fn validate(&self) -> Result<()> {
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_bytes) {
            return Err(Error::InvalidConfig(format!(
                "block size {} is not in {MIN_BLOCK}..={MAX_BLOCK} bytes",
                self.block_bytes
            )));
        }
        Ok(())
    }
}

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

#[inline(always)]
fn load_be64(data: &[u8], byte: usize) -> u64 {
    u64::from_be_bytes(data[byte..byte + 8].try_into().expect("8 bytes"))
}

/// Reads `n` bits (1 ..= 64) at bit position `pos`.
#[inline(always)]
fn read_bits(data: &[u8], pos: usize, n: u32) -> u64 {
    let byte = pos >> 3;
    let w = u128::from_be_bytes(data[byte..byte + 16].try_into().expect("16 bytes")) << (pos & 7);
    (w >> (128 - n)) as u64
}

/// The symbol `h` for a non-zero delta word.
#[inline(always)]
fn symbol(delta: u64) -> u32 {
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
struct Cursor {
    /// Upcoming code bits, most significant first.
    cbuf: u64,
    /// Valid bits in `cbuf`.
    cbits: u32,
    /// Bit position (in the block) of the first bit of `cbuf`.
    cpos: usize,
    /// Bit position (in the block) of the next value's low bits.
    rpos: usize,
}

impl Cursor {
    /// A cursor at the second value of `block` (the first is stored whole).
    #[inline(always)]
    fn new(block: &[u8]) -> Cursor {
        let code_bits = u16::from_le_bytes([block[10], block[11]]) as usize;
        Cursor { cbuf: 0, cbits: 0, cpos: BLOCK_HEAD * 8, rpos: BLOCK_HEAD * 8 + code_bits }
    }

    /// The next value's delta word.
    #[inline(always)]
    fn next(&mut self, block: &[u8], lut: &Lut) -> u64 {
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

/// A run's decoding table: entry `len << 8 | h` for every [`MAX_CODE_LEN`]-bit window.
type Lut = [u16; 1 << MAX_CODE_LEN];

/// One range scan over a run, prepared ahead and run by [`scan_lanes`]. A query prepares
/// the scans of all its tables first (their block lookups and prefetches overlap), then
/// decodes.
#[derive(Debug)]
pub struct Lane<'a> {
    data: &'a [u8],
    lut: &'a Lut,
    ranks: &'a [u32],
    bb: usize,
    blocks: usize,
    block: usize,
    /// Values in the current block, and how many are left after `v`.
    count: u32,
    left: u32,
    cur: Cursor,
    v: u64,
    lo: u64,
    hi: u64,
    pq: u64,
    tag: u32,
    done: bool,
}

/// Starts loading the cache lines of `data[at..at + len]`, one hint a line.
#[inline(always)]
fn prefetch_lines(data: &[u8], at: usize, len: usize) {
    let mut line = 0;
    while line < len {
        prefetch(data, at + line);
        line += 64;
    }
}

/// The value count a block's header holds.
#[inline(always)]
fn block_count(block: &[u8]) -> u32 {
    u16::from_le_bytes([block[8], block[9]]) as u32
}

impl Lane<'_> {
    /// Runs the scan to its end, reporting values within `k` of the lane's query.
    ///
    /// The inner loops stay within one block and carry only what decoding needs, so the
    /// state fits in registers: first values below the range are skipped with a compare,
    /// then values in the range are checked; block changes and hits are out of line.
    #[inline(always)]
    fn run<C: Code>(&mut self, k: u32, out: &mut Vec<(u64, u32, u32)>) {
        let (lut, lo, hi, pq) = (self.lut, self.lo, self.hi, self.pq);
        while !self.done {
            let block = &self.data[self.block * self.bb..];
            let (mut v, mut cur, mut left) = (self.v, self.cur, self.left);
            while v < lo && left > 0 {
                v = C::apply(v, cur.next(block, lut));
                left -= 1;
            }
            if v >= lo {
                loop {
                    if v > hi {
                        self.done = true;
                        return;
                    }
                    if (v ^ pq).count_ones() <= k {
                        self.hit(v, left, out);
                    }
                    if left == 0 {
                        break;
                    }
                    v = C::apply(v, cur.next(block, lut));
                    left -= 1;
                }
            }
            self.next_block();
        }
    }

    /// Reports a matching value (rare: kept out of the decoding loop).
    #[cold]
    #[inline(never)]
    fn hit(&self, v: u64, left: u32, out: &mut Vec<(u64, u32, u32)>) {
        let rank = match self.ranks.get(self.block) {
            Some(r) => r + (self.count - 1 - left),
            None => NO_RANK,
        };
        out.push((v, rank, self.tag));
    }

    /// Moves to the first value of the next block, or ends the scan.
    #[inline(never)]
    fn next_block(&mut self) {
        self.block += 1;
        if self.block >= self.blocks {
            self.done = true;
            return;
        }
        let block = &self.data[self.block * self.bb..];
        self.v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        self.count = block_count(block);
        self.left = self.count - 1;
        self.cur = Cursor::new(block);
        self.done = self.v > self.hi;
    }
}

/// Runs `lanes` to completion, one after the other, appending `(value, rank, tag)`
/// for every value within `k` of its lane's query. All lanes must come from runs with
/// codec `codec`.
pub fn scan_lanes(codec: Codec, lanes: &mut [Lane<'_>], k: u32, out: &mut Vec<(u64, u32, u32)>) {
    match codec {
        Codec::Xor => scan_lanes_with::<XorCode>(lanes, k, out),
        Codec::Gap => scan_lanes_with::<GapCode>(lanes, k, out),
    }
}

fn scan_lanes_with<C: Code>(lanes: &mut [Lane<'_>], k: u32, out: &mut Vec<(u64, u32, u32)>) {
    for lane in lanes.iter_mut() {
        lane.run::<C>(k, out);
    }
}

/// A sorted run of distinct `u64` values, Huffman-XOR coded in fixed-size blocks.
#[derive(Debug, Clone)]
pub struct HxRun {
    opts: RunOptions,
    huffman: Huffman,
    len: usize,
    /// `blocks * block_bytes` bytes, then [`SLACK`] zero bytes, from a 128-byte boundary. A
    /// block's first value, read from its first 8 bytes, is its search key.
    data: AlignedBytes,
    /// Number of blocks.
    nblocks: usize,
    /// Values before each block, and `len` at the end; empty after
    /// [`drop_ranks`](HxRun::drop_ranks).
    ranks: Vec<u32>,
    /// Entry `t`: the block where a scan for keys with top bits `t` starts.
    dir: Directory,
}

impl HxRun {
    /// Encodes strictly increasing `values`.
    pub fn encode(values: &[u64], opts: RunOptions) -> Result<HxRun> {
        opts.validate()?;
        if values.len() > u32::MAX as usize {
            return Err(Error::InvalidConfig("a run holds at most 2^32 - 1 values".into()));
        }
        match opts.codec {
            Codec::Xor => Self::encode_with::<XorCode>(values, opts),
            Codec::Gap => Self::encode_with::<GapCode>(values, opts),
        }
    }

    /// [`encode`](Self::encode) with the codec fixed at compile time.
    fn encode_with<C: Code>(values: &[u64], opts: RunOptions) -> Result<HxRun> {
        let mut counts = [0u64; SYMBOLS];
        for (&prev, &next) in values.iter().zip(values.iter().skip(1)) {
            if next <= prev {
                return Err(Error::InvalidConfig("run values must be strictly increasing".into()));
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
        // Room for the worst case (a value never takes more than 9 bytes); pages never
        // written are never backed, and the excess goes at shrink_to_fit below.
        let blocks_bound = values.len().div_ceil(1.max((bb - BLOCK_HEAD - BLOCK_TAIL) / 9)) + 1;
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
        Ok(HxRun::assemble(opts, huffman, values.len(), data, ranks))
    }

    /// A run of `len` values from its blocks and ranks (one more rank than blocks), with its
    /// directory built.
    fn assemble(
        opts: RunOptions,
        huffman: Huffman,
        len: usize,
        data: AlignedBytes,
        ranks: Vec<u32>,
    ) -> HxRun {
        let mut run = HxRun {
            opts,
            huffman,
            len,
            data,
            nblocks: ranks.len() - 1,
            ranks,
            dir: Directory::default(),
        };
        run.build_directory();
        run
    }

    /// The first value of block `b`.
    #[inline(always)]
    fn key(&self, b: usize) -> u64 {
        let at = b * self.opts.block_bytes;
        u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Builds the top-bits directory: about one entry per block. `dir[t]` is the block a
    /// scan from the smallest key with top bits `t` starts in: the last block whose first
    /// value is at most that key (or block 0).
    fn build_directory(&mut self) {
        let blocks = self.blocks();
        let bits = if blocks <= 1 { 0 } else { (usize::BITS - 1 - blocks.leading_zeros()).min(24) };
        let shift = 64 - bits;
        let buckets = 1usize << bits;
        let mut dir = Vec::with_capacity(buckets + 1);
        let mut b = 0usize; // first block whose key has top bits >= t
        for t in 0..buckets {
            while b < blocks && ((self.key(b).checked_shr(shift).unwrap_or(0)) as usize) < t {
                b += 1;
            }
            // The bucket's smallest key is t << shift: it starts in block b if that block's
            // key is exactly there, else in the block before.
            let starts_here =
                b < blocks && self.key(b) == (t as u64).checked_shl(shift).unwrap_or(0);
            dir.push(if starts_here || b == 0 { b as u32 } else { (b - 1) as u32 });
        }
        dir.push(blocks.saturating_sub(1) as u32);
        self.dir = Directory::new(shift, &dir);
    }

    /// Frees the per-block ranks, which only [`get`](Self::get), [`rank_of`](Self::rank_of)
    /// and the ranks reported by scans need (those then report [`NO_RANK`]). Tables other
    /// than the document store's key column never use them.
    pub fn drop_ranks(&mut self) {
        self.ranks = Vec::new();
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the run holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.nblocks
    }

    /// The options the run was encoded with.
    pub fn options(&self) -> RunOptions {
        self.opts
    }

    /// Changes the block lookup method (no re-encoding needed).
    pub fn set_search(&mut self, search: BlockSearch) {
        self.opts.search = search;
    }

    /// The run's Huffman code.
    pub fn huffman(&self) -> &Huffman {
        &self.huffman
    }

    /// Smallest value, if any.
    pub fn first(&self) -> Option<u64> {
        (self.len > 0).then(|| self.key(0))
    }

    /// Bytes of memory this run holds (blocks, keys, ranks, directory, decoding table).
    pub fn heap_bytes(&self) -> usize {
        self.data.capacity()
            + self.ranks.capacity() * 4
            + self.dir.heap_bytes()
            + self.huffman.lut().len() * 2
            + std::mem::size_of::<Self>()
    }

    /// Index of the block where a scan for values `>= key` starts: the last block whose
    /// first value is `<= key`, or block 0.
    #[inline]
    pub fn block_for(&self, key: u64) -> usize {
        match self.opts.search {
            BlockSearch::Directory => self.block_by_directory(key),
            BlockSearch::Interpolation => self.block_by_interpolation(key),
        }
    }

    #[inline]
    fn block_by_directory(&self, key: u64) -> usize {
        let (first, last) = self.dir.blocks_for(key);
        self.search_from(first, last, key)
    }

    /// The last block in `first..=last` whose first value is `<= key`, given that block
    /// `first` qualifies (or is block 0).
    #[inline(always)]
    fn search_from(&self, first: usize, last: usize, key: u64) -> usize {
        let mut b = first;
        while b < last && self.key(b + 1) <= key {
            b += 1;
        }
        b
    }

    #[inline]
    fn block_by_interpolation(&self, key: u64) -> usize {
        let n = self.blocks();
        if n <= 1 || key <= self.key(0) {
            return 0;
        }
        let (mut lo, mut hi) = (0usize, n - 1); // invariant: key(lo) <= key < key(hi)
        if self.key(hi) <= key {
            return hi;
        }
        let (mut klo, mut khi) = (self.key(lo), self.key(hi));
        // Now keys[lo] <= key < keys[hi].
        for _ in 0..3 {
            if hi - lo <= 8 {
                break;
            }
            let span = (khi - klo) as u128;
            let off = ((key - klo) as u128 * (hi - lo) as u128 / span) as usize;
            let guess = (lo + off).clamp(lo + 1, hi - 1);
            let kg = self.key(guess);
            if kg <= key {
                (lo, klo) = (guess, kg);
                // Probe a little ahead: a good guess is usually within a few blocks.
                let ahead = (guess + 2).min(hi);
                let ka = self.key(ahead);
                if ka > key {
                    (hi, khi) = (ahead, ka);
                } else {
                    (lo, klo) = (ahead, ka);
                }
            } else {
                (hi, khi) = (guess, kg);
                let back = guess.saturating_sub(2).max(lo);
                let kb = self.key(back);
                if kb <= key {
                    (lo, klo) = (back, kb);
                } else {
                    (hi, khi) = (back, kb);
                }
            }
        }
        // Binary search for the last block in lo..hi with key <= `key`.
        let (mut a, mut b) = (lo, hi);
        while b - a > 1 {
            let mid = a + (b - a) / 2;
            if self.key(mid) <= key { a = mid } else { b = mid }
        }
        a
    }

    /// Where a lookup of `key` will search: a range of candidate blocks (one load from
    /// the directory, or none with interpolation). With
    /// [`prefetch_directory`](Self::prefetch_directory),
    /// [`prefetch_blocks`](Self::prefetch_blocks) and [`lane_in`](Self::lane_in) it splits
    /// [`lane`](Self::lane) into stages, so that the cache misses of many lookups overlap.
    #[inline(always)]
    pub fn candidates(&self, key: u64) -> (usize, usize) {
        match self.opts.search {
            BlockSearch::Directory => self.dir.blocks_for(key),
            BlockSearch::Interpolation => {
                let g = ((key as u128 * self.blocks() as u128) >> 64) as usize;
                (g, g + 1)
            }
        }
    }

    /// Stage 1 of a staged lookup: starts loading the directory entries
    /// [`candidates`](Self::candidates) reads for `key`.
    #[inline(always)]
    pub fn prefetch_directory(&self, key: u64) {
        if self.opts.search == BlockSearch::Directory {
            self.dir.prefetch(key);
        }
    }

    /// Stage 2: starts loading what a lane over `candidates` reads: the whole first candidate
    /// block, and the key of the second when the search may need it.
    #[inline(always)]
    pub fn prefetch_blocks(&self, candidates: (usize, usize)) {
        let bb = self.opts.block_bytes;
        let first = candidates.0 * bb;
        prefetch_lines(&self.data, first, bb);
        if candidates.1 > candidates.0 {
            prefetch(&self.data, first + bb);
        }
    }

    /// [`block_for`](Self::block_for) `key`, searching only the blocks from
    /// [`candidates`](Self::candidates) when the directory gave them.
    #[inline(always)]
    fn block_in(&self, candidates: (usize, usize), key: u64) -> usize {
        match self.opts.search {
            BlockSearch::Directory if self.len > 0 => {
                self.search_from(candidates.0, candidates.1, key)
            }
            _ => self.block_for(key),
        }
    }

    /// Like [`lane`](Self::lane), searching the blocks from [`candidates`](Self::candidates)
    /// (after [`prefetch_blocks`](Self::prefetch_blocks)); prefetches the rest of the block
    /// it starts in when that is not the first candidate, which is already on its way.
    #[inline]
    pub fn lane_in(
        &self,
        candidates: (usize, usize),
        lo: u64,
        hi: u64,
        pq: u64,
        tag: u32,
    ) -> Lane<'_> {
        let b = self.block_in(candidates, lo);
        let bb = self.opts.block_bytes;
        if b != candidates.0 {
            prefetch_lines(&self.data, b * bb + 64, bb.saturating_sub(64));
        }
        self.lane_at(b, lo, hi, pq, tag)
    }

    /// Stage 3 of a staged lookup, after [`prefetch_blocks`](Self::prefetch_blocks): appends
    /// `(value, rank, tag)` for every value in `lo..=hi` within `k` of `pq`. The same as
    /// running the [`lane_in`](Self::lane_in) lane, which here never leaves the stack.
    #[inline(always)]
    pub(crate) fn probe(
        &self,
        candidates: (usize, usize),
        (lo, hi): (u64, u64),
        pq: u64,
        k: u32,
        tag: u32,
        out: &mut Vec<(u64, u32, u32)>,
    ) {
        let mut lane = self.lane_in(candidates, lo, hi, pq, tag);
        match self.opts.codec {
            Codec::Xor => lane.run::<XorCode>(k, out),
            Codec::Gap => lane.run::<GapCode>(k, out),
        }
    }

    /// Calls `visit(value, rank)` for every value in `lo..=hi`, in increasing order.
    #[inline]
    pub fn scan_range(&self, lo: u64, hi: u64, visit: impl FnMut(u64, usize)) {
        if self.len == 0 || lo > hi {
            return;
        }
        self.scan_from(self.block_for(lo), lo, hi, visit);
    }

    /// [`scan_range`](Self::scan_range) from block `b`, which must be where a scan for `lo`
    /// starts.
    #[inline]
    fn scan_from(&self, b: usize, lo: u64, hi: u64, visit: impl FnMut(u64, usize)) {
        match self.opts.codec {
            Codec::Xor => self.scan_with::<XorCode>(b, lo, hi, visit),
            Codec::Gap => self.scan_with::<GapCode>(b, lo, hi, visit),
        }
    }

    /// [`scan_from`](Self::scan_from) with the codec fixed at compile time.
    #[inline(always)]
    fn scan_with<C: Code>(
        &self,
        mut b: usize,
        lo: u64,
        hi: u64,
        mut visit: impl FnMut(u64, usize),
    ) {
        let bb = self.opts.block_bytes;
        let lut = self.huffman.lut();
        while b < self.blocks() {
            let block = &self.data[b * bb..];
            let count = block_count(block);
            let mut v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            if v > hi {
                return;
            }
            let rank0 = self.ranks.get(b).map_or(NO_RANK as usize, |&r| r as usize);
            if v >= lo {
                visit(v, rank0);
            }
            let mut cur = Cursor::new(block);
            for j in 1..count as usize {
                v = C::apply(v, cur.next(block, lut));
                if v > hi {
                    return;
                }
                if v >= lo {
                    visit(v, rank0.saturating_add(j));
                }
            }
            b += 1;
        }
    }

    /// The value of rank `rank` (its position in sorted order), if `rank < len`.
    pub fn get(&self, rank: usize) -> Option<u64> {
        if rank >= self.len || self.ranks.is_empty() {
            return None;
        }
        let b = self.ranks.partition_point(|&r| r as usize <= rank) - 1;
        let block = &self.data[b * self.opts.block_bytes..];
        let mut v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        let mut cur = Cursor::new(block);
        for _ in self.ranks[b] as usize..rank {
            v = self.opts.codec.apply(v, cur.next(block, self.huffman.lut()));
        }
        Some(v)
    }

    /// Starts a scan of `lo..=hi` that reports values within `k` of `pq`. See [`Lane`].
    #[inline]
    pub fn lane(&self, lo: u64, hi: u64, pq: u64, tag: u32) -> Lane<'_> {
        let b = if self.len == 0 { 0 } else { self.block_for(lo) };
        self.lane_at(b, lo, hi, pq, tag)
    }

    #[inline(always)]
    fn lane_at(&self, b: usize, lo: u64, hi: u64, pq: u64, tag: u32) -> Lane<'_> {
        let bb = self.opts.block_bytes;
        let mut lane = Lane {
            data: &self.data,
            lut: self.huffman.lut(),
            ranks: &self.ranks,
            bb,
            blocks: self.blocks(),
            block: 0,
            count: 1,
            left: 0,
            cur: Cursor { cbuf: 0, cbits: 0, cpos: 0, rpos: 0 },
            v: 0,
            lo,
            hi,
            pq,
            tag,
            done: true,
        };
        if self.len == 0 || lo > hi {
            return lane;
        }
        let block = &self.data[b * bb..];
        lane.block = b;
        lane.v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        lane.count = block_count(block);
        lane.left = lane.count - 1;
        lane.cur = Cursor::new(block);
        lane.done = lane.v > hi;
        lane
    }

    /// The codec of this run.
    pub fn codec(&self) -> Codec {
        self.opts.codec
    }

    /// Stage 2 of a staged [`rank_of`](Self::rank_of), beside
    /// [`prefetch_blocks`](Self::prefetch_blocks) (after [`prefetch_directory`] and
    /// [`candidates`]): starts loading the rank of the first candidate block.
    ///
    /// [`prefetch_directory`]: Self::prefetch_directory
    /// [`candidates`]: Self::candidates
    #[inline(always)]
    pub fn prefetch_rank(&self, candidates: (usize, usize)) {
        prefetch(&self.ranks, candidates.0);
    }

    /// Stage 3 of a staged [`rank_of`](Self::rank_of): the rank of `value`, searching the
    /// blocks from [`candidates`](Self::candidates).
    pub fn rank_in(&self, candidates: (usize, usize), value: u64) -> Option<usize> {
        if self.len == 0 || self.ranks.is_empty() {
            return None;
        }
        let mut found = None;
        self.scan_from(self.block_in(candidates, value), value, value, |_, r| found = Some(r));
        found
    }

    /// The rank (position in sorted order) of `value`, if present (`None` without ranks).
    pub fn rank_of(&self, value: u64) -> Option<usize> {
        self.rank_in(self.candidates(value), value)
    }

    /// Decodes every value, in order.
    pub fn to_vec(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len);
        self.scan_range(0, u64::MAX, |v, _| out.push(v));
        out
    }

    /// Decodes one block with every check: checksum, counts, code validity, bounds and
    /// strict increase. Never panics on damaged bytes.
    fn decode_block_checked(
        block: &[u8],
        bb: usize,
        huffman: &Huffman,
        codec: Codec,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        if block.len() < bb + SLACK {
            return Err(Error::corrupt("block is truncated"));
        }
        let stored = u32::from_le_bytes(block[bb - BLOCK_TAIL..bb].try_into().expect("4 bytes"));
        if crc32fast::hash(&block[..bb - BLOCK_TAIL]) != stored {
            return Err(Error::corrupt("block checksum mismatch"));
        }
        let mut v = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        let count = u16::from_le_bytes([block[8], block[9]]) as u32;
        let code_bits = u16::from_le_bytes([block[10], block[11]]) as usize;
        let code_end = BLOCK_HEAD * 8 + code_bits;
        let end_bits = (bb - BLOCK_TAIL) * 8;
        if count == 0 {
            return Err(Error::corrupt("empty block"));
        }
        if code_end > end_bits {
            return Err(Error::corrupt("block code stream runs past the block"));
        }
        out.push(v);
        let lut = huffman.lut();
        let (mut cpos, mut rpos) = (BLOCK_HEAD * 8, code_end);
        for _ in 1..count {
            let e = lut[read_bits(block, cpos, MAX_CODE_LEN) as usize];
            let (len, h) = ((e >> 8) as u32, (e & 0xFF) as u32);
            if len == 0 {
                return Err(Error::corrupt("invalid Huffman code in block"));
            }
            if cpos + len as usize > code_end {
                return Err(Error::corrupt("block code stream is shorter than its count"));
            }
            if rpos + h as usize > end_bits {
                return Err(Error::corrupt("block low bits run past the block"));
            }
            let low = if h == 0 { 0 } else { read_bits(block, rpos, h) };
            cpos += len as usize;
            rpos += h as usize;
            let delta = (1u64 << h) | low;
            let next = codec.apply(v, delta);
            let increasing = match codec {
                Codec::Xor => next > v,
                Codec::Gap => v.checked_add(delta).is_some(),
            };
            if !increasing {
                return Err(Error::corrupt("block values are not strictly increasing"));
            }
            v = next;
            out.push(v);
        }
        if cpos != code_end {
            return Err(Error::corrupt("block code stream is longer than its count"));
        }
        Ok(())
    }

    /// The serialized header: magic, format version, codec, block size, counts, Huffman code
    /// lengths, CRC-32.
    pub fn header_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[6] = self.opts.codec.to_byte();
        h[7] = 0;
        h[8..12].copy_from_slice(&(self.opts.block_bytes as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(self.blocks() as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(self.len as u64).to_le_bytes());
        h[24..24 + SYMBOLS].copy_from_slice(self.huffman.lengths());
        let crc = crc32fast::hash(&h[..HEADER_BYTES - 4]);
        h[HEADER_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// The bytes of every block, in order (each exactly the block size).
    pub fn block_slices(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.data[..self.data.len() - SLACK].chunks_exact(self.opts.block_bytes)
    }

    /// The whole run as bytes: header, then every block.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.data.len());
        out.extend_from_slice(&self.header_bytes());
        out.extend_from_slice(&self.data[..self.data.len() - SLACK]);
        out
    }

    /// Reads a run written by [`to_bytes`](Self::to_bytes), verifying the header, every
    /// block checksum and every value. `search` is the lookup method to use in memory.
    pub fn from_bytes(bytes: &[u8], search: BlockSearch) -> Result<HxRun> {
        if bytes.len() < HEADER_BYTES {
            return Err(Error::corrupt("run is shorter than its header"));
        }
        let (header, body) = bytes.split_at(HEADER_BYTES);
        let bb = Self::parse_header(header)?.1.block_bytes;
        if body.len() % bb != 0 {
            return Err(Error::corrupt("run body is not a whole number of blocks"));
        }
        Self::from_parts(header, body.chunks(bb), search)
    }

    /// Parses a header into (blocks, options, len, Huffman code).
    fn parse_header(h: &[u8]) -> Result<(usize, RunOptions, usize, Huffman)> {
        if h.len() != HEADER_BYTES {
            return Err(Error::corrupt("run header has the wrong size"));
        }
        if h[0..4] != MAGIC {
            return Err(Error::corrupt("not a neardup run (bad magic)"));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        let stored = u32::from_le_bytes(h[HEADER_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32fast::hash(&h[..HEADER_BYTES - 4]) != stored {
            return Err(Error::corrupt("run header checksum mismatch"));
        }
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                found: version as u32,
                supported: FORMAT_VERSION as u32,
            });
        }
        let codec = Codec::from_byte(h[6])?;
        let block_bytes = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        let blocks = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as usize;
        let len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")) as usize;
        let mut lengths = [0u8; SYMBOLS];
        lengths.copy_from_slice(&h[24..24 + SYMBOLS]);
        let huffman = Huffman::from_lengths(&lengths)?;
        let opts = RunOptions { codec, block_bytes, ..RunOptions::default() };
        opts.validate().map_err(|e| Error::corrupt(format!("run header: {e}")))?;
        if len > u32::MAX as usize || blocks > len {
            return Err(Error::corrupt("run header counts are impossible"));
        }
        Ok((blocks, opts, len, huffman))
    }

    /// Rebuilds a run from its header and its blocks (as stored one by one), verifying
    /// everything.
    pub fn from_parts<'a>(
        header: &[u8],
        blocks: impl IntoIterator<Item = &'a [u8]>,
        search: BlockSearch,
    ) -> Result<HxRun> {
        let (nblocks, mut opts, len, huffman) = Self::parse_header(header)?;
        opts.search = search;
        let bb = opts.block_bytes;
        let mut data = AlignedBytes::with_capacity(nblocks * bb + SLACK);
        let mut ranks = Vec::with_capacity(nblocks + 1);
        let mut values = Vec::new();
        let mut scratch = vec![0u8; bb + SLACK];
        let mut total = 0usize;
        let mut last: Option<u64> = None;
        for (i, block) in blocks.into_iter().enumerate() {
            if i >= nblocks {
                return Err(Error::corrupt("run has more blocks than its header says"));
            }
            if block.len() != bb {
                return Err(Error::corrupt(format!(
                    "block {i} has {} bytes, expected {bb}",
                    block.len()
                )));
            }
            scratch[..bb].copy_from_slice(block);
            values.clear();
            Self::decode_block_checked(&scratch, bb, &huffman, opts.codec, &mut values)
                .map_err(|e| Error::corrupt(format!("block {i}: {e}")))?;
            if last.is_some_and(|l| values[0] <= l) {
                return Err(Error::corrupt(format!("block {i} does not follow its predecessor")));
            }
            last = values.last().copied();
            ranks.push(total as u32);
            total += values.len();
            data.extend_from_slice(block);
        }
        if ranks.len() != nblocks {
            return Err(Error::corrupt(format!(
                "run is truncated: {} of {nblocks} blocks",
                ranks.len()
            )));
        }
        if total != len {
            return Err(Error::corrupt(format!("run holds {total} values, header says {len}")));
        }
        ranks.push(total as u32);
        data.resize_zeroed(data.len() + SLACK);
        Ok(HxRun::assemble(opts, huffman, len, data, ranks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    fn sorted_random(n: usize, seed: u64) -> Vec<u64> {
        let mut r = SplitMix64::new(seed);
        let mut v: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

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

    fn clustered(n: usize, seed: u64) -> Vec<u64> {
        // Values packed in a few narrow ranges, plus extremes.
        let mut r = SplitMix64::new(seed);
        let mut v: Vec<u64> = (0..n)
            .map(|i| match i % 4 {
                0 => r.next_u64() >> 40,
                1 => 0xABCD_0000_0000_0000 | (r.next_u64() >> 48),
                2 => u64::MAX - (r.next_u64() >> 50),
                _ => r.next_u64(),
            })
            .collect();
        v.extend([0, 1, 2, u64::MAX]);
        v.sort_unstable();
        v.dedup();
        v
    }

    fn all_options() -> Vec<RunOptions> {
        let mut out = Vec::new();
        for codec in [Codec::Xor, Codec::Gap] {
            for block_bytes in [32, 100, 1024, 4096] {
                for search in [BlockSearch::Directory, BlockSearch::Interpolation] {
                    out.push(RunOptions { codec, block_bytes, search, ..RunOptions::default() });
                }
            }
        }
        out
    }

    #[test]
    fn round_trip_and_ranges() {
        for data in
            [sorted_random(5000, 1), clustered(5000, 2), vec![], vec![42], vec![0, u64::MAX]]
        {
            for opts in all_options() {
                let run = HxRun::encode(&data, opts).unwrap();
                assert_eq!(run.to_vec(), data, "{opts:?}");
                let back = HxRun::from_bytes(&run.to_bytes(), opts.search).unwrap();
                assert_eq!(back.to_vec(), data);
                assert_eq!(run.get(data.len()), None);
                // Range scans and ranks agree with the plain sorted list.
                let mut r = SplitMix64::new(9);
                for _ in 0..200 {
                    let (a, b) = (r.next_u64(), r.next_u64());
                    let (lo, hi) = (a.min(b), a.max(b) >> (r.below(60) as u32));
                    let mut got = Vec::new();
                    run.scan_range(lo, hi, |v, rank| {
                        assert_eq!(data[rank], v);
                        got.push(v);
                    });
                    let want: Vec<u64> =
                        data.iter().copied().filter(|&v| v >= lo && v <= hi).collect();
                    assert_eq!(got, want);
                }
                for (i, &v) in data.iter().enumerate().step_by(37) {
                    assert_eq!(run.rank_of(v), Some(i));
                    assert_eq!(run.get(i), Some(v));
                    if v > 0 && (i == 0 || data[i - 1] != v - 1) {
                        assert_eq!(run.rank_of(v - 1), None);
                    }
                }
            }
        }
    }

    #[test]
    fn lanes_match_plain_scans() {
        let data = [sorted_random(20_000, 31), clustered(20_000, 32)];
        for codec in [Codec::Xor, Codec::Gap] {
            let runs: Vec<HxRun> = data
                .iter()
                .map(|d| {
                    HxRun::encode(d, RunOptions { codec, block_bytes: 96, ..Default::default() })
                        .unwrap()
                })
                .collect();
            let mut r = SplitMix64::new(3);
            for _ in 0..300 {
                let k = r.below(40) as u32;
                let mut want = Vec::new();
                let mut lanes = Vec::new();
                for (t, run) in runs.iter().enumerate() {
                    for j in 0..3u32 {
                        let pq = r.next_u64();
                        let p = 4 + r.below(20) as u32;
                        let (lo, hi) = (pq & !(u64::MAX >> p), pq | (u64::MAX >> p));
                        let tag = t as u32 * 10 + j;
                        run.scan_range(lo, hi, |v, rank| {
                            if (v ^ pq).count_ones() <= k {
                                want.push((v, rank as u32, tag));
                            }
                        });
                        lanes.push(run.lane(lo, hi, pq, tag));
                    }
                }
                let mut got = Vec::new();
                scan_lanes(codec, &mut lanes, k, &mut got);
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn block_search_methods_agree() {
        for data in [sorted_random(20_000, 3), clustered(20_000, 4)] {
            let a =
                HxRun::encode(&data, RunOptions { block_bytes: 64, ..Default::default() }).unwrap();
            let mut b = a.clone();
            b.set_search(BlockSearch::Interpolation);
            let mut r = SplitMix64::new(5);
            for _ in 0..20_000 {
                let key = match r.below(3) {
                    0 => r.next_u64(),
                    1 => data[r.below(data.len() as u64) as usize],
                    _ => data[r.below(data.len() as u64) as usize].wrapping_add(1),
                };
                assert_eq!(a.block_for(key), b.block_for(key), "key {key:#x}");
                let blk = a.block_for(key);
                assert!(blk == 0 || a.key(blk) <= key);
                assert!(blk + 1 >= a.blocks() || a.key(blk + 1) > key);
            }
        }
    }

    #[test]
    fn rejects_unsorted_and_bad_options() {
        assert!(HxRun::encode(&[3, 2], RunOptions::default()).is_err());
        assert!(HxRun::encode(&[3, 3], RunOptions::default()).is_err());
        let bad = RunOptions { block_bytes: 8, ..Default::default() };
        assert!(HxRun::encode(&[1], bad).is_err());
    }

    #[test]
    fn compresses_near_the_floor() {
        let n = 200_000;
        let data = sorted_random(n, 11);
        let floor = 64.0 - (n as f64).log2() + 1.44;
        // Block headers, checksums, ranks, the directory and the 4 KiB decoding table add about
        // 1.2 bits a value at this size; XOR coding itself is about 2 bits above the floor.
        for (codec, slack) in [(Codec::Xor, 3.4), (Codec::Gap, 1.5)] {
            let run = HxRun::encode(&data, RunOptions { codec, ..Default::default() }).unwrap();
            let bits = run.heap_bytes() as f64 * 8.0 / n as f64;
            eprintln!("{codec:?}: {bits:.2} bits a value, floor {floor:.2}");
            assert!(bits < floor + slack, "{codec:?}: {bits:.2} bits vs floor {floor:.2}");
            assert!(bits > floor - 0.5, "{codec:?}: {bits:.2} is below the floor {floor:.2}?");
        }
    }

    #[test]
    fn every_corruption_is_an_error_never_a_panic() {
        let data = sorted_random(3000, 21);
        for codec in [Codec::Xor, Codec::Gap] {
            let run =
                HxRun::encode(&data, RunOptions { codec, block_bytes: 256, ..Default::default() })
                    .unwrap();
            let bytes = run.to_bytes();
            let mut r = SplitMix64::new(77);
            // Every single-bit flip in the header and in a sample of block bytes.
            let positions: Vec<usize> = (0..HEADER_BYTES * 8)
                .chain((0..4000).map(|_| r.below(bytes.len() as u64 * 8) as usize))
                .collect();
            for bit in positions {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(HxRun::from_bytes(&damaged, BlockSearch::Directory).is_err(), "bit {bit}");
            }
            // Truncation at every block boundary and in between.
            for cut in (0..bytes.len()).step_by(97) {
                assert!(HxRun::from_bytes(&bytes[..cut], BlockSearch::Directory).is_err());
            }
            // A block with a valid checksum but garbage content decodes to an error.
            let mut forged = bytes.clone();
            let b0 = HEADER_BYTES;
            for (i, x) in forged[b0 + 12..b0 + 252].iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(151).wrapping_add(7);
            }
            let crc = crc32fast::hash(&forged[b0..b0 + 252]);
            forged[b0 + 252..b0 + 256].copy_from_slice(&crc.to_le_bytes());
            assert!(HxRun::from_bytes(&forged, BlockSearch::Directory).is_err());
        }
    }

    #[test]
    fn unknown_version_is_reported() {
        let run = HxRun::encode(&[1, 2, 3], RunOptions::default()).unwrap();
        let mut bytes = run.to_bytes();
        bytes[4] = 9;
        let crc = crc32fast::hash(&bytes[..HEADER_BYTES - 4]);
        bytes[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            HxRun::from_bytes(&bytes, BlockSearch::Directory).unwrap_err(),
            Error::UnsupportedVersion { found: 9, supported: 1 }
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_sets_round_trip(
            mut v in proptest::collection::vec(proptest::num::u64::ANY, 0..600),
            bb in 32usize..300,
            gap in proptest::bool::ANY,
        ) {
            v.sort_unstable();
            v.dedup();
            let opts = RunOptions { codec: if gap { Codec::Gap } else { Codec::Xor }, block_bytes: bb, ..Default::default() };
            let run = HxRun::encode(&v, opts).unwrap();
            proptest::prop_assert_eq!(run.to_vec(), v.clone());
            let back = HxRun::from_bytes(&run.to_bytes(), BlockSearch::Interpolation).unwrap();
            proptest::prop_assert_eq!(back.to_vec(), v);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2000)) {
            let _ = HxRun::from_bytes(&bytes, BlockSearch::Directory);
        }
    }
}
