//! `neardup serve` as a node of a cluster: its identity, its Raft state in `<data>/cluster`
//! (a sled database of its own), the internal listener, and the join.
//!
//! - `--bootstrap` starts a new cluster with this node as its only voter and the configured
//!   design.
//! - `--join HOST:PORT` starts the node with an empty state, then asks that member (any
//!   member: a follower forwards to the leader) to add it, retrying a few times with backoff
//!   while the answer says a retry may work.
//! - A restart on a data directory holding cluster state needs neither flag: the node id is
//!   the one stored there, and `--node-id` with another id is refused.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use neardup_client::Token;
use neardup_cluster::map::{DesignInfo, Layout};
use neardup_cluster::{ClusterConfig, ClusterMetrics, ClusterNode, NodeId};
use neardup_proto::admin::AddNodeRequest;
use neardup_server::cluster_rpc::GrpcTransport;
use neardup_server::tls::{ClusterTls, named};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::Code;

use crate::cmd::cluster::admin_client;
use crate::cmd::common::read_token_file;
use crate::config::Config;
use crate::error::CliError;
use crate::ops;

/// Join attempts before giving up.
const JOIN_ATTEMPTS: u32 = 8;

/// A running cluster node of this process.
pub struct ClusterRole {
    /// The Raft node.
    pub node: ClusterNode,
    transport: GrpcTransport,
    /// The member to join through, and what to ask it.
    join: Option<(String, AddNodeRequest)>,
    /// The admin token sent with the join.
    join_token: Option<Token>,
    /// Mutual TLS with the other nodes.
    tls: Option<Arc<ClusterTls>>,
}

/// Where a node keeps its Raft state.
pub fn cluster_dir(data: &Path) -> PathBuf {
    data.join("cluster")
}

/// Whether `serve` runs as a cluster node: asked to bootstrap or join, or its data
/// directory already holds cluster state.
pub fn cluster_mode(config: &Config) -> bool {
    let c = &config.cluster;
    c.bootstrap || !c.join.is_empty() || cluster_dir(&config.data).exists()
}

/// The node id stored in a Raft directory, if it holds one.
fn stored_id(dir: &Path) -> Result<Option<NodeId>, CliError> {
    if !dir.exists() {
        return Ok(None);
    }
    let store = neardup_cluster::storage::RaftStore::open_dir(dir)
        .map_err(|e| CliError::Cluster(format!("cannot open {}: {e}", dir.display())))?;
    Ok(store.identity().map(|i| i.node_id))
}

/// The node id a host name gives: 1 + the number after its last `-` (`neardup-0` is 1).
fn id_from_hostname(host: &str) -> Result<NodeId, CliError> {
    host.rsplit_once('-')
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| {
            CliError::Config(format!(
                "cluster.node_id_from_hostname: the host name {host:?} does not end in -N \
                 (a StatefulSet's pod name does): give cluster.node_id instead"
            ))
        })
}

/// The node id to run as: the stored one, which `--node-id` may repeat but not change.
fn node_id(wanted: u64, stored: Option<NodeId>, dir: &Path) -> Result<NodeId, CliError> {
    match (wanted, stored) {
        (0, Some(id)) => Ok(id),
        (0, None) => Err(CliError::Usage(
            "a new cluster node needs an id: --node-id N (or cluster.node_id), N > 0".into(),
        )),
        (w, Some(id)) if w != id => Err(CliError::Cluster(format!(
            "--node-id {w}, but the data directory {} belongs to node {id}: a node keeps its \
             id for life; start it without --node-id (or with --node-id {id}), or give the \
             new node another data directory",
            dir.display()
        ))),
        (w, _) => Ok(w),
    }
}

