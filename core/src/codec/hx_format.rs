//! The stored form of an [`HxTable`]: the header (magic, format version, codec, block size,
//! counts, Huffman code lengths), the block layout and the CRC-32s, written by
//! [`HxTable::to_bytes`] and read back, verified, by [`HxTable::from_bytes`]. The format is
//! specified in `docs/run-format.md`; a reader refuses what it does not understand.

use crate::codec::aligned::AlignedBytes;
use crate::codec::huffman::{Huffman, MAX_CODE_LEN, SYMBOLS};
use crate::codec::hx_block::read_bits;
use crate::codec::hx_table::HxTable;
use crate::codec::options::{BlockSearch, Codec, TableOptions};
use crate::error::{Error, Result};

/// Format version written in every table header; readers refuse any other.
pub const FORMAT_VERSION: u16 = 1;
const MAGIC: [u8; 4] = *b"NDHX";
/// Size of a serialized table header.
pub const HEADER_BYTES: usize = 4 + 2 + 1 + 1 + 4 + 4 + 8 + SYMBOLS + 4;
/// Bytes at the start of a block: first value (u64), value count (u16), bits of the code
/// stream (u16).
pub(super) const BLOCK_HEAD: usize = 12;
/// Most values one block holds (its count is a u16).
pub(super) const MAX_BLOCK_ENTRIES: u32 = u16::MAX as u32;
/// Bytes at the end of a block: CRC-32 of everything before it.
pub(super) const BLOCK_TAIL: usize = 4;
/// Extra zero bytes after the last block, so 16-byte loads near the end stay in bounds.
pub(super) const SLACK: usize = 16;

impl HxTable {
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

