//! Clients of the nodes' internal `Data` service: [`GrpcNode`] implements
//! [`NodeApi`] over gRPC, [`GrpcNodes`] keeps one lazily connected client per node of the
//! cluster map (by its internal address) for [`crate::cluster::ClusterRouter`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_cluster::NodeId;
use neardup_cluster::map::ClusterMap;
use neardup_proto::internal::data_client::DataClient;
use neardup_proto::internal::{
    DocLookupRequest, DocResolveRequest, DocWriteRequest, NodeStatsRequest, PartitionScanRequest,
    TabletProbeRequest, TabletProbeTarget, TabletScanRequest, TabletWriteRequest,
};
use neardup_server::data_api::{
    doc_from_wire, doc_op_to_wire, docs_from_wire, probe_results_from_wire, tablet_op_to_wire,
};
use neardup_server::tls::{ClusterTls, peer_endpoint};
use neardup_server::{
    DataError, DataResult, DocInfo, DocOp, NodeApi, NodeStats, ProbeAnswer, Resolve, ScanPage,
    TabletOp,
};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::cluster::NodeResolver;

/// A node's client, with the address and TLS generation it was made for.
type CachedNode = (String, u64, Arc<dyn NodeApi>);

/// Reaches nodes over gRPC `Data`, by the internal address the map gives them: one lazily
/// connected channel per node, cached while its address (and the TLS files) stay the same.
pub struct GrpcNodes {
    map: watch::Receiver<Arc<ClusterMap>>,
    cache: Mutex<HashMap<NodeId, CachedNode>>,
    max_message_bytes: usize,
    tls: Option<Arc<ClusterTls>>,
}

impl GrpcNodes {
    /// Nodes as `map` lists them, over mutual TLS with `tls`; `max_message_bytes` bounds
    /// messages both ways.
    pub fn new(
        map: watch::Receiver<Arc<ClusterMap>>,
        max_message_bytes: usize,
        tls: Option<Arc<ClusterTls>>,
    ) -> Arc<Self> {
        Arc::new(GrpcNodes { map, cache: Mutex::new(HashMap::new()), max_message_bytes, tls })
    }

    /// The node `id`: a client of its address, or one that answers UNAVAILABLE when the
    /// map does not know it or its address is unusable.
    pub fn node(&self, id: NodeId) -> Arc<dyn NodeApi> {
        let addr = self.map.borrow().nodes.get(&id).map(|n| n.internal_addr.clone());
        let Some(addr) = addr else {
            return Arc::new(Unreachable(format!("node {id} is not in the cluster map")));
        };
        let generation = self.tls.as_ref().map_or(0, |t| t.generation());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((a, g, api)) = cache.get(&id)
            && *a == addr
            && *g == generation
        {
            return api.clone();
        }
        let api: Arc<dyn NodeApi> =
            match GrpcNode::connect(&addr, self.max_message_bytes, self.tls.as_deref()) {
                Ok(n) => Arc::new(n),
                Err(e) => Arc::new(Unreachable(format!("node {id}: {e}"))),
            };
        cache.insert(id, (addr, generation, api.clone()));
        api
    }

    /// As a [`NodeResolver`] (nodes other than `local`; `local` answered by `local_api`).
    pub fn resolver(self: &Arc<Self>, local: Option<(NodeId, Arc<dyn NodeApi>)>) -> NodeResolver {
        let me = self.clone();
        Arc::new(move |id| match &local {
            Some((l, api)) if *l == id => api.clone(),
            _ => me.node(id),
        })
    }
}

/// A node that cannot be reached: every call is UNAVAILABLE.
pub(crate) struct Unreachable(pub(crate) String);