/// Opens (or creates) the node's Raft state, binds the internal listener and starts Raft.
/// `public` is the bound public address (advertised unless `advertise_public` is set). The
/// transport's tasks run on `runtime` (the one of the internal services); with `tls`, every
/// connection to the other nodes is mutual TLS, and the certificate must name this node.
pub async fn start(
    config: &Config,
    public: SocketAddr,
    registry: &mut Registry,
    runtime: &tokio::runtime::Handle,
    tls: Option<Arc<ClusterTls>>,
) -> Result<(ClusterRole, TcpListener), CliError> {
    let c = &config.cluster;
    let dir = cluster_dir(&config.data);
    std::fs::create_dir_all(&config.data).map_err(|source| CliError::File {
        action: "create data directory",
        path: config.data.display().to_string(),
        source,
    })?;
    let d = dir.clone();
    let stored = tokio::task::spawn_blocking(move || stored_id(&d))
        .await
        .map_err(|e| CliError::Cluster(e.to_string()))??;
    let wanted = if c.node_id == 0 && c.node_id_from_hostname && stored.is_none() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|source| {
            CliError::File {
                action: "read the host name from",
                path: "/proc/sys/kernel/hostname".into(),
                source,
            }
        })?;
        id_from_hostname(host.trim())?
    } else {
        c.node_id
    };
    let id = node_id(wanted, stored, &dir)?;
    if let Some(t) = &tls
        && t.node() != Some(id)
    {
        return Err(CliError::Config(format!(
            "the certificate {} names {}, but this is node {id}: a node's certificate carries \
             its id (neardup cert issue --node-id {id})",
            c.tls_cert_file,
            named(t.node()),
        )));
    }
    let listener = ops::bind(&c.internal_listen, "the internal gRPC API").await?;
    let internal = listener.local_addr().map_err(|source| CliError::Listen {
        what: "the internal gRPC API",
        address: c.internal_listen.clone(),
        source,
    })?;
    let advertise = |set: &str, bound: SocketAddr| {
        if set.is_empty() { bound.to_string() } else { set.to_string() }
    };
    let public_addr = advertise(&c.advertise_public, public);
    let internal_addr = advertise(&c.advertise_internal, internal);
    // Told to join through itself: it is the first node, and starts the cluster.
    let join_self = !c.join.is_empty() && c.join == internal_addr;
    let bootstrap = if c.bootstrap || join_self {
        if stored.is_some() {
            tracing::info!("the data directory holds cluster state: --bootstrap has no effect");
        }
        let design = config.index_config()?.design;
        Some(DesignInfo {
            name: config.index.design.clone(),
            tables: design.tables().len() as u32,
            max_k: design.max_k(),
        })
    } else {
        None
    };
    let cfg = ClusterConfig {
        bootstrap,
        tick: Duration::from_millis(c.tick_ms),
        election_ticks: c.election_ticks,
        heartbeat_ticks: c.heartbeat_ticks,
        max_voters: c.max_voters,
        snapshot_every: c.snapshot_every,
        layout: Layout { replicas: c.replicas, split_bits: c.split_bits, partitions: c.partitions },
        failure_timeout: Duration::from_millis(c.failure_timeout_ms),
        rebuild_after: Duration::from_millis(c.rebuild_after_ms),
        ..ClusterConfig::new(id, public_addr.clone(), internal_addr.clone(), dir)
    };
    let metrics = ClusterMetrics::default();
    metrics.register(registry);
    let transport = {
        let _on = runtime.enter();
        GrpcTransport::new(id, internal_addr.clone(), tls.clone())
    };
    let t: Arc<dyn neardup_cluster::Transport> = Arc::new(transport.clone());
    let node = tokio::task::spawn_blocking(move || ClusterNode::start(cfg, t, metrics))
        .await
        .map_err(|e| CliError::Cluster(e.to_string()))?
        .map_err(|e| CliError::Cluster(format!("cannot start the cluster node: {e}")))?;
    tracing::info!(
        node_id = id,
        internal = %internal_addr,
        public = %public_addr,
        "cluster node started"
    );
    let join = (!c.join.is_empty() && !join_self).then(|| {
        let req = AddNodeRequest { node_id: id, public_addr, internal_addr };
        (c.join.clone(), req)
    });
    let join_token = (!c.join_token_file.is_empty())
        .then(|| read_token_file(Path::new(&c.join_token_file)))
        .transpose()?;
    Ok((ClusterRole { node, transport, join, join_token, tls }, listener))
}

impl ClusterRole {
    /// With `--join`: asks the member to add this node, retrying while a retry may work
    /// (no leader yet, the member unreachable, another change under way). Without: nothing.
    pub async fn join(&self) -> Result<(), CliError> {
        let Some((via, req)) = &self.join else { return Ok(()) };
        let mut wait = Duration::from_millis(250);
        for attempt in 1..=JOIN_ATTEMPTS {
            let (timeout, token) = (Duration::from_secs(10), self.join_token.clone());
            let mut client = admin_client(via, timeout, token, self.tls.as_deref())?;
            match client.add_node(req.clone()).await {
                Ok(r) => {
                    let r = r.into_inner();
                    tracing::info!(via = %via, epoch = r.epoch, "joined the cluster");
                    return Ok(());
                }
                Err(s) if retryable(s.code()) && attempt < JOIN_ATTEMPTS => {
                    tracing::warn!(
                        via = %via, attempt, error = %s.message(),
                        "join not accepted yet; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(4));
                }
                Err(s) => {
                    return Err(CliError::Cluster(format!(
                        "cannot join the cluster through {via}: {}",
                        s.message()
                    )));
                }
            }
        }
        Err(CliError::Cluster(format!("cannot join the cluster through {via}")))
    }

    /// Stops Raft (after persisting) and the transport's tasks.
    pub async fn shutdown(self) {
        let node = self.node.clone();
        let _ = tokio::task::spawn_blocking(move || node.shutdown()).await;
        self.transport.close();
    }
}

/// Whether a refused join may succeed later.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::FailedPrecondition | Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_comes_from_the_directory_once_stored() {
        let dir = Path::new("/d/cluster");
        assert_eq!(node_id(3, None, dir).unwrap(), 3);
        assert_eq!(node_id(0, Some(4), dir).unwrap(), 4);
        assert_eq!(node_id(4, Some(4), dir).unwrap(), 4);
        let e = node_id(5, Some(4), dir).unwrap_err().to_string();
        assert!(e.contains("belongs to node 4"), "{e}");
        let e = node_id(0, None, dir).unwrap_err().to_string();
        assert!(e.contains("--node-id"), "{e}");
    }

    #[test]
    fn a_statefulset_pod_name_gives_the_node_id() {
        assert_eq!(id_from_hostname("neardup-0").unwrap(), 1);
        assert_eq!(id_from_hostname("my-neardup-12").unwrap(), 13);
        for bad in ["neardup", "neardup-", "neardup-x", "node1"] {
            let e = id_from_hostname(bad).unwrap_err().to_string();
            assert!(e.contains("does not end in -N"), "{bad}: {e}");
        }
    }
}
