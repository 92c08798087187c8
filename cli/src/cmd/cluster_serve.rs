//! `neardup serve` as a node of a cluster: the node's data ([`NodeStore`] in `<data>/node`),
//! its Raft node ([`crate::cmd::cluster_node`]), the internal listener (`Data`, `Raft`,
//! admin, health), the public API over a [`ClusterRouter`] (any node answers for the whole
//! cluster), and the filler that brings this node's new and returning replicas level
//! before they serve ([`neardup_router::fill`]).

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use neardup_cluster::ClusterNode;
use neardup_router::cluster::{ClusterRouter, GrpcNodes, IdSource};
use neardup_router::hedge::Hedger;
use neardup_router::{Router, RpcMetrics};
use neardup_server::cluster_rpc::cluster_status;
use neardup_server::local_node::LocalNode;
use neardup_server::node_store::{NodeStore, NodeStoreConfig};
use neardup_server::{NodeApi, ShardMetrics};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Status;

use crate::cmd::cluster_node;
use crate::cmd::serve::stop_signal;
use crate::config::Config;
use crate::error::CliError;
use crate::ops;

/// Gids come from blocks the map grants this node.
struct GrantedIds(ClusterNode);

#[tonic::async_trait]
impl IdSource for GrantedIds {
    async fn grant(&self, count: u64) -> Result<Range<u64>, Status> {
        let count = count.clamp(1, neardup_cluster::map::MAX_GRANT);
        let epoch = self.0.watch_map().borrow().epoch;
        self.0.grant_ids(count).await.map_err(|e| cluster_status(&e, epoch))
    }
}

/// Runs a cluster node until a shutdown signal.
pub async fn run(
    config: Config,
    listener: TcpListener,
    address: SocketAddr,
    shard_metrics: ShardMetrics,
    rpc_metrics: RpcMetrics,
    mut registry: Registry,
) -> Result<(), CliError> {
    // Files that do not read stop the start here.
    let (access, tls, cluster_tls) = (config.access()?, config.tls()?, config.cluster_tls()?);
    let internal_rt = internal_runtime()?;
    // The cluster's state is opened first: a wrong node id stops the start here.
    let (cluster, internal_listener) = cluster_node::start(
        &config,
        address,
        &mut registry,
        internal_rt.handle(),
        cluster_tls.clone(),
    )
    .await?;
    let design = config.index_config()?.design;
    let shard = config.shard_config()?;
    let store_config = NodeStoreConfig::of_shard(shard);
    let dir = config.data.join("node");
    // A node whose data directory is new has missed nothing and holds nothing yet.
    let fresh = !dir.exists();
    let d = design.clone();
    let metrics = shard_metrics.clone();
    let store =
        tokio::task::spawn_blocking(move || NodeStore::open(&dir, &d, store_config, metrics))
            .await
            .map_err(|e| CliError::Start(neardup_server::Error::Internal(e.to_string())))?
            .map_err(CliError::Start)?;
    let hedger = Arc::new(Hedger::default());
    hedger.register(&mut registry);
    ops::serve_metrics(&config.metrics_listen, registry, config.metrics_token()?).await?;
    let node = cluster.node.clone();
    let id = node.id();
    let contact = {
        let n = node.clone();
        Arc::new(move || n.in_contact())
    };
    let local = Arc::new(LocalNode::new(id, store.clone(), node.watch_map(), contact));
    let grpc =
        GrpcNodes::new(node.watch_map(), config.limits.max_message_bytes, cluster_tls.clone());
    let local_api: Arc<dyn NodeApi> = local.clone();
    let nodes = grpc.resolver(Some((id, local_api.clone())));
    let cluster_router = ClusterRouter::new(
        node.watch_map(),
        nodes.clone(),
        Arc::new(GrantedIds(node.clone())),
        Some(id),
    )
    .with_hedger(hedger);
    let router = Router::with_verify(
        Arc::new(cluster_router),
        design.max_k(),
        config.limits.clone(),
        config.verify.clone(),
        rpc_metrics,
    );
    tracing::info!(
        address = %address,
        data = %config.data.display(),
        design = %design,
        node_id = id,
        "neardup serving as a cluster node"
    );
    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    let signal = stop.clone();
    tokio::spawn(async move {
        ops::shutdown_signal().await;
        signal.send_replace(true);
    });
    tokio::spawn(check_design(node.clone(), design.to_string(), stop.clone()));
    let internal_listener = internal_listener.into_std().map_err(|source| CliError::Listen {
        what: "the internal gRPC API",
        address: config.cluster.internal_listen.clone(),
        source,
    })?;
    let (held, raft, limits) = (store.clone(), node.clone(), config.limits.clone());
    let admin_access = access.clone();
    let stopping = stop_signal(stopped.clone());
    // The listener becomes a tokio one on the runtime that serves it.
    let internal = internal_rt.spawn(async move {
        internal_listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(internal_listener)?;
        let (max, http2) = (limits.max_message_bytes, limits.http2());
        neardup_server::node::serve_cluster(
            listener,
            held,
            local_api,
            raft,
            max,
            http2,
            admin_access,
            cluster_tls,
            stopping,
        )
        .await
    });
    if fresh {
        local.allow_reads();
    } else {
        tokio::spawn(mark_for_catching_up(node.clone(), local.clone(), stopped.clone()));
    }
    let copy = neardup_router::fill::CopyConfig {
        rate: config.cluster.copy_rate_mb.saturating_mul(1_000_000),
        page: config.cluster.copy_page_entries,
        split_entries: config.cluster.split_entries,
    };
    let filler =
        tokio::spawn(neardup_router::fill::run(local, node.clone(), nodes, copy, stopped.clone()));
    // A joining node asks a member to add it once its internal listener serves (the leader
    // then replicates the map to it); a refused join stops the process.
    let joined = cluster.join().await;
    if joined.is_err() {
        stop.send_replace(true);
    }
    let served =
        neardup_router::server::serve(listener, router, access, tls, stop_signal(stopped)).await;
    match internal.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "the internal listener failed"),
        Err(e) => tracing::error!(error = %e, "the internal listener's task failed"),
    }
    let _ = filler.await;
    cluster.shutdown().await;
    // The transport's tasks are gone with the cluster's shutdown.
    internal_rt.shut_down().await;
    let down = tokio::task::spawn_blocking(move || store.shutdown())
        .await
        .map_err(|e| CliError::Shutdown(e.to_string()))?
        .map_err(|e| CliError::Shutdown(e.to_string()));
    joined?;
    served.map_err(|e| CliError::Serve(e.to_string()))?;
    down
}

