//! # neardup-server
//!
//! A shard node of neardup: it owns tablets (in this release, every permuted table of the
//! design on one node) and their storage.
//!
//! - [`shard`]: the index and document table made durable — write-ahead log with group
//!   commit, runs stored as Huffman-XOR blocks, background merges and checkpoints, recovery.
//! - [`storage`]: the storage contract ([`storage::Store`]) and its sled implementation;
//!   [`fault_store`]: a store that fails on command, for durability tests.
//! - [`record`], [`persist`], [`doc_table`], [`commit`]: the log record format, the stored
//!   layout, the document table and group commit.
//! - [`service`]: the internal gRPC service (`neardup.internal.v1.Shard`) over a [`Shard`],
//!   and the one conversion between the shard's types and the wire types.
//! - [`node_store`]: a cluster node's data ([`NodeStore`]): its tablets' fingerprint
//!   entries, one shard without names per table, and its partitions' documents, all in one
//!   database.
//! - [`node`]: a node's internal gRPC server (shard, Raft, health; the admin API in a
//!   cluster).
//! - [`cluster_rpc`]: a cluster node's network side: the gRPC [`neardup_cluster::Transport`],
//!   the Raft and admin services, and the one mapping of cluster errors to gRPC codes.
//! - [`metrics`]: the shard's Prometheus series.
//!
//! ```no_run
//! # fn main() -> Result<(), neardup_server::Error> {
//! use neardup_server::{Shard, ShardConfig, ShardMetrics};
//! let shard = Shard::open("./neardup-data".as_ref(), ShardConfig::default(),
//!     ShardMetrics::default())?;
//! shard.recover()?; // blocks until the stored data is loaded
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod access;
pub mod cluster_rpc;
pub mod commit;
pub mod data_api;
pub mod data_types;
pub mod doc_table;
pub mod error;
pub mod expect;
pub mod fault_store;
pub mod local_node;
pub mod metrics;
pub mod node;
pub mod node_store;
pub mod persist;
pub mod record;
pub mod reload;
pub mod service;
pub mod shard;
pub mod slots;
pub mod storage;
pub mod tls;
pub mod transport;
pub mod wal;

pub use data_api::{DataError, DataResult, DataService, NodeApi, ScanPage};
pub use data_types::{DocInfo, DocOp, NodeStats, ProbeAnswer, Resolve, TabletHit, TabletOp};
pub use error::{Error, ErrorClass, Result};
pub use metrics::ShardMetrics;
pub use node_store::{NodeStore, NodeStoreConfig, NodeStoreStats};
pub use service::{RaftService, ShardService};
pub use shard::{
    Admission, BackupCopy, BackupTail, DocMatch, MAX_RESTORED_ID, NewDocument, ProbeHits, Shard,
    ShardConfig, ShardStats, Status, WriteOutcome,
};

/// The version a node reports (`Stats.version`): the build's, unless the process set
/// another once at start ([`set_reported_version`]).
pub fn version() -> &'static str {
    REPORTED_VERSION.get().map_or(env!("CARGO_PKG_VERSION"), String::as_str)
}

/// Makes [`version`] report `v` for the rest of the process (once; later calls are
/// ignored). Upgrade tests use it to tell a restarted node from the one before.
pub fn set_reported_version(v: String) {
    let _ = REPORTED_VERSION.set(v);
}

static REPORTED_VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Turns transparent huge pages off for the rest of this process (Linux's
/// `PR_SET_THP_DISABLE`; elsewhere it does nothing).
///
/// The allocator asks for huge pages on its large regions, and the kernel clears a whole
/// 2 MiB page at the first touch of any of it. A node whose buffers come and go (pages of a
/// copy, runs built and merged away) then spends its time clearing memory: during a
/// rebuild, clearing pages took about a sixth of the machine's CPU, and with huge pages off
/// the rebuild ran faster and queries meanwhile waited less (`docs/cluster.md`). Queries
/// showed no loss without them (`docs/service.md`).
pub fn no_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes a flag of this
        // process; no memory is passed to the kernel.
        if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
