//! Insert, query and check end to end over gRPC against a real `neardup serve` process;
//! the same through separate shard and router processes; health and reflection.

use std::collections::BTreeSet;

use neardup_client::{Target, doc, text_doc};
use neardup_core::util::SplitMix64;
use neardup_tests::Node;
use tonic_health::pb::health_check_response::ServingStatus;

const TEXT: &str = "Detecting near-duplicates for web crawling: a crawler that fetches billions \
                    of pages sees the same content again and again, with other ads and counters.";

/// Insert, query (fingerprint and text), QueryBatch, CheckAndInsert, delete, stats.
async fn exercise(node: &Node) {
    let c = node.client().await;
    let mut rng = SplitMix64::new(11);
    let fps: Vec<u64> = (0..3000).map(|_| rng.next_u64()).collect();
    let docs: Vec<_> = fps
        .iter()
        .enumerate()
        .map(|(i, &fp)| doc(format!("https://e2e/{i}"), fp, i as i64))
        .collect();
    let r = c.insert(docs[..1000].to_vec()).await.unwrap();
    assert_eq!((r.inserted, r.replaced), (1000, 0));
    let r = c.insert_all(&docs[1000..], 300).await.unwrap();
    assert_eq!((r.inserted, r.replaced), (2000, 0));
    // Every document is found at distance 0, and near copies at their distance.
    for (i, &fp) in fps.iter().enumerate().step_by(97) {
        let r = c.query(fp ^ 0b101, Some(3), 10).await.unwrap();
        assert_eq!(r.matches.len(), 1, "document {i}");
        assert_eq!(
            (r.matches[0].id.as_str(), r.matches[0].distance),
            (format!("https://e2e/{i}").as_str(), 2)
        );
    }
    // QueryBatch answers in order, exactly like unary queries.
    let targets: Vec<Target> = fps.iter().map(|&fp| Target::Fingerprint(fp ^ 1)).collect();
    let all = c.query_all(&targets, Some(1), 5, 250).await.unwrap();
    assert_eq!(all.len(), fps.len());
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.matches[0].id, format!("https://e2e/{i}"));
    }
    // Text: stored, then found by a variant of the text, and admitted as a duplicate.
    c.insert(vec![text_doc("https://e2e/text", TEXT, 5)]).await.unwrap();
    let variant = TEXT.to_uppercase().replace(',', " ;");
    let r = c.query_target(Target::Text(variant.clone()), None, 10).await.unwrap();
    assert_eq!(r.matches[0].id, "https://e2e/text");
    let fp = c.fingerprint(vec![TEXT.into()]).await.unwrap()[0];
    assert_eq!(r.matches[0].fingerprint, fp);
    let d = c
        .check_and_insert(text_doc("https://e2e/copy", variant, 50), None, 10, false)
        .await
        .unwrap();
    assert!(d.duplicate && d.inserted && !d.replaced);
    assert_eq!(d.original_id, "https://e2e/text");
    let original = c.query(fp, Some(0), 10).await.unwrap();
    let ids: BTreeSet<&str> = original.matches.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["https://e2e/copy", "https://e2e/text"]));
    assert!(original.matches.iter().all(|m| m.cluster_id == d.cluster_id));
    // Not a duplicate: its own original, its own cluster.
    let d2 =
        c.check_and_insert(doc("https://e2e/new", !fps[0], 9), Some(3), 10, true).await.unwrap();
    assert!(!d2.duplicate && d2.inserted);
    assert_eq!(d2.original_id, "https://e2e/new");
    // Replace, delete.
    let r = c.insert(vec![doc("https://e2e/0", 42, 1)]).await.unwrap();
    assert_eq!(r.replaced, 1);
    assert!(c.query(fps[0], Some(0), 10).await.unwrap().matches.is_empty());
    let r = c.delete(vec!["https://e2e/1".into(), "https://e2e/none".into()], false).await.unwrap();
    assert_eq!((r.deleted, r.missing.len()), (1, 1));
    let s = c.stats().await.unwrap();
    assert_eq!(s.documents, 3000 + 3 - 1);
    // The index and the document table (names of 3000 documents) are counted apart.
    assert!(s.index_bytes > 0 && s.document_bytes > 3000 * 12, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_serve_end_to_end_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["serve", "--data", data.to_str().unwrap()];
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    assert_eq!(node.health("neardup.v1.Neardup").await, Some(ServingStatus::Serving));
    exercise(&node).await;
    // Reflection, v1 and v1alpha, lists the public service and health, and nothing of the
    // internal API, which this port does not serve.
    let services = list_services(&node.addr).await;
    for s in ["neardup.v1.Neardup", "grpc.health.v1.Health"] {
        assert!(
            services.0.contains(&s.to_string()) && services.1.contains(&s.to_string()),
            "{services:?}"
        );
    }
    for listed in services.0.iter().chain(&services.1) {
        assert!(!listed.contains("internal"), "the public port lists {listed}: {services:?}");
    }
    // SIGTERM drains and checkpoints; a restart serves the same data.
    let before = node.client().await.stats().await.unwrap();
    node.terminate();
    assert!(node.log_text().contains("data synced"), "{}", node.log_text());
    // A log written to a file carries no terminal colours.
    assert!(!node.log_text().contains('\u{1b}'), "ANSI escapes in a log file");
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    let after = node.client().await.stats().await.unwrap();
    assert_eq!(after.documents, before.documents);
    let r = node.client().await.query(42, Some(0), 10).await.unwrap();
    assert_eq!(r.matches[0].id, "https://e2e/0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_shard_and_router_processes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut shard = Node::start(&["shard", "--data", data.to_str().unwrap()], dir.path());
    let shard_url = format!("http://{}", shard.addr);
    let mut router = Node::start(&["router", "--shard", &shard_url], dir.path());
    router.serving().await;
    assert_eq!(shard.health("neardup.internal.v1.Shard").await, Some(ServingStatus::Serving));
    exercise(&router).await;
    // The router reports NOT_SERVING once its shard is gone.
    shard.terminate();
    router.wait_health(ServingStatus::NotServing).await;
}

/// Services listed by reflection v1 and v1alpha.
async fn list_services(addr: &str) -> (Vec<String>, Vec<String>) {
    use tonic_reflection::pb::{v1, v1alpha};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c1 = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut s = c1.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let mut names1 = Vec::new();
    if let Some(m) = s.message().await.unwrap()
        && let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
            m.message_response
    {
        names1 = l.service.into_iter().map(|s| s.name).collect();
    }
    let mut c2 = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut s = c2.server_reflection_info(tokio_stream::iter([req])).await.unwrap().into_inner();
    let mut names2 = Vec::new();
    if let Some(m) = s.message().await.unwrap()
        && let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
            m.message_response
    {
        names2 = l.service.into_iter().map(|s| s.name).collect();
    }
    (names1, names2)
}
