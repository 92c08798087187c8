//! A cluster node's data operations as routers call them: the trait [`NodeApi`], its errors
//! ([`DataError`], mapped to gRPC statuses in one place), and the gRPC service `Data`
//! ([`DataService`]) over any `Arc<dyn NodeApi>`, so the service never knows the store.
//!
//! Every call carries the caller's map epoch and deadline. A node that does not hold the
//! unit asked for in the role asked (serving for reads, writer for writes) under its own map
//! answers [`DataError::EpochMoved`]: FAILED_PRECONDITION with its epoch in the
//! `neardup-epoch` metadata ([`crate::cluster_rpc::EPOCH_METADATA`]), which the caller's
//! side turns back into [`DataError::EpochMoved`] ([`DataError::from_status`]).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use neardup_proto::internal::data_server::Data;
use neardup_proto::internal::{
    DocChange, DocLookupRequest, DocLookupResponse, DocRecord, DocRemoval, DocResolveRequest,
    DocResolveResponse, DocWriteRequest, DocWriteResponse, MaybeDoc, NodeStatsRequest,
    PartitionDocuments, PartitionScanChunk, PartitionScanRequest, ShardStatsResponse, TabletEntry,
    TabletEntryOp, TabletProbeRequest, TabletProbeResponse, TabletProbeResult, TabletProbeTarget,
    TabletScanChunk, TabletScanRequest, TabletWriteRequest, TabletWriteResponse, doc_change,
};
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status};

use crate::cluster_rpc::EPOCH_METADATA;
use crate::data_types::{DocInfo, DocOp, NodeStats, ProbeAnswer, Resolve, TabletHit, TabletOp};

/// Entries or documents per message of a scan stream.
pub const SCAN_CHUNK: usize = 4096;

/// Entries in a page of a tablet scan when the caller names no limit, and the most it may.
pub const TABLET_PAGE: usize = 1 << 16;

/// Documents in a page of a partition scan when the caller names no limit, and the most it
/// may.
pub const PARTITION_PAGE: usize = 1 << 13;

/// A page of a scan, and where the next one starts (`None`: the scan is done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage<T> {
    /// The page's entries or documents.
    pub items: Vec<T>,
    /// The next page's start, to send back as its `from` or `cursor`.
    pub next: Option<u64>,
}

/// A scan's page size: `limit` (0: `default`), at most `default`.
pub fn page_limit(limit: u32, default: usize) -> usize {
    match limit as usize {
        0 => default,
        n => n.min(default),
    }
}

/// Why a data operation failed. Mapped to a gRPC status once, by `From<DataError> for
/// Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// The request is malformed (INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such unit or document (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The node does not hold the unit in the role asked under its map at `epoch`: the
    /// caller's map is behind or ahead (FAILED_PRECONDITION with `neardup-epoch`).
    #[error("epoch moved: this node's map is at epoch {epoch}: {why}")]
    EpochMoved {
        /// The answering node's epoch.
        epoch: u64,
        /// What it does not hold.
        why: String,
    },
    /// The node is in the wrong state for the request (FAILED_PRECONDITION, no epoch).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Retry may work: storage recovering, node unreachable or cut off (UNAVAILABLE).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The caller's deadline passed (DEADLINE_EXCEEDED).
    #[error("the deadline passed: {0}")]
    DeadlineExceeded(String),
    /// Stored data is damaged (DATA_LOSS).
    #[error("data loss: {0}")]
    DataLoss(String),
    /// A bug (INTERNAL).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<DataError> for Status {
    fn from(e: DataError) -> Status {
        let code = match &e {
            DataError::InvalidArgument(_) => Code::InvalidArgument,
            DataError::NotFound(_) => Code::NotFound,
            DataError::EpochMoved { .. } | DataError::FailedPrecondition(_) => {
                Code::FailedPrecondition
            }
            DataError::Unavailable(_) => Code::Unavailable,
            DataError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            DataError::DataLoss(_) => Code::DataLoss,
            DataError::Internal(_) => Code::Internal,
        };
        let mut status = Status::new(code, e.to_string());
        if let DataError::EpochMoved { epoch, .. } = &e
            && let Ok(v) = epoch.to_string().parse()
        {
            status.metadata_mut().insert(EPOCH_METADATA, v);
        }
        status
    }
}

