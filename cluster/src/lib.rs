//! The cluster control plane of neardup: one map of the cluster (nodes, the table design,
//! tablets, an epoch) replicated with Raft (raft-rs) among the nodes.
//!
//! Only the map goes through Raft; data writes go to the nodes directly. The crate has no
//! network code: the wiring gives it a [`Transport`] that carries raft-rs messages (opaque
//! bytes) to a peer's internal address, and hands it the messages that arrive with
//! [`ClusterNode::step`].
//!
//! # Modules
//!
//! - [`map`]: the map and its commands, pure (no I/O, clocks or randomness): members,
//!   tablets (`tables * 2^split_bits`), document partitions, their replicas, granted ids.
//! - [`placement`]: where the replicas of every tablet and partition go, pure, recomputed by
//!   the commands that change membership.
//! - [`storage`]: raft-rs `Storage` on sled (log, hard state, snapshot, node identity), a
//!   CRC-32 on every value, log compaction by snapshots of the map.
//! - [`replica`]: a synchronous driver of `raft::RawNode` (the ready loop, membership and
//!   liveness duties),
//!   driven by the node's thread and by the deterministic simulation (`tests/sim.rs`).
//! - [`node`]: [`ClusterNode`], the replica on its own thread behind a channel.
//! - [`metrics`], [`error`], [`logger`] (raft-rs's slog records into `tracing`).
//!
//! # How the wiring uses it
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use neardup_cluster::*;
//! # struct Grpc;
//! # impl Transport for Grpc { fn send(&self, _: NodeId, _: &str, _: Vec<u8>) {} }
//! # async fn wiring() -> Result<(), ClusterError> {
//! let cfg = ClusterConfig {
//!     // `Some(design)` on the node that starts a cluster (`--bootstrap`), `None` elsewhere.
//!     bootstrap: Some(map::DesignInfo { name: "5c2".into(), tables: 10, max_k: 3 }),
//!     ..ClusterConfig::new(1, "127.0.0.1:7000", "127.0.0.1:7001", "/data/raft".into())
//! };
//! let metrics = ClusterMetrics::default(); // `metrics.register(&mut registry)`
//! let node = ClusterNode::start(cfg, Arc::new(Grpc), metrics)?;
//! // The internal gRPC `Raft` service hands every incoming message to `step`:
//! # let (bytes, from_addr) = (Vec::<u8>::new(), "127.0.0.1:7101");
//! node.step(&bytes, from_addr)?;
//! // A joining node (`--join ADDR`) starts with `bootstrap: None` and asks a member to run
//! // this on the leader (a follower answers `NotLeader` with the leader's address):
//! let applied = node.add_node(2, "127.0.0.1:7100".into(), "127.0.0.1:7101".into()).await?;
//! println!("epoch {} at index {}", applied.epoch, applied.index);
//! // Health is SERVING once the node has applied the committed map:
//! let mut ready = node.watch_ready();
//! ready.wait_for(|r| *r).await.ok();
//! // Routers follow the map:
//! let map = node.watch_map().borrow().clone();
//! println!("{} nodes at epoch {}", map.nodes.len(), map.epoch);
//! node.shutdown();
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - Every node applies the same map commands in the same order ([`map`] is pure), so nodes
//!   at the same applied index hold equal maps; the epoch grows by one with every change.
//! - A change answered with [`Applied`] is committed by a quorum and applied on the leader;
//!   it survives the loss of any minority of voters. An error means it was not applied,
//!   except [`ClusterError::Unavailable`] after a loss of leadership, which says the outcome
//!   is unknown (read the map, retry: changes are idempotent by node id).
//! - One membership change at a time; a new node joins as a learner and is promoted to voter
//!   once caught up, up to `max_voters`; removals drain first and never take the last voter or
//!   the quorum of reachable caught-up voters.
//! - The Raft state lives in sled in `dir` with a CRC-32 on every value: a restarted node
//!   comes back with its id and map, and a damaged byte is reported as
//!   [`ClusterError::Corrupt`], never a panic.
//! - Every tablet and partition is placed on `min(replicas, usable nodes)` distinct nodes,
//!   balanced per kind; a new replica fills (takes writes) before it serves, and the replica
//!   it replaces serves until then ([`placement`]).
//! - The leader marks a node it has not heard from for `failure_timeout` down (routers skip
//!   it) and active again once heard; a node back fills before it serves.
//!   [`ClusterNode::in_contact`] says whether this node may answer data requests.
//! - [`ClusterNode::grant_ids`] hands out blocks of document sequence numbers through the
//!   log: no number is granted twice, across leaders and restarts.
//! - Raft runs on its own thread; nothing here blocks on the data path. [`Transport::send`]
//!   must not block either.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

