//! Simhash fingerprints of text: "neardup fingerprint v1", specified in
//! `docs/fingerprint.md`.
//!
//! This module exists so that every part of neardup (the shard servers, the router, the
//! command line, the quality evaluation) turns a page's text into the same 64-bit
//! fingerprint: stored fingerprints are compared with fingerprints computed later, possibly
//! by another program, so the computation is pinned down by a written, versioned spec and by
//! test vectors produced by an independent reference implementation
//! (`docs/fingerprint_reference.py`).
//!
//! The pipeline (Charikar's simhash, as in Manku, Jain & Das Sarma, WWW 2007):
//!
//! 1. normalise: code points unassigned in Unicode 16.0 become spaces, then NFKC, then the
//!    full per-code-point lowercase mapping;
//! 2. tokenise: maximal runs of letters, marks and numbers are word tokens, except that
//!    characters of scripts written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar;
//!    optionally Hangul) each stand alone;
//! 3. features: word n-gram shingles over the word tokens plus character n-grams over the
//!    spaceless characters, weighted by term frequency (optionally times an integer IDF);
//! 4. each distinct feature is hashed once (MD5, low 64 bits little-endian; or xxh3-64);
//! 5. per bit, the weights of features with the bit set minus those without; the
//!    fingerprint bit is 1 iff that sum is positive.
//!
//! Alongside, [`DocFingerprint::content_hash`] identifies exact duplicates up to case,
//! whitespace, punctuation and Unicode form.
//!
//! ```
//! use neardup_core::fingerprint::{Fingerprinter, FingerprintConfig};
//! use neardup_core::util::hamming;
//!
//! let mut fp = Fingerprinter::new(FingerprintConfig::default()).unwrap();
//! let a = fp.fingerprint_doc("The quick brown fox jumps over the lazy dog.").unwrap();
//! let b = fp.fingerprint_doc("the QUICK brown fox -- jumps over the lazy dog").unwrap();
//! assert_eq!(a.simhash, b.simhash);
//! assert_eq!(a.content_hash, b.content_hash);
//! let c = fp.fingerprint("The quick brown fox jumps over the lazy cat.").unwrap();
//! assert!(hamming(a.simhash, c) < 32);
//! ```

mod bits;
mod md5_lanes;
pub mod naive;
mod text;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use xxhash_rust::xxh3::{Xxh3Builder, xxh3_64, xxh3_128};

use crate::{Error, Result};
pub use text::{HANGUL_RANGES, SPACELESS_RANGES, UNICODE_VERSION, VARIATION_SELECTORS};
use text::{Tokens, for_each_ngram};

/// The version of the fingerprint computation this module implements. Any change that can
/// alter a fingerprint or a content hash for some input bumps it.
pub const FINGERPRINT_VERSION: u32 = 1;

/// The largest n accepted for word and character n-grams.
pub const MAX_NGRAM: usize = 16;

/// The 64-bit hash applied to each feature's UTF-8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FeatureHash {
    /// MD5, the low 64 bits of the digest read little-endian
    /// (`u64::from_le_bytes(digest[0..8])`), as in the reference description of the method.
    #[default]
    Md5,
    /// xxh3-64 with seed 0: much faster, equally well mixed for this purpose.
    Xxh3,
}

/// What to extract from text and how to hash it. Two fingerprints are comparable only when
/// made with equal configurations (and equal IDF tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FingerprintConfig {
    /// n of the word n-gram shingles (1..=[`MAX_NGRAM`]).
    pub word_ngram: usize,
    /// n of the character n-grams over spaceless scripts (1..=[`MAX_NGRAM`]).
    pub char_ngram: usize,
    /// The feature hash.
    pub hash: FeatureHash,
    /// Treat Hangul as a script without spaces (character n-grams) instead of as words.
    pub hangul_as_chars: bool,
}

