//! `neardup-bench eval`: precision and recall of near-duplicate detection against exact
//! ground truth.
//!
//! # Why this module exists
//!
//! Every default of neardup (shingle size, character n-grams, the hash, `k`, the verify
//! settings) is to be chosen from measured quality, and the measurement must be the same
//! every time. This is that measurement:
//!
//! * **Truth.** Each document's word 3-gram shingle set over normalised units
//!   (`Fingerprinter::word_shingles`: words, and each Chinese/Japanese/Thai character as a
//!   unit), and the exact Jaccard similarity of every pair at or above `--join-threshold`
//!   (0.5), from the exact similarity join of [`crate::jaccard`] (no sampling). A pair
//!   is a true near-duplicate at threshold `t` (0.8 and 0.9) when its similarity is `>= t`.
//! * **Simhash at k.** The pairs of documents whose fingerprints differ in at most `k` bits,
//!   for every `k` from 0 to `--max-k` (12), from the core index's self-join.
//! * **Verify at (k, J).** The pairs within `k` whose exact Jaccard similarity is `>= J`:
//!   what `neardup dedup --verify J -k k` keeps.
//! * **Scores** ([`crate::quality`]): precision, recall and F1 per unordered pair and
//!   per document (a document is flagged if it is in any pair).
//!
//! Outputs: a table on stdout and `report.json` in the output directory. The measurement
//! program (`neardup-bench eval`) adds two PNG plots from the [`EvalReport`]:
//! `precision_recall.png` (precision and recall against `k`: the paper's Figure 1) and
//! `xor_leading_bit.png` (where the leading 1-bit of the XOR of successive sorted
//! fingerprints falls: Figure 2, which the table designs and the compression rely on).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::jaccard::{jaccard, similarity_join};
use crate::quality::{Scores, evaluate};
use neardup_core::fingerprint::Fingerprinter;
use rayon::prelude::*;

use crate::clusters::near_pairs;
use crate::config::FingerprintArgs;
use crate::dedup::{VERIFY_NGRAM, report_skipped, threads};
use crate::error::{DedupError, SkipReason};
use crate::input::{InputFormat, Inputs, OrderedFields, read_all};
use crate::pipeline::{OnError, ScanOptions, scan};

/// A `--verify-at` point: candidate distance `k` and Jaccard threshold `j`, written `k:j`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerifyPoint {
    /// Candidate Hamming distance.
    pub k: u32,
    /// Jaccard threshold.
    pub j: f64,
}

impl std::str::FromStr for VerifyPoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected K:J, e.g. 12:0.8");
        let (k, j) = s.split_once(':').ok_or_else(bad)?;
        let k: u32 = k.trim().parse().map_err(|_| bad())?;
        let j: f64 = j.trim().parse().map_err(|_| bad())?;
        if k > 16 || !(j > 0.0 && j <= 1.0) {
            return Err(format!("{s:?}: k must be at most 16 and J in (0, 1]"));
        }
        Ok(VerifyPoint { k, j })
    }
}

impl std::fmt::Display for VerifyPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.k, self.j)
    }
}

/// Options of `neardup-bench eval` (without its plot options).
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// The corpus: JSONL with `id` and `text` (e.g. from `scripts/build-eval-set`).
    pub corpus: PathBuf,
    /// Directory for `report.json` and the PNG plots (created if missing).
    #[arg(long, default_value = "neardup-eval")]
    pub out: PathBuf,
    /// Largest k to score (every k from 0 to it).
    #[arg(long, default_value_t = 12)]
    pub max_k: u32,
    /// True near-duplicates: pairs with Jaccard similarity at or above each of these.
    #[arg(long, value_delimiter = ',', default_value = "0.8,0.9")]
    pub truth: Vec<f64>,
    /// The ground-truth join keeps pairs at or above this similarity.
    #[arg(long, default_value_t = 0.5)]
    pub join_threshold: f64,
    /// Verify settings to score, as K:J.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_VERIFY_AT)]
    pub verify_at: Vec<VerifyPoint>,
    /// Weigh features by term frequency times inverse document frequency learnt from the
    /// corpus (two more passes over it) instead of term frequency alone.
    #[arg(long)]
    pub idf: bool,
    /// Also score each value of this JSONL field separately (e.g. `lang`): pairs whose two
    /// documents both have that value, at k = 3 and at every verify point.
    #[arg(long, value_name = "FIELD")]
    pub by: Option<String>,
    /// Worker threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// What to do with a bad document.
    #[arg(long, value_enum, default_value_t)]
    pub on_error: OnError,
    /// Treat every text as HTML (strip tags).
    #[arg(long)]
    pub html: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
    /// The fingerprint configuration.
    #[command(flatten)]
    pub fingerprint: FingerprintArgs,
}

