//! The `neardup` command line against a real `neardup serve` process: insert (one document
//! and JSON lines), query, check, fingerprint (server and local agree), delete, stats, and
//! a clear error for bad input.

use std::process::Output;

use neardup_server::tls::{ClusterTls, ClusterTlsFiles};
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

/// `neardup secrets` makes a small cluster's CA, node certificates and tokens once: a second
/// run keeps every file as it is, a half pair is an error that names both files, and the
/// node certificates name their nodes.
#[test]
fn secrets_are_made_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let args = [
        "secrets",
        "--out",
        out.to_str().unwrap(),
        "--node=1=node1",
        "--node=2=node2,node2.example",
        "--token=admin=admin",
        "--metrics-token",
    ];
    let first = run(&args);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let made: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(
        made["made"],
        serde_json::json!(["ca", "node1", "node2", "admin.token", "metrics.token"])
    );
    let files = [
        "ca.pem",
        "ca.key",
        "node1.pem",
        "node2.key",
        "tokens.toml",
        "admin.token",
        "metrics.token",
    ];
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(out.join(f)).unwrap()).collect();
    let tokens = String::from_utf8(before[4].clone()).unwrap();
    assert!(
        tokens.contains("role = \"admin\"")
            && !tokens.contains(std::str::from_utf8(&before[5]).unwrap())
    );
    use std::os::unix::fs::PermissionsExt;
    for secret in ["ca.key", "node1.key", "admin.token", "metrics.token"] {
        let mode = std::fs::metadata(out.join(secret)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{secret}");
    }

    let again = run(&args);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let kept: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(kept["made"], serde_json::json!([]));
    let after: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(out.join(f)).unwrap()).collect();
    assert_eq!(before, after, "a second run changed a file");

    // Node 2's certificate names node 2 (mutual TLS between nodes checks it).
    let files = ClusterTlsFiles {
        ca_file: out.join("ca.pem"),
        cert_file: out.join("node2.pem"),
        key_file: out.join("node2.key"),
    };
    assert_eq!(ClusterTls::new(files).unwrap().node(), Some(2));

    std::fs::remove_file(out.join("node1.key")).unwrap();
    let half = run(&args);
    assert!(!half.status.success());
    let said = String::from_utf8_lossy(&half.stderr);
    assert!(said.contains("node1.pem") && said.contains("node1.key"), "{said}");
}
