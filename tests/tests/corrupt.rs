//! Damaged stored data: a damaged table is rebuilt from an intact one and served exactly; a
//! run that cannot be loaded is reported clearly, health is NOT_SERVING, and nothing is
//! answered from it.

use neardup_client::doc;
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
            }),
            k: None,
            limit: 0,
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
