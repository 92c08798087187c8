//! `neardup dedup` end to end: clusters against a brute-force all-pairs computation, exact
//! duplicates, timestamps, --verify, input forms, output formats and bad input.

mod dedup_common;
use dedup_common as common;

use std::collections::HashMap;

use common::*;
use neardup_core::cluster::{DocTime, NearPair, Rule, cluster};
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::util::hamming;
use neardup_dedup::jaccard::jaccard;

/// The expected output of dedup computed the slow way: every pair of documents compared,
/// the core clustering run on the full pair graph.
struct Expected {
    ids: Vec<String>,
    fps: Vec<u64>,
    /// Per document: original, is_original, nearest, exact_duplicate_of (indices).
    docs: Vec<(usize, bool, Option<usize>, Option<usize>)>,
    /// Pairs of distinct texts within k (and verified).
    pairs: usize,
}

fn brute_force(pages: &[common::Page], k: u32, verify: Option<f64>, rule: Rule) -> Expected {
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let docs: Vec<_> = pages.iter().map(|p| f.fingerprint_doc(&p.body).unwrap()).collect();
    let sets: Vec<Vec<u64>> = pages.iter().map(|p| f.word_shingles(&p.body, 3).unwrap()).collect();
    let times: Vec<DocTime> = pages
        .iter()
        .enumerate()
        .map(|(i, p)| DocTime {
            timestamp: timestamp_ms(p).unwrap_or(i64::MAX),
            first_seen: i as u64,
        })
        .collect();
    let before = |a: usize, b: usize| (times[a].timestamp, a) < (times[b].timestamp, b);
    let mut pairs = Vec::new();
    // Pairs of distinct texts (exact duplicates count once).
    let mut distinct_pairs = std::collections::HashSet::new();
    for i in 0..pages.len() {
        for j in i + 1..pages.len() {
            let d = hamming(docs[i].simhash, docs[j].simhash);
            let s = jaccard(&sets[i], &sets[j]);
            if d <= k && verify.is_none_or(|t| s >= t) {
                let distance = if verify.is_some() { 1.0 - s } else { d as f64 };
                pairs.push(NearPair { a: i, b: j, distance: Some(distance) });
                let (x, y) = (docs[i].content_hash, docs[j].content_hash);
                if x != y {
                    distinct_pairs.insert((x.min(y), x.max(y)));
                }
            }
        }
    }
    let c = cluster(&times, &pairs, rule).unwrap();
    let out = c
        .docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let first_copy = (0..pages.len())
                .filter(|&j| docs[j].content_hash == docs[i].content_hash)
                .reduce(|a, b| if before(b, a) { b } else { a })
                .filter(|&j| j != i);
            (d.original, d.is_original, d.nearest.map(|n| n.doc), first_copy)
        })
        .collect();
    Expected {
        ids: pages.iter().map(|p| format!("p{}", p.index)).collect(),
        fps: docs.iter().map(|d| d.simhash).collect(),
        docs: out,
        pairs: distinct_pairs.len(),
    }
}

