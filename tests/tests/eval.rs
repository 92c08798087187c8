//! `neardup-bench eval` end to end: the report against brute force on a generated corpus, and on the real
//! evaluation slice when CI provides it.
//!
//! `NEARDUP_EVAL_SMALL` names the small slice built by `scripts/build-eval-set --small`;
//! when it is set, the file must exist and the eval must succeed on it.

mod dedup_common;
use dedup_common as common;

use common::*;
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::util::hamming;
use neardup_dedup::jaccard::brute_force_join;

fn report(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report.json"))
        .expect("report JSON")
}

fn assert_png(path: &std::path::Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", path.display());
    assert!(bytes.len() > 10_000, "{} is almost empty", path.display());
}

#[test]
fn eval_matches_brute_force_on_a_generated_corpus() {
    let dir = TempDir::new("eval");
    let pages = pages(240, 11);
    let corpus = dir.path("corpus.jsonl");
    write_jsonl(&corpus, &pages);
    let out_dir = dir.path("out");
    let out = run_bench_ok(&[
        "eval",
        corpus.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--verify-at",
        "8:0.8,12:0.9",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pair P"), "{stdout}");
    let r = report(&out_dir);

    // Brute force: every pair's Jaccard similarity and Hamming distance.
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let sets: Vec<Vec<u64>> = pages.iter().map(|p| f.word_shingles(&p.body, 3).unwrap()).collect();
    let fps: Vec<u64> = pages.iter().map(|p| f.fingerprint(&p.body).unwrap()).collect();
    let truth = brute_force_join(&sets, 0.5).unwrap();
    assert_eq!(r["documents"], pages.len());
    assert_eq!(r["truth"]["pairs_at_join_threshold"], truth.len());
    for (i, t) in [0.8, 0.9].iter().enumerate() {
        let n = truth.iter().filter(|p| p.jaccard >= *t).count();
        assert!(n > 10, "the corpus has true pairs at {t}");
        assert_eq!(r["truth"]["true_pairs"][i]["pairs"], n);
    }
    let rows = r["simhash"].as_array().unwrap();
    assert_eq!(rows.len(), 13 * 2, "k = 0..12 against two truth thresholds");
    let mut nontrivial = 0;
    for row in rows {
        let (k, t) = (row["k"].as_u64().unwrap() as u32, row["truth"].as_f64().unwrap());
        let true_pairs: Vec<(usize, usize)> =
            truth.iter().filter(|p| p.jaccard >= t).map(|p| (p.i, p.j)).collect();
        let mut tp = 0;
        let mut predicted = 0;
        for i in 0..fps.len() {
            for j in i + 1..fps.len() {
                if hamming(fps[i], fps[j]) <= k {
                    predicted += 1;
                    tp += true_pairs.contains(&(i, j)) as usize;
                }
            }
        }
        let ctx = format!("k = {k}, truth {t}");
        assert_eq!(row["predicted_pairs"], predicted, "{ctx}");
        assert_eq!(row["pairs"]["tp"], tp, "{ctx}");
        assert_eq!(row["pairs"]["fp"], predicted - tp, "{ctx}");
        assert_eq!(row["pairs"]["fn"], true_pairs.len() - tp, "{ctx}");
        let precision = if predicted == 0 { 1.0 } else { tp as f64 / predicted as f64 };
        assert!((row["pairs"]["precision"].as_f64().unwrap() - precision).abs() < 1e-12, "{ctx}");
        if tp > 0 && tp < predicted {
            nontrivial += 1;
        }
    }
    assert!(nontrivial > 3, "some rows have both hits and false positives");
    // Verified rows: Jaccard-confirmed pairs are all true at their own threshold.
    let verified = r["verified"].as_array().unwrap();
    assert_eq!(verified.len(), 4);
    for row in verified {
        if row["verify"] == row["truth"] {
            assert_eq!(row["pairs"]["precision"], 1.0, "{row}");
        }
    }
    // Figure 2's counts: one per pair of successive distinct sorted fingerprints.
    let mut sorted = fps.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let counts: u64 =
        r["xor_leading_bit"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
    assert_eq!(counts as usize, sorted.len() - 1);
    assert_png(&out_dir.join("precision_recall.png"));
    assert_png(&out_dir.join("xor_leading_bit.png"));

    // IDF weights learnt from the corpus: same truth, other fingerprints.
    let idf_dir = dir.path("idf");
    run_bench_ok(&[
        "eval",
        corpus.to_str().unwrap(),
        "--out",
        idf_dir.to_str().unwrap(),
        "--idf",
        "--no-plots",
        "-q",
    ]);
    let ri = report(&idf_dir);
    assert_eq!(ri["truth"], r["truth"]);
    assert_eq!(ri["fingerprint"]["idf"]["documents"], pages.len());
    assert!(ri["fingerprint"]["idf"]["entries"].as_u64().unwrap() > 100);
    assert!(r["fingerprint"]["idf"].is_null());
    assert_ne!(ri["xor_leading_bit"], r["xor_leading_bit"], "IDF changes the fingerprints");
    assert!(!idf_dir.join("precision_recall.png").exists());
}

#[test]
fn eval_on_the_real_small_slice_when_provided() {
    let Some(path) = std::env::var_os("NEARDUP_EVAL_SMALL").filter(|p| !p.is_empty()) else {
        neardup_tests::skip_without(
            "NEARDUP_EVAL_SMALL is not set (scripts/build-eval-set --small makes the slice): \
             the real evaluation slice is not checked",
        );
        return;
    };
    let path = std::path::PathBuf::from(path);
    assert!(path.is_file(), "NEARDUP_EVAL_SMALL={} does not exist", path.display());
    let dir = TempDir::new("eval-real");
    let out_dir = dir.path("out");
    run_bench_ok(&["eval", path.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "-q"]);
    let r = report(&out_dir);
    let docs = r["documents"].as_u64().unwrap();
    assert!(docs > 4000, "the small slice has about 5,400 documents, found {docs}");
    let get = |rows: &serde_json::Value, k: u64, verify: Option<f64>, truth: f64| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|x| x["k"] == k && x["verify"].as_f64() == verify && x["truth"] == truth)
            .cloned()
            .unwrap_or_else(|| panic!("no row k = {k}, verify {verify:?}, truth {truth}"))
    };
    // The default settings (verify 0.9 over k = 8) against truth J >= 0.9: the quality
    // aim of docs/quality.md, both at or above 0.9.
    let v = get(&r["verified"], 8, Some(0.9), 0.9);
    assert!(v["pairs"]["precision"].as_f64().unwrap() >= 0.9, "{v}");
    assert!(v["pairs"]["recall"].as_f64().unwrap() >= 0.9, "{v}");
    // Simhash alone at k = 3 finds many true pairs and few false ones.
    let s = get(&r["simhash"], 3, None, 0.9);
    assert!(s["pairs"]["precision"].as_f64().unwrap() >= 0.8, "{s}");
    assert!(s["pairs"]["recall"].as_f64().unwrap() >= 0.6, "{s}");
    assert_png(&out_dir.join("precision_recall.png"));
}

/// `eval --online` on the real slice: admission through a real server with every default
/// (its design, `8c2`, and its verification) reaches precision 0.97 and recall 0.93 per
/// document against J >= 0.9, within 0.03 of the offline rule measured in the same run.
#[test]
fn eval_online_on_the_real_small_slice_when_provided() {
    let Some(path) = std::env::var_os("NEARDUP_EVAL_SMALL").filter(|p| !p.is_empty()) else {
        neardup_tests::skip_without(
            "NEARDUP_EVAL_SMALL is not set (scripts/build-eval-set --small makes the slice): \
             online admission is not scored",
        );
        return;
    };
    let dir = TempDir::new("eval-online");
    let out_dir = dir.path("out");
    let neardup = neardup_tests::binary();
    run_bench_ok(&[
        "eval",
        std::path::Path::new(&path).to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "-q",
        "--no-plots",
        "--online",
        "--neardup",
        neardup.to_str().unwrap(),
    ]);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("online.json")).unwrap()).unwrap();
    let score = |side: &str, what: &str| r[side][what].as_f64().unwrap();
    assert!(r["true_near_duplicates"].as_u64().unwrap() > 200, "{r}");
    assert_eq!(r["design"].as_str().unwrap(), "8c2", "{r}");
    assert!(score("online", "precision") >= 0.97, "{r}");
    assert!(score("online", "recall") >= 0.93, "{r}");
    for what in ["precision", "recall"] {
        assert!(score("offline", what) - score("online", what) <= 0.03, "{what}: {r}");
    }
}

