//! A straightforward implementation of the same spec, written for clarity rather than speed.
//!
//! It exists for two reasons: property tests check the fast [`Fingerprinter`] against it on
//! arbitrary input (two implementations that share only the range tables), and the
//! benchmark reports it as the baseline. It always runs NFKC, looks up every general
//! category in the crate's table, allocates a `String` per token and per feature
//! occurrence, hashes every occurrence (no counting) and keeps signed per-bit sums.
//!
//! [`Fingerprinter`]: super::Fingerprinter

use unicode_general_category::{GeneralCategory as G, get_general_category};
use unicode_normalization::UnicodeNormalization;

use super::{
    DocFingerprint, FeatureHash, FingerprintConfig, HANGUL_RANGES, Idf, SPACELESS_RANGES,
    VARIATION_SELECTORS,
};
use crate::{Error, Result};

enum Unit {
    Word(String),
    Char(char),
}

#[derive(PartialEq)]
enum Class {
    Word,
    Mark,
    Ignore,
    Separator,
}

fn class(c: char) -> Class {
    if in_any(c, VARIATION_SELECTORS) {
        return Class::Ignore;
    }
    match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter
        | G::DecimalNumber
        | G::LetterNumber
        | G::OtherNumber => Class::Word,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Class::Mark,
        G::Format => Class::Ignore,
        _ => Class::Separator,
    }
}

fn in_any(c: char, ranges: &[(u32, u32)]) -> bool {
    let cp = c as u32;
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

/// Normalised text: unassigned code points to U+0020, NFKC, per-code-point lowercase.
pub fn normalise(text: &str) -> String {
    let masked: String = text
        .chars()
        .map(|c| if get_general_category(c) == G::Unassigned { ' ' } else { c })
        .collect();
    let nfkc: String = masked.nfkc().collect();
    nfkc.chars().flat_map(char::to_lowercase).collect()
}

fn units(config: &FingerprintConfig, text: &str) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut in_word = false;
    let mut after_spaceless = false;
    for c in normalise(text).chars() {
        let cls = class(c);
        let spaceless = (cls == Class::Word || cls == Class::Mark)
            && (in_any(c, SPACELESS_RANGES)
                || (config.hangul_as_chars && in_any(c, HANGUL_RANGES)));
        if spaceless || (cls == Class::Mark && after_spaceless) {
            out.push(Unit::Char(c));
            in_word = false;
            after_spaceless = true;
        } else if cls == Class::Word || (cls == Class::Mark && in_word) {
            if in_word {
                if let Some(Unit::Word(w)) = out.last_mut() {
                    w.push(c);
                }
            } else {
                out.push(Unit::Word(c.to_string()));
                in_word = true;
            }
            after_spaceless = false;
        } else if cls != Class::Ignore {
            // A separator, or a mark with nothing to attach to.
            in_word = false;
            after_spaceless = false;
        }
    }
    out
}

fn ngrams(items: &[String], n: usize, sep: &str) -> Vec<String> {
    if items.is_empty() {
        vec![]
    } else if items.len() < n {
        vec![items.join(sep)]
    } else {
        items.windows(n).map(|w| w.join(sep)).collect()
    }
}

/// The normalised units of `text` joined by single spaces (the content-hash input).
pub fn content_string(config: &FingerprintConfig, text: &str) -> String {
    units(config, text)
        .iter()
        .map(|u| match u {
            Unit::Word(w) => w.clone(),
            Unit::Char(c) => c.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every feature occurrence of `text`, in order: word n-grams, then character n-grams.
pub fn feature_occurrences(config: &FingerprintConfig, text: &str) -> Vec<String> {
    let us = units(config, text);
    let words: Vec<String> = us
        .iter()
        .filter_map(|u| match u {
            Unit::Word(w) => Some(w.clone()),
            Unit::Char(_) => None,
        })
        .collect();
    let chars: Vec<String> = us
        .iter()
        .filter_map(|u| match u {
            Unit::Char(c) => Some(c.to_string()),
            Unit::Word(_) => None,
        })
        .collect();
    let mut out = ngrams(&words, config.word_ngram, " ");
    out.extend(ngrams(&chars, config.char_ngram, ""));
    out
}

/// The feature hash of one feature string.
pub fn feature_hash(hash: FeatureHash, feature: &str) -> u64 {
    match hash {
        FeatureHash::Md5 => super::md5_lanes::md5_low64(feature.as_bytes()),
        FeatureHash::Xxh3 => xxhash_rust::xxh3::xxh3_64(feature.as_bytes()),
    }
}

/// The fingerprint of `text` computed the slow, obvious way.
pub fn fingerprint_doc(
    config: &FingerprintConfig,
    idf: Option<&Idf>,
    text: &str,
) -> Result<DocFingerprint> {
    config.validate()?;
    let features = feature_occurrences(config, text);
    if features.is_empty() {
        return Err(Error::EmptyDocument);
    }
    let mut sums = [0i128; 64];
    for f in &features {
        let h = feature_hash(config.hash, f);
        let w = idf.map_or(1, |t| t.get(f)) as i128;
        for (i, s) in sums.iter_mut().enumerate() {
            if h >> i & 1 == 1 {
                *s += w;
            } else {
                *s -= w;
            }
        }
    }
    let mut simhash = 0u64;
    for (i, s) in sums.iter().enumerate() {
        if *s > 0 {
            simhash |= 1 << i;
        }
    }
    let mut distinct = features.clone();
    distinct.sort();
    distinct.dedup();
    Ok(DocFingerprint {
        simhash,
        content_hash: xxhash_rust::xxh3::xxh3_128(content_string(config, text).as_bytes()),
        tokens: units(config, text).len(),
        features: features.len(),
        distinct_features: distinct.len(),
    })
}