fn check(got: &[serde_json::Value], want: &Expected, ctx: &str) {
    assert_eq!(got.len(), want.ids.len(), "{ctx}: one record per document");
    let index: HashMap<&str, usize> =
        want.ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
    let id_of = |v: &serde_json::Value| -> Option<usize> { v.as_str().map(|s| index[s]) };
    let mut cluster_of_original: HashMap<usize, u64> = HashMap::new();
    for (i, rec) in got.iter().enumerate() {
        let (original, is_original, nearest, exact) = want.docs[i];
        assert_eq!(rec["id"], want.ids[i], "{ctx}: input order");
        assert_eq!(rec["fingerprint"], format!("{:016x}", want.fps[i]), "{ctx}: doc {i}");
        assert_eq!(id_of(&rec["original"]), Some(original), "{ctx}: original of doc {i}");
        assert_eq!(rec["is_original"], is_original, "{ctx}: doc {i}");
        assert_eq!(id_of(&rec["nearest"]), nearest, "{ctx}: nearest of doc {i}");
        let distance = nearest.map(|n| hamming(want.fps[i], want.fps[n]) as u64);
        assert_eq!(rec["distance"].as_u64(), distance, "{ctx}: distance of doc {i}");
        assert_eq!(id_of(&rec["exact_duplicate_of"]), exact, "{ctx}: exact duplicate of doc {i}");
        let c = rec["cluster"].as_u64().expect("cluster number");
        assert_eq!(
            *cluster_of_original.entry(original).or_insert(c),
            c,
            "{ctx}: cluster of doc {i}"
        );
        assert!(rec["url"].is_string(), "{ctx}: fields passed through");
        assert!(rec.get("text").is_none(), "{ctx}: text is not copied by default");
    }
    // Cluster numbers are dense and follow the input order of their originals.
    let mut by_number: Vec<(u64, usize)> =
        cluster_of_original.iter().map(|(&o, &c)| (c, o)).collect();
    by_number.sort_unstable();
    assert!(by_number.iter().enumerate().all(|(n, &(c, _))| c == n as u64), "{ctx}: dense");
    assert!(by_number.windows(2).all(|w| w[0].1 < w[1].1), "{ctx}: numbered in input order");
}

#[test]
fn clusters_match_brute_force() {
    let dir = TempDir::new("brute");
    let pages = pages(260, 3);
    let corpus = dir.path("corpus.jsonl");
    write_jsonl(&corpus, &pages);
    let c = corpus.to_str().unwrap();
    for (rule, rule_arg) in
        [(Rule::AttachToOriginal, "attach-to-original"), (Rule::ConnectedComponents, "components")]
    {
        for k in [3u32, 8] {
            let want = brute_force(&pages, k, None, rule);
            let summary = dir.path("summary.json");
            let k_arg = k.to_string();
            let out = run_ok(
                &[
                    "dedup",
                    c,
                    "--no-verify",
                    "-k",
                    &k_arg,
                    "--rule",
                    rule_arg,
                    "--summary",
                    summary.to_str().unwrap(),
                ],
                None,
            );
            let ctx = format!("{rule_arg}, k = {k}");
            check(&records(&out.stdout), &want, &ctx);
            let s: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
            let exact = want.docs.iter().filter(|d| d.3.is_some()).count();
            let originals = want.docs.iter().filter(|d| d.1).count();
            assert!(exact > 10, "{ctx}: the corpus plants exact duplicates");
            assert!(want.pairs > 5, "{ctx}: and near-duplicates within k ({})", want.pairs);
            assert_eq!(s["documents"], pages.len(), "{ctx}");
            assert_eq!(s["exact_duplicates"], exact, "{ctx}");
            assert_eq!(s["clusters"], originals, "{ctx}");
            assert_eq!(s["duplicate_documents"], pages.len() - originals, "{ctx}");
            assert_eq!(s["candidate_pairs"], want.pairs, "{ctx}");
            assert_eq!(s["skipped"], 0, "{ctx}");
        }
    }
}

#[test]
fn verify_matches_brute_force() {
    let dir = TempDir::new("verify");
    let pages = pages(220, 5);
    let corpus = dir.path("corpus.jsonl");
    write_jsonl(&corpus, &pages);
    let summary = dir.path("summary.json");
    let c = corpus.to_str().unwrap();
    // The defaults verify at J = 0.9 the candidates within k = 8.
    for (k, j, defaults) in [(8u32, 0.9, true), (12, 0.8, false), (6, 0.5, false)] {
        let want = brute_force(&pages, k, Some(j), Rule::AttachToOriginal);
        let (k_arg, j_arg) = (k.to_string(), j.to_string());
        let mut args = vec!["dedup", c, "--summary", summary.to_str().unwrap()];
        if !defaults {
            args.extend(["-k", &k_arg, "--verify", &j_arg]);
        }
        let out = run_ok(&args, None);
        let got = records(&out.stdout);
        check(&got, &want, &format!("verify {j} at k = {k}"));
        for rec in &got {
            if rec["nearest"].is_null() {
                assert!(rec["jaccard"].is_null());
            } else {
                assert!(rec["jaccard"].as_f64().is_some_and(|x| x >= j), "{rec}");
            }
        }
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
        assert_eq!(s["confirmed_pairs"], want.pairs);
        assert!(s["candidate_pairs"].as_u64() >= s["confirmed_pairs"].as_u64());
    }
}

