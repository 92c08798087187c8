//! Prometheus metrics of the Raft node.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the member gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// `voter` or `learner`.
    pub role: &'static str,
}

/// The cluster node's metrics; cloning shares the series.
#[derive(Clone, Default)]
pub struct ClusterMetrics {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) term: Gauge<u64, AtomicU64>,
    pub(crate) is_leader: Gauge,
    pub(crate) epoch: Gauge<u64, AtomicU64>,
    pub(crate) applied_index: Gauge<u64, AtomicU64>,
    pub(crate) committed_index: Gauge<u64, AtomicU64>,
    pub(crate) members: Family<RoleLabels, Gauge>,
    pub(crate) proposals: Counter,
    pub(crate) elections: Counter,
    pub(crate) snapshot_sends: Counter,
    pub(crate) unavailable_units: Gauge,
    pub(crate) down_nodes: Gauge,
}

impl ClusterMetrics {
    /// Registers the series under `neardup_cluster_` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("neardup_cluster");
        let i = &self.inner;
        r.register("term", "Current Raft term", i.term.clone());
        r.register("is_leader", "1 on the Raft leader, else 0", i.is_leader.clone());
        r.register("epoch", "Epoch of the applied cluster map", i.epoch.clone());
        r.register("applied_index", "Last Raft index applied to the map", i.applied_index.clone());
        r.register("committed_index", "Last Raft index known committed", i.committed_index.clone());
        r.register("members", "Members of the map by role", i.members.clone());
        r.register("proposals", "Map changes proposed by this node", i.proposals.clone());
        r.register("elections", "Elections this node started", i.elections.clone());
        r.register("snapshot_sends", "Raft snapshots sent to followers", i.snapshot_sends.clone());
        r.register(
            "unavailable_units",
            "Tablets and partitions without a serving replica that is up",
            i.unavailable_units.clone(),
        );
        r.register("down_nodes", "Members marked down", i.down_nodes.clone());
    }

    /// The values as (name, value) pairs, for tests and status pages.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let i = &self.inner;
        vec![
            ("term", i.term.get()),
            ("is_leader", i.is_leader.get() as u64),
            ("epoch", i.epoch.get()),
            ("applied_index", i.applied_index.get()),
            ("committed_index", i.committed_index.get()),
            ("members_voter", i.members.get_or_create(&RoleLabels { role: "voter" }).get() as u64),
            (
                "members_learner",
                i.members.get_or_create(&RoleLabels { role: "learner" }).get() as u64,
            ),
            ("proposals_total", i.proposals.get()),
            ("elections_total", i.elections.get()),
            ("snapshot_sends_total", i.snapshot_sends.get()),
            ("unavailable_units", i.unavailable_units.get() as u64),
            ("down_nodes", i.down_nodes.get() as u64),
        ]
    }
}
