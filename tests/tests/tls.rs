//! TLS on the public API, against a real `neardup serve`: certificates made by `neardup
//! cert`, a client trusting the authority reads and writes, a plaintext client and one that
//! trusts another authority are refused, the command line reaches it with `--tls-ca`, and a
//! certificate replaced on disk is served to new connections without a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, ClientTls, doc};
use neardup_tests::{Node, cert, run};

/// An authority in `dir/name` and a certificate for 127.0.0.1 it signs, `dir/name/server.*`.
fn pki(dir: &Path, name: &str) -> std::path::PathBuf {
    let d = dir.join(name);
    let s = d.to_str().unwrap();
    cert(&["ca", "--out", s, "--name", name]);
    cert(&[
        "issue",
        "--ca",
        s,
        "--name",
        "server",
        "--host",
        "127.0.0.1",
        "--host",
        "localhost",
        "--out",
        s,
    ]);
    d
}

async fn client(node: &Node, ca: Option<&Path>) -> Client {
    let tls =
        ca.map(|d| ClientTls { ca_pem: std::fs::read(d.join("ca.pem")).unwrap(), domain: None });
    let options = ClientOptions {
        timeout: Duration::from_secs(10),
        attempts: 1,
        tls,
        ..ClientOptions::default()
    };
    Client::connect_with(&node.addr, options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_public_api() {
    let dir = tempfile::tempdir().unwrap();
    let one = pki(dir.path(), "one");
    let two = pki(dir.path(), "two");
    // The server's files: a copy, so that they can be replaced.
    let (cert_file, key_file) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    std::fs::copy(one.join("server.pem"), &cert_file).unwrap();
    std::fs::copy(one.join("server.key"), &key_file).unwrap();
    let data = dir.path().join("data");
    let (c, k) = (
        format!("tls.cert_file={}", cert_file.display()),
        format!("tls.key_file={}", key_file.display()),
    );
    let args = ["serve", "--data", data.to_str().unwrap(), "--set", &c, "--set", &k];
    let node = Node::start(&args, dir.path());
    // Serving once a TLS client is answered (the health helper speaks plaintext).
    let trusted = client(&node, Some(&one)).await;
    let limit = Instant::now() + Duration::from_secs(60);
    while trusted.stats().await.is_err() {
        assert!(Instant::now() < limit, "never answered over TLS:\n{}", node.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    trusted.insert(vec![doc("https://a", 0x1234, 1)]).await.unwrap();
    assert_eq!(trusted.query(0x1234, Some(0), 10).await.unwrap().matches.len(), 1);
    // Plaintext, and a client trusting another authority: refused.
    assert!(client(&node, None).await.stats().await.is_err());
    assert!(client(&node, Some(&two)).await.stats().await.is_err());
    // The command line.
    let ca = one.join("ca.pem");
    let q = [
        "query",
        "--server",
        &node.addr,
        "--fingerprint",
        "0x1234",
        "--k",
        "0",
        "--tls-ca",
        ca.to_str().unwrap(),
    ];
    let out = run(&q);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("https://a"));
    // A certificate replaced on disk: new connections get it, no restart.
    std::fs::copy(two.join("server.key"), &key_file).unwrap();
    std::fs::copy(two.join("server.pem"), &cert_file).unwrap();
    let limit = Instant::now() + Duration::from_secs(15);
    loop {
        if client(&node, Some(&two)).await.stats().await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < limit,
            "the new certificate was never served:\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(client(&node, Some(&one)).await.stats().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_that_do_not_read_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let missing = dir.path().join("missing.pem");
    let c = format!("tls.cert_file={}", missing.display());
    let k = format!("tls.key_file={}", dir.path().join("missing.key").display());
    let base = ["serve", "--data", data.to_str().unwrap(), "--listen", "127.0.0.1:0"];
    let out = run(&[&base[..], &["--set", &c, "--set", &k]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.pem"));
    // One without the other.
    let out = run(&[&base[..], &["--set", &c]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("go together"));
}