/// The runtime of the node's internal services (Raft, Data, admin) and of the Raft
/// transport, with worker threads of its own: Raft's messages (heartbeats, votes, the
/// leader's liveness checks) must arrive within the election and failure timeouts, and on a
/// node whose public API is busy (a router for many clients) they would otherwise queue
/// behind its requests on the same workers.
fn internal_runtime() -> Result<InternalRuntime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("neardup-internal")
        .enable_all()
        .build()
        .map(|rt| InternalRuntime(Some(rt)))
        .map_err(CliError::Runtime)
}

/// The internal runtime. [`shut_down`](Self::shut_down) waits for its threads off the
/// async threads; dropped without it (an early return of `run`, which is async and where a
/// runtime may not wait), it shuts down without waiting.
struct InternalRuntime(Option<tokio::runtime::Runtime>);

impl InternalRuntime {
    async fn shut_down(mut self) {
        if let Some(rt) = self.0.take() {
            let wait = move || rt.shutdown_timeout(Duration::from_secs(1));
            let _ = tokio::task::spawn_blocking(wait).await;
        }
    }
}

impl std::ops::Deref for InternalRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("present until shut down")
    }
}

impl Drop for InternalRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// After a start, lets the node serve reads only once its replicas are marked for catching
/// up: it may have missed writes while it was away (the others stop writing to a node once
/// it is marked down), and its map may be older than the cluster's. A node the map holds
/// as active (killed and back before the leader noticed) marks itself down; the leader then
/// marks it back, which turns its replicas into filling ones, and the filler brings them
/// level. A node with no replicas (new, or joining) has nothing to catch up.
async fn mark_for_catching_up(
    node: ClusterNode,
    local: Arc<LocalNode>,
    stopped: watch::Receiver<bool>,
) {
    let id = node.id();
    let mut map = node.watch_map();
    loop {
        if *stopped.borrow() {
            return;
        }
        if node.in_contact() && *node.watch_ready().borrow() {
            let m = map.borrow_and_update().clone();
            let holds = m.units().any(|u| m.holds(u, id));
            if !holds || !m.is_up(id) {
                break;
            }
            match node.mark_self_down().await {
                Ok(_) => break,
                Err(e) => tracing::info!(error = %e, "marking this node for catching up; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!("replicas marked for catching up; serving reads");
    local.allow_reads();
}

/// Stops the node when the cluster's design is not the one its data was opened with: every
/// node must hold the same tables.
async fn check_design(node: ClusterNode, ours: String, stop: Arc<watch::Sender<bool>>) {
    let mut map = node.watch_map();
    let Ok(m) = map.wait_for(|m| m.design.is_some()).await else { return };
    let theirs = m.design.as_ref().map(|d| d.name.clone()).unwrap_or_default();
    drop(m);
    let same = neardup_core::Design::parse(&theirs).is_ok_and(|d| d.to_string() == ours);
    if !same {
        tracing::error!(
            cluster = %theirs,
            configured = %ours,
            "the cluster's design is not this node's [index] design; stopping"
        );
        stop.send_replace(true);
    }
}