impl Default for FingerprintConfig {
    /// Word 2-grams, character 2-grams, MD5, Hangul as words: chosen from measured precision
    /// and recall on real text (`docs/quality.md`).
    fn default() -> Self {
        FingerprintConfig {
            word_ngram: 2,
            char_ngram: 2,
            hash: FeatureHash::Md5,
            hangul_as_chars: false,
        }
    }
}

impl FingerprintConfig {
    /// Checks that both n are in `1..=MAX_NGRAM`.
    pub fn validate(&self) -> Result<()> {
        for (name, n) in [("word_ngram", self.word_ngram), ("char_ngram", self.char_ngram)] {
            if !(1..=MAX_NGRAM).contains(&n) {
                return Err(Error::InvalidConfig(format!(
                    "{name} = {n}; it must be between 1 and {MAX_NGRAM}"
                )));
            }
        }
        Ok(())
    }
}

/// An inverse-document-frequency table: integer weights for feature strings (as
/// [`Fingerprinter::features`] shows them), and a default for features not in the table.
/// A feature's weight is its count in the document times its IDF weight.
///
/// Weights are integers so that fingerprints are exactly reproducible; quantise real IDF
/// values yourself (for example `round(idf * 100)`), and record how, next to the table.
#[derive(Debug, Clone)]
pub struct Idf {
    weights: HashMap<Box<[u8]>, u32, Xxh3Builder>,
    default: u32,
}

impl Idf {
    /// An empty table whose every feature weighs `default`.
    pub fn new(default: u32) -> Self {
        Idf { weights: HashMap::with_hasher(Xxh3Builder::new()), default }
    }

    /// Sets the weight of one feature (a normalised feature string: tokens joined by one
    /// space, or characters).
    pub fn insert(&mut self, feature: &str, weight: u32) {
        self.weights.insert(feature.as_bytes().into(), weight);
    }

    /// The weight of `feature`: its entry, or the default.
    pub fn get(&self, feature: &str) -> u32 {
        self.get_bytes(feature.as_bytes())
    }

    fn get_bytes(&self, feature: &[u8]) -> u32 {
        self.weights.get(feature).copied().unwrap_or(self.default)
    }

    /// The weight of features not in the table.
    pub fn default_weight(&self) -> u32 {
        self.default
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

/// Everything computed for one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DocFingerprint {
    /// The 64-bit simhash.
    pub simhash: u64,
    /// xxh3-128 of the normalised units (word tokens and spaceless characters) joined by
    /// single spaces: equal for texts that differ only in case, whitespace, punctuation or
    /// Unicode form.
    pub content_hash: u128,
    /// Number of units: word tokens plus spaceless characters.
    pub tokens: usize,
    /// Number of feature occurrences (word n-grams plus character n-grams).
    pub features: usize,
    /// Number of distinct features, each hashed once.
    pub distinct_features: usize,
}

/// One distinct feature of a document, for debugging and for building IDF tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    /// The feature's string: word tokens joined by one space, or spaceless characters.
    pub text: String,
    /// How often it occurs in the document.
    pub count: u64,
    /// Its weight: `count` times its IDF weight (1 without a table), saturating.
    pub weight: u64,
    /// Its 64-bit feature hash.
    pub hash: u64,
}

/// Nanoseconds spent in each phase of one [`Fingerprinter::fingerprint_doc_timed`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Normalisation and tokenisation.
    pub tokenise_ns: u64,
    /// Building features and counting the distinct ones (includes the xxh3 key hash).
    pub count_ns: u64,
    /// Feature hashing (MD5; near zero for xxh3, whose key hash is reused).
    pub hash_ns: u64,
    /// Weighting, bit sums and the content hash.
    pub accumulate_ns: u64,
}

/// A slot of the counting table: the xxh3-64 key of a feature and the index + 1 of its
/// entry (0 = empty), so that probing past other keys touches no entry.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    entry: usize,
}

/// Where a distinct feature's bytes are, its count and (once hashed) its feature hash.
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: usize,
    end: usize,
    chars: bool,
    count: u64,
    hash: u64,
}