/// A storage error as the data API reports it, by its class.
impl From<crate::Error> for DataError {
    fn from(e: crate::Error) -> DataError {
        use crate::error::ErrorClass;
        let m = e.to_string();
        match e.class() {
            ErrorClass::InvalidInput => DataError::InvalidArgument(m),
            ErrorClass::NotFound => DataError::NotFound(m),
            ErrorClass::Unavailable => DataError::Unavailable(m),
            ErrorClass::FailedPrecondition => DataError::FailedPrecondition(m),
            ErrorClass::DataLoss => DataError::DataLoss(m),
            ErrorClass::Internal => DataError::Internal(m),
        }
    }
}

impl DataError {
    /// The error a status received from a node stands for (the inverse of the mapping):
    /// FAILED_PRECONDITION with `neardup-epoch` is [`DataError::EpochMoved`]; transport
    /// failures and unknown codes are UNAVAILABLE (the node may be back on retry).
    pub fn from_status(s: &Status) -> DataError {
        let m = s.message().to_string();
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange => DataError::InvalidArgument(m),
            Code::NotFound => DataError::NotFound(m),
            Code::FailedPrecondition => {
                match s
                    .metadata()
                    .get(EPOCH_METADATA)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                {
                    Some(epoch) => DataError::EpochMoved { epoch, why: m },
                    None => DataError::FailedPrecondition(m),
                }
            }
            Code::DeadlineExceeded | Code::Cancelled => DataError::DeadlineExceeded(m),
            Code::DataLoss => DataError::DataLoss(m),
            Code::Internal => DataError::Internal(m),
            _ => DataError::Unavailable(m),
        }
    }
}

/// Result of a data operation.
pub type DataResult<T> = std::result::Result<T, DataError>;

