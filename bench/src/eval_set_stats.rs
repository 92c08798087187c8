//! Measures the duplicate structure of an evaluation set built by `scripts/build-eval-set`:
//! exact duplicates, and near-duplicate pairs by exact word 3-gram Jaccard similarity, split
//! by how the two documents are related. The figures in `docs/eval-set.md` come from here.
//!
//! ```text
//! neardup-bench eval-set-stats eval-set.jsonl [T...]
//! ```
//!
//! Shingles: `Fingerprinter::word_shingles(text, 3)`, the word 3-grams over the normalised
//! units of `docs/fingerprint.md` (each Chinese, Japanese or Thai character is a unit of its
//! own; Hangul words stay whole), exactly the sets `neardup-bench eval` uses as ground truth.
//! Thresholds default to 0.5, 0.8 and 0.9.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::time::Instant;

use neardup_core::cluster::{DocTime, NearPair, Rule, cluster};
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_dedup::jaccard::similarity_join_with_stats;
use xxhash_rust::xxh3::xxh3_64;

struct Doc {
    kind: String,
    lang: String,
    group: String,
    text_hash: u64,
    timestamp: i64,
}

/// Word 3-gram shingles over normalised units (each Chinese/Japanese/Thai character a unit
/// of its own), as the ground truth of `neardup-bench eval` and `dedup --verify` computes them.
fn shingles(f: &mut Fingerprinter, text: &str) -> Vec<u64> {
    f.word_shingles(text, 3).expect("n = 3 is valid")
}

fn relation(a: &Doc, b: &Doc) -> &'static str {
    let same_text = a.text_hash == b.text_hash;
    match (a.group == b.group, a.lang == b.lang, same_text) {
        (_, _, true) => "identical text",
        (true, true, false) => "same group, same language (versions, variants)",
        (true, false, false) => "same group, other language (translations)",
        (false, true, false) => "other group, same language",
        (false, false, false) => "other group, other language",
    }
}

/// Options of `neardup-bench eval-set-stats`: `FILE.jsonl [THRESHOLD...]`.
#[derive(Debug, clap::Args)]
pub struct EvalSetStatsArgs {
    /// The evaluation set (JSONL), then Jaccard thresholds [default: 0.5 0.8 0.9].
    args: Vec<String>,
}

/// Runs `neardup-bench eval-set-stats`.
pub fn run(EvalSetStatsArgs { args }: EvalSetStatsArgs) {
    let Some(path) = args.first() else {
        eprintln!("usage: neardup-bench eval-set-stats FILE.jsonl [THRESHOLD...]");
        std::process::exit(2);
    };
    let mut thresholds: Vec<f64> = args[1..].iter().filter_map(|a| a.parse().ok()).collect();
    if thresholds.is_empty() {
        thresholds = vec![0.5, 0.8, 0.9];
    }
    let t0 = Instant::now();
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("cannot open {path}: {e}");
        std::process::exit(1)
    });
    let mut docs = Vec::new();
    let mut sets = Vec::new();
    let mut fingerprinter =
        Fingerprinter::new(FingerprintConfig::default()).expect("default configuration");
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.expect("read");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            eprintln!("{path}:{}: {e}", i + 1);
            std::process::exit(1)
        });
        let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
        let text = s("text");
        let norm: Vec<&str> = text.split_whitespace().collect();
        docs.push(Doc {
            kind: s("kind"),
            lang: s("lang"),
            group: s("group"),
            text_hash: xxh3_64(norm.join(" ").as_bytes()),
            timestamp: v["timestamp"].as_i64().unwrap_or(0),
        });
        sets.push(shingles(&mut fingerprinter, &text));
    }
    let n = docs.len();
    let total: usize = sets.iter().map(Vec::len).sum();
    let mut sizes: Vec<usize> = sets.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    println!(
        "{n} documents, {total} shingles (median {} per document, 90th percentile {}, max {}), \
         read in {:.1} s",
        sizes.get(n / 2).copied().unwrap_or(0),
        sizes.get(n * 9 / 10).copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        t0.elapsed().as_secs_f64()
    );
    let mut by_text: HashMap<u64, usize> = HashMap::new();
    for d in &docs {
        *by_text.entry(d.text_hash).or_default() += 1;
    }
    let groups = by_text.values().filter(|&&c| c > 1).count();
    let extra: usize = by_text.values().filter(|&&c| c > 1).map(|c| c - 1).sum();
    println!(
        "exact duplicates (same text up to spaces): {extra} documents beyond the first in {groups} groups"
    );

    for &t in &thresholds {
        let t1 = Instant::now();
        let (pairs, st) = similarity_join_with_stats(&sets, t).expect("join");
        let secs = t1.elapsed().as_secs_f64();
        let mut in_pair = vec![false; n];
        let mut by_rel: BTreeMap<&str, usize> = BTreeMap::new();
        let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
        let mut cjk = 0;
        for p in &pairs {
            in_pair[p.i] = true;
            in_pair[p.j] = true;
            let (a, b) = (&docs[p.i], &docs[p.j]);
            *by_rel.entry(relation(a, b)).or_default() += 1;
            let (k1, k2) = if a.kind <= b.kind { (&a.kind, &b.kind) } else { (&b.kind, &a.kind) };
            let key = if k1 == k2 { k1.clone() } else { format!("{k1} + {k2}") };
            *by_kind.entry(key).or_default() += 1;
            if [&a.lang, &b.lang]
                .iter()
                .any(|l| l.starts_with("zh") || l.starts_with("ja") || l.starts_with("ko"))
            {
                cjk += 1;
            }
        }
        let near = pairs.iter().filter(|p| p.jaccard < 1.0).count();
        println!(
            "\nJaccard >= {t}: {} pairs ({near} with Jaccard < 1) over {} documents; join {secs:.2} s \
             ({} candidates verified)",
            pairs.len(),
            in_pair.iter().filter(|&&x| x).count(),
            st.verified
        );
        for (r, c) in &by_rel {
            println!("  {c:>8}  {r}");
        }
        println!("  by kind:");
        for (k, c) in &by_kind {
            println!("  {c:>8}  {k}");
        }
        println!("  {cjk:>8}  pairs with a Chinese, Japanese or Korean document");
        let times: Vec<DocTime> = docs
            .iter()
            .enumerate()
            .map(|(i, d)| DocTime { timestamp: d.timestamp, first_seen: i as u64 })
            .collect();
        let np: Vec<NearPair> =
            pairs.iter().map(|p| NearPair::from((p.i, p.j, 1.0 - p.jaccard))).collect();
        for rule in [Rule::ConnectedComponents, Rule::AttachToOriginal] {
            let c = cluster(&times, &np, rule).expect("cluster");
            let dup: Vec<usize> = c.duplicate_clusters().map(|c| c.members.len()).collect();
            println!(
                "  {rule:?}: {} clusters with 2+ members holding {} documents, largest {}",
                dup.len(),
                dup.iter().sum::<usize>(),
                dup.iter().max().copied().unwrap_or(0)
            );
        }
    }
}
