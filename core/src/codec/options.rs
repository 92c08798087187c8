//! The choices a table is encoded with: [`Codec`], [`BlockSearch`], [`Layout`] and the
//! [`TableOptions`] that hold them.
//!
//! Kept apart from the encoders because every caller that configures an index names these
//! and nothing else of the codec; each parses from the word the command line uses.

use crate::error::{Error, Result};

/// Smallest and largest block sizes.
pub(super) const MIN_BLOCK: usize = 32;
pub(super) const MAX_BLOCK: usize = 8192;

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
    pub(super) fn to_byte(self) -> u8 {
        match self {
            Codec::Xor => 0,
            Codec::Gap => 1,
        }
    }

    pub(super) fn from_byte(b: u8) -> Result<Codec> {
        match b {
            0 => Ok(Codec::Xor),
            1 => Ok(Codec::Gap),
            _ => Err(Error::corrupt(format!("unknown codec {b}"))),
        }
    }

    /// The value after `prev` from its delta word (see [`Code::delta`]).
    #[inline(always)]
    pub(super) fn apply(self, prev: u64, delta: u64) -> u64 {
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

/// How a table is laid out in memory: the one layout choice of the crate (the memory
/// estimates of [`LayoutCost`](crate::design::LayoutCost) derive from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// Huffman-XOR blocks ([`HxTable`](crate::codec::HxTable)), coded with [`TableOptions::codec`]. The default.
    #[default]
    Blocks,
    /// Fixed-width low bits under a top-bits directory
    /// ([`PackedTable`](crate::codec::PackedTable)): a few bits a value larger than the
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

/// Options for encoding a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableOptions {
    /// Value coding of the blocks (stored tables, and in memory with [`Layout::Blocks`]).
    pub codec: Codec,
    /// Block size in bytes (32 ..= 8192).
    pub block_bytes: usize,
    /// Block lookup method.
    pub search: BlockSearch,
    /// In-memory layout of an index's tables.
    pub layout: Layout,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            codec: Codec::Xor,
            block_bytes: 1024,
            search: BlockSearch::Directory,
            layout: Layout::Blocks,
        }
    }
}

impl TableOptions {
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
