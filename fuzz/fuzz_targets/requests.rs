//! Every request message the servers accept, decoded by prost from arbitrary bytes and then
//! handled as far as the project's own validation goes without a store:
//!
//! - public `neardup.v1` (the router): `Insert`, `Query`, `CheckAndInsert`, `Delete`,
//!   `Fingerprint`, `Stats` run through the real `Router` handlers (limits, ids, texts
//!   fingerprinted, sketches checked, k and limit, verification options) over a shard stub
//!   that answers in the right shape; `QueryBatchRequest` (a client stream's message) decoded,
//!   its queries run through `Query`;
//! - internal `Shard`: decoded, documents and options through the service's
//!   `new_document`/`verify_of`/`sketch_of`;
//! - internal `Data`: the real `DataService` handlers over a node stub;
//! - internal `Raft`: `RaftMessage`/`RaftBatch` decoded and their messages parsed as raft-rs
//!   parses them (stepping them is the `raft` target);
//! - `neardup.admin.v1`: decoded (its handlers need a running cluster node); a restore's
//!   documents also converted as the backup service converts them.
//!
//! Every message that decodes is also encoded again and must decode to itself.
//!
//! Input: a selector byte (which message), then the message's bytes.
#![no_main]

use std::sync::Arc;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use neardup_fuzz::write_seeds;
use neardup_proto::internal::data_server::Data;
use neardup_proto::internal::{self as int};
use neardup_proto::v1::neardup_server::Neardup;
use neardup_proto::{admin, v1};
use neardup_router::{Limits, Router, RpcMetrics, ShardApi, ShardHealth};
use neardup_server::data_types::{DocInfo, DocOp, NodeStats, ProbeAnswer, Resolve, TabletOp};
use neardup_server::{DataResult, DataService, NodeApi, ScanPage};
use prost::Message;
use tokio::sync::watch;
use tonic::{Request, Status};

/// A shard that accepts everything and answers in the shape asked for.
struct StubShard(watch::Sender<ShardHealth>);

#[tonic::async_trait]
impl ShardApi for StubShard {
    async fn write(
        &self,
        req: int::WriteRequest,
        _: Option<Instant>,
    ) -> Result<int::WriteResponse, Status> {
        Ok(int::WriteResponse { inserted: req.documents.len() as u64, ..Default::default() })
    }
    async fn wait_durable(&self, _: u64, _: Option<Instant>) -> Result<(), Status> {
        Ok(())
    }
    async fn probe(
        &self,
        req: int::ProbeRequest,
        _: Option<Instant>,
    ) -> Result<int::ProbeResponse, Status> {
        let results = req
            .fingerprints
            .iter()
            .map(|&fp| v1::QueryResult { fingerprint: fp, ..Default::default() })
            .collect();
        Ok(int::ProbeResponse { results })
    }
    async fn admit(
        &self,
        _: int::AdmitRequest,
        _: Option<Instant>,
    ) -> Result<int::AdmitResponse, Status> {
        Ok(int::AdmitResponse { decision: Some(Default::default()) })
    }
    async fn stats(&self, _: Option<Instant>) -> Result<v1::StatsResponse, Status> {
        Ok(Default::default())
    }
    fn health(&self) -> watch::Receiver<ShardHealth> {
        self.0.subscribe()
    }
}

/// A node that accepts everything and answers in the shape asked for.
struct StubNode;

#[tonic::async_trait]
impl NodeApi for StubNode {
    async fn tablet_write(
        &self,
        _: u64,
        _: Vec<(u32, TabletOp)>,
        _: bool,
        _: Option<Instant>,
    ) -> DataResult<()> {
        Ok(())
    }
    async fn tablet_probe(
        &self,
        _: u64,
        probes: Vec<(u32, u64)>,
        _: u32,
        _: usize,
        _: Resolve,
        _: Option<Instant>,
    ) -> DataResult<ProbeAnswer> {
        Ok(ProbeAnswer { results: vec![(Vec::new(), false); probes.len()], ..Default::default() })
    }
    async fn doc_write(&self, _: u64, _: Vec<DocOp>, _: Option<Instant>) -> DataResult<()> {
        Ok(())
    }
    async fn doc_lookup(
        &self,
        _: u64,
        names: Vec<String>,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        Ok(vec![None; names.len()])
    }
    async fn doc_resolve(
        &self,
        _: u64,
        gids: Vec<u64>,
        _: bool,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        Ok(vec![None; gids.len()])
    }
    async fn tablet_scan(
        &self,
        _: u64,
        _: u32,
        _: u64,
        _: u64,
        _: u64,
        _: u32,
        _: Option<Instant>,
    ) -> DataResult<ScanPage<(u64, u64)>> {
        Ok(ScanPage { items: Vec::new(), next: None })
    }
    async fn partition_scan(
        &self,
        _: u64,
        _: u32,
        _: u64,
        _: u32,
        _: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>> {
        Ok(ScanPage { items: Vec::new(), next: None })
    }
    async fn stats(&self, _: u64, _: Option<Instant>) -> DataResult<NodeStats> {
        Ok(NodeStats { stats: Default::default(), partitions: Vec::new() })
    }
}

struct World {
    rt: tokio::runtime::Runtime,
    router: Router,
    data: DataService,
}

fn world() -> &'static World {
    static W: std::sync::OnceLock<World> = std::sync::OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (tx, _) = watch::channel(ShardHealth::Serving);
        let shard: Arc<dyn ShardApi> = Arc::new(StubShard(tx));
        let router = Router::new(shard, 3, Limits::default(), RpcMetrics::default());
        World { rt, router, data: DataService::new(Arc::new(StubNode)) }
    })
}