    /// The whole table as bytes: header, then every block.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.data.len());
        out.extend_from_slice(&self.header_bytes());
        out.extend_from_slice(&self.data[..self.data.len() - SLACK]);
        out
    }

    /// Reads a table written by [`to_bytes`](Self::to_bytes), verifying the header, every
    /// block checksum and every value. `search` is the lookup method to use in memory.
    pub fn from_bytes(bytes: &[u8], search: BlockSearch) -> Result<HxTable> {
        if bytes.len() < HEADER_BYTES {
            return Err(Error::corrupt("table is shorter than its header"));
        }
        let (header, body) = bytes.split_at(HEADER_BYTES);
        let bb = Self::parse_header(header)?.1.block_bytes;
        if body.len() % bb != 0 {
            return Err(Error::corrupt("table body is not a whole number of blocks"));
        }
        Self::from_parts(header, body.chunks(bb), search)
    }

    /// Parses a header into (blocks, options, len, Huffman code).
    fn parse_header(h: &[u8]) -> Result<(usize, TableOptions, usize, Huffman)> {
        if h.len() != HEADER_BYTES {
            return Err(Error::corrupt("table header has the wrong size"));
        }
        if h[0..4] != MAGIC {
            return Err(Error::corrupt("not a neardup table (bad magic)"));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        let stored = u32::from_le_bytes(h[HEADER_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32fast::hash(&h[..HEADER_BYTES - 4]) != stored {
            return Err(Error::corrupt("table header checksum mismatch"));
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
        let opts = TableOptions { codec, block_bytes, ..TableOptions::default() };
        opts.validate().map_err(|e| Error::corrupt(format!("table header: {e}")))?;
        if len > u32::MAX as usize || blocks > len {
            return Err(Error::corrupt("table header counts are impossible"));
        }
        Ok((blocks, opts, len, huffman))
    }

    /// Rebuilds a table from its header and its blocks (as stored one by one), verifying
    /// everything.
    pub fn from_parts<'a>(
        header: &[u8],
        blocks: impl IntoIterator<Item = &'a [u8]>,
        search: BlockSearch,
    ) -> Result<HxTable> {
        let (nblocks, mut opts, len, huffman) = Self::parse_header(header)?;
        opts.search = search;
        let bb = opts.block_bytes;
        // The header's block count is not trusted with memory before the blocks are there:
        // room for at most the blocks the iterator says it holds (damaged headers of a few
        // bytes asked for gigabytes).
        let blocks = blocks.into_iter();
        let (at_least, at_most) = blocks.size_hint();
        let room = nblocks.min(at_most.unwrap_or(at_least));
        let mut data = AlignedBytes::with_capacity(room * bb + SLACK);
        let mut ranks = Vec::with_capacity(room + 1);
        let mut values = Vec::new();
        let mut scratch = vec![0u8; bb + SLACK];
        let mut total = 0usize;
        let mut last: Option<u64> = None;
        for (i, block) in blocks.enumerate() {
            if i >= nblocks {
                return Err(Error::corrupt("table has more blocks than its header says"));
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
                "table is truncated: {} of {nblocks} blocks",
                ranks.len()
            )));
        }
        if total != len {
            return Err(Error::corrupt(format!("table holds {total} values, header says {len}")));
        }
        ranks.push(total as u32);
        data.resize_zeroed(data.len() + SLACK);
        Ok(HxTable::assemble(opts, huffman, len, data, ranks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::hx_table::samples::sorted_random;
    use crate::util::SplitMix64;

    #[test]
    fn every_corruption_is_an_error_never_a_panic() {
        let data = sorted_random(3000, 21);
        for codec in [Codec::Xor, Codec::Gap] {
            let table = HxTable::encode(
                &data,
                TableOptions { codec, block_bytes: 256, ..Default::default() },
            )
            .unwrap();
            let bytes = table.to_bytes();
            let mut r = SplitMix64::new(77);
            // Every single-bit flip in the header and in a sample of block bytes.
            let positions: Vec<usize> = (0..HEADER_BYTES * 8)
                .chain((0..4000).map(|_| r.below(bytes.len() as u64 * 8) as usize))
                .collect();
            for bit in positions {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    HxTable::from_bytes(&damaged, BlockSearch::Directory).is_err(),
                    "bit {bit}"
                );
            }
            // Truncation at every block boundary and in between.
            for cut in (0..bytes.len()).step_by(97) {
                assert!(HxTable::from_bytes(&bytes[..cut], BlockSearch::Directory).is_err());
            }
            // A block with a valid checksum but garbage content decodes to an error.
            let mut forged = bytes.clone();
            let b0 = HEADER_BYTES;
            for (i, x) in forged[b0 + 12..b0 + 252].iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(151).wrapping_add(7);
            }
            let crc = crc32fast::hash(&forged[b0..b0 + 252]);
            forged[b0 + 252..b0 + 256].copy_from_slice(&crc.to_le_bytes());
            assert!(HxTable::from_bytes(&forged, BlockSearch::Directory).is_err());
        }
    }

    /// Found by the `hx_table` fuzz target (`fuzz/`): a header with a valid checksum that
    /// claims 620,756,993 blocks of 32 bytes before one block made the reader reserve ~19 GB.
    /// It must be refused as truncated, reserving only what the blocks there need.
    #[test]
    fn fuzz_header_claiming_huge_block_count_is_an_error() {
        let bytes: [u8; 124] = [
            78, 68, 72, 88, 1, 0, 0, 0, 32, 0, 0, 0, 1, 0, 0, 37, 1, 0, 0, 128, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 252, 84, 227, 213, 147, 69, 30, 190, 60, 6, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 112, 146, 28, 158,
        ];
        let err = HxTable::from_bytes(&bytes, BlockSearch::Directory).unwrap_err();
        assert!(err.to_string().contains("block"), "{err}");
    }

    #[test]
    fn unknown_version_is_reported() {
        let table = HxTable::encode(&[1, 2, 3], TableOptions::default()).unwrap();
        let mut bytes = table.to_bytes();
        bytes[4] = 9;
        let crc = crc32fast::hash(&bytes[..HEADER_BYTES - 4]);
        bytes[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            HxTable::from_bytes(&bytes, BlockSearch::Directory).unwrap_err(),
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
            let opts = TableOptions { codec: if gap { Codec::Gap } else { Codec::Xor }, block_bytes: bb, ..Default::default() };
            let table = HxTable::encode(&v, opts).unwrap();
            proptest::prop_assert_eq!(table.to_vec(), v.clone());
            let back = HxTable::from_bytes(&table.to_bytes(), BlockSearch::Interpolation).unwrap();
            proptest::prop_assert_eq!(back.to_vec(), v);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2000)) {
            let _ = HxTable::from_bytes(&bytes, BlockSearch::Directory);
        }
    }
}
