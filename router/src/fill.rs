//! Filling: a node brings each replica it holds in a unit's `filling` list level with a
//! serving replica, then reports it ready through the map, after which routers read from it.
//!
//! A replica is filling when placement adds it to a unit (a new node, a move) and when its
//! node comes back after being marked down ([`neardup_cluster::map::Command::NodeBack`]).
//! It takes writes from the moment its node's map lists it as filling; the copy is then
//! reconciled with what it took ([`LocalNode::reconcile`]). Units are filled one at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_cluster::map::{ClusterMap, Unit};
use neardup_cluster::{ClusterNode, NodeId};
use neardup_server::local_node::{LocalNode, Source};
use neardup_server::{DataError, DataResult};
use tokio::sync::watch;

use crate::cluster::NodeResolver;

/// How long a copy of one unit may take.
pub(crate) const COPY_DEADLINE: Duration = Duration::from_secs(300);
/// How often the filler looks at the map when nothing changes.
const POLL: Duration = Duration::from_millis(500);

/// Fills this node's filling replicas until `stop` turns true.
pub async fn run(
    local: Arc<LocalNode>,
    cluster: ClusterNode,
    nodes: NodeResolver,
    mut stop: watch::Receiver<bool>,
) {
    let me = cluster.id();
    let mut map_rx = cluster.watch_map();
    loop {
        if *stop.borrow() {
            return;
        }
        local.prune_fill_logs();
        let map = map_rx.borrow_and_update().clone();
        // A node marked down takes no writes, so nothing it would copy could be kept level.
        let units = if map.is_up(me) { map.filling_on(me) } else { Vec::new() };
        for unit in units {
            if *stop.borrow() {
                return;
            }
            // The map as it is now: a unit reported ready, or taken away, since the list was
            // made is not filled again.
            let map = map_rx.borrow().clone();
            if !map.is_up(me) || !map.is_filling_on(unit, me) {
                continue;
            }
            let started = Instant::now();
            match fill_one(&local, &map, unit, me, &nodes).await {
                Ok(()) => match cluster.replica_ready(unit).await {
                    Ok(_) => tracing::info!(
                        ?unit,
                        ms = started.elapsed().as_millis() as u64,
                        "replica filled and ready"
                    ),
                    Err(e) => {
                        tracing::warn!(?unit, error = %e, "replica filled; not reported ready yet")
                    }
                },
                Err(e) => {
                    tracing::warn!(?unit, error = %e, "cannot fill the replica yet; retrying")
                }
            }
        }
        tokio::select! {
            _ = map_rx.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Copies `unit` from one of its serving replicas and reconciles this node's replica.
async fn fill_one(
    local: &LocalNode,
    map: &ClusterMap,
    unit: Unit,
    me: NodeId,
    nodes: &NodeResolver,
) -> DataResult<()> {
    let sources: Vec<NodeId> = map.serving(unit).into_iter().filter(|&n| n != me).collect();
    let Some(&from) = sources.first() else {
        return Err(DataError::Unavailable(format!("no serving replica of {unit:?} to copy")));
    };
    let deadline = Some(Instant::now() + COPY_DEADLINE);
    let api = nodes(from);
    let source = match unit {
        Unit::Tablet { table, start } => {
            let end = map
                .tablet(table, start)
                .map(|t| t.end)
                .ok_or_else(|| DataError::Internal(format!("no tablet {unit:?} in the map")))?;
            Source::Entries(api.tablet_scan(map.epoch, table, start, end, deadline).await?)
        }
        Unit::Partition(p) => Source::Docs(api.partition_scan(map.epoch, p, deadline).await?),
    };
    local.reconcile(unit, source).await
}