/// Computes fingerprints, reusing its buffers from one document to the next. Make one per
/// thread (it is `Send`; it is not shared).
#[derive(Debug)]
pub struct Fingerprinter {
    config: FingerprintConfig,
    idf: Option<Arc<Idf>>,
    tokens: Tokens,
    entries: Vec<Entry>,
    /// Open-addressing table over `entries`, keyed by xxh3-64.
    slots: Vec<Slot>,
    occurrences: usize,
    #[cfg(test)]
    hash_calls: usize,
}

impl Fingerprinter {
    /// A fingerprinter for `config`, weighting features by term frequency.
    pub fn new(config: FingerprintConfig) -> Result<Self> {
        config.validate()?;
        Ok(Fingerprinter {
            config,
            idf: None,
            tokens: Tokens::default(),
            entries: Vec::new(),
            slots: Vec::new(),
            occurrences: 0,
            #[cfg(test)]
            hash_calls: 0,
        })
    }

    /// A fingerprinter for `config` weighting features by term frequency times `idf`.
    pub fn with_idf(config: FingerprintConfig, idf: Arc<Idf>) -> Result<Self> {
        let mut f = Self::new(config)?;
        f.idf = Some(idf);
        Ok(f)
    }

    /// The configuration.
    pub fn config(&self) -> &FingerprintConfig {
        &self.config
    }

    /// The 64-bit simhash of `text`; [`Error::EmptyDocument`] if it has no features.
    pub fn fingerprint(&mut self, text: &str) -> Result<u64> {
        Ok(self.fingerprint_doc(text)?.simhash)
    }

    /// Simhash, content hash and counts of `text`; [`Error::EmptyDocument`] if it has no
    /// features (no letters, marks or numbers).
    pub fn fingerprint_doc(&mut self, text: &str) -> Result<DocFingerprint> {
        self.tokens.tokenise(text, self.config.hangul_as_chars);
        self.count_features();
        self.hash_features();
        self.finish()
    }

    /// Like [`fingerprint_doc`](Self::fingerprint_doc), also timing each phase (for
    /// benchmarks; the timer costs well under a microsecond per document).
    pub fn fingerprint_doc_timed(&mut self, text: &str) -> Result<(DocFingerprint, PhaseTimes)> {
        let t0 = Instant::now();
        self.tokens.tokenise(text, self.config.hangul_as_chars);
        let t1 = Instant::now();
        self.count_features();
        let t2 = Instant::now();
        self.hash_features();
        let t3 = Instant::now();
        let doc = self.finish()?;
        let t4 = Instant::now();
        let ns = |a: Instant, b: Instant| (b - a).as_nanos() as u64;
        Ok((
            doc,
            PhaseTimes {
                tokenise_ns: ns(t0, t1),
                count_ns: ns(t1, t2),
                hash_ns: ns(t2, t3),
                accumulate_ns: ns(t3, t4),
            },
        ))
    }

    /// The content hash alone (see [`DocFingerprint::content_hash`]); [`Error::EmptyDocument`]
    /// if the text has no units.
    pub fn content_hash(&mut self, text: &str) -> Result<u128> {
        self.tokens.tokenise(text, self.config.hangul_as_chars);
        if self.tokens.unit_count() == 0 {
            return Err(Error::EmptyDocument);
        }
        Ok(xxh3_128(self.tokens.units().0))
    }

