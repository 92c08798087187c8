//! The router over both shard implementations, in-process and remote, through a real gRPC
//! listener on loopback: the same requests give the same answers and the same status codes.

use std::sync::Arc;
use std::time::Duration;

use neardup_proto::v1::neardup_client::NeardupClient;
use neardup_proto::v1::{
    CheckAndInsertRequest, DeleteRequest, Document, InsertRequest, QueryBatchRequest, QueryRequest,
    QueryTarget, StatsRequest, document, query_target,
};
use neardup_router::{InProcess, Limits, Remote, Router, RpcMetrics, ShardApi, ShardHealth};
use neardup_server::{Shard, ShardConfig, ShardMetrics, ShardService};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;

fn open_shard(dir: &std::path::Path) -> Arc<Shard> {
    let config = ShardConfig { min_free_bytes: 0, cache_bytes: 8 << 20, ..Default::default() };
    let shard = Shard::open(dir, config, ShardMetrics::default()).unwrap();
    shard.recover().unwrap();
    shard
}

async fn start_router(shard: Arc<dyn ShardApi>) -> NeardupClient<Channel> {
    let router = Router::new(shard, 3, Limits::default(), RpcMetrics::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(neardup_router::server::serve(
        listener,
        router,
        None,
        None,
        std::future::pending(),
    ));
    NeardupClient::connect(format!("http://{addr}")).await.unwrap()
}

fn doc(id: &str, fp: u64, ts: i64) -> Document {
    Document {
        id: id.into(),
        content: Some(document::Content::Fingerprint(fp)),
        timestamp_ms: ts,
        ..Default::default()
    }
}

fn target(fp: u64) -> QueryTarget {
    QueryTarget { target: Some(query_target::Target::Fingerprint(fp)), ..Default::default() }
}

/// One script of calls; returns what it saw, to compare across implementations.
async fn script(mut c: NeardupClient<Channel>) -> Vec<String> {
    let mut seen = Vec::new();
    let base = 0x0123_4567_89AB_CDEFu64;
    let docs: Vec<Document> = (0..100)
        .map(|i| doc(&format!("u{i}"), base.rotate_left(i) ^ (i as u64), i as i64))
        .collect();
    let r = c.insert(InsertRequest { documents: docs }).await.unwrap().into_inner();
    seen.push(format!("insert {} {}", r.inserted, r.replaced));
    let stream = tokio_stream::iter(vec![
        InsertRequest { documents: vec![doc("s1", base ^ 1, 1000), doc("s2", base ^ 3, 1001)] },
        InsertRequest { documents: vec![doc("u5", 42, 5)] },
    ]);
    let r = c.insert_stream(stream).await.unwrap().into_inner();
    seen.push(format!("stream {} {}", r.inserted, r.replaced));
    let r = c
        .query(QueryRequest { target: Some(target(base)), k: None, limit: 0, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    seen.push(format!(
        "query {:?}",
        r.matches.iter().map(|m| (&m.id, m.distance)).collect::<Vec<_>>()
    ));
    let r = c
        .check_and_insert(CheckAndInsertRequest {
            document: Some(doc("new", base ^ 0b110, 5000)),
            k: Some(3),
            limit: 10,
            skip_insert_if_duplicate: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    seen.push(format!(
        "check {} {} {} {}",
        r.duplicate,
        r.original_id,
        r.inserted,
        r.matches.len()
    ));
    let reqs: Vec<QueryBatchRequest> = (0..5)
        .map(|j| QueryBatchRequest {
            queries: (0..300).map(|i| target(base.rotate_left(i) ^ j)).collect(),
            k: Some(2),
            limit: 5,
        })
        .collect();
    let mut out = c.query_batch(tokio_stream::iter(reqs)).await.unwrap().into_inner();
    let mut hits = 0;
    let mut messages = 0;
    while let Some(m) = out.message().await.unwrap() {
        messages += 1;
        hits += m.results.iter().map(|r| r.matches.len()).sum::<usize>();
    }
    seen.push(format!("batch {messages} {hits}"));
    let r = c
        .delete(DeleteRequest { ids: vec!["u1".into(), "nope".into()], must_exist: false })
        .await
        .unwrap()
        .into_inner();
    seen.push(format!("delete {} {:?}", r.deleted, r.missing));
    // Bad input: documented codes, nothing changed.
    let before = c.stats(StatsRequest {}).await.unwrap().into_inner().documents;
    let codes = vec![
        c.query(QueryRequest {
            target: Some(target(1)),
            k: Some(4),
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap_err()
        .code(),
        c.query(QueryRequest { target: None, k: None, limit: 0, ..Default::default() })
            .await
            .unwrap_err()
            .code(),
        c.insert(InsertRequest { documents: vec![doc("ok", 1, 1), doc("", 2, 2)] })
            .await
            .unwrap_err()
            .code(),
        c.delete(DeleteRequest { ids: vec!["u2".into(), "nope".into()], must_exist: true })
            .await
            .unwrap_err()
            .code(),
    ];
    assert_eq!(
        codes,
        [Code::InvalidArgument, Code::InvalidArgument, Code::InvalidArgument, Code::NotFound]
    );
    let after = c.stats(StatsRequest {}).await.unwrap().into_inner().documents;
    assert_eq!(before, after);
    seen.push(format!("documents {after}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_and_remote_shards_answer_alike() {
    // In process.
    let dir = tempfile::tempdir().unwrap();
    let shard = open_shard(dir.path());
    let api = Arc::new(InProcess::new(
        ShardService::new(shard.clone()),
        neardup_router::shard::health_of(&shard),
    ));
    let embedded = script(start_router(api).await).await;
    // Remote: the shard node on its own listener.
    let dir2 = tempfile::tempdir().unwrap();
    let shard2 = open_shard(dir2.path());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(neardup_server::node::serve(
        listener,
        shard2.clone(),
        64 << 20,
        neardup_server::transport::Http2Limits::default(),
        std::future::pending(),
    ));
    let remote = Remote::connect(&format!("http://{addr}"), 64 << 20).unwrap();
    let mut health = remote.health();
    tokio::time::timeout(Duration::from_secs(20), health.wait_for(|h| *h == ShardHealth::Serving))
        .await
        .expect("the remote shard becomes healthy")
        .unwrap();
    let over_network = script(start_router(Arc::new(remote)).await).await;
    assert_eq!(embedded, over_network);
    assert_eq!(embedded[0], "insert 100 0");
    assert_eq!(embedded[1], "stream 3 1");
    assert!(embedded[3].starts_with("check true "), "{}", embedded[3]);
    assert_eq!(embedded.last().unwrap(), "documents 102");
    shard.shutdown().unwrap();
    shard2.shutdown().unwrap();
}
