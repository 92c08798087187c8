//! Damaged stored data: a damaged table is rebuilt from an intact one and served exactly; a
//! run that cannot be loaded is reported clearly, health is NOT_SERVING, and nothing is
//! answered from it. A damaged database file (truncated, a byte flipped, unreadable) never
//! crashes the binary: it exits 1 with one clear line, or reports NOT_SERVING and answers
//! DATA_LOSS, or serves every acknowledged document. (Many more damage trials run in
//! process, in the shard's own tests.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neardup_client::{Target, doc};
use neardup_core::util::SplitMix64;
use neardup_server::persist::{Manifest, key64};
use neardup_server::storage::{SledStore, Store};
use neardup_tests::Node;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// Flips a byte in the first value stored for the newest run in keyspace `space`.
fn damage(data: &std::path::Path, space: &str) {
    let store = SledStore::open(&data.join("db"), 8 << 20).unwrap();
    let meta = store.space("meta").unwrap();
    let manifest = Manifest::decode(&meta.get(b"manifest").unwrap().unwrap()).unwrap();
    let sid = *manifest.runs.last().expect("a stored run");
    let s = store.space(space).unwrap();
    let (k, mut v) = s.scan(&key64(sid), &key64(sid + 1)).next().unwrap().unwrap();
    let i = v.len() / 3;
    v[i] ^= 0x41;
    s.put(&k, &v).unwrap();
    store.sync().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_tables_are_rebuilt_and_damaged_runs_are_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["serve", "--data", data.to_str().unwrap()];
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    let c = node.client().await;
    let mut rng = SplitMix64::new(5);
    let fps: Vec<u64> = (0..20_000).map(|_| rng.next_u64()).collect();
    let docs: Vec<_> = fps.iter().enumerate().map(|(i, &f)| doc(format!("d{i}"), f, 0)).collect();
    c.insert_all(&docs, 5000).await.unwrap();
    node.terminate();

    // A damaged table: rebuilt, logged, served exactly.
    damage(&data, "run_blocks");
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    assert!(node.log_text().contains("rebuilt"), "{}", node.log_text());
    let c = node.client().await;
    for (i, &fp) in fps.iter().enumerate().step_by(50) {
        let r = c.query(fp ^ 0b111, Some(3), 10).await.unwrap();
        assert_eq!(r.matches.len(), 1);
        assert_eq!(r.matches[0].id, format!("d{i}"));
    }
    node.terminate();

    // Damaged run metadata: not served, NOT_SERVING, a clear error.
    damage(&data, "run_meta");
    let mut node = Node::start(&args, dir.path());
    node.wait_health(ServingStatus::NotServing).await;
    let mut rpc = node.client().await.raw();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        let req = neardup_proto::v1::QueryRequest {
            target: Some(neardup_proto::v1::QueryTarget {
                target: Some(neardup_proto::v1::query_target::Target::Fingerprint(fps[0])),
                ..Default::default()
            }),
            k: None,
            limit: 0,
            ..Default::default()
        };
        let s = rpc.query(req).await.unwrap_err();
        // While recovery runs the answer is UNAVAILABLE; once it failed, DATA_LOSS.
        if s.code() != Code::Unavailable || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    assert!(status.message().contains("corrupt"), "{}", status.message());
    assert_eq!(node.health("neardup.v1.Neardup").await, Some(ServingStatus::NotServing));
    assert!(node.log_text().contains("corrupt"), "{}", node.log_text());
    node.terminate();
}

/// How the binary met a damaged data directory.
#[derive(Debug, PartialEq)]
enum Met {
    /// Exit status 1, one clear line.
    Exit1,
    /// NOT_SERVING, DATA_LOSS (or FAILED_PRECONDITION) answers, the corrupt gauge or an
    /// ERROR line.
    Refused,
    /// SERVING with every acknowledged document and no deleted one.
    ServedWhole,
}

/// Health of the whole server at `addr`, None when unreachable.
async fn health_at(addr: &str) -> Option<ServingStatus> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).ok()?;
    let channel = endpoint.connect().await.ok()?;
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .ok()?;
    ServingStatus::try_from(r.get_ref().status).ok()
}

