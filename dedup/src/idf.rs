//! Inverse document frequency weights learnt from a corpus, for `eval --idf`.
//!
//! The fingerprint weighs each feature by its count in the document, optionally times an
//! integer IDF weight (`docs/fingerprint.md`, section 5). Whether that weighting helps is a
//! question for the data, so `eval --idf` learns the table from the corpus it evaluates and
//! measures the result against the same truth as plain term-frequency weighting.
//!
//! Weights are `round(100 × ln(N / df))` for a feature found in `df` of the corpus's `N`
//! documents; features found in one document only are left out of the table and get its
//! default, `round(100 × ln N)`, as do features never seen. Two passes over the corpus keep
//! memory down: the first counts document frequencies by a 64-bit hash of each feature; the
//! second collects the strings of the features found in two or more documents.

use std::collections::HashMap;
use std::sync::Arc;

use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter, Idf};
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{DedupError, SkipReason};
use crate::input::Inputs;
use crate::pipeline::{ScanOptions, scan};

/// How a weight is derived from a document frequency (recorded in reports).
pub const RULE: &str = "round(100 * ln(N / df)); features in one document only: round(100 * ln N)";

fn weight(n: usize, df: u32) -> u32 {
    (100.0 * (n as f64 / df.max(1) as f64).ln()).round().max(0.0) as u32
}

fn distinct_feature_hashes(f: &mut Fingerprinter, text: &str) -> Result<Vec<u64>, SkipReason> {
    let features = f.features(text).map_err(|e| match e {
        neardup_core::Error::EmptyDocument => SkipReason::Empty,
        e => SkipReason::BadField(e.to_string()),
    })?;
    Ok(features.iter().map(|x| xxh3_64(x.text.as_bytes())).collect())
}

/// Learns the IDF table of the documents in `inputs` under `config`; returns it with the
/// number of documents it was learnt from.
pub(crate) fn learn(
    inputs: &mut Inputs,
    opts: &ScanOptions,
    config: FingerprintConfig,
) -> Result<(Arc<Idf>, usize), DedupError> {
    let opts = ScanOptions { label: "counting features", ..opts.clone() };
    let counted = scan(
        inputs,
        &|_| true,
        &opts,
        || Fingerprinter::new(config).expect("configuration checked before"),
        |f, doc| distinct_feature_hashes(f, &doc.text),
    )?;
    let n = counted.docs.len();
    let mut df: HashMap<u64, u32> = HashMap::new();
    for d in &counted.docs {
        for &h in &d.value {
            *df.entry(h).or_insert(0) += 1;
        }
    }
    drop(counted);
    df.retain(|_, c| *c >= 2);
    let df = &df;
    let opts = ScanOptions { label: "collecting features", ..opts };
    let shared = scan(
        inputs,
        &|_| true,
        &opts,
        || Fingerprinter::new(config).expect("configuration checked before"),
        |f, doc| {
            let features =
                f.features(&doc.text).map_err(|e| SkipReason::BadField(e.to_string()))?;
            Ok(features
                .into_iter()
                .filter_map(|x| df.get(&xxh3_64(x.text.as_bytes())).map(|&c| (x.text, c)))
                .collect::<Vec<(String, u32)>>())
        },
    )?;
    let mut idf = Idf::new(weight(n, 1));
    for d in shared.docs {
        for (text, c) in d.value {
            idf.insert(&text, weight(n, c));
        }
    }
    Ok((Arc::new(idf), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights() {
        assert_eq!(weight(100, 100), 0);
        assert_eq!(weight(100, 1), 461);
        assert_eq!(weight(100, 10), 230);
        assert_eq!(weight(0, 0), 0);
    }
}
