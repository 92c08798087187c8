//! Mutual TLS between the nodes of a cluster, with real processes: three nodes whose internal
//! ports take only certificates of the cluster's CA, each naming its node
//! (`neardup cert issue --node-id`).
//!
//! - The cluster forms (joins, Raft, data moving between nodes) and answers exactly across
//!   nodes (checked against brute force over the acknowledged documents).
//! - `neardup cluster status` needs a certificate of the CA: plaintext is refused.
//! - A node whose certificate another CA signed cannot join (it stops), read or write.
//! - Once removed, a node is refused by the others although its certificate is valid: its
//!   writes (through its own public API, and sent straight to a member's data service) and
//!   its Raft messages; it cannot be added again under its id.
//! - An operator's certificate (naming no node) reaches the admin API, not the data service.
//! - A cluster node listening beyond loopback without TLS refuses to start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, doc};
use neardup_proto::internal::data_client::DataClient;
use neardup_proto::internal::raft_client::RaftClient;
use neardup_proto::internal::{NodeStatsRequest, RaftMessage, TabletEntryOp, TabletWriteRequest};
use neardup_server::tls::{ClusterTls, ClusterTlsFiles, peer_endpoint};
use neardup_tests::cluster::Member;
use neardup_tests::{brute_ids as brute, query_ids as query};
use neardup_tests::{cert, run};
use serde_json::Value;
use tonic::Code;

/// A CA in `dir/name`, with the certificates of nodes `nodes` (named `node-ID`) and of an
/// operator (`op`, naming no node), all for 127.0.0.1.
fn pki(dir: &Path, name: &str, nodes: &[u64]) -> PathBuf {
    let d = dir.join(name);
    let s = d.to_str().unwrap();
    cert(&["ca", "--out", s, "--name", name]);
    for id in nodes {
        let (n, i) = (format!("node-{id}"), id.to_string());
        cert(&[
            "issue",
            "--ca",
            s,
            "--name",
            &n,
            "--node-id",
            &i,
            "--host",
            "127.0.0.1",
            "--out",
            s,
        ]);
    }
    cert(&["issue", "--ca", s, "--name", "op", "--host", "127.0.0.1", "--out", s]);
    d
}

/// `--set` arguments of a node's mutual TLS: the CA of `ca_dir`, its certificate in
/// `cert_dir`.
fn tls_args(ca_dir: &Path, cert_dir: &Path, id: u64) -> Vec<String> {
    let f = |k: &str, p: PathBuf| ["--set".to_string(), format!("cluster.{k}={}", p.display())];
    [
        f("tls_ca_file", ca_dir.join("ca.pem")),
        f("tls_cert_file", cert_dir.join(format!("node-{id}.pem"))),
        f("tls_key_file", cert_dir.join(format!("node-{id}.key"))),
    ]
    .concat()
}

/// The client side of mutual TLS with the CA of `ca_dir` and the certificate `name` there.
fn identity(ca_dir: &Path, name: &str) -> ClusterTls {
    let files = ClusterTlsFiles {
        ca_file: ca_dir.join("ca.pem"),
        cert_file: ca_dir.join(format!("{name}.pem")),
        key_file: ca_dir.join(format!("{name}.key")),
    };
    std::sync::Arc::into_inner(ClusterTls::new(files).unwrap()).unwrap()
}

/// A channel to the internal port `addr` as `who`.
async fn internal(addr: &str, who: &ClusterTls) -> tonic::transport::Channel {
    peer_endpoint(addr, Some(who))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("a certificate of the CA connects")
}

/// `neardup ARGS...` beside member `m`, with the operator's certificate of `ca_dir`.
fn operator(m: &Member, ca_dir: &Path, args: &[&str]) -> Result<Value, String> {
    let f = |name: &str| ca_dir.join(name).display().to_string();
    let (ca, cert, key) = (f("ca.pem"), f("op.pem"), f("op.key"));
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    m.cli(&[args, &tls[..]].concat())
}

/// `neardup cluster status` of member `m` with the operator's certificate of `ca_dir`.
fn status(m: &Member, ca_dir: &Path) -> Result<Value, String> {
    operator(m, ca_dir, &["cluster", "status", "--addr", &m.internal, "--timeout-ms", "3000"])
}