#[test]
fn stdin_is_spooled_for_verify_and_fields_pass_through() {
    let pages = pages(80, 9);
    let dir = TempDir::new("stdin");
    let corpus = dir.path("corpus.jsonl");
    write_jsonl(&corpus, &pages);
    let input = std::fs::read(&corpus).unwrap();
    let from_file = run_ok(&["dedup", corpus.to_str().unwrap(), "--verify", "0.8"], None);
    let from_stdin = run_ok(&["dedup", "--verify", "0.8"], Some(&input));
    let dash = run_ok(&["dedup", "-", "--verify", "0.8", "--keep-text"], Some(&input));
    assert_eq!(from_file.stdout, from_stdin.stdout);
    let recs = records(&dash.stdout);
    assert_eq!(recs.len(), pages.len());
    for (rec, p) in recs.iter().zip(&pages) {
        assert_eq!(rec["text"], p.body.as_str());
        assert_eq!(rec["url"], p.url.as_str());
    }
}

#[test]
fn html_files_directories_and_csv() {
    let dir = TempDir::new("html");
    let site = dir.path("site");
    std::fs::create_dir_all(site.join("b")).unwrap();
    let body = "The committee approved the new budget for the coming year after a long debate";
    std::fs::write(
        site.join("a.html"),
        format!("<html><head><style>p {{ x }}</style></head><body><p>{body}.</p><script>var v = 1;</script></body></html>"),
    )
    .unwrap();
    // The same text with other markup, case and entities: an exact duplicate.
    std::fs::write(
        site.join("b/c.htm"),
        format!(
            "<!DOCTYPE html><div class=x>{}</div><!-- footer -->",
            body.to_uppercase().replace(' ', "&nbsp;")
        ),
    )
    .unwrap();
    std::fs::write(site.join("b/d.txt"), "Something else entirely, written as plain text.")
        .unwrap();
    let out = run_ok(&["dedup", site.to_str().unwrap(), "--format", "csv"], None);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "id,fingerprint,cluster,original,is_original,nearest,distance,exact_duplicate_of,jaccard"
    );
    let a = site.join("a.html").display().to_string();
    let c = site.join("b/c.htm").display().to_string();
    let d = site.join("b/d.txt").display().to_string();
    assert_eq!(lines.len(), 4, "{text}");
    let row = |l: &str| l.split(',').map(str::to_string).collect::<Vec<_>>();
    let (ra, rc, rd) = (row(lines[1]), row(lines[2]), row(lines[3]));
    assert_eq!(
        (ra[0].as_str(), rc[0].as_str(), rd[0].as_str()),
        (a.as_str(), c.as_str(), d.as_str())
    );
    assert_eq!(ra[1], rc[1], "same visible text, same fingerprint");
    assert_eq!(&rc[2..], [ra[2].as_str(), &a, "false", &a, "0", &a, "1.0"], "{text}");
    assert_eq!(&ra[4..], ["true", &c, "0", "", "1.0"]);
    assert_eq!(&rd[4..], ["true", "", "", "", ""]);
    // Without verifying there is no jaccard column.
    let out = run_ok(&["dedup", site.to_str().unwrap(), "--format", "csv", "--no-verify"], None);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(
        "id,fingerprint,cluster,original,is_original,nearest,distance,exact_duplicate_of\n"
    ));
}

