//! Conformance of the Rust sketch with "neardup sketch" versions 1 and 2 (docs/fingerprint.md,
//! section 15).
//!
//! The expected values in `data/sketch_vectors.tsv` are written by the independent Python
//! reference (`docs/fingerprint_reference.py sketch-regenerate`); this test recomputes every
//! one of them, and when `python3` is available runs the reference's own check on the file.

use std::path::PathBuf;
use std::process::Command;

use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::sketch::Sketch;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn vectors() -> String {
    std::fs::read_to_string(root().join("core/tests/data/sketch_vectors.tsv")).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn rust_reproduces_every_sketch_vector() {
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let mut rows = 0;
    for line in vectors().lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let c: Vec<&str> = line.split('\t').collect();
        assert_eq!(c.len(), 6, "malformed row {line:?}");
        // The vectors use no escapes.
        assert!(!c[1].contains('\\') && !c[2].contains('\\'), "{}: escapes", c[0]);
        rows += 1;
        let shingles = f.word_shingles(c[1], 3).unwrap();
        assert_eq!(shingles.len().to_string(), c[3], "{}: shingles", c[0]);
        let sketch = match Sketch::of_text(&mut f, c[1]) {
            Ok(s) => s,
            Err(neardup_core::Error::EmptyDocument) => {
                assert_eq!((c[4], c[5]), ("error:EmptyDocument", "-"), "{}", c[0]);
                continue;
            }
            Err(e) => panic!("{}: {e}", c[0]),
        };
        assert_eq!(hex(&sketch.to_bytes()), c[4], "{}: sketch", c[0]);
        assert_eq!(Sketch::from_bytes(&sketch.to_bytes()).unwrap(), sketch);
        let est = if c[2].is_empty() {
            "-".to_string()
        } else {
            format!("{:.6}", sketch.jaccard(&Sketch::of_text(&mut f, c[2]).unwrap()))
        };
        assert_eq!(est, c[5], "{}: estimate", c[0]);
    }
    assert!(rows >= 12, "only {rows} vectors");
}

#[test]
fn reference_agrees_with_the_sketch_vector_file() {
    let ok = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("python3 not found: skipping the reference-implementation comparison");
        return;
    }
    let out = Command::new("python3")
        .arg(root().join("docs/fingerprint_reference.py"))
        .arg("sketch-check")
        .arg(root().join("core/tests/data/sketch_vectors.tsv"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the reference disagrees with the file:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
