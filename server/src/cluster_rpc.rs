//! The network side of a cluster node: what carries Raft between nodes and what operators
//! call, over gRPC on the node's internal listener.
//!
//! - [`GrpcTransport`]: the [`Transport`] a [`ClusterNode`] sends its Raft messages through.
//!   One lazily connected tonic channel per peer (it reconnects by itself), and a bounded
//!   queue per peer drained by a task of its own: [`Transport::send`] only queues, so the Raft
//!   thread never waits on the network. The task sends what queued up during a call in the
//!   next one (`StepBatch`): with a peer slow to answer, a heartbeat waits one round trip,
//!   not one per message queued ahead of it. A full queue drops the message (Raft retries); a
//!   failed call drops what is queued behind it, so a peer that comes back gets fresh
//!   messages, not a backlog of stale ones.
//! - [`RaftRpc`]: the internal `neardup.internal.v1.Raft` service: every message is handed
//!   to [`ClusterNode::step`] with the sender's address.
//! - [`AdminService`]: `neardup.admin.v1.Admin`. Status answers from this node's state. A
//!   change goes to [`ClusterNode`]; on a node that is not the leader it is forwarded once to
//!   the leader's internal address (marked so that it is not forwarded again); when there is
//!   no leader, or the leader cannot be reached, the answer is UNAVAILABLE with the leader's
//!   address in the message when it is known.
//! - [`cluster_status`]: the one mapping of [`ClusterError`] to gRPC codes. Every answer
//!   carries the epoch: a success in its body, an error in the `neardup-epoch` metadata key.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use neardup_cluster::map::{self, ClusterMap};
use neardup_cluster::{Applied, ClusterError, ClusterNode, NodeId, Transport};
use neardup_proto::admin::admin_client::AdminClient;
use neardup_proto::admin::admin_server::Admin;
use neardup_proto::admin::{
    AddNodeRequest, ChangeResponse, Design, Node, NodeState, Partition, RebalanceRequest,
    RemoveNodeRequest, Role, StatusRequest, StatusResponse, Tablet, TabletState,
    TransferLeaderRequest,
};
use neardup_proto::internal::raft_client::RaftClient;
use neardup_proto::internal::raft_server::Raft;
use neardup_proto::internal::{RaftAck, RaftBatch, RaftMessage};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::{Code, Request, Response, Status};

use crate::tls::{ClusterTls, PeerCert};

/// Messages queued for one peer before new ones are dropped.
pub const PEER_QUEUE: usize = 1024;

/// How long a Raft message may take to reach a peer (connecting included).
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Most messages, and about the most bytes, one StepBatch call carries.
const BATCH_MESSAGES: usize = 256;
const BATCH_BYTES: usize = 8 << 20;

/// The metadata key an error's epoch travels in.
pub const EPOCH_METADATA: &str = "neardup-epoch";

/// The metadata key that marks a change forwarded by another node (not forwarded again).
pub const FORWARDED_METADATA: &str = "neardup-forwarded";

/// A change's deadline when the caller gives none.
const CHANGE_DEADLINE: Duration = Duration::from_secs(10);

/// The one mapping of a cluster error to a gRPC status, with the node's `epoch` in the
/// `neardup-epoch` metadata: bad input -> INVALID_ARGUMENT, an unknown node -> NOT_FOUND, an
/// id held by another address -> ALREADY_EXISTS, a refused change -> FAILED_PRECONDITION, no
/// leader or storage trouble -> UNAVAILABLE (retry may work), corrupt storage -> DATA_LOSS.
pub fn cluster_status(e: &ClusterError, epoch: u64) -> Status {
    let code = match e {
        ClusterError::InvalidArgument(_) => Code::InvalidArgument,
        ClusterError::NotFound(_) => Code::NotFound,
        ClusterError::IdInUse { .. } => Code::AlreadyExists,
        ClusterError::FailedPrecondition(_) => Code::FailedPrecondition,
        ClusterError::NotLeader { .. } | ClusterError::Unavailable(_) => Code::Unavailable,
        ClusterError::Storage(_) => Code::Unavailable,
        ClusterError::Corrupt(_) => Code::DataLoss,
    };
    with_epoch(Status::new(code, e.to_string()), epoch)
}