/// The verify settings `eval` scores by default (the dedup default is 8:0.9).
pub const DEFAULT_VERIFY_AT: &str = "6:0.8,8:0.8,10:0.8,12:0.8,6:0.9,8:0.9,10:0.9,12:0.9";

fn default_verify_points() -> Vec<VerifyPoint> {
    DEFAULT_VERIFY_AT.split(',').filter_map(|p| p.parse().ok()).collect()
}

impl EvalArgs {
    /// Arguments for `corpus`, writing to `out`, with every other default.
    pub fn new(corpus: PathBuf, out: PathBuf) -> EvalArgs {
        EvalArgs {
            corpus,
            out,
            max_k: 12,
            truth: vec![0.8, 0.9],
            join_threshold: 0.5,
            verify_at: default_verify_points(),
            by: None,
            idf: false,
            threads: None,
            on_error: OnError::Skip,
            html: false,
            quiet: false,
            fingerprint: FingerprintArgs::default(),
        }
    }
}

/// One scored prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalRow {
    /// Hamming distance.
    pub k: u32,
    /// The `--verify` threshold, if the pairs were verified.
    pub verify: Option<f64>,
    /// The truth threshold.
    pub truth: f64,
    /// Distinct predicted pairs.
    pub predicted_pairs: usize,
    /// Pair-level scores.
    pub pairs: Scores,
    /// Document-level scores.
    pub docs: Scores,
}

/// What `neardup-bench eval` measured.
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// Documents scored.
    pub documents: usize,
    /// Skipped documents by reason.
    pub skipped: BTreeMap<String, usize>,
    /// True pairs per truth threshold.
    pub true_pairs: Vec<(f64, usize)>,
    /// Simhash alone, for each k and truth threshold.
    pub simhash: Vec<EvalRow>,
    /// Simhash candidates confirmed by Jaccard, for each `--verify-at` point and truth
    /// threshold.
    pub verified: Vec<EvalRow>,
    /// With `--by`: per value of the field, its documents and the rows at k = 3 and at each
    /// verify point, restricted to pairs inside the group.
    pub by_group: Vec<(String, usize, Vec<EvalRow>)>,
    /// Successive sorted distinct fingerprints whose XOR has its leading 1-bit at each
    /// position (0 = least significant).
    pub xor_leading_bit: [u64; 64],
    /// The report as written to `report.json`.
    pub json: serde_json::Value,
}

