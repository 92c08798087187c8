//! Command-line options shared by `dedup` and `eval`: the fingerprint configuration.
//!
//! Fingerprints are comparable only under one configuration, and the defaults are chosen
//! from measured quality (`docs/quality.md`), so both commands take the same options and
//! take their defaults from `FingerprintConfig::default()` in the core.

use neardup_core::fingerprint::{FeatureHash, FingerprintConfig};

/// The feature hash, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HashArg {
    /// MD5 (low 64 bits), as the method's description; the default.
    Md5,
    /// xxh3-64: several times cheaper per feature; other fingerprints than MD5.
    Xxh3,
}

impl From<FeatureHash> for HashArg {
    fn from(h: FeatureHash) -> Self {
        match h {
            FeatureHash::Md5 => HashArg::Md5,
            FeatureHash::Xxh3 => HashArg::Xxh3,
        }
    }
}

/// How texts become fingerprints (see `docs/fingerprint.md`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct FingerprintArgs {
    /// n of the word n-gram shingles.
    #[arg(long, default_value_t = FingerprintConfig::default().word_ngram)]
    pub word_ngram: usize,
    /// n of the character n-grams over scripts written without spaces (Chinese, Japanese,
    /// Thai...).
    #[arg(long, default_value_t = FingerprintConfig::default().char_ngram)]
    pub char_ngram: usize,
    /// The feature hash.
    #[arg(long, value_enum, default_value_t = FingerprintConfig::default().hash.into())]
    pub hash: HashArg,
    /// Treat Hangul (Korean) as a script without spaces: character n-grams instead of words.
    #[arg(long, default_value_t = FingerprintConfig::default().hangul_as_chars, action = clap::ArgAction::Set)]
    pub hangul_chars: bool,
}

impl Default for FingerprintArgs {
    fn default() -> Self {
        let c = FingerprintConfig::default();
        FingerprintArgs {
            word_ngram: c.word_ngram,
            char_ngram: c.char_ngram,
            hash: c.hash.into(),
            hangul_chars: c.hangul_as_chars,
        }
    }
}

impl FingerprintArgs {
    /// The core configuration (checked).
    pub fn config(&self) -> Result<FingerprintConfig, neardup_core::Error> {
        let c = FingerprintConfig {
            word_ngram: self.word_ngram,
            char_ngram: self.char_ngram,
            hash: match self.hash {
                HashArg::Md5 => FeatureHash::Md5,
                HashArg::Xxh3 => FeatureHash::Xxh3,
            },
            hangul_as_chars: self.hangul_chars,
        };
        c.validate()?;
        Ok(c)
    }
}
