//! Helpers for the process-level tests: find the binary, run it, make corpora.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use neardup_dedup::synth::Page;
use neardup_dedup::synth::{GenerateArgs, Pages};

/// The `neardup` command line under test (see `neardup_tests::binary`).
pub fn binary() -> PathBuf {
    neardup_tests::binary()
}

/// Runs `binary() <args>` with `stdin`, returning its output.
pub fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(binary())
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("wait for the binary")
}

/// Like [`run`], failing the test with stderr when the exit status is not 0.
pub fn run_ok(args: &[&str], stdin: Option<&[u8]>) -> Output {
    succeeded(args, run(args, stdin))
}

/// Runs the measurement program `neardup-bench <args>` (see `neardup_tests::bench_binary`),
/// failing the test with stderr when the exit status is not 0.
pub fn run_bench_ok(args: &[&str]) -> Output {
    succeeded(args, neardup_tests::run_bench(args))
}

fn succeeded(args: &[&str], out: Output) -> Output {
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh temporary directory for one test, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("neardup-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Plain-text pages with many planted copies, small enough for brute force.
pub fn pages(docs: usize, seed: u64) -> Vec<Page> {
    let mut a = GenerateArgs::new(PathBuf::new(), docs);
    a.seed = seed;
    a.words = 150;
    a.max_edit_rate = 0.015;
    a.related = 1;
    a.sites = 12;
    a.plain = true;
    a.exact_fraction = 0.1;
    a.near_fraction = 0.35;
    Pages::new(&a).collect()
}

/// How a page's timestamp is written into the JSONL test corpus: RFC 3339, integer
/// seconds, or left out, by page number; a few pages share a timestamp to test ties.
pub fn timestamp_json(p: &Page) -> Option<serde_json::Value> {
    let ts = if p.index % 11 == 3 { 1_600_000_000 } else { p.timestamp };
    match p.index % 5 {
        0 => None,
        1 | 2 => Some(serde_json::json!(ts)),
        _ => Some(serde_json::json!(rfc3339(ts))),
    }
}

/// Milliseconds of [`timestamp_json`], as dedup reads it.
pub fn timestamp_ms(p: &Page) -> Option<i64> {
    timestamp_json(p).map(|v| match v {
        serde_json::Value::String(s) => neardup_dedup::timestamp::parse_rfc3339(&s).unwrap(),
        n => n.as_i64().unwrap() * 1000,
    })
}

fn rfc3339(secs: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Writes pages as JSONL: `id` (`"p<index>"`), `text`, `timestamp` (see
/// [`timestamp_json`]) and an extra field `url`.
pub fn write_jsonl(path: &Path, pages: &[Page]) {
    let mut out = String::new();
    for p in pages {
        let mut rec =
            serde_json::json!({"id": format!("p{}", p.index), "url": p.url, "text": p.body});
        if let Some(ts) = timestamp_json(p) {
            rec["timestamp"] = ts;
        }
        out.push_str(&rec.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).expect("write corpus");
}

/// Parses JSONL output.
pub fn records(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8(bytes.to_vec())
        .expect("UTF-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}