/// Runs the evaluation; writes `report.json` into `args.out`, prints the table (unless
/// `quiet`) and returns the report.
pub fn run_eval(args: EvalArgs) -> Result<EvalReport, DedupError> {
    let start = Instant::now();
    let config = args.fingerprint.config()?;
    for &t in args.truth.iter().chain([&args.join_threshold]) {
        if !(t > 0.0 && t <= 1.0) {
            return Err(DedupError::Usage(format!("threshold {t}: must be in (0, 1]")));
        }
    }
    if let Some(t) = args.truth.iter().find(|&&t| t < args.join_threshold) {
        return Err(DedupError::Usage(format!(
            "truth threshold {t} is below --join-threshold {}",
            args.join_threshold
        )));
    }
    let k_all = args.verify_at.iter().map(|v| v.k).max().unwrap_or(0).max(args.max_k);
    if k_all > 16 {
        return Err(DedupError::Usage(format!("k = {k_all}: at most 16")));
    }
    std::fs::create_dir_all(&args.out).map_err(|e| DedupError::io(args.out.display(), e))?;
    let mut inputs =
        Inputs::resolve(std::slice::from_ref(&args.corpus), InputFormat::Jsonl, args.html)?;
    let opts = ScanOptions {
        threads: threads(args.threads),
        on_error: args.on_error,
        progress: !args.quiet,
        label: "reading",
    };
    let idf = if args.idf { Some(crate::idf::learn(&mut inputs, &opts, config)?) } else { None };
    let idf_table = idf.as_ref().map(|(t, _)| t.clone());
    let scanned = scan(
        &mut inputs,
        &|_| true,
        &opts,
        || {
            match &idf_table {
                Some(t) => Fingerprinter::with_idf(config, t.clone()),
                None => Fingerprinter::new(config),
            }
            .expect("configuration checked above")
        },
        |f, doc| {
            let fp = match f.fingerprint(&doc.text) {
                Ok(fp) => fp,
                Err(neardup_core::Error::EmptyDocument) => return Err(SkipReason::Empty),
                Err(e) => return Err(SkipReason::BadField(e.to_string())),
            };
            let set = f
                .word_shingles(&doc.text, VERIFY_NGRAM)
                .map_err(|e| SkipReason::BadField(e.to_string()))?;
            Ok((fp, set))
        },
    )?;
    let read_seconds = start.elapsed().as_secs_f64();
    let skipped = report_skipped(&scanned.skipped, None)?;
    let seqs: Vec<u64> = scanned.docs.iter().map(|a| a.seq).collect();
    let (fps, sets): (Vec<u64>, Vec<Vec<u64>>) = scanned.docs.into_iter().map(|a| a.value).unzip();
    let n = fps.len();

    let t = Instant::now();
    let truth = similarity_join(&sets, args.join_threshold)?;
    let truth_seconds = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let candidates = near_pairs(&fps, k_all, 8 << 30)?;
    let join_seconds = t.elapsed().as_secs_f64();
    let similarity: Vec<f64> = candidates
        .par_iter()
        .map(|&(a, b, _)| jaccard(&sets[a as usize], &sets[b as usize]))
        .collect();

    let truth_at = |t: f64| -> Vec<(usize, usize)> {
        truth.iter().filter(|p| p.jaccard >= t).map(|p| (p.i, p.j)).collect()
    };
    let truths: Vec<(f64, Vec<(usize, usize)>)> =
        args.truth.iter().map(|&t| (t, truth_at(t))).collect();
    let score = |k: u32, verify: Option<f64>| -> Result<Vec<EvalRow>, DedupError> {
        let pred: Vec<(usize, usize)> = candidates
            .iter()
            .zip(&similarity)
            .filter(|((_, _, d), s)| *d <= k && verify.is_none_or(|j| **s >= j))
            .map(|(&(a, b, _), _)| (a as usize, b as usize))
            .collect();
        truths
            .iter()
            .map(|(t, tp)| {
                let q = evaluate(n, &pred, tp)?;
                Ok(EvalRow {
                    k,
                    verify,
                    truth: *t,
                    predicted_pairs: q.predicted_pairs,
                    pairs: q.pairs,
                    docs: q.docs,
                })
            })
            .collect()
    };
    let mut simhash = Vec::new();
    for k in 0..=args.max_k {
        simhash.extend(score(k, None)?);
    }
    let mut verified = Vec::new();
    for v in &args.verify_at {
        verified.extend(score(v.k, Some(v.j))?);
    }

    // Per value of a field: the same scores restricted to pairs inside the group.
    let mut by_group = Vec::new();
    if let Some(field) = &args.by {
        let groups = field_values(&mut inputs, &seqs, field)?;
        let mut values: Vec<&str> = groups.iter().map(String::as_str).collect();
        values.sort_unstable();
        values.dedup();
        for value in values {
            let inside = |a: usize, b: usize| groups[a] == value && groups[b] == value;
            let documents = groups.iter().filter(|g| *g == value).count();
            let mut rows = Vec::new();
            let settings =
                std::iter::once((3, None)).chain(args.verify_at.iter().map(|v| (v.k, Some(v.j))));
            for (k, verify) in settings {
                let pred: Vec<(usize, usize)> = candidates
                    .iter()
                    .zip(&similarity)
                    .filter(|((a, b, d), s)| {
                        *d <= k
                            && verify.is_none_or(|j| **s >= j)
                            && inside(*a as usize, *b as usize)
                    })
                    .map(|(&(a, b, _), _)| (a as usize, b as usize))
                    .collect();
                for (t, tp) in &truths {
                    let tp: Vec<(usize, usize)> =
                        tp.iter().copied().filter(|&(a, b)| inside(a, b)).collect();
                    let q = evaluate(n, &pred, &tp)?;
                    rows.push(EvalRow {
                        k,
                        verify,
                        truth: *t,
                        predicted_pairs: q.predicted_pairs,
                        pairs: q.pairs,
                        docs: q.docs,
                    });
                }
            }
            by_group.push((value.to_string(), documents, rows));
        }
    }

    let mut sorted = fps.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let mut xor_leading_bit = [0u64; 64];
    for w in sorted.windows(2) {
        xor_leading_bit[63 - (w[0] ^ w[1]).leading_zeros() as usize] += 1;
    }

    let true_pairs: Vec<(f64, usize)> = truths.iter().map(|(t, p)| (*t, p.len())).collect();
    let row_json = |r: &EvalRow| {
        let s = |x: &Scores| {
            serde_json::json!({
                "precision": x.precision, "recall": x.recall, "f1": x.f1,
                "tp": x.true_positives, "fp": x.false_positives, "fn": x.false_negatives,
            })
        };
        serde_json::json!({
            "k": r.k, "verify": r.verify, "truth": r.truth,
            "predicted_pairs": r.predicted_pairs, "pairs": s(&r.pairs), "documents": s(&r.docs),
        })
    };
    let c = config;
    let json = serde_json::json!({
        "corpus": args.corpus.display().to_string(),
        "documents": n,
        "skipped": skipped,
        "fingerprint": {
            "word_ngram": c.word_ngram, "char_ngram": c.char_ngram,
            "hash": format!("{:?}", c.hash).to_lowercase(), "hangul_as_chars": c.hangul_as_chars,
            "idf": idf.as_ref().map(|(t, docs)| serde_json::json!({
                "rule": crate::idf::RULE, "documents": docs, "entries": t.len(),
                "default": t.default_weight(),
            })),
        },
        "truth": {
            "shingles": format!("word {VERIFY_NGRAM}-grams over normalised units"),
            "join_threshold": args.join_threshold,
            "pairs_at_join_threshold": truth.len(),
            "true_pairs": true_pairs.iter().map(|(t, c)| serde_json::json!({"threshold": t, "pairs": c})).collect::<Vec<_>>(),
        },
        "simhash": simhash.iter().map(row_json).collect::<Vec<_>>(),
        "verified": verified.iter().map(row_json).collect::<Vec<_>>(),
        "by": args.by.as_ref().map(|f| serde_json::json!({
            "field": f,
            "groups": by_group.iter().map(|(v, d, rows)| serde_json::json!({
                "value": v, "documents": d, "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })),
        "xor_leading_bit": xor_leading_bit.to_vec(),
        "distinct_fingerprints": sorted.len(),
        "seconds": {
            "read_and_fingerprint": read_seconds, "truth_join": truth_seconds,
            "self_join": join_seconds, "total": start.elapsed().as_secs_f64(),
        },
    });
    let report_path = args.out.join("report.json");
    let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
    std::fs::write(&report_path, text).map_err(|e| DedupError::io(report_path.display(), e))?;

    let report = EvalReport {
        documents: n,
        skipped,
        true_pairs,
        simhash,
        verified,
        by_group,
        xor_leading_bit,
        json,
    };
    if !args.quiet {
        print!("{}", table(&report));
        println!("report: {}", report_path.display());
    }
    Ok(report)
}

/// The value of `field` in each accepted record (by record number `seqs`): a string's
/// contents, other JSON as written, `-` when missing.
fn field_values(inputs: &mut Inputs, seqs: &[u64], field: &str) -> Result<Vec<String>, DedupError> {
    let mut out = Vec::with_capacity(seqs.len());
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let want = |seq: u64| seqs.binary_search(&seq).is_ok();
    read_all(inputs, &want, &bytes, |raw| {
        let value = raw
            .bytes
            .as_ref()
            .ok()
            .and_then(|line| serde_json::from_slice::<OrderedFields<'_>>(line).ok())
            .and_then(|f| {
                f.0.iter().find(|(k, _)| k == field).map(|(_, v)| {
                    serde_json::from_str::<String>(v.get()).unwrap_or_else(|_| v.get().to_string())
                })
            });
        out.push(value.unwrap_or_else(|| "-".to_string()));
        true
    })?;
    if out.len() != seqs.len() {
        return Err(DedupError::Usage("the corpus changed while it was read".into()));
    }
    Ok(out)
}

/// The report as a text table.
pub fn table(r: &EvalReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} documents; true pairs: {}",
        r.documents,
        r.true_pairs.iter().map(|(t, c)| format!("{c} at J >= {t}")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(
        s,
        "{:>4} {:>7} {:>6} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9}",
        "k", "verify", "truth", "predicted", "pair P", "pair R", "pair F1", "doc P", "doc R"
    );
    let rows = r.simhash.iter().chain(&r.verified).map(|x| ("", x));
    let groups =
        r.by_group.iter().flat_map(|(v, _, rows)| rows.iter().map(move |x| (v.as_str(), x)));
    for (group, row) in rows.chain(groups) {
        if !group.is_empty() && row.verify.is_some_and(|j| j != row.truth) {
            continue;
        }
        let _ = writeln!(
            s,
            "{:>4} {:>7} {:>6} {:>9} | {:>9.3} {:>9.3} {:>9.3} | {:>9.3} {:>9.3} {group}",
            row.k,
            row.verify.map_or("-".to_string(), |j| j.to_string()),
            row.truth,
            row.predicted_pairs,
            row.pairs.precision,
            row.pairs.recall,
            row.pairs.f1,
            row.docs.precision,
            row.docs.recall
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_points() {
        assert_eq!(default_verify_points().len(), 8);
        assert_eq!("12:0.8".parse::<VerifyPoint>(), Ok(VerifyPoint { k: 12, j: 0.8 }));
        for bad in ["12", "x:0.8", "12:y", "17:0.5", "3:0", "3:1.5"] {
            assert!(bad.parse::<VerifyPoint>().is_err(), "{bad}");
        }
    }
}