/// Waits (a safety net of two minutes) until `m`'s status satisfies `ready`.
fn wait_status(m: &mut Member, ca_dir: &Path, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(m.running(), "node {} exited while waiting for {what}:\n{}", m.id, m.log_text());
        if let Ok(v) = status(m, ca_dir)
            && ready(&v)
        {
            return v;
        }
        assert!(Instant::now() < limit, "node {}: no {what}:\n{}", m.id, m.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ids of the nodes in a status.
fn node_ids(v: &Value) -> Vec<u64> {
    v["nodes"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| n["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// A client of `m`'s public API making `attempts` tries of a call that finds the cluster
/// UNAVAILABLE (a write that meets the map moving twice, while units still move, is one).
async fn client(m: &Member, attempts: u32) -> Client {
    let options =
        ClientOptions { timeout: Duration::from_secs(10), attempts, ..ClientOptions::default() };
    Client::connect_with(&m.public, options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let ca = pki(dir.path(), "cluster", &[1, 2, 3]);
    let other = pki(dir.path(), "other", &[4]);
    let mut members: Vec<Member> = (1..=3).map(|id| Member::on_loopback(id, dir.path())).collect();
    let via = members[0].internal.clone();
    for m in members.iter_mut() {
        let mut args = tls_args(&ca, &ca, m.id);
        if m.id == 1 {
            args.push("--bootstrap".into());
        } else {
            args.extend(["--join".to_string(), via.clone()]);
        }
        m.start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    wait_status(&mut members[0], &ca, "three active nodes, nothing filling", |v| {
        let nodes = v["nodes"].as_array().map(Vec::as_slice).unwrap_or_default();
        let settled = |units: &Value| {
            units.as_array().is_some_and(|u| {
                u.iter().all(|u| u["filling"].as_array().is_some_and(Vec::is_empty))
            })
        };
        nodes.len() == 3
            && nodes.iter().all(|n| n["state"] == "active")
            && settled(&v["tablets"])
            && settled(&v["partitions"])
    });

    // Writes through node 1, reads through node 3: the data crosses nodes over mutual TLS.
    // The writes are tried again when they meet the map moving (placement may still move
    // units after a moment with none filling), as a client does by default.
    let c1 = client(&members[0], ClientOptions::default().attempts).await;
    let c3 = client(&members[2], 1).await;
    let mut acked = BTreeMap::new();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Every fourth document lies near an earlier one, so queries find several.
        let fp = if i % 4 == 3 {
            acked.values().last().copied().unwrap_or(x) ^ (1 << (i % 64))
        } else {
            x
        };
        let id = format!("https://mtls.example/{i}");
        c1.insert(vec![doc(&id, fp, i)]).await.unwrap();
        acked.insert(id, fp);
    }
    for (i, &fp) in acked.values().enumerate().step_by(10) {
        let k = (i % 4) as u32;
        assert_eq!(query(&c3, fp, k).await, brute(&acked, fp, k), "query {fp:#x} k {k}");
    }

    // Plaintext to the internal port is refused.
    let out = members[0].cli(&["cluster", "status", "--addr", &via, "--timeout-ms", "3000"]);
    assert!(out.is_err(), "plaintext status answered: {out:?}");

    // A node whose certificate another CA signed (trusting the cluster's CA) cannot join.
    let mut stranger = Member::on_loopback(4, dir.path());
    let mut args = tls_args(&ca, &other, 4);
    args.extend(["--join".to_string(), via.clone()]);
    stranger.start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!stranger.wait_exit(), "a node of another CA joined");
    assert!(stranger.log_text().contains("cannot join"), "{}", stranger.log_text());
    assert_eq!(node_ids(&status(&members[0], &ca).unwrap()), vec![1, 2, 3]);

    // Its certificate, trusting the cluster's CA, reads nothing and writes nothing either:
    // the handshake refuses it.
    let files = ClusterTlsFiles {
        ca_file: ca.join("ca.pem"),
        cert_file: other.join("node-4.pem"),
        key_file: other.join("node-4.key"),
    };
    let foreign = std::sync::Arc::into_inner(ClusterTls::new(files).unwrap()).unwrap();
    let channel = peer_endpoint(&via, Some(&foreign)).unwrap().timeout(Duration::from_secs(10));
    match channel.connect().await {
        Err(_) => {}
        Ok(channel) => {
            let mut data = DataClient::new(channel);
            let read = data.node_stats(NodeStatsRequest::default()).await;
            assert!(read.is_err(), "another CA's certificate read: {read:?}");
            let put = TabletWriteRequest {
                epoch: 1,
                ops: vec![TabletEntryOp { table: 0, gid: 1 << 40, fp: 1, remove: false }],
                new_gids: false,
            };
            let write = data.tablet_write(put).await;
            assert!(write.is_err(), "another CA's certificate wrote: {write:?}");
        }
    }

    // The operator's certificate names no node: the admin API answers it, the data service
    // does not.
    let op = identity(&ca, "op");
    let e = DataClient::new(internal(&via, &op).await)
        .node_stats(NodeStatsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Remove node 3 (its process keeps running).
    let removed = operator(&members[0], &ca, &["cluster", "remove", "3", "--addr", &via]);
    assert!(removed.is_ok(), "{removed:?}");
    let v = wait_status(&mut members[0], &ca, "node 3 removed", |v| node_ids(v) == [1, 2]);
    assert_eq!(v["removed"], serde_json::json!([3]));
    assert!(members[2].running(), "node 3 stopped by itself");

    // Its writes through its own public API are not acknowledged, and not stored.
    let fp = 0x0123_4567_89AB_CDEF;
    let write = c3.insert(vec![doc("https://mtls.example/removed", fp, 1)]).await;
    assert!(write.is_err(), "a removed node acknowledged a write: {write:?}");
    let c2 = client(&members[1], 1).await;
    assert_eq!(query(&c2, fp, 3).await, brute(&acked, fp, 3));

    // Sent straight to a member with its valid certificate: refused, saying why.
    let node3 = identity(&ca, "node-3");
    let epoch = v["epoch"].as_u64().unwrap();
    let put = TabletWriteRequest {
        epoch,
        ops: vec![TabletEntryOp { table: 0, gid: 1 << 40, fp, remove: false }],
        new_gids: false,
    };
    let e = DataClient::new(internal(&via, &node3).await).tablet_write(put).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("removed"), "{}", e.message());
    let raft =
        RaftMessage { message: Vec::new(), from_id: 3, from_addr: members[2].internal.clone() };
    let e = RaftClient::new(internal(&via, &node3).await).step(raft).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(query(&c2, fp, 3).await, brute(&acked, fp, 3));

    // A member cannot speak for another node, and node 3 cannot come back under its id.
    let node2 = identity(&ca, "node-2");
    let as_1 = RaftMessage { message: Vec::new(), from_id: 1, from_addr: String::new() };
    let e = RaftClient::new(internal(&via, &node2).await).step(as_1).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let (public, internal) = (members[2].public.clone(), members[2].internal.clone());
    let add = ["cluster", "add", "--addr", &via, "--node-id", "3", "--public", &public];
    let again = operator(&members[0], &ca, &[&add[..], &["--internal", &internal]].concat());
    let e = again.expect_err("a removed id was added again");
    assert!(e.contains("was removed"), "{e}");

    // Everything acknowledged is still answered exactly by the remaining nodes.
    for (i, &fp) in acked.values().enumerate().step_by(25) {
        assert_eq!(query(&c2, fp, 2).await, brute(&acked, fp, 2), "query {fp:#x} ({i})");
    }
    drop(members);
}

#[test]
fn a_cluster_node_beyond_loopback_without_tls_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    // The check runs on the configured address, before anything is bound.
    let out = run(&[
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--listen",
        "0.0.0.0:1",
        "--metrics-listen",
        "",
        "--node-id",
        "1",
        "--bootstrap",
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("beyond loopback needs TLS") && e.contains("--insecure"), "{e}");
    assert!(!data.join("cluster").exists(), "state was made before the refusal");
}
