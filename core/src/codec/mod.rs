//! Huffman-XOR compressed runs of sorted 64-bit values.
//!
//! A table of the index is a sorted list of distinct permuted fingerprints. Stored whole it
//! costs 64 bits a value; the information-theoretic floor for `n` random values is about
//! `64 - log2 n + 1.44` bits. Following Manku et al., a run is cut into fixed-size blocks
//! (1 KiB by default). A block keeps its first value whole; each next value is the canonical
//! Huffman code of `h`, the position of the most significant 1-bit of its XOR with the
//! predecessor, followed by the `h` bits below that 1-bit. That lands about two bits above
//! the floor. [`Codec::Gap`] codes the difference to the predecessor the same way instead of
//! the XOR, which lands within about 0.1 bit of the floor at the same decoding cost; it is an
//! option, the XOR code is the default.
//!
//! Each block carries a CRC-32 and the run header a format version; [`HxRun::from_bytes`]
//! verifies everything and rejects what it does not understand. A block's first value is its
//! key, read from the block itself; a lookup finds the block it decodes through a directory
//! on the top bits of the keys, or by interpolation over them ([`BlockSearch`]).
//!
//! In memory, a table may instead be a [`PackedRun`] ([`Layout::Packed`]): the bits below a
//! top-bits directory, fixed-width, for lookups that decode nothing. [`SortedRun`] is either.

mod aligned;
mod directory;
mod huffman;
mod packed;
mod run;
mod sorted;

pub use huffman::{Huffman, MAX_CODE_LEN};
pub use packed::PackedRun;
pub(crate) use packed::{bits_per_value as packed_bits_per_value, dir_bits as packed_dir_bits};
pub use run::{
    BlockSearch, Codec, FORMAT_VERSION, HEADER_BYTES, HxRun, Lane, Layout, NO_RANK, RunOptions,
    scan_lanes,
};
pub use sorted::SortedRun;