/// The sketch's estimate on real texts: every pair of the slice whose exact Jaccard
/// similarity is at least 0.5, and as many random pairs, estimated within 4.5 σ of the
/// exact similarity (σ of the pair's union, `std_dev_for`).
#[test]
fn sketch_estimates_on_the_real_small_slice_when_provided() {
    use neardup_core::sketch::{Sketch, std_dev_for};
    let Some(path) = std::env::var_os("NEARDUP_EVAL_SMALL").filter(|p| !p.is_empty()) else {
        neardup_tests::skip_without(
            "NEARDUP_EVAL_SMALL is not set: the sketch is not checked on real texts",
        );
        return;
    };
    let text = std::fs::read_to_string(path).unwrap();
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let mut sets = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let s = f.word_shingles(v["text"].as_str().unwrap_or(""), 3).unwrap();
        if !s.is_empty() {
            sets.push(s);
        }
    }
    let sketches: Vec<Sketch> = sets.iter().map(|s| Sketch::from_shingles(s).unwrap()).collect();
    let mut pairs: Vec<(usize, usize)> = neardup_dedup::jaccard::similarity_join(&sets, 0.5)
        .unwrap()
        .iter()
        .map(|p| (p.i, p.j))
        .collect();
    let similar = pairs.len();
    let mut r = neardup_core::util::SplitMix64::new(19);
    for _ in 0..similar {
        let n = sets.len() as u64;
        let (i, j) = (r.below(n) as usize, r.below(n) as usize);
        if i != j {
            pairs.push((i, j));
        }
    }
    assert!(similar > 1000, "{similar} similar pairs");
    let mut worst = 0.0f64;
    for &(i, j) in &pairs {
        let inter = neardup_dedup::jaccard::intersection_size(&sets[i], &sets[j]);
        let union = sets[i].len() + sets[j].len() - inter;
        let truth = inter as f64 / union as f64;
        let est = sketches[i].jaccard(&sketches[j]);
        if truth == 1.0 {
            assert_eq!(est, 1.0);
            continue;
        }
        let z = (est - truth) / std_dev_for(truth, union);
        worst = worst.max(z.abs());
        assert!(z.abs() <= 4.5, "pair {i} {j}: J {truth}, union {union}, estimate {est}");
    }
    eprintln!("{} pairs, worst |z| {worst:.2}", pairs.len());
}
