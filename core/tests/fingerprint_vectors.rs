//! Conformance of the Rust fingerprinter with "neardup fingerprint v1" (docs/fingerprint.md).
//!
//! The expected values in `data/fingerprint_vectors.tsv` are written by the independent
//! Python reference (`docs/fingerprint_reference.py`); this test recomputes every one of them.
//! When `python3` is available it also runs the reference on the file (so an edited vector or
//! an edited reference fails) and on a few hundred random texts, and compares.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use neardup_core::Error;
use neardup_core::fingerprint::{FeatureHash, FingerprintConfig, Fingerprinter, Idf};

const INPUT_COLUMNS: usize = 7;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn vectors_path() -> PathBuf {
    root().join("core/tests/data/fingerprint_vectors.tsv")
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => out.push('\\'),
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('u') => {
                assert_eq!(it.next(), Some('{'), "bad escape in {s:?}");
                let hex: String = it.by_ref().take_while(|&c| c != '}').collect();
                let cp = u32::from_str_radix(&hex, 16).expect("hex escape");
                out.push(char::from_u32(cp).expect("scalar value"));
            }
            other => panic!("bad escape \\{other:?} in {s:?}"),
        }
    }
    out
}

fn idf_from(spec: &str) -> Option<Idf> {
    if spec == "-" {
        return None;
    }
    let mut parts = spec.split(';');
    let mut idf = Idf::new(parts.next().unwrap().parse().expect("idf default"));
    for p in parts {
        let (f, w) = p.rsplit_once('=').expect("feature=weight");
        idf.insert(&unescape(f), w.parse().expect("idf weight"));
    }
    Some(idf)
}

/// The result columns the Rust implementation computes for one row's inputs.
fn rust_columns(cols: &[&str]) -> Vec<String> {
    let config = FingerprintConfig {
        word_ngram: cols[1].parse().unwrap(),
        char_ngram: cols[2].parse().unwrap(),
        hash: match cols[3] {
            "md5" => FeatureHash::Md5,
            "xxh3" => FeatureHash::Xxh3,
            h => panic!("unknown hash {h}"),
        },
        hangul_as_chars: cols[4] == "1",
    };
    let mut f = match idf_from(cols[5]) {
        None => Fingerprinter::new(config).unwrap(),
        Some(idf) => Fingerprinter::with_idf(config, Arc::new(idf)).unwrap(),
    };
    match f.fingerprint_doc(&unescape(cols[6])) {
        Ok(d) => vec![
            format!("{:016x}", d.simhash),
            format!("{:032x}", d.content_hash),
            d.tokens.to_string(),
            d.features.to_string(),
            d.distinct_features.to_string(),
        ],
        Err(Error::EmptyDocument) => {
            let mut v = vec!["error:EmptyDocument".to_string()];
            v.extend(std::iter::repeat_n("-".to_string(), 4));
            v
        }
        Err(e) => panic!("{}: unexpected error {e}", cols[0]),
    }
}

/// Compares every data row of `text` with the Rust results; returns the row count.
fn compare_rows(text: &str, origin: &str) -> usize {
    let mut rows = 0;
    let mut bad = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), INPUT_COLUMNS + 5, "{origin}: malformed row {line:?}");
        rows += 1;
        let got = rust_columns(&cols);
        if got != cols[INPUT_COLUMNS..] {
            bad.push(format!(
                "{}: expected {:?}, Rust computed {:?}",
                cols[0],
                &cols[INPUT_COLUMNS..],
                got
            ));
        }
    }
    assert!(bad.is_empty(), "{origin}: {} mismatches:\n{}", bad.len(), bad.join("\n"));
    rows
}

#[test]
fn rust_reproduces_every_vector() {
    let text = std::fs::read_to_string(vectors_path()).unwrap();
    let rows = compare_rows(&text, "fingerprint_vectors.tsv");
    assert!(rows >= 60, "only {rows} vectors");
    // The file covers both hashes, IDF, Hangul as characters, and the error case.
    for needle in ["\tmd5\t", "\txxh3\t", "\t2;the=0;", "\tmd5\t1\t-\t", "error:EmptyDocument"] {
        assert!(text.contains(needle), "no vector with {needle:?}");
    }
}

fn python() -> Option<Command> {
    let ok = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if ok {
        let mut c = Command::new("python3");
        c.arg(root().join("docs/fingerprint_reference.py"));
        Some(c)
    } else {
        eprintln!("python3 not found: skipping the reference-implementation comparison");
        None
    }
}

#[test]
fn reference_selftest_passes() {
    let Some(mut py) = python() else { return };
    let out = py.arg("selftest").output().unwrap();
    assert!(
        out.status.success(),
        "reference selftest failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reference_agrees_with_the_vector_file() {
    let Some(mut py) = python() else { return };
    let out = py.arg("check").arg(vectors_path()).output().unwrap();
    assert!(
        out.status.success(),
        "the reference implementation disagrees with the vector file:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reference_agrees_on_random_texts() {
    for seed in [1, 2] {
        let Some(mut py) = python() else { return };
        let out = py.args(["random", "150", &seed.to_string()]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let rows = compare_rows(&text, &format!("random seed {seed}"));
        assert_eq!(rows, 150);
    }
}