    /// The sorted, distinct xxh3-64 hashes of the n-gram shingles over the normalised units
    /// (word tokens and spaceless characters, joined by single spaces; one shingle of all
    /// units when there are fewer than `n`): the sets whose Jaccard similarity is the ground
    /// truth for near-duplicate quality. Empty for a text without units;
    /// [`Error::InvalidConfig`] if `n` is 0.
    pub fn word_shingles(&mut self, text: &str, n: usize) -> Result<Vec<u64>> {
        if n == 0 {
            return Err(Error::InvalidConfig("shingle n must be at least 1".into()));
        }
        self.tokens.tokenise(text, self.config.hangul_as_chars);
        let (units, starts) = self.tokens.units();
        let mut out = Vec::with_capacity(starts.len());
        for_each_ngram(starts, units.len(), n, 1, |s, e| out.push(xxh3_64(&units[s..e])));
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The distinct features of `text` with counts, weights and hashes: word n-grams first,
    /// then character n-grams, each in order of first occurrence.
    /// [`Error::EmptyDocument`] if there are none.
    pub fn features(&mut self, text: &str) -> Result<Vec<Feature>> {
        self.tokens.tokenise(text, self.config.hangul_as_chars);
        self.count_features();
        if self.entries.is_empty() {
            return Err(Error::EmptyDocument);
        }
        self.hash_features();
        let idf = self.idf.clone();
        Ok(self
            .entries
            .iter()
            .map(|e| {
                let bytes = self.bytes_of(e);
                let w = idf.as_ref().map_or(1, |t| t.get_bytes(bytes)) as u64;
                Feature {
                    text: String::from_utf8_lossy(bytes).into_owned(),
                    count: e.count,
                    weight: e.count.saturating_mul(w),
                    hash: e.hash,
                }
            })
            .collect())
    }

    #[inline]
    fn bytes_of(&self, e: &Entry) -> &[u8] {
        let arena = if e.chars { &self.tokens.chars } else { &self.tokens.words };
        &arena[e.start..e.end]
    }

    /// Builds every feature occurrence and counts the distinct ones into `entries`.
    fn count_features(&mut self) {
        let t = &self.tokens;
        let (wn, cn) = (self.config.word_ngram, self.config.char_ngram);
        let windows = |m: usize, n: usize| if m == 0 { 0 } else { m.saturating_sub(n) + 1 };
        let total = windows(t.word_starts.len(), wn) + windows(t.char_starts.len(), cn);
        self.occurrences = total;
        self.entries.clear();
        // At most half full: no resizing while counting.
        let cap = (total.max(4) * 2).next_power_of_two();
        self.slots.clear();
        self.slots.resize(cap, Slot::default());
        let mask = cap - 1;
        let entries = &mut self.entries;
        let slots = &mut self.slots;
        let mut insert = |arena: &[u8], chars: bool, s: usize, e: usize| {
            let bytes = &arena[s..e];
            let key = xxh3_64(bytes);
            let mut i = key as usize & mask;
            loop {
                let slot = slots[i];
                if slot.entry == 0 {
                    entries.push(Entry { start: s, end: e, chars, count: 1, hash: key });
                    slots[i] = Slot { key, entry: entries.len() };
                    return;
                }
                if slot.key == key {
                    // Compare the bytes (a 64-bit collision must not merge two features);
                    // the entry's string may even be in the other arena.
                    let en = &mut entries[slot.entry - 1];
                    let their = if en.chars { &t.chars } else { &t.words };
                    if their[en.start..en.end] == *bytes {
                        en.count += 1;
                        return;
                    }
                }
                i = (i + 1) & mask;
            }
        };
        for_each_ngram(&t.word_starts, t.words.len(), wn, 1, |s, e| insert(&t.words, false, s, e));
        for_each_ngram(&t.char_starts, t.chars.len(), cn, 0, |s, e| insert(&t.chars, true, s, e));
    }

    /// Sets each distinct entry's feature hash (already the key for xxh3).
    fn hash_features(&mut self) {
        if self.config.hash != FeatureHash::Md5 {
            return;
        }
        #[cfg(test)]
        {
            self.hash_calls += self.entries.len();
        }
        // 64 bytes of padding after each arena let every short feature be read as a fixed
        // 64-byte window (see `md5_lanes::block_from_window`).
        const PAD: [u8; 64] = [0; 64];
        let (words_len, chars_len) = (self.tokens.words.len(), self.tokens.chars.len());
        self.tokens.words.extend_from_slice(&PAD);
        self.tokens.chars.extend_from_slice(&PAD);
        let t = &self.tokens;
        let arena = |e: &Entry| if e.chars { &t.chars } else { &t.words };
        let mut blocks = [[0u32; 16]; md5_lanes::LANES];
        let mut batch = [0usize; md5_lanes::LANES];
        let mut filled = 0;
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            let len = e.end - e.start;
            if len <= md5_lanes::MAX_LEN {
                let a = arena(e);
                blocks[filled] = match a.get(e.start..e.start + 64) {
                    Some(w) => md5_lanes::block_from_window(w.try_into().unwrap_or(&PAD), len),
                    None => md5_lanes::block_from_msg(&a[e.start..e.end]),
                };
                batch[filled] = i;
                filled += 1;
                if filled == md5_lanes::LANES {
                    let out = md5_lanes::md5_low64_blocks(&blocks);
                    for (&j, &h) in batch.iter().zip(out.iter()) {
                        self.entries[j].hash = h;
                    }
                    filled = 0;
                }
            } else {
                self.entries[i].hash = md5_lanes::md5_low64(&arena(e)[e.start..e.end]);
            }
        }
        if filled > 0 {
            let out = md5_lanes::md5_low64_blocks(&blocks);
            for (&j, &h) in batch[..filled].iter().zip(out.iter()) {
                self.entries[j].hash = h;
            }
        }
        self.tokens.words.truncate(words_len);
        self.tokens.chars.truncate(chars_len);
    }

