//! # neardup-core
//!
//! The pure engine of neardup, a near-duplicate detection service for web-scale crawling.
//! No network and no files: callers hand in bytes and get bytes back.
//!
//! The method is Manku, Jain & Das Sarma, *Detecting Near-Duplicates for Web Crawling*
//! (WWW 2007), on Charikar's simhash:
//!
//! 1. [`fingerprint`]: text to a 64-bit simhash; similar texts get fingerprints a few bits
//!    apart.
//! 2. [`design`] and [`permute`]: the permuted tables that find every stored fingerprint within
//!    Hamming distance `k` of a query by exact matches on leading bits.
//! 3. [`codec`]: sorted tables kept as Huffman-XOR compressed blocks.
//! 4. [`index`]: the exact, updatable in-memory index over documents (id, fingerprint,
//!    timestamp), with a write buffer, immutable runs and merges.
//! 5. [`cluster`]: duplicate clusters and the original of each, from near-duplicate pairs.
//! 6. [`sketch`]: a MinHash sketch of a text's word 3-grams (66 bytes; small sets kept
//!    whole), to verify candidates by their Jaccard similarity.
//!
//! ```
//! use neardup_core::{Doc, Index, IndexConfig};
//!
//! let mut index = Index::new(IndexConfig::default()).unwrap();
//! index.insert(Doc { id: 1, fp: 0xDEAD_BEEF_0000_0000, ts: 10 }).unwrap();
//! index.insert(Doc { id: 2, fp: 0xDEAD_BEEF_0000_0007, ts: 20 }).unwrap(); // 3 bits away
//! let hits = index.query(0xDEAD_BEEF_0000_0000, 3).unwrap();
//! assert_eq!(hits.iter().map(|m| (m.id, m.distance)).collect::<Vec<_>>(), [(1, 0), (2, 3)]);
//! ```
#![deny(missing_docs)]

pub mod cluster;
pub mod codec;
pub mod design;
pub mod error;
pub mod fingerprint;
pub mod index;
pub mod permute;
pub mod sketch;
pub mod util;

pub use design::Design;
pub use error::{Error, ErrorKind, Result};
pub use index::{Doc, Index, IndexConfig, Match};