/// Decodes `bytes` as `M`; if it decodes, checks the round trip (by bytes: a NaN is not
/// equal to itself) and returns it.
fn decode<M: Message + Default>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let once = m.encode_to_vec();
    let again = M::decode(once.as_slice()).expect("own encoding decodes");
    assert_eq!(again.encode_to_vec(), once, "a decoded message encodes back to itself");
    Some(m)
}

fn shard_docs(docs: Vec<int::ShardDocument>) {
    for d in docs {
        let _ = neardup_server::service::new_document(d);
    }
}

const KINDS: u8 = 34;

fn handle(kind: u8, b: &[u8]) {
    let w = world();
    let block = |f: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>| w.rt.block_on(f);
    match kind % KINDS {
        // neardup.v1, through the router's handlers.
        0 => {
            if let Some(m) = decode::<v1::InsertRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.insert(Request::new(m)).await;
                }));
            }
        }
        1 => {
            if let Some(m) = decode::<v1::QueryRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.query(Request::new(m)).await;
                }));
            }
        }
        2 => {
            if let Some(m) = decode::<v1::QueryBatchRequest>(b) {
                let v1::QueryBatchRequest { queries, k, limit } = m;
                block(Box::pin(async {
                    for q in queries.into_iter().take(16) {
                        let req =
                            v1::QueryRequest { target: Some(q), k, limit, ..Default::default() };
                        let _ = w.router.query(Request::new(req)).await;
                    }
                }));
            }
        }
        3 => {
            if let Some(m) = decode::<v1::CheckAndInsertRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.check_and_insert(Request::new(m)).await;
                }));
            }
        }
        4 => {
            if let Some(m) = decode::<v1::DeleteRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.delete(Request::new(m)).await;
                }));
            }
        }
        5 => {
            if let Some(m) = decode::<v1::FingerprintRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.fingerprint(Request::new(m)).await;
                }));
            }
        }
        6 => {
            if let Some(m) = decode::<v1::StatsRequest>(b) {
                block(Box::pin(async {
                    let _ = w.router.stats(Request::new(m)).await;
                }));
            }
        }
        // neardup.internal.v1 Shard: decoded, then the service's own checks.
        7 => {
            if let Some(m) = decode::<int::WriteRequest>(b) {
                shard_docs(m.documents);
            }
        }
        8 => {
            let _ = decode::<int::WaitDurableRequest>(b);
        }
        9 => {
            if let Some(m) = decode::<int::ProbeRequest>(b) {
                let _ = neardup_server::service::verify_of(m.verify_jaccard, m.candidate_k);
                for s in &m.sketches {
                    let _ = neardup_server::service::sketch_of(s);
                }
            }
        }
        10 => {
            if let Some(m) = decode::<int::AdmitRequest>(b) {
                let _ = neardup_server::service::verify_of(m.verify_jaccard, m.candidate_k);
                shard_docs(m.document.into_iter().collect());
            }
        }
        11 => {
            let _ = decode::<int::ShardStatsRequest>(b);
        }
        // neardup.internal.v1 Data, through the service's handlers.
        12 => {
            if let Some(m) = decode::<int::TabletWriteRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.tablet_write(Request::new(m)).await;
                }));
            }
        }
        13 => {
            if let Some(m) = decode::<int::TabletProbeRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.tablet_probe(Request::new(m)).await;
                }));
            }
        }
        14 => {
            if let Some(m) = decode::<int::DocWriteRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.doc_write(Request::new(m)).await;
                }));
            }
        }
        15 => {
            if let Some(m) = decode::<int::DocLookupRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.doc_lookup(Request::new(m)).await;
                }));
            }
        }
        16 => {
            if let Some(m) = decode::<int::DocResolveRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.doc_resolve(Request::new(m)).await;
                }));
            }
        }
        17 => {
            if let Some(m) = decode::<int::TabletScanRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.tablet_scan(Request::new(m)).await;
                }));
            }
        }
        18 => {
            if let Some(m) = decode::<int::PartitionScanRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.partition_scan(Request::new(m)).await;
                }));
            }
        }
        19 => {
            if let Some(m) = decode::<int::NodeStatsRequest>(b) {
                block(Box::pin(async {
                    let _ = w.data.node_stats(Request::new(m)).await;
                }));
            }
        }
        // neardup.internal.v1 Raft: the messages inside parsed as raft-rs parses them.
        20 => {
            if let Some(m) = decode::<int::RaftMessage>(b) {
                let _ = <raft::eraftpb::Message as protobuf::Message>::parse_from_bytes(&m.message);
            }
        }
        21 => {
            if let Some(m) = decode::<int::RaftBatch>(b) {
                for msg in &m.messages {
                    let _ = <raft::eraftpb::Message as protobuf::Message>::parse_from_bytes(msg);
                }
            }
        }
        // neardup.admin.v1.
        22 => {
            let _ = decode::<admin::StatusRequest>(b);
        }
        23 => {
            let _ = decode::<admin::AddNodeRequest>(b);
        }
        24 => {
            let _ = decode::<admin::RemoveNodeRequest>(b);
        }
        25 => {
            let _ = decode::<admin::TransferLeaderRequest>(b);
        }
        // Messages a client or router decodes from a server: answers, and the scan chunks.
        26 => {
            let _ = decode::<int::ProbeResponse>(b);
        }
        27 => {
            let _ = decode::<int::TabletProbeResponse>(b);
        }
        28 => {
            if let Some(m) = decode::<int::DocLookupResponse>(b) {
                let n = m.docs.len();
                let _ = neardup_server::data_api::docs_from_wire(m.docs, n);
            }
        }
        29 => {
            let _ = decode::<int::TabletScanChunk>(b);
        }
        30 => {
            let _ = decode::<int::PartitionScanChunk>(b);
        }
        31 => {
            let _ = decode::<v1::QueryResponse>(b);
        }
        32 => {
            let _ = decode::<v1::CheckAndInsertResponse>(b);
        }
        // neardup.admin.v1.Backup: a restore's messages as its service converts them, and
        // the snapshot chunks `neardup backup` decodes.
        33 => {
            if let Some(m) = decode::<admin::RestoreRequest>(b) {
                for d in m.docs {
                    let _ = neardup_router::backup::doc_from_wire(d);
                }
            }
        }
        34 => {
            let _ = decode::<admin::SnapshotChunk>(b);
        }
        _ => {
            let _ = decode::<admin::StatusResponse>(b);
        }
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let doc = |id: &str, text: Option<&str>| v1::Document {
        id: id.into(),
        content: Some(match text {
            Some(t) => v1::document::Content::Text(t.into()),
            None => v1::document::Content::Fingerprint(0x1234_5678_9ABC_DEF0),
        }),
        timestamp_ms: 5,
        sketch: Vec::new(),
    };
    let target = v1::QueryTarget {
        target: Some(v1::query_target::Target::Text("the quick brown fox".into())),
        sketch: Vec::new(),
    };
    let msgs: Vec<(u8, Vec<u8>)> = vec![
        (
            0,
            v1::InsertRequest { documents: vec![doc("a", Some("hello world")), doc("b", None)] }
                .encode_to_vec(),
        ),
        (
            1,
            v1::QueryRequest {
                target: Some(target.clone()),
                k: Some(3),
                limit: 10,
                verify_jaccard: Some(0.5),
                candidate_k: None,
            }
            .encode_to_vec(),
        ),
        (
            2,
            v1::QueryBatchRequest { queries: vec![target.clone(), target], k: None, limit: 0 }
                .encode_to_vec(),
        ),
        (
            3,
            v1::CheckAndInsertRequest {
                document: Some(doc("c", Some("some text here"))),
                k: Some(2),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            4,
            v1::DeleteRequest { ids: vec!["a".into(), "b".into()], must_exist: true }
                .encode_to_vec(),
        ),
        (
            5,
            v1::FingerprintRequest {
                texts: vec!["日本語のテキスト".into(), "ascii words".into()]
            }
            .encode_to_vec(),
        ),
        (
            7,
            int::WriteRequest {
                documents: vec![int::ShardDocument {
                    id: "x".into(),
                    fingerprint: 1,
                    timestamp_ms: 2,
                    sketch: vec![1, 64],
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            13,
            int::TabletProbeRequest {
                epoch: 3,
                probes: vec![int::TabletProbeTarget { table: 1, fp: 2 }],
                k: 3,
                max_matches: 10,
                resolve: true,
                skip_sketches: false,
            }
            .encode_to_vec(),
        ),
        (
            14,
            int::DocWriteRequest {
                epoch: 1,
                ops: vec![int::DocChange {
                    change: Some(int::doc_change::Change::Remove(int::DocRemoval {
                        gid: 5,
                        name: "n".into(),
                    })),
                }],
            }
            .encode_to_vec(),
        ),
        (23, admin::AddNodeRequest::default().encode_to_vec()),
        (
            33,
            admin::RestoreRequest {
                start: Some(admin::RestoreStart { max_id: 9, ..Default::default() }),
                docs: vec![admin::BackupDoc {
                    id: 5,
                    name: "n".into(),
                    fingerprint: 7,
                    timestamp_ms: 1,
                    cluster: 5,
                    sketch: Vec::new(),
                }],
            }
            .encode_to_vec(),
        ),
    ];
    msgs.into_iter().map(|(k, m)| (format!("kind-{k}"), [&[k][..], &m].concat())).collect()
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else { return };
    handle(kind, rest);
});
