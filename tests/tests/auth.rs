//! Tokens with roles on the public API, against a real `neardup serve`: tokens made by
//! `neardup token new --append`, checked by the server (UNAUTHENTICATED without a valid
//! token, PERMISSION_DENIED for a role that does not allow the method, nothing stored by a
//! refused write), the tokens file read again when it changes, no token in the server's
//! log, and a tokens file that does not read stops the start.

use std::path::Path;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, Token, doc};
use neardup_tests::cluster::Member;
use neardup_tests::{Node, run};
use serde_json::Value;
use tonic::Code;

/// `neardup token new --role ROLE --name NAME --append FILE`: the token it printed.
fn new_token(role: &str, name: &str, file: &Path) -> String {
    let out =
        run(&["token", "new", "--role", role, "--name", name, "--append", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["role"], role);
    v["token"].as_str().unwrap().to_string()
}

async fn client(node: &Node, token: Option<&str>) -> Client {
    let options = ClientOptions {
        timeout: Duration::from_secs(10),
        attempts: 1,
        token: token.map(Token::new),
        ..ClientOptions::default()
    };
    Client::connect_with(&node.addr, options).await.unwrap()
}

fn code<T: std::fmt::Debug>(r: neardup_client::Result<T>) -> Option<Code> {
    match r {
        Ok(_) => None,
        Err(e) => e.code(),
    }
}

/// Polls (every 100 ms, at most 10 s) until a Query with `token` is answered with `want`
/// (`None`: answered), and says whether it was.
async fn until_query(node: &Node, token: &str, want: Option<Code>) -> bool {
    let limit = Instant::now() + Duration::from_secs(10);
    let c = client(node, Some(token)).await;
    while Instant::now() < limit {
        if code(c.query(1, Some(0), 1).await) == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_with_roles_on_the_public_api() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let read = new_token("read", "reader", &tokens);
    let write = new_token("write", "writer", &tokens);
    let data = dir.path().join("data");
    let file_set = format!("auth.tokens_file={}", tokens.display());
    let args = ["serve", "--data", data.to_str().unwrap(), "--set", &file_set];
    let mut node = Node::start(&args, dir.path());
    // Health stays open.
    node.serving().await;

    // No token, a wrong one: UNAUTHENTICATED.
    let none = client(&node, None).await;
    assert_eq!(code(none.query(1, Some(0), 1).await), Some(Code::Unauthenticated));
    let wrong = client(&node, Some("nd_0000")).await;
    assert_eq!(code(wrong.insert(vec![doc("https://a", 1, 1)]).await), Some(Code::Unauthenticated));
    // A read token may read, not write: PERMISSION_DENIED, and nothing is stored.
    let reader = client(&node, Some(&read)).await;
    assert_eq!(
        code(reader.insert(vec![doc("https://a", 1, 1)]).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(reader.delete(vec!["https://a".into()], false).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(reader.stats().await.unwrap().documents, 0);
    // A write token writes; the reader sees it.
    let writer = client(&node, Some(&write)).await;
    writer.insert(vec![doc("https://a", 0xABCD, 1)]).await.unwrap();
    let r = reader.query(0xABCD, Some(0), 10).await.unwrap();
    assert_eq!(r.matches.len(), 1);
    assert_eq!(reader.stats().await.unwrap().documents, 1);

    // The command line takes the token from a file, or from the environment.
    let token_file = dir.path().join("read.token");
    std::fs::write(&token_file, format!("{read}\n")).unwrap();
    let q = ["query", "--server", &node.addr, "--fingerprint", "0xABCD", "--k", "0"];
    let out = run(&[&q[..], &["--token-file", token_file.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("https://a"));
    let out = run(&q);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("unauthenticated"), "{err}");

    // A token added to the file is taken within moments; one taken out is refused.
    let later = new_token("read", "later", &tokens);
    assert!(until_query(&node, &later, None).await, "the new token was never accepted");
    let kept: String = std::fs::read_to_string(&tokens)
        .unwrap()
        .split("[[token]]")
        .filter(|e| !e.trim().is_empty() && !e.contains("\"reader\""))
        .map(|e| format!("[[token]]{e}"))
        .collect();
    std::fs::write(&tokens, kept).unwrap();
    assert!(
        until_query(&node, &read, Some(Code::Unauthenticated)).await,
        "the removed token was still accepted"
    );
    assert!(until_query(&node, &later, None).await);
    // A file that no longer reads keeps the tokens in force.
    std::fs::write(&tokens, "not [ toml").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(until_query(&node, &write, None).await);

    // No token appears in the server's log.
    node.terminate();
    let log = node.log_text();
    for t in [&read, &write, &later] {
        assert!(!log.contains(t.as_str()), "a token is in the log");
    }
    assert!(log.contains("did not read"), "the bad file is not reported:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_file_that_does_not_read_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (name, text) in [
        ("missing.toml", None),
        ("bad.toml", Some("[[token]]\nname = \"x\"\nrole = \"root\"\nsha256 = \"00\"\n")),
    ] {
        let path = dir.path().join(name);
        if let Some(t) = text {
            std::fs::write(&path, t).unwrap();
        }
        let set = format!("auth.tokens_file={}", path.display());
        let out = run(&[
            "serve",
            "--data",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--set",
            &set,
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name), "{err}");
    }
}

/// `neardup cluster status` at `m`'s admin API with `extra` flags.
fn status(m: &Member, extra: &[&str]) -> std::process::Output {
    let args =
        [&["cluster", "status", "--addr", m.internal.as_str(), "--timeout-ms", "3000"][..], extra]
            .concat();
    run(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_an_admin_token_and_a_join_carries_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let admin = new_token("admin", "operator", &tokens);
    let read = new_token("read", "reader", &tokens);
    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, &admin).unwrap();
    let admin_flag = ["--token-file", admin_file.to_str().unwrap()];
    let file_set = format!("auth.tokens_file={}", tokens.display());
    let join_set = format!("cluster.join_token_file={}", admin_file.display());
    let mut m1 = Member::on_loopback(1, dir.path());
    m1.start(&["--bootstrap", "--set", &file_set]);
    let mut m2 = Member::on_loopback(2, dir.path());
    m2.start(&["--join", &m1.internal.clone(), "--set", &file_set, "--set", &join_set]);
    // Node 2 joined with its admin token: the map lists both.
    let limit = Instant::now() + Duration::from_secs(60);
    loop {
        let out = status(&m1, &admin_flag);
        let nodes = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["nodes"].as_array().map(Vec::len));
        if nodes == Some(2) {
            break;
        }
        assert!(Instant::now() < limit, "node 2 never joined:\n{}", m2.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without a token, and with a read token, the admin API refuses.
    let err = |out: std::process::Output| {
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_lowercase()
    };
    assert!(err(status(&m1, &[])).contains("unauthenticated"));
    let read_flag = ["--token", read.as_str()];
    assert!(err(status(&m2, &read_flag)).contains("permission"));
    // A node that joins without a token is refused and stops.
    let mut m3 = Member::on_loopback(3, dir.path());
    m3.start(&["--join", &m1.internal.clone(), "--set", &file_set]);
    assert!(!m3.wait_exit(), "node 3 joined without a token");
    assert!(m3.log_text().contains("cannot join"), "{}", m3.log_text());
    drop((m1, m2));
}
