//! The `neardup` command line against a real `neardup serve` process: insert (one document
//! and JSON lines), query, check, fingerprint (server and local agree), delete, stats, and
//! a clear error for bad input.

use std::process::Output;

use neardup_tests::{Node, run};
use serde_json::Value;

const TEXT: &str = "A crawler fetches the same page again and again, with other ads and counters \
                    and a different date at the bottom, and wants to know it has seen it before.";

/// Runs a client command against `node`.
fn run_on(node: &Node, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend(["--server", &node.addr]);
    run(&all)
}

/// Runs a client command against `node` that must succeed; its stdout lines as JSON.
fn cli(node: &Node, args: &[&str]) -> Vec<Value> {
    let out = run_on(node, args);
    assert!(
        out.status.success(),
        "neardup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

fn ids(v: &Value) -> Vec<(String, u64)> {
    v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m["distance"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_command_against_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::serve_in(dir.path(), &[]).await;

    // One document by fingerprint, then a JSON-lines file with fingerprints (number and
    // hex) and a text.
    let r = cli(&node, &["insert", "--id", "a", "--fingerprint", "0xff00", "--timestamp-ms", "5"]);
    assert_eq!((r[0]["inserted"].as_u64(), r[0]["replaced"].as_u64()), (Some(1), Some(0)));
    let jsonl = dir.path().join("docs.jsonl");
    std::fs::write(
        &jsonl,
        format!(
            "{{\"id\":\"b\",\"fingerprint\":65281,\"timestamp_ms\":6}}\n\n\
             {{\"id\":\"c\",\"fingerprint\":\"0x00000000000fff00\",\"timestamp_ms\":7}}\n\
             {{\"id\":\"t\",\"text\":{TEXT:?},\"timestamp_ms\":8}}\n"
        ),
    )
    .unwrap();
    let r = cli(&node, &["insert", "--jsonl", jsonl.to_str().unwrap(), "--batch", "2"]);
    assert_eq!(r[0]["inserted"].as_u64(), Some(3));

    // Query: a (distance 0), b (0xff01, distance 1), c (0xfff00, distance 4) is beyond k=3.
    let r = cli(&node, &["query", "--fingerprint", "0xff00", "-k", "3"]);
    assert_eq!(ids(&r[0]), vec![("a".to_string(), 0), ("b".to_string(), 1)]);
    assert_eq!(r[0]["fingerprint"], "0x000000000000ff00");

    // The server and the local fingerprinter agree, and querying by the text finds "t".
    let server = cli(&node, &["fingerprint", TEXT]);
    let out = run(&["fingerprint", "--local", TEXT]);
    assert!(out.status.success());
    let local: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(server[0]["fingerprint"], local["fingerprint"]);
    let r = cli(&node, &["query", "--text", TEXT, "-k", "0"]);
    assert_eq!(ids(&r[0]), vec![("t".to_string(), 0)]);

    // Check: a near-copy of "a" is a duplicate whose original is "a" (the oldest); with
    // --skip-duplicates it is not stored. A far fingerprint is new and stored.
    let r = cli(&node, &["check", "--id", "d", "--fingerprint", "0xff02", "--skip-duplicates"]);
    assert_eq!(r[0]["duplicate"], true);
    assert_eq!(r[0]["original_id"], "a");
    assert_eq!(r[0]["inserted"], false);
    let r = cli(&node, &["check", "--id", "e", "--fingerprint", "0xabcdef0123456789"]);
    assert_eq!(
        (r[0]["duplicate"].as_bool(), r[0]["inserted"].as_bool()),
        (Some(false), Some(true))
    );

    // Delete one stored and one unknown id; stats count what is left.
    let r = cli(&node, &["delete", "b", "nobody"]);
    assert_eq!(r[0]["deleted"].as_u64(), Some(1));
    assert_eq!(r[0]["missing"], serde_json::json!(["nobody"]));
    let r = cli(&node, &["stats"]);
    assert_eq!(r[0]["documents"].as_u64(), Some(4)); // a, c, t, e
    for key in ["design", "max_k", "runs", "merging", "checkpoint_pending", "tables"] {
        assert!(!r[0][key].is_null(), "stats has {key}: {}", r[0]);
    }
    let r = cli(&node, &["query", "--fingerprint", "0xff00", "-k", "3"]);
    assert_eq!(ids(&r[0]), vec![("a".to_string(), 0)]);

    // Bad input: a clear message, a failing exit status, and nothing changed.
    for (args, says) in [
        (vec!["query", "--fingerprint", "0xff00", "-k", "60"], "k = 60 is out of range"),
        (vec!["query", "--fingerprint", "0xzz"], "not a 64-bit fingerprint"),
        (vec!["insert", "--id", "x"], "exactly one of --fingerprint and --text"),
    ] {
        let out = run_on(&node, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let r = cli(&node, &["stats"]);
    assert_eq!(r[0]["documents"].as_u64(), Some(4));
    node.terminate();
}