/// A node's data operations, as a router calls them (in-process over the node's store, or
/// over gRPC `Data`).
///
/// # Contract
/// Every method takes the caller's map `epoch` (answer [`DataError::EpochMoved`] when the
/// unit is not held in the role asked under the node's own map) and `deadline` (give up
/// with [`DataError::DeadlineExceeded`] past it). Writes return once durable and are
/// idempotent; results come one per input, in input order.
#[tonic::async_trait]
pub trait NodeApi: Send + Sync + 'static {
    /// Applies `(table, op)` changes to the node's tablets, durably. `new_gids`: the puts
    /// carry gids never sent to any node before (the wire's `TabletWriteRequest.new_gids`),
    /// so a replica that serves the unit may store them without looking them up.
    async fn tablet_write(
        &self,
        epoch: u64,
        ops: Vec<(u32, TabletOp)>,
        new_gids: bool,
        deadline: Option<Instant>,
    ) -> DataResult<()>;
    /// For each `(table, fp)` probe, the entries within `k`, at most `max_matches` (then
    /// `true`: truncated). Unless `resolve` is [`Resolve::No`], also the documents of the
    /// hits whose partitions this node serves, looked up in the same call (a read's second
    /// hop saved for them; a node may resolve none), with their sketches or not as
    /// `resolve` says.
    async fn tablet_probe(
        &self,
        epoch: u64,
        probes: Vec<(u32, u64)>,
        k: u32,
        max_matches: usize,
        resolve: Resolve,
        deadline: Option<Instant>,
    ) -> DataResult<ProbeAnswer>;
    /// Applies document changes in order, durably.
    async fn doc_write(
        &self,
        epoch: u64,
        ops: Vec<DocOp>,
        deadline: Option<Instant>,
    ) -> DataResult<()>;
    /// Documents by name.
    async fn doc_lookup(
        &self,
        epoch: u64,
        names: Vec<String>,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>>;
    /// Documents by gid; with `sketches`, with their stored sketches (a storage read each).
    async fn doc_resolve(
        &self,
        epoch: u64,
        gids: Vec<u64>,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>>;
    /// A page of the entries `(gid, fp)` of the tablet `[start, end]` of `table`: those with
    /// permuted value in `[max(start, from), end]`, in permuted order, about `limit` (see
    /// [`page_limit`]; [`TABLET_PAGE`]) and cut between two permuted values, so the page
    /// covers `[from, next - 1]`.
    #[allow(clippy::too_many_arguments)]
    async fn tablet_scan(
        &self,
        epoch: u64,
        table: u32,
        start: u64,
        end: u64,
        from: u64,
        limit: u32,
        deadline: Option<Instant>,
    ) -> DataResult<ScanPage<(u64, u64)>>;
    /// A page of the documents of partition `partition` from `cursor` (0 to start), at most
    /// `limit` ([`page_limit`]; [`PARTITION_PAGE`]), in no particular order. The pages of
    /// one pass hold every document there throughout it, once.
    async fn partition_scan(
        &self,
        epoch: u64,
        partition: u32,
        cursor: u64,
        limit: u32,
        deadline: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>>;
    /// The node's own statistics (each of its replicas counted once; routers sum them) and
    /// its documents per partition.
    async fn stats(&self, epoch: u64, deadline: Option<Instant>) -> DataResult<NodeStats>;
}

// Wire conversions, shared by the service and the router's client. Structs are
// destructured whole, so a new field fails to compile here until it is carried over.

/// A tablet change on the wire.
pub fn tablet_op_to_wire(table: u32, op: TabletOp) -> TabletEntryOp {
    match op {
        TabletOp::Put { gid, fp } => TabletEntryOp { table, gid, fp, remove: false },
        TabletOp::Remove { gid, fp } => TabletEntryOp { table, gid, fp, remove: true },
    }
}

/// A tablet change from the wire.
pub fn tablet_op_from_wire(op: TabletEntryOp) -> (u32, TabletOp) {
    let TabletEntryOp { table, gid, fp, remove } = op;
    (table, if remove { TabletOp::Remove { gid, fp } } else { TabletOp::Put { gid, fp } })
}

/// A document on the wire.
pub fn doc_to_wire(d: DocInfo) -> DocRecord {
    let DocInfo { gid, name, fp, ts_ms, cluster, sketch } = d;
    DocRecord { gid, name, fp, ts_ms, cluster, sketch }
}

/// A document from the wire.
pub fn doc_from_wire(d: DocRecord) -> DocInfo {
    let DocRecord { gid, name, fp, ts_ms, cluster, sketch } = d;
    DocInfo { gid, name, fp, ts_ms, cluster, sketch }
}

/// A document change on the wire.
pub fn doc_op_to_wire(op: DocOp) -> DocChange {
    DocChange {
        change: Some(match op {
            DocOp::Put(d) => doc_change::Change::Put(doc_to_wire(d)),
            DocOp::Remove { gid, name } => doc_change::Change::Remove(DocRemoval { gid, name }),
        }),
    }
}

/// A document change from the wire; INVALID_ARGUMENT when empty.
pub fn doc_op_from_wire(op: DocChange) -> DataResult<DocOp> {
    match op.change {
        Some(doc_change::Change::Put(d)) => Ok(DocOp::Put(doc_from_wire(d))),
        Some(doc_change::Change::Remove(DocRemoval { gid, name })) => {
            Ok(DocOp::Remove { gid, name })
        }
        None => Err(DataError::InvalidArgument("a document change with no change".into())),
    }
}

/// Optional documents on the wire.
pub fn docs_to_wire(docs: Vec<Option<DocInfo>>) -> Vec<MaybeDoc> {
    docs.into_iter().map(|d| MaybeDoc { doc: d.map(doc_to_wire) }).collect()
}

/// Optional documents from the wire, checked to be `expected` of them.
pub fn docs_from_wire(docs: Vec<MaybeDoc>, expected: usize) -> DataResult<Vec<Option<DocInfo>>> {
    if docs.len() != expected {
        return Err(DataError::Internal(format!(
            "a node answered {} documents for {expected} asked",
            docs.len()
        )));
    }
    Ok(docs.into_iter().map(|m| m.doc.map(doc_from_wire)).collect())
}

/// Probe results on the wire.
pub fn probe_results_to_wire(results: Vec<(Vec<TabletHit>, bool)>) -> Vec<TabletProbeResult> {
    results
        .into_iter()
        .map(|(hits, truncated)| TabletProbeResult {
            hits: hits
                .into_iter()
                .map(|TabletHit { gid, fp, distance }| neardup_proto::internal::TabletHit {
                    gid,
                    fp,
                    distance,
                })
                .collect(),
            truncated,
        })
        .collect()
}

/// Probe results from the wire, checked to be `expected` of them.
pub fn probe_results_from_wire(
    results: Vec<TabletProbeResult>,
    expected: usize,
) -> DataResult<Vec<(Vec<TabletHit>, bool)>> {
    if results.len() != expected {
        return Err(DataError::Internal(format!(
            "a node answered {} probes for {expected} asked",
            results.len()
        )));
    }
    Ok(results
        .into_iter()
        .map(|TabletProbeResult { hits, truncated }| {
            let hits = hits
                .into_iter()
                .map(|neardup_proto::internal::TabletHit { gid, fp, distance }| TabletHit {
                    gid,
                    fp,
                    distance,
                })
                .collect();
            (hits, truncated)
        })
        .collect())
}

/// The gRPC service `neardup.internal.v1.Data` over a node's [`NodeApi`].
#[derive(Clone)]
pub struct DataService {
    api: Arc<dyn NodeApi>,
}

impl DataService {
    /// The service over `api`.
    pub fn new(api: Arc<dyn NodeApi>) -> Self {
        DataService { api }
    }
}

/// The moment a request's `grpc-timeout` ends.
fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    crate::transport::grpc_timeout(req.metadata()).and_then(|t| Instant::now().checked_add(t))
}

type ScanStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A page as a stream of chunks of [`SCAN_CHUNK`] items (one, maybe empty, at least); the
/// last one carries the page's `next`.
fn chunked<I: Send + 'static, T: Send + 'static>(
    page: ScanPage<I>,
    wrap: impl Fn(Vec<I>, Option<u64>) -> T + Send + 'static,
) -> ScanStream<T> {
    let mut chunks = Vec::new();
    let mut rest = page.items.into_iter().peekable();
    loop {
        let chunk: Vec<I> = rest.by_ref().take(SCAN_CHUNK).collect();
        let last = rest.peek().is_none();
        chunks.push(Ok(wrap(chunk, if last { page.next } else { None })));
        if last {
            break;
        }
    }
    Box::pin(tokio_stream::iter(chunks))
}

#[tonic::async_trait]
impl Data for DataService {
    async fn tablet_write(
        &self,
        req: Request<TabletWriteRequest>,
    ) -> Result<Response<TabletWriteResponse>, Status> {
        let deadline = deadline_of(&req);
        let TabletWriteRequest { epoch, ops, new_gids } = req.into_inner();
        let ops = ops.into_iter().map(tablet_op_from_wire).collect();
        self.api.tablet_write(epoch, ops, new_gids, deadline).await?;
        Ok(Response::new(TabletWriteResponse {}))
    }

    async fn tablet_probe(
        &self,
        req: Request<TabletProbeRequest>,
    ) -> Result<Response<TabletProbeResponse>, Status> {
        let deadline = deadline_of(&req);
        let TabletProbeRequest { epoch, probes, k, max_matches, resolve, skip_sketches } =
            req.into_inner();
        let resolve = Resolve::from_wire(resolve, skip_sketches);
        let probes: Vec<(u32, u64)> =
            probes.into_iter().map(|TabletProbeTarget { table, fp }| (table, fp)).collect();
        let n = probes.len();
        let max = usize::try_from(max_matches).unwrap_or(usize::MAX);
        let ProbeAnswer { results, docs, resolved } =
            self.api.tablet_probe(epoch, probes, k, max, resolve, deadline).await?;
        if results.len() != n {
            return Err(
                DataError::Internal(format!("{} results for {n} probes", results.len())).into()
            );
        }
        Ok(Response::new(TabletProbeResponse {
            results: probe_results_to_wire(results),
            docs: docs.into_iter().map(doc_to_wire).collect(),
            resolved_partitions: resolved,
        }))
    }

    async fn doc_write(
        &self,
        req: Request<DocWriteRequest>,
    ) -> Result<Response<DocWriteResponse>, Status> {
        let deadline = deadline_of(&req);
        let DocWriteRequest { epoch, ops } = req.into_inner();
        let ops = ops.into_iter().map(doc_op_from_wire).collect::<DataResult<_>>()?;
        self.api.doc_write(epoch, ops, deadline).await?;
        Ok(Response::new(DocWriteResponse {}))
    }

    async fn doc_lookup(
        &self,
        req: Request<DocLookupRequest>,
    ) -> Result<Response<DocLookupResponse>, Status> {
        let deadline = deadline_of(&req);
        let DocLookupRequest { epoch, names } = req.into_inner();
        let docs = self.api.doc_lookup(epoch, names, deadline).await?;
        Ok(Response::new(DocLookupResponse { docs: docs_to_wire(docs) }))
    }

    async fn doc_resolve(
        &self,
        req: Request<DocResolveRequest>,
    ) -> Result<Response<DocResolveResponse>, Status> {
        let deadline = deadline_of(&req);
        let DocResolveRequest { epoch, gids, skip_sketches } = req.into_inner();
        let docs = self.api.doc_resolve(epoch, gids, !skip_sketches, deadline).await?;
        Ok(Response::new(DocResolveResponse { docs: docs_to_wire(docs) }))
    }

    type TabletScanStream = ScanStream<TabletScanChunk>;

    async fn tablet_scan(
        &self,
        req: Request<TabletScanRequest>,
    ) -> Result<Response<Self::TabletScanStream>, Status> {
        let deadline = deadline_of(&req);
        let TabletScanRequest { epoch, table, start, end, from, limit } = req.into_inner();
        let page = self.api.tablet_scan(epoch, table, start, end, from, limit, deadline).await?;
        Ok(Response::new(chunked(page, |c, next| TabletScanChunk {
            entries: c.into_iter().map(|(gid, fp)| TabletEntry { gid, fp }).collect(),
            next,
        })))
    }

    async fn node_stats(
        &self,
        req: Request<NodeStatsRequest>,
    ) -> Result<Response<ShardStatsResponse>, Status> {
        let deadline = deadline_of(&req);
        let NodeStatsRequest { epoch } = req.into_inner();
        let NodeStats { stats, partitions } = self.api.stats(epoch, deadline).await?;
        let partitions = partitions
            .into_iter()
            .map(|(partition, documents)| PartitionDocuments { partition, documents })
            .collect();
        Ok(Response::new(ShardStatsResponse { stats: Some(stats), partitions }))
    }

    type PartitionScanStream = ScanStream<PartitionScanChunk>;

    async fn partition_scan(
        &self,
        req: Request<PartitionScanRequest>,
    ) -> Result<Response<Self::PartitionScanStream>, Status> {
        let deadline = deadline_of(&req);
        let PartitionScanRequest { epoch, partition, cursor, limit } = req.into_inner();
        let page = self.api.partition_scan(epoch, partition, cursor, limit, deadline).await?;
        Ok(Response::new(chunked(page, |c, next| PartitionScanChunk {
            docs: c.into_iter().map(doc_to_wire).collect(),
            next,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_code_and_epoch_moved_comes_back() {
        let cases = [
            (DataError::InvalidArgument("x".into()), Code::InvalidArgument),
            (DataError::NotFound("x".into()), Code::NotFound),
            (DataError::EpochMoved { epoch: 7, why: "x".into() }, Code::FailedPrecondition),
            (DataError::FailedPrecondition("x".into()), Code::FailedPrecondition),
            (DataError::Unavailable("x".into()), Code::Unavailable),
            (DataError::DeadlineExceeded("x".into()), Code::DeadlineExceeded),
            (DataError::DataLoss("x".into()), Code::DataLoss),
            (DataError::Internal("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let s = Status::from(e.clone());
            assert_eq!(s.code(), code, "{e:?}");
            let back = DataError::from_status(&s);
            assert_eq!(std::mem::discriminant(&back), std::mem::discriminant(&e), "{e:?}");
        }
        let s = Status::from(DataError::EpochMoved { epoch: 42, why: "not a writer".into() });
        assert_eq!(s.metadata().get(EPOCH_METADATA).unwrap().to_str().unwrap(), "42");
        assert!(matches!(DataError::from_status(&s), DataError::EpochMoved { epoch: 42, .. }));
        assert!(matches!(
            DataError::from_status(&Status::unknown("transport")),
            DataError::Unavailable(_)
        ));
    }

    #[test]
    fn wire_conversions_round_trip() {
        for op in [TabletOp::Put { gid: 5, fp: 9 }, TabletOp::Remove { gid: 1 << 40, fp: 0 }] {
            assert_eq!(tablet_op_from_wire(tablet_op_to_wire(3, op)), (3, op));
        }
        let d = DocInfo {
            gid: 257,
            name: "a".into(),
            fp: 7,
            ts_ms: -3,
            cluster: 257,
            sketch: Some(vec![1, 2]),
        };
        let none = DocInfo { sketch: None, ..d.clone() };
        for op in [
            DocOp::Put(d.clone()),
            DocOp::Put(none.clone()),
            DocOp::Remove { gid: 3, name: "b".into() },
        ] {
            assert_eq!(doc_op_from_wire(doc_op_to_wire(op.clone())).unwrap(), op);
        }
        assert!(doc_op_from_wire(DocChange { change: None }).is_err());
        let docs = vec![Some(d), None, Some(none)];
        assert_eq!(docs_from_wire(docs_to_wire(docs.clone()), 3).unwrap(), docs);
        assert!(docs_from_wire(docs_to_wire(docs), 2).is_err());
        let hits = vec![(vec![TabletHit { gid: 1, fp: 2, distance: 3 }], true), (vec![], false)];
        assert_eq!(probe_results_from_wire(probe_results_to_wire(hits.clone()), 2).unwrap(), hits);
    }
}