pub mod error;
pub mod logger;
pub mod map;
pub mod metrics;
pub mod node;
pub mod placement;
pub mod replica;
pub mod storage;

pub use error::ClusterError;
pub use map::Unit;
pub use metrics::ClusterMetrics;
pub use node::{Applied, ClusterNode, ClusterStatus};

/// A node's Raft id (not 0).
pub type NodeId = u64;

/// A Raft tick this late, a round of readies, a Raft flush or a Raft call this slow gets a
/// warning: a quarter of the default election timeout's lower bound. Stalls this long make
/// followers call elections.
pub const STALL_WARN: std::time::Duration = std::time::Duration::from_millis(250);

/// Sends encoded raft-rs messages (`eraftpb::Message` bytes) to a peer.
///
/// Implementations must not block: queue and return. Delivery is best effort: a lost,
/// duplicated or reordered message is fine, Raft retries. `to_addr` is the peer's internal
/// address as the map (or the peer's own messages) taught this node.
pub trait Transport: Send + Sync + 'static {
    /// Queues `message` for node `to` at `to_addr`.
    fn send(&self, to: NodeId, to_addr: &str, message: Vec<u8>);
}

/// How a [`ClusterNode`] runs.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node's Raft id (not 0).
    pub node_id: NodeId,
    /// Address of its public gRPC service.
    pub public_addr: String,
    /// Address of its internal services (Raft messages arrive there).
    pub internal_addr: String,
    /// Directory of the sled database holding the Raft log, hard state and snapshots.
    pub dir: PathBuf,
    /// `Some` starts a new cluster with this design and this node as its sole voter (ignored
    /// when `dir` already holds a Raft state).
    pub bootstrap: Option<map::DesignInfo>,
    /// One Raft tick.
    pub tick: Duration,
    /// Ticks without a leader before an election (randomised up to twice this).
    pub election_ticks: usize,
    /// Ticks between the leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// The largest number of voters; further nodes stay learners.
    pub max_voters: usize,
    /// Compact the log after this many applied entries.
    pub snapshot_every: u64,
    /// How a bootstrapped cluster lays out its data (replicas, split bits, partitions);
    /// used with `bootstrap` only.
    pub layout: map::Layout,
    /// The leader marks a node it has not heard from for this long down, and active again
    /// once it hears from it.
    pub failure_timeout: Duration,
    /// The leader marks a down node it has not heard from for this long lost: its units are
    /// rebuilt on the other nodes. Zero: never.
    pub rebuild_after: Duration,
}

impl ClusterConfig {
    /// A configuration with the defaults: tick 100 ms, election 10 ticks, heartbeat 2 ticks,
    /// 5 voters at most, a snapshot every 1000 entries, no bootstrap, the default
    /// [`map::Layout`] (2 replicas, 2 split bits, 16 partitions), failure timeout 2 s, rebuild after 5 minutes.
    pub fn new(
        node_id: NodeId,
        public_addr: impl Into<String>,
        internal_addr: impl Into<String>,
        dir: PathBuf,
    ) -> ClusterConfig {
        ClusterConfig {
            node_id,
            public_addr: public_addr.into(),
            internal_addr: internal_addr.into(),
            dir,
            bootstrap: None,
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            max_voters: 5,
            snapshot_every: 1000,
            layout: map::Layout::default(),
            failure_timeout: Duration::from_secs(2),
            rebuild_after: Duration::from_secs(300),
        }
    }
}