/// `status` with `epoch` in its metadata.
fn with_epoch(mut status: Status, epoch: u64) -> Status {
    if let Ok(v) = epoch.to_string().parse() {
        status.metadata_mut().insert(EPOCH_METADATA, v);
    }
    status
}

/// A lazily connected channel to the internal port at `addr` (mutual TLS under `tls`), or
/// why the address is not usable.
fn channel(
    addr: &str,
    timeout: Duration,
    tls: Option<&ClusterTls>,
) -> Result<tonic::transport::Channel, String> {
    let endpoint = crate::tls::peer_endpoint(addr, tls)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

/// The [`Transport`] of a cluster node over gRPC (see the module docs).
#[derive(Clone)]
pub struct GrpcTransport {
    inner: Arc<TransportInner>,
}

struct TransportInner {
    from_id: NodeId,
    from_addr: String,
    tls: Option<Arc<ClusterTls>>,
    runtime: tokio::runtime::Handle,
    peers: Mutex<HashMap<NodeId, Peer>>,
    dropped: AtomicU64,
}

struct Peer {
    addr: String,
    /// The TLS generation its channel was made under.
    generation: u64,
    queue: mpsc::Sender<Vec<u8>>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcTransport {
    /// A transport sending as node `from_id` reachable at `from_addr`, over mutual TLS with
    /// `tls`; its tasks run on the current tokio runtime (call it inside one).
    pub fn new(from_id: NodeId, from_addr: String, tls: Option<Arc<ClusterTls>>) -> GrpcTransport {
        GrpcTransport {
            inner: Arc::new(TransportInner {
                from_id,
                from_addr,
                tls,
                runtime: tokio::runtime::Handle::current(),
                peers: Mutex::new(HashMap::new()),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Messages dropped so far (a full queue, or behind a failed call).
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Stops every peer's task.
    pub fn close(&self) {
        for (_, p) in self.inner.peers.lock().drain() {
            p.task.abort();
        }
    }

    fn open_peer(&self, to: NodeId, addr: &str) -> Peer {
        let (queue, rx) = mpsc::channel(PEER_QUEUE);
        let inner = self.inner.clone();
        let addr_owned = addr.to_string();
        let generation = self.generation();
        let task = self.inner.runtime.spawn(drain(inner, to, addr_owned, rx));
        Peer { addr: addr.to_string(), generation, queue, task }
    }

    fn generation(&self) -> u64 {
        self.inner.tls.as_ref().map_or(0, |t| t.generation())
    }
}

impl Transport for GrpcTransport {
    fn send(&self, to: NodeId, to_addr: &str, message: Vec<u8>) {
        let generation = self.generation();
        let mut peers = self.inner.peers.lock();
        let stale = peers
            .get(&to)
            .is_none_or(|p| p.addr != to_addr || p.queue.is_closed() || p.generation != generation);
        if stale {
            if let Some(old) = peers.remove(&to) {
                old.task.abort();
            }
            let peer = self.open_peer(to, to_addr);
            peers.insert(to, peer);
        }
        let Some(peer) = peers.get(&to) else { return };
        if peer.queue.try_send(message).is_err() {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends the messages queued for peer `to` at `addr`, one call at a time, until the queue
/// closes.
async fn drain(
    inner: Arc<TransportInner>,
    to: NodeId,
    addr: String,
    mut rx: mpsc::Receiver<Vec<u8>>,
) {
    let mut client = match channel(&addr, SEND_TIMEOUT, inner.tls.as_deref()) {
        Ok(c) => RaftClient::new(c).max_decoding_message_size(64 << 20),
        Err(e) => {
            tracing::warn!(peer = to, error = %e, "cannot send Raft messages to this peer");
            while rx.recv().await.is_some() {
                inner.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
    };
    let mut failing = false;
    let mut batches = true;
    while let Some(first) = rx.recv().await {
        // Whatever queued up behind the last call goes in this one.
        let mut messages = vec![first];
        let mut bytes = messages[0].len();
        while messages.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
            match rx.try_recv() {
                Ok(m) => {
                    bytes += m.len();
                    messages.push(m);
                }
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let count = messages.len();
        let (from_id, from_addr) = (inner.from_id, inner.from_addr.clone());
        let result = if batches && count > 1 {
            let req = RaftBatch { messages, from_id, from_addr };
            let r = client.step_batch(req).await.map(|_| ());
            if r.as_ref().is_err_and(|e| e.code() == Code::Unimplemented) {
                // An older peer: this batch is lost (Raft sends again), later ones go singly.
                tracing::info!(peer = to, "peer has no StepBatch; sending one message a call");
                batches = false;
                inner.dropped.fetch_add(count as u64, Ordering::Relaxed);
                continue;
            }
            r
        } else {
            let mut r = Ok(());
            let mut sent = 0;
            for message in messages {
                let req = RaftMessage { message, from_id, from_addr: from_addr.clone() };
                if let Err(e) = client.step(req).await {
                    r = Err(e);
                    break;
                }
                sent += 1;
            }
            r.inspect_err(|_| {
                // The failed message and those after it in this call are not sent.
                inner.dropped.fetch_add((count - sent) as u64, Ordering::Relaxed);
            })
        };
        let took = started.elapsed();
        if took >= neardup_cluster::STALL_WARN {
            tracing::warn!(
                peer = to,
                messages = count,
                took_ms = took.as_millis() as u64,
                "Raft messages took long to deliver"
            );
        }
        match result {
            Ok(()) => {
                if failing {
                    tracing::info!(peer = to, addr = %addr, "Raft peer reachable again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::info!(peer = to, addr = %addr, error = %e.message(), "Raft peer unreachable");
                    failing = true;
                }
                // What waited behind a failed call is stale by now: Raft sends again.
                while rx.try_recv().is_ok() {
                    inner.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The node the caller's certificate names, under mutual TLS.
fn peer_node<T>(request: &Request<T>) -> Option<NodeId> {
    request.extensions().get::<Arc<PeerCert>>().and_then(|p| p.node)
}

/// Under mutual TLS, a node speaks for itself only: the `from_id` of its messages, and the
/// `from` of each Raft message inside, is the node its certificate names.
fn check_sender(peer: Option<NodeId>, from_id: NodeId) -> Result<(), Status> {
    match peer {
        Some(id) if id != from_id => Err(Status::permission_denied(format!(
            "the certificate of node {id} cannot send as node {from_id}"
        ))),
        _ => Ok(()),
    }
}

/// The internal `Raft` service of a cluster node.
#[derive(Clone)]
pub struct RaftRpc {
    node: ClusterNode,
}

impl RaftRpc {
    /// The service handing messages to `node`.
    pub fn new(node: ClusterNode) -> RaftRpc {
        RaftRpc { node }
    }

    /// Hands `messages` to the node in order; the first refused ends the call.
    fn deliver(
        &self,
        messages: &[Vec<u8>],
        sender: Option<NodeId>,
        from_addr: &str,
    ) -> Result<Response<RaftAck>, Status> {
        for message in messages {
            self.node
                .step_as(message, sender, from_addr)
                .map_err(|e| cluster_status(&e, self.node.status().epoch))?;
        }
        Ok(Response::new(RaftAck {}))
    }
}

#[tonic::async_trait]
impl Raft for RaftRpc {
    async fn step(&self, request: Request<RaftMessage>) -> Result<Response<RaftAck>, Status> {
        let peer = peer_node(&request);
        let RaftMessage { message, from_id, from_addr } = request.into_inner();
        check_sender(peer, from_id)?;
        self.deliver(&[message], peer, &from_addr)
    }

    async fn step_batch(&self, request: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        let peer = peer_node(&request);
        let RaftBatch { messages, from_id, from_addr } = request.into_inner();
        check_sender(peer, from_id)?;
        self.deliver(&messages, peer, &from_addr)
    }
}

/// The admin service of a cluster node.
#[derive(Clone)]
pub struct AdminService {
    node: ClusterNode,
    tls: Option<Arc<ClusterTls>>,
}

impl AdminService {
    /// The service over `node`; changes are forwarded to the leader over mutual TLS with
    /// `tls`.
    pub fn new(node: ClusterNode, tls: Option<Arc<ClusterTls>>) -> AdminService {
        AdminService { node, tls }
    }

    fn epoch(&self) -> u64 {
        self.node.status().epoch
    }

    /// Runs a change here, or forwards it once to the leader when this node is not it.
    async fn change<T, F, Fut, G, GFut>(
        &self,
        request: Request<T>,
        local: F,
        forward: G,
    ) -> Result<Response<ChangeResponse>, Status>
    where
        T: Clone,
        F: FnOnce(ClusterNode, T) -> Fut,
        Fut: std::future::Future<Output = Result<Applied, ClusterError>>,
        G: FnOnce(AdminClient<tonic::transport::Channel>, Request<T>) -> GFut,
        GFut: std::future::Future<Output = Result<Response<ChangeResponse>, Status>>,
    {
        let forwarded = request.metadata().contains_key(FORWARDED_METADATA);
        let deadline = deadline_of(&request);
        let authorization = request.metadata().get("authorization").cloned();
        let body = request.into_inner();
        let outcome = tokio::time::timeout(deadline, local(self.node.clone(), body.clone())).await;
        let e = match outcome {
            Ok(Ok(applied)) => return Ok(Response::new(self.applied(applied))),
            Ok(Err(e)) => e,
            Err(_) => {
                return Err(with_epoch(
                    Status::deadline_exceeded(format!(
                        "the change was not committed within {} ms (no quorum reachable?); \
                         read the status before retrying",
                        deadline.as_millis()
                    )),
                    self.epoch(),
                ));
            }
        };
        let ClusterError::NotLeader { leader: Some((leader, addr)) } = &e else {
            return Err(cluster_status(&e, self.epoch()));
        };
        if forwarded || *leader == self.node.status().node_id {
            return Err(cluster_status(&e, self.epoch()));
        }
        let client = match channel(addr, deadline, self.tls.as_deref()) {
            Ok(c) => AdminClient::new(c),
            Err(why) => return Err(with_epoch(Status::unavailable(why), self.epoch())),
        };
        let mut req = Request::new(body);
        req.set_timeout(deadline);
        // The leader checks the caller's token as this node did.
        if let Some(token) = authorization {
            req.metadata_mut().insert("authorization", token);
        }
        req.metadata_mut()
            .insert(FORWARDED_METADATA, tonic::metadata::MetadataValue::from_static("1"));
        match forward(client, req).await {
            Ok(r) => Ok(r),
            // The leader's own answer (with its epoch) is passed on as it is; a failure to
            // reach it says where it is.
            Err(s) if s.metadata().contains_key(EPOCH_METADATA) => Err(s),
            Err(s) => Err(with_epoch(
                Status::unavailable(format!(
                    "not the leader; the leader is node {leader} at {addr}, which could not be \
                     reached: {}",
                    s.message()
                )),
                self.epoch(),
            )),
        }
    }

    fn applied(&self, applied: Applied) -> ChangeResponse {
        let Applied { epoch, index } = applied;
        ChangeResponse { epoch, index, leader: self.node.status().leader.unwrap_or(0) }
    }
}

/// The caller's deadline (`grpc-timeout`), or [`CHANGE_DEADLINE`].
fn deadline_of<T>(request: &Request<T>) -> Duration {
    crate::transport::grpc_timeout(request.metadata()).unwrap_or(CHANGE_DEADLINE)
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(status_response(&self.node)))
    }

    async fn add_node(
        &self,
        request: Request<AddNodeRequest>,
    ) -> Result<Response<ChangeResponse>, Status> {
        let AddNodeRequest { node_id, public_addr, internal_addr } = request.get_ref();
        if *node_id == 0 || public_addr.is_empty() || internal_addr.is_empty() {
            return Err(with_epoch(
                Status::invalid_argument(
                    "AddNode needs a node id (not 0), a public and an internal address",
                ),
                self.epoch(),
            ));
        }
        // A node's certificate adds that node only (an operator's, naming none, adds any).
        if let Some(peer) = peer_node(&request)
            && peer != *node_id
            && !request.metadata().contains_key(FORWARDED_METADATA)
        {
            return Err(with_epoch(
                Status::permission_denied(format!(
                    "the certificate of node {peer} cannot add node {node_id}"
                )),
                self.epoch(),
            ));
        }
        self.change(
            request,
            |node, r: AddNodeRequest| async move {
                node.add_node(r.node_id, r.public_addr, r.internal_addr).await
            },
            |mut c, r| async move { c.add_node(r).await },
        )
        .await
    }

    async fn remove_node(
        &self,
        request: Request<RemoveNodeRequest>,
    ) -> Result<Response<ChangeResponse>, Status> {
        self.change(
            request,
            |node, r: RemoveNodeRequest| async move { node.remove_node(r.node_id).await },
            |mut c, r| async move { c.remove_node(r).await },
        )
        .await
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<ChangeResponse>, Status> {
        self.change(
            request,
            |node, r: TransferLeaderRequest| async move { node.transfer_leader(r.node_id).await },
            |mut c, r| async move { c.transfer_leader(r).await },
        )
        .await
    }

    async fn rebalance(
        &self,
        request: Request<RebalanceRequest>,
    ) -> Result<Response<ChangeResponse>, Status> {
        self.change(
            request,
            |node, _: RebalanceRequest| async move { node.rebalance().await },
            |mut c, r| async move { c.rebalance(r).await },
        )
        .await
    }
}

/// The status of `node` as the admin API answers it.
pub fn status_response(node: &ClusterNode) -> StatusResponse {
    let s = node.status();
    let leader = s.leader.unwrap_or(0);
    let ClusterMap {
        cluster_id,
        epoch: _,
        design,
        nodes,
        tablets,
        partitions,
        replicas,
        split_bits,
        next_gid_seq: _,
        leaving: _,
        removed,
        min_prefix_bits: _,
    } = &*s.map;
    let leader_addr =
        s.leader.and_then(|l| nodes.get(&l)).map(|n| n.internal_addr.clone()).unwrap_or_default();
    let nodes = nodes
        .values()
        .map(|n| {
            let map::NodeInfo { id, public_addr, internal_addr, role, state, lost, .. } = n;
            Node {
                id: *id,
                public_addr: public_addr.clone(),
                internal_addr: internal_addr.clone(),
                role: match role {
                    map::Role::Voter => Role::Voter,
                    map::Role::Learner => Role::Learner,
                } as i32,
                state: match state {
                    map::NodeState::Joining => NodeState::Joining,
                    map::NodeState::Active => NodeState::Active,
                    map::NodeState::Draining => NodeState::Draining,
                    map::NodeState::Down => NodeState::Down,
                } as i32,
                caught_up: s.progress.get(id).copied().unwrap_or(false),
                lost: *lost,
            }
        })
        .collect();
    let tablets = tablets
        .iter()
        .map(|t| {
            let map::Tablet { table, start, end, nodes, state, filling, .. } = t;
            Tablet {
                table: *table,
                start: *start,
                end: *end,
                nodes: nodes.clone(),
                filling: filling.clone(),
                state: match state {
                    map::TabletState::Active => TabletState::Active,
                    map::TabletState::Moving => TabletState::Moving,
                } as i32,
            }
        })
        .collect();
    let design = design.as_ref().map(|d| {
        let map::DesignInfo { name, tables, max_k } = d;
        Design { name: name.clone(), tables: *tables, max_k: *max_k }
    });
    StatusResponse {
        node_id: s.node_id,
        leader,
        leader_addr,
        term: s.term,
        epoch: s.map.epoch,
        applied: s.applied,
        committed: s.committed,
        cluster_id: cluster_id.clone(),
        design,
        nodes,
        tablets,
        partitions: partitions
            .iter()
            .map(|p| {
                let map::Partition { index, nodes, filling, .. } = p;
                Partition { index: *index, nodes: nodes.clone(), filling: filling.clone() }
            })
            .collect(),
        replicas: *replicas,
        split_bits: *split_bits,
        removed: removed.iter().copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use neardup_proto::internal::raft_server::RaftServer;

    use super::*;

    /// A peer that takes 20 ms to answer each call and records what it got, in order;
    /// `batches` false: it has no StepBatch (an older node); `refuse`: the number of a message
    /// whose Step call fails.
    #[derive(Clone, Default)]
    struct SlowPeer {
        got: Arc<Mutex<Vec<Vec<u8>>>>,
        calls: Arc<AtomicU64>,
        batches: bool,
        refuse: Option<u32>,
    }

    impl SlowPeer {
        /// The numbers of the messages received, in order.
        fn numbers(&self) -> Vec<u32> {
            let got = self.got.lock();
            got.iter().map(|m| u32::from_be_bytes(m[..4].try_into().unwrap())).collect()
        }
    }

    #[tonic::async_trait]
    impl Raft for SlowPeer {
        async fn step(&self, r: Request<RaftMessage>) -> Result<Response<RaftAck>, Status> {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.calls.fetch_add(1, Ordering::Relaxed);
            let message = r.into_inner().message;
            if self.refuse.is_some_and(|n| message[..4] == n.to_be_bytes()) {
                return Err(Status::unavailable("refused"));
            }
            self.got.lock().push(message);
            Ok(Response::new(RaftAck {}))
        }

        async fn step_batch(&self, r: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
            if !self.batches {
                return Err(Status::unimplemented("no StepBatch"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.got.lock().extend(r.into_inner().messages);
            Ok(Response::new(RaftAck {}))
        }
    }

    async fn serve_peer(peer: SlowPeer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftServer::new(peer))
                .serve_with_incoming(incoming),
        );
        addr
    }

    /// Sends `n` numbered messages at once and waits (bounded) until `want` arrived.
    async fn send_and_wait(t: &GrpcTransport, peer: &SlowPeer, addr: &str, n: u32, want: usize) {
        send_numbered(t, addr, 0..n);
        if !poll(|| peer.got.lock().len() >= want).await {
            panic!("{} of {want} messages arrived", peer.got.lock().len());
        }
    }

    /// Whether `done` became true within 5 s, polled every 10 ms.
    async fn poll(done: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    fn send_numbered(t: &GrpcTransport, addr: &str, numbers: std::ops::Range<u32>) {
        for i in numbers {
            t.send(2, addr, i.to_be_bytes().to_vec());
        }
    }

    /// Waits (bounded) until every one of `sent` messages arrived or was counted dropped.
    async fn settle(t: &GrpcTransport, peer: &SlowPeer, sent: u64) {
        poll(|| peer.got.lock().len() as u64 + t.dropped() >= sent).await;
    }

    /// A backlog behind a slow call goes in one StepBatch call, in order, nothing dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backlog_goes_in_one_call_in_order() {
        let peer = SlowPeer { batches: true, ..Default::default() };
        let addr = serve_peer(peer.clone()).await;
        let t = GrpcTransport::new(1, "127.0.0.1:1".into(), None);
        send_and_wait(&t, &peer, &addr, 200, 200).await;
        let got = peer.numbers();
        assert_eq!(got, (0..200).collect::<Vec<_>>());
        assert_eq!(t.dropped(), 0);
        // One message a call would take 200 calls (4 s at 20 ms each).
        let calls = peer.calls.load(Ordering::Relaxed);
        assert!(calls <= 10, "{calls} calls for 200 queued messages");
        t.close();
    }

    /// A peer without StepBatch loses the first batch (Raft sends again); after that every
    /// message goes one a call, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_older_peer_gets_one_message_a_call() {
        let peer = SlowPeer { batches: false, ..Default::default() };
        let addr = serve_peer(peer.clone()).await;
        let t = GrpcTransport::new(1, "127.0.0.1:1".into(), None);
        send_numbered(&t, &addr, 0..30);
        settle(&t, &peer, 30).await;
        let dropped = t.dropped();
        assert!(dropped >= 2, "the refused batch held {dropped} messages");
        let before = peer.got.lock().len();
        assert_eq!(before as u64 + dropped, 30);
        send_and_wait(&t, &peer, &addr, 30, before + 30).await;
        let got = peer.numbers();
        assert_eq!(got[before..], (0..30).collect::<Vec<_>>()[..]);
        assert_eq!(t.dropped(), dropped, "nothing dropped once sending singly");
        assert_eq!(peer.calls.load(Ordering::Relaxed), got.len() as u64);
        t.close();
    }

    /// Sending one message a call, a failed call drops the rest of its backlog, and every
    /// message not delivered is counted dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_call_counts_every_message_it_did_not_send() {
        let peer = SlowPeer { batches: false, refuse: Some(110), ..Default::default() };
        let addr = serve_peer(peer.clone()).await;
        let t = GrpcTransport::new(1, "127.0.0.1:1".into(), None);
        // The first backlog finds out that the peer takes one message a call.
        send_numbered(&t, &addr, 0..30);
        settle(&t, &peer, 30).await;
        // The next goes one a call; the call of 110 fails.
        send_numbered(&t, &addr, 100..130);
        settle(&t, &peer, 60).await;
        let got = peer.numbers();
        assert!(!got.contains(&110));
        assert!(got.contains(&100) && got.contains(&109), "{got:?}");
        assert_eq!(got.len() as u64 + t.dropped(), 60, "{got:?}, {} dropped", t.dropped());
        t.close();
    }

    #[test]
    fn every_cluster_error_has_its_code_and_the_epoch() {
        let cases = [
            (ClusterError::InvalidArgument("x".into()), Code::InvalidArgument),
            (ClusterError::NotFound(3), Code::NotFound),
            (ClusterError::IdInUse { id: 2, existing_addr: "a:1".into() }, Code::AlreadyExists),
            (ClusterError::FailedPrecondition("quorum".into()), Code::FailedPrecondition),
            (ClusterError::NotLeader { leader: None }, Code::Unavailable),
            (ClusterError::NotLeader { leader: Some((2, "h:7".into())) }, Code::Unavailable),
            (ClusterError::Unavailable("x".into()), Code::Unavailable),
            (ClusterError::Storage("disk".into()), Code::Unavailable),
            (ClusterError::Corrupt("crc".into()), Code::DataLoss),
        ];
        for (e, code) in cases {
            let s = cluster_status(&e, 41);
            assert_eq!(s.code(), code, "{e}");
            assert_eq!(s.metadata().get(EPOCH_METADATA).unwrap(), "41");
        }
        let s = cluster_status(&ClusterError::NotLeader { leader: Some((2, "h:7".into())) }, 1);
        assert!(s.message().contains("h:7"), "the leader's address is in the message: {s:?}");
    }
}