#[test]
fn bad_input_is_reported_and_counted() {
    let dir = TempDir::new("bad");
    let jsonl = dir.path("in.jsonl");
    let lines = [
        r#"{"id": "a", "text": "one two three four five six seven"}"#,
        r#"{"id": "b", "text": "broken"#,
        r#"{"text": "no id here at all"}"#,
        r#"{"id": "d"}"#,
        "",
        r#"{"id": "e", "text": "  ... !!! "}"#,
        r#"{"id": "f", "text": "fine text", "timestamp": "last tuesday"}"#,
        r#"{"id": "g", "text": "one two three four five six seven"}"#,
    ];
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let docs = dir.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("latin1.txt"), b"caf\xe9 au lait").unwrap();
    std::fs::write(docs.join("empty.html"), "<html><body><img src=x></body></html>").unwrap();
    std::fs::write(docs.join("ok.txt"), "a perfectly fine document").unwrap();
    let summary = dir.path("summary.json");
    let skipped = dir.path("skipped.jsonl");
    let (j, d) = (jsonl.to_str().unwrap(), docs.to_str().unwrap());
    let out = run_ok(
        &[
            "dedup",
            j,
            d,
            "--summary",
            summary.to_str().unwrap(),
            "--skipped",
            skipped.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (location, words) in [
        (format!("{j}:2"), "broken JSON"),
        (format!("{j}:3"), "no \"id\""),
        (format!("{j}:4"), "no \"text\""),
        (format!("{j}:6"), "empty document"),
        (format!("{j}:7"), "last tuesday"),
        (format!("{d}/empty.html"), "empty document"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&format!("skipped {location}: ")) && l.contains(words)),
            "no message for {location} ({words}) in:\n{stderr}"
        );
    }
    let recs = records(&out.stdout);
    let ids: Vec<&str> = recs.iter().map(|r| r["id"].as_str().unwrap()).collect();
    // A Latin-1 file is decoded (its encoding guessed), not skipped.
    assert_eq!(ids, ["a", "g", &format!("{d}/latin1.txt"), &format!("{d}/ok.txt")]);
    assert_eq!(recs[1]["exact_duplicate_of"], "a");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(s["documents"], 4);
    assert_eq!(s["non_utf8_documents"], 1);
    assert_eq!(s["skipped"], 6);
    assert_eq!(s["blank_lines"], 1);
    assert_eq!(
        s["skipped_by_reason"],
        serde_json::json!({"broken_json": 1, "missing_id": 1, "missing_text": 1, "empty": 2, "bad_field": 1})
    );
    assert_eq!(std::fs::read_to_string(&skipped).unwrap().lines().count(), 6);

    // --on-error stop: a non-zero exit naming the first bad line, no output.
    let out = run(&["dedup", j, "--on-error", "stop"], None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{j}:2: broken JSON")), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn byte_order_mark_and_crlf_line_ends() {
    let dir = TempDir::new("crlf");
    let path = dir.path("windows.jsonl");
    let text = "\u{feff}{\"id\": 1, \"text\": \"first document here\"}\r\n\r\n{\"id\": 2, \"text\": \"First document, here!\"}\r\n";
    std::fs::write(&path, text).unwrap();
    let out = run_ok(&["dedup", path.to_str().unwrap()], None);
    let recs = records(&out.stdout);
    assert_eq!(recs.len(), 2, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(recs[1]["exact_duplicate_of"], 1);
}

#[test]
fn bad_options_and_missing_input_fail_clearly() {
    for (args, words) in [
        (vec!["dedup", "/nonexistent/corpus.jsonl"], "/nonexistent/corpus.jsonl"),
        (vec!["dedup", "-k", "40", "-"], "at most 16"),
        (vec!["dedup", "--verify", "1.5", "-"], "(0, 1]"),
        (vec!["dedup", "--word-ngram", "0", "-"], "word_ngram"),
    ] {
        let out = run(&args, Some(b""));
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(words), "{args:?}: {stderr}");
    }
}