/// Starts `serve` on `data` and judges the outcome; panics on anything else.
async fn meet(data: &std::path::Path, live: &[(String, u64)], deleted: &[(String, u64)]) -> Met {
    let addr = format!("127.0.0.1:{}", neardup_tests::free_port());
    let log = data.with_extension("log");
    let mut child = Command::new(neardup_tests::binary())
        .args(["serve", "--data", data.to_str().unwrap(), "--listen", &addr])
        .args(["--metrics-listen", ""])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let limit = Instant::now() + Duration::from_secs(120);
    let met = loop {
        if let Some(status) = child.try_wait().unwrap() {
            let text = text();
            assert_eq!(status.code(), Some(1), "{text}");
            assert!(!text.contains("panicked"), "{text}");
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
            assert!(last.starts_with("neardup: "), "{text}");
            break Met::Exit1;
        }
        match health_at(&addr).await {
            Some(ServingStatus::Serving) => {
                let c = neardup_client::Client::connect(&addr).await.unwrap();
                let targets: Vec<Target> = live.iter().map(|d| Target::Fingerprint(d.1)).collect();
                let found = c.query_all(&targets, Some(0), 100, 1000).await.unwrap();
                for (d, r) in live.iter().zip(&found) {
                    assert!(r.matches.iter().any(|m| m.id == d.0), "{} missing:\n{}", d.0, text());
                }
                let targets: Vec<Target> =
                    deleted.iter().map(|d| Target::Fingerprint(d.1)).collect();
                let found = c.query_all(&targets, Some(0), 100, 1000).await.unwrap();
                for (d, r) in deleted.iter().zip(&found) {
                    assert!(r.matches.iter().all(|m| m.id != d.0), "{} back:\n{}", d.0, text());
                }
                break Met::ServedWhole;
            }
            Some(ServingStatus::NotServing) => {
                let mut rpc = neardup_client::Client::connect(&addr).await.unwrap().raw();
                let req = neardup_proto::v1::QueryRequest {
                    target: Some(neardup_proto::v1::QueryTarget {
                        target: Some(neardup_proto::v1::query_target::Target::Fingerprint(1)),
                        ..Default::default()
                    }),
                    k: None,
                    limit: 0,
                    ..Default::default()
                };
                // UNAVAILABLE only while recovery runs; an answer if it just finished.
                let s = rpc.query(req).await.err();
                if let Some(s) = s.filter(|s| s.code() != Code::Unavailable) {
                    assert!(matches!(s.code(), Code::DataLoss | Code::FailedPrecondition), "{s:?}");
                    assert!(text().contains("ERROR"), "{}", text());
                    break Met::Refused;
                }
            }
            _ => {}
        }
        assert!(Instant::now() < limit, "no outcome in time:\n{}", text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    met
}

/// A way to damage a copied data directory.
type Damage = Box<dyn Fn(&std::path::Path)>;

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_file_exits_1_or_is_refused_or_served_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = Node::serve_in(dir.path(), &[]).await;
    let c = node.client().await;
    let mut rng = SplitMix64::new(9);
    let all: Vec<(String, u64)> = (0..3000).map(|i| (format!("d{i}"), rng.next_u64())).collect();
    let docs: Vec<_> = all.iter().map(|(n, f)| doc(n.clone(), *f, 0)).collect();
    c.insert_all(&docs, 1000).await.unwrap();
    let (deleted, live): (Vec<_>, Vec<_>) = all.iter().cloned().partition(|d| d.1 % 10 == 0);
    c.delete(deleted.iter().map(|d| d.0.clone()).collect(), true).await.unwrap();
    node.terminate();

    let db = |d: &std::path::Path| d.join("db").join("db");
    let len = std::fs::metadata(db(&data)).unwrap().len();
    let mut damages: Vec<(String, Damage)> = Vec::new();
    for i in 1..8u64 {
        let at = len * i / 8;
        damages.push((
            format!("truncate -s {at}"),
            Box::new(move |d| {
                let f = std::fs::OpenOptions::new().write(true).open(db(d)).unwrap();
                f.set_len(at).unwrap();
            }),
        ));
    }
    for _ in 0..5 {
        let at = (rng.next_u64() % len) as usize;
        damages.push((
            format!("flip byte {at}"),
            Box::new(move |d| {
                let mut b = std::fs::read(db(d)).unwrap();
                b[at] ^= 0x5A;
                std::fs::write(db(d), b).unwrap();
            }),
        ));
    }
    damages.push((
        "db/db replaced by a directory".into(),
        Box::new(move |d| {
            std::fs::remove_file(db(d)).unwrap();
            std::fs::create_dir(db(d)).unwrap();
        }),
    ));
    let mut counts = std::collections::BTreeMap::new();
    for (i, (what, damage)) in damages.iter().enumerate() {
        let copy = dir.path().join(format!("trial{i}"));
        copy_dir(&data, &copy);
        damage(&copy);
        let met = meet(&copy, &live, &deleted).await;
        println!("{what}: {met:?}");
        *counts.entry(format!("{met:?}")).or_insert(0) += 1;
    }
    println!("through the binary: {} trials, {counts:?}", damages.len());
    assert!(counts.get("Exit1").copied().unwrap_or(0) >= 1, "{counts:?}");
}