    /// Weights, bit sums, signs and the content hash.
    fn finish(&mut self) -> Result<DocFingerprint> {
        if self.entries.is_empty() {
            return Err(Error::EmptyDocument);
        }
        let simhash = match &self.idf {
            None => signs_tf(&self.entries),
            Some(idf) => {
                let t = &self.tokens;
                signs_weighted(self.entries.iter().map(|e| {
                    let arena = if e.chars { &t.chars } else { &t.words };
                    let w = idf.get_bytes(&arena[e.start..e.end]) as u128;
                    (e.hash, e.count as u128 * w)
                }))
            }
        };
        Ok(DocFingerprint {
            simhash,
            content_hash: xxh3_128(self.tokens.units().0),
            tokens: self.tokens.unit_count(),
            features: self.occurrences,
            distinct_features: self.entries.len(),
        })
    }
}

/// Sign rule with term-frequency weights: bit i is 1 iff the weights of features with bit i
/// set outweigh those without, i.e. `2 * pos[i] > total`. Counts fit in u64 (at most the
/// number of features); weight-1 features are counted bit-sliced.
fn signs_tf(entries: &[Entry]) -> u64 {
    let mut counter = bits::BitCounter::new();
    let mut total: u64 = 0;
    for e in entries {
        total += e.count;
        if e.count == 1 {
            counter.add_one(e.hash);
        } else {
            counter.add(e.hash, e.count);
        }
    }
    let pos = counter.finish();
    let mut fp = 0u64;
    for (i, &p) in pos.iter().enumerate() {
        fp |= (((p as u128) * 2 > total as u128) as u64) << i;
    }
    fp
}

/// Sign rule with arbitrary weights (tf × idf), in u128 so that no weight can overflow.
fn signs_weighted(features: impl Iterator<Item = (u64, u128)>) -> u64 {
    let mut pos = [0u128; 64];
    let mut total: u128 = 0;
    for (h, w) in features {
        total = total.saturating_add(w);
        for (i, p) in pos.iter_mut().enumerate() {
            *p = p.saturating_add(((h >> i) & 1) as u128 * w);
        }
    }
    let mut fp = 0u64;
    for (i, &p) in pos.iter().enumerate() {
        // 2p > total, without overflowing 2p.
        fp |= ((p > total - p) as u64) << i;
    }
    fp
}

#[cfg(test)]
mod tests;
