//! Huffman-XOR compressed tables of sorted 64-bit values.
//!
//! A table of the index is a sorted list of distinct permuted fingerprints. Stored whole it
//! costs 64 bits a value; the information-theoretic floor for `n` random values is about
//! `64 - log2 n + 1.44` bits. Following Manku et al., a table is cut into fixed-size blocks
//! (1 KiB by default). A block keeps its first value whole; each next value is the canonical
//! Huffman code of `h`, the position of the most significant 1-bit of its XOR with the
//! predecessor, followed by the `h` bits below that 1-bit. That lands about two bits above
//! the floor. [`Codec::Gap`] codes the difference to the predecessor the same way instead of
//! the XOR, which lands within about 0.1 bit of the floor at the same decoding cost; it is an
//! option, the XOR code is the default.
//!
//! Each block carries a CRC-32 and the table header a format version;
//! [`HxTable::from_bytes`] verifies everything and rejects what it does not understand. A
//! block's first value is its key, read from the block itself; a lookup finds the block it
//! decodes through a directory on the top bits of the keys, or by interpolation over them
//! ([`BlockSearch`]).
//!
//! In memory, a table may instead be a [`PackedTable`] ([`Layout::Packed`]): the bits below a
//! top-bits directory, fixed-width, for lookups that decode nothing. [`EncodedTable`] is
//! either.
//!
//! (A *run*, in this crate, is the index's immutable batch of documents; each run holds one
//! encoded table per permutation.)

mod aligned;
mod directory;
mod encoded_table;
mod huffman;
mod hx_block;
mod hx_encode;
mod hx_format;
mod hx_lanes;
mod hx_table;
mod options;
mod packed_table;

pub use encoded_table::EncodedTable;
pub use huffman::{Huffman, MAX_CODE_LEN};
pub use hx_format::{FORMAT_VERSION, HEADER_BYTES};
pub use hx_lanes::{Lane, scan_lanes};
pub use hx_table::{HxTable, NO_RANK};
pub use options::{BlockSearch, Codec, Layout, TableOptions};
pub use packed_table::PackedTable;
pub(crate) use packed_table::{
    bits_per_value as packed_bits_per_value, dir_bits as packed_dir_bits,
};

/// A value a table probe found within `k` of the query: what [`scan_lanes`] and the probes of
/// both layouts report. The same 16 bytes as the `(u64, u32, u32)` it names, ordered as that
/// tuple was (by value, then rank, then probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableHit {
    /// The value, in the probed table's (permuted) order.
    pub value: u64,
    /// Its rank (position in sorted order) in the table, or [`NO_RANK`] when the table keeps
    /// no ranks (or the hit came from a sub-index, which the index layer reports so).
    pub rank: u32,
    /// The caller's number for the probe that found it ([`HxTable::lane`]'s `probe`): the
    /// index passes the position of the table among those a query probes.
    pub probe: u32,
}