#[tonic::async_trait]
impl NodeApi for Unreachable {
    async fn tablet_write(
        &self,
        _: u64,
        _: Vec<(u32, TabletOp)>,
        _: bool,
        _: Option<Instant>,
    ) -> DataResult<()> {
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn tablet_probe(
        &self,
        _: u64,
        _: Vec<(u32, u64)>,
        _: u32,
        _: usize,
        _: Resolve,
        _: Option<Instant>,
    ) -> DataResult<ProbeAnswer> {
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn doc_write(&self, _: u64, _: Vec<DocOp>, _: Option<Instant>) -> DataResult<()> {
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn doc_lookup(
        &self,
        _: u64,
        _: Vec<String>,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn doc_resolve(
        &self,
        _: u64,
        _: Vec<u64>,
        _: bool,
        _: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        Err(DataError::Unavailable(self.0.clone()))
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
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn partition_scan(
        &self,
        _: u64,
        _: u32,
        _: u64,
        _: u32,
        _: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>> {
        Err(DataError::Unavailable(self.0.clone()))
    }
    async fn stats(&self, _: u64, _: Option<Instant>) -> DataResult<NodeStats> {
        Err(DataError::Unavailable(self.0.clone()))
    }
}

/// A node over gRPC `Data`.
pub struct GrpcNode {
    client: DataClient<Channel>,
}

fn request<T>(msg: T, deadline: Option<Instant>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(d) = deadline {
        r.set_timeout(d.saturating_duration_since(Instant::now()));
    }
    r
}

fn status_error(s: Status) -> DataError {
    DataError::from_status(&s)
}

impl GrpcNode {
    /// A client of the node at `addr` (`HOST:PORT` or `http://HOST:PORT`), connected lazily,
    /// over mutual TLS with `tls`.
    pub fn connect(
        addr: &str,
        max_message_bytes: usize,
        tls: Option<&ClusterTls>,
    ) -> Result<GrpcNode, DataError> {
        let channel = peer_endpoint(addr, tls)
            .map_err(|e| DataError::InvalidArgument(format!("node address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .connect_lazy();
        let client = DataClient::new(channel)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        Ok(GrpcNode { client })
    }
}

#[tonic::async_trait]
impl NodeApi for GrpcNode {
    async fn tablet_write(
        &self,
        epoch: u64,
        ops: Vec<(u32, TabletOp)>,
        new_gids: bool,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        let ops = ops.into_iter().map(|(t, op)| tablet_op_to_wire(t, op)).collect();
        let req = request(TabletWriteRequest { epoch, ops, new_gids }, deadline);
        self.client.clone().tablet_write(req).await.map_err(status_error)?;
        Ok(())
    }

    async fn tablet_probe(
        &self,
        epoch: u64,
        probes: Vec<(u32, u64)>,
        k: u32,
        max_matches: usize,
        resolve: Resolve,
        deadline: Option<Instant>,
    ) -> DataResult<ProbeAnswer> {
        let n = probes.len();
        let probes =
            probes.into_iter().map(|(table, fp)| TabletProbeTarget { table, fp }).collect();
        let max_matches = max_matches as u64;
        let (resolve, skip_sketches) = resolve.to_wire();
        let req = TabletProbeRequest { epoch, probes, k, max_matches, resolve, skip_sketches };
        let req = request(req, deadline);
        let r = self.client.clone().tablet_probe(req).await.map_err(status_error)?.into_inner();
        Ok(ProbeAnswer {
            results: probe_results_from_wire(r.results, n)?,
            docs: r.docs.into_iter().map(doc_from_wire).collect(),
            resolved: r.resolved_partitions,
        })
    }

    async fn doc_write(
        &self,
        epoch: u64,
        ops: Vec<DocOp>,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        let ops = ops.into_iter().map(doc_op_to_wire).collect();
        let req = request(DocWriteRequest { epoch, ops }, deadline);
        self.client.clone().doc_write(req).await.map_err(status_error)?;
        Ok(())
    }

    async fn doc_lookup(
        &self,
        epoch: u64,
        names: Vec<String>,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        let n = names.len();
        let req = request(DocLookupRequest { epoch, names }, deadline);
        let r = self.client.clone().doc_lookup(req).await.map_err(status_error)?;
        docs_from_wire(r.into_inner().docs, n)
    }

    async fn doc_resolve(
        &self,
        epoch: u64,
        gids: Vec<u64>,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        let n = gids.len();
        let req = request(DocResolveRequest { epoch, gids, skip_sketches: !sketches }, deadline);
        let r = self.client.clone().doc_resolve(req).await.map_err(status_error)?;
        docs_from_wire(r.into_inner().docs, n)
    }

    async fn tablet_scan(
        &self,
        epoch: u64,
        table: u32,
        start: u64,
        end: u64,
        from: u64,
        limit: u32,
        deadline: Option<Instant>,
    ) -> DataResult<ScanPage<(u64, u64)>> {
        let req = request(TabletScanRequest { epoch, table, start, end, from, limit }, deadline);
        let mut stream =
            self.client.clone().tablet_scan(req).await.map_err(status_error)?.into_inner();
        let mut page = ScanPage { items: Vec::new(), next: None };
        while let Some(chunk) = stream.message().await.map_err(status_error)? {
            page.items.extend(chunk.entries.into_iter().map(|e| (e.gid, e.fp)));
            page.next = chunk.next;
        }
        Ok(page)
    }

    async fn partition_scan(
        &self,
        epoch: u64,
        partition: u32,
        cursor: u64,
        limit: u32,
        deadline: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>> {
        let req = request(PartitionScanRequest { epoch, partition, cursor, limit }, deadline);
        let mut stream =
            self.client.clone().partition_scan(req).await.map_err(status_error)?.into_inner();
        let mut page = ScanPage { items: Vec::new(), next: None };
        while let Some(chunk) = stream.message().await.map_err(status_error)? {
            page.items.extend(chunk.docs.into_iter().map(doc_from_wire));
            page.next = chunk.next;
        }
        Ok(page)
    }

    async fn stats(&self, epoch: u64, deadline: Option<Instant>) -> DataResult<NodeStats> {
        let req = request(NodeStatsRequest { epoch }, deadline);
        let r = self.client.clone().node_stats(req).await.map_err(status_error)?.into_inner();
        let stats =
            r.stats.ok_or_else(|| DataError::Internal("a node sent no statistics".into()))?;
        let partitions = r.partitions.into_iter().map(|p| (p.partition, p.documents)).collect();
        Ok(NodeStats { stats, partitions })
    }
}
