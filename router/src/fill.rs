//! Filling: a node brings each replica it holds in a unit's `filling` list level with a
//! serving replica, then reports it ready through the map, after which routers read from it.
//!
//! A replica is filling when placement adds it to a unit (a new node, a move) and when its
//! node comes back after being marked down ([`neardup_cluster::map::Command::NodeBack`]).
//! It takes writes from the moment its node's map lists it as filling; the copy is then
//! reconciled with what it took, a page of the source's copy at a time
//! ([`LocalNode::reconcile_tablet`], [`LocalNode::reconcile_docs`]), the next page read
//! while one is stored. Units are filled two at a time: one worker takes tablets first, the
//! other partitions first (a node keeps them in different shards), so one fill's syncs and
//! source reads overlap the other's work.
//!
//! The same task drops the copies the map took away from this node, after each pass of
//! fills ([`LocalNode::drop_page`]): a unit given back is filled only once its drop is
//! over, so the fill brings back whatever a write sent meanwhile put and the drop removed.
//!
//! It also splits the tablets grown past `cluster.split_entries`: every [`SPLIT_EVERY`],
//! the first serving replica of each settled tablet counts its entries and, past the
//! threshold, asks the leader to cut the tablet at the prefix boundary nearest its middle
//! ([`LocalNode::split_point`], [`neardup_cluster::map::Command::SplitTablet`]). Both
//! halves stay on the same nodes, so nothing is copied; placement then balances the tablets
//! again.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_cluster::map::{ClusterMap, Unit};
use neardup_cluster::{ClusterNode, NodeId};
use neardup_server::data_types::entries_bytes;
use neardup_server::local_node::LocalNode;
#[cfg(doc)]
use neardup_server::local_node::PartitionFill;
use neardup_server::{DataError, DataResult, DocInfo};
use tokio::sync::watch;

use crate::cluster::NodeResolver;

/// How long a page of a copy may take (a backup's scan of a partition: all its pages).
pub(crate) const COPY_DEADLINE: Duration = Duration::from_secs(300);
/// How often the filler looks at the map when nothing changes.
const POLL: Duration = Duration::from_millis(500);
/// How often a node counts the entries of the tablets it is first to serve.
pub const SPLIT_EVERY: Duration = Duration::from_secs(5);

/// Keeps copies at most `rate` bytes a second (0: unlimited), counted from their start.
#[derive(Debug)]
struct Pace {
    rate: u64,
    started: Instant,
    bytes: u64,
}

impl Pace {
    fn new(rate: u64) -> Pace {
        Pace { rate, started: Instant::now(), bytes: 0 }
    }

    /// How long to wait, `elapsed` after the start, once `bytes` more are copied.
    fn wait_after(&mut self, bytes: u64, elapsed: Duration) -> Duration {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.rate == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.bytes as f64 / self.rate as f64).saturating_sub(elapsed)
    }
}

/// Waits as `pace` (shared by the fills that run at once) says once `bytes` more are
/// copied: see [`Pace::wait_after`].
async fn paced(pace: &Mutex<Pace>, bytes: u64) {
    let wait = {
        let mut p = pace.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = p.started.elapsed();
        p.wait_after(bytes, elapsed)
    };
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// Bytes a page of documents costs, about: name, sketch and the fixed fields.
fn docs_bytes(docs: &[DocInfo]) -> u64 {
    docs.iter().map(DocInfo::approx_bytes).sum()
}

/// How a node copies the replicas it fills.
#[derive(Debug, Clone, Copy)]
pub struct CopyConfig {
    /// Most bytes a second copied into the replicas this node fills, all together
    /// (`cluster.copy_rate_mb`; 0: unlimited).
    pub rate: u64,
    /// Entries per page of a tablet, and documents per page of a partition over 8
    /// (`cluster.copy_page_entries`; 0: the source's default, at most
    /// [`TABLET_PAGE`](neardup_server::data_api::TABLET_PAGE)).
    pub page: u32,
    /// A tablet splits once its replicas hold more than this many entries
    /// (`cluster.split_entries`; 0: never).
    pub split_entries: u64,
}

/// Fills this node's filling replicas, as `copy` says, until `stop` turns true.
pub async fn run(
    local: Arc<LocalNode>,
    cluster: ClusterNode,
    nodes: NodeResolver,
    copy: CopyConfig,
    mut stop: watch::Receiver<bool>,
) {
    let me = cluster.id();
    let mut map_rx = cluster.watch_map();
    // Units this node does not hold and has no data of.
    let mut clean = HashSet::new();
    let mut split_checked = Instant::now();
    loop {
        if *stop.borrow() {
            return;
        }
        local.prune_fill_logs();
        let map = map_rx.borrow_and_update().clone();
        // A node marked down takes no writes, so nothing it would copy could be kept level.
        let units = if map.is_up(me) { map.filling_on(me) } else { Vec::new() };
        let (tablets, partitions): (VecDeque<Unit>, VecDeque<Unit>) =
            units.into_iter().partition(|u| matches!(u, Unit::Tablet { .. }));
        let queues = Mutex::new([tablets, partitions]);
        let pace = Mutex::new(Pace::new(copy.rate));
        // Two workers take the next unit until none is left (or the filler stops): one
        // tablets first, the other partitions first, which a node keeps in different
        // shards. Each fill waits for syncs and for its source; the other goes on meanwhile.
        {
            let (stop, map_rx, local, nodes, cluster) = (&stop, &map_rx, &local, &nodes, &cluster);
            let (queues, pace) = (&queues, &pace);
            let worker = |first: usize| async move {
                loop {
                    if *stop.borrow() {
                        return;
                    }
                    let next = {
                        let mut q = queues.lock().unwrap_or_else(|e| e.into_inner());
                        q[first].pop_front().or_else(|| q[1 - first].pop_front())
                    };
                    let Some(unit) = next else { return };
                    // The map as it is now: a unit reported ready, or taken away, since the list
                    // was made is not filled again.
                    let map = map_rx.borrow().clone();
                    if !map.is_up(me) || !map.is_filling_on(unit, me) {
                        continue;
                    }
                    let started = Instant::now();
                    match fill_one(local, &map, unit, me, nodes, copy.page, pace).await {
                        Ok(()) => match cluster.replica_ready(unit).await {
                            Ok(_) => tracing::info!(
                                ?unit,
                                ms = started.elapsed().as_millis() as u64,
                                "replica filled and ready"
                            ),
                            Err(e) => tracing::warn!(?unit, error = %e,
                            "replica filled; not reported ready yet"),
                        },
                        Err(e) => {
                            tracing::warn!(?unit, error = %e, "cannot fill the replica yet; retrying")
                        }
                    }
                }
            };
            tokio::join!(worker(0), worker(1));
        }
        if *stop.borrow() {
            return;
        }
        let map = map_rx.borrow().clone();
        drop_released(&local, &map, me, copy, &mut clean).await;
        if split_checked.elapsed() >= SPLIT_EVERY {
            split_checked = Instant::now();
            let map = map_rx.borrow().clone();
            split_large(&local, &cluster, &map, me, copy.split_entries).await;
        }
        tokio::select! {
            _ = map_rx.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Drops this node's copies of the units `map` does not give it ([`LocalNode::drop_page`]),
/// a page at a time, paced as copies are: at the first pass, every such unit it has data of
/// (a restart may have cut a drop short); later, those taken away since (`clean` holds the
/// units known to have no data here). A failed drop is tried again at the next pass.
async fn drop_released(
    local: &LocalNode,
    map: &ClusterMap,
    me: NodeId,
    copy: CopyConfig,
    clean: &mut HashSet<Unit>,
) {
    let mut released = Vec::new();
    for unit in map.units() {
        if map.holds(unit, me) {
            clean.remove(&unit);
        } else if !clean.contains(&unit) {
            match local.holds_data(unit).await {
                Ok(true) => released.push(unit),
                Ok(false) => {
                    clean.insert(unit);
                }
                Err(e) => {
                    tracing::warn!(?unit, error = %e, "cannot tell whether a unit moved away is held here")
                }
            }
        }
    }
    if released.is_empty() {
        return;
    }
    let started = Instant::now();
    local.fence_reads().await;
    let pace = Mutex::new(Pace::new(copy.rate));
    for unit in released {
        let mut cursor = Some(0);
        while let Some(at) = cursor {
            match local.drop_page(unit, at).await {
                Ok((bytes, next)) => {
                    paced(&pace, bytes).await;
                    cursor = next;
                }
                Err(e) => {
                    tracing::warn!(?unit, error = %e, "cannot drop a copy the map took away yet; retrying");
                    break;
                }
            }
        }
        // Known clean once nothing is left (a unit given back meanwhile was left alone).
        if cursor.is_none()
            && let Ok(false) = local.holds_data(unit).await
        {
            clean.insert(unit);
        }
    }
    tracing::info!(
        bytes = pace.lock().unwrap_or_else(|e| e.into_inner()).bytes,
        ms = started.elapsed().as_millis() as u64,
        "copies the map took away dropped"
    );
}

/// Asks the leader to split each settled tablet whose first serving replica is this node
/// and which holds more than `threshold` entries (0: none), at the point
/// [`LocalNode::split_point`] gives. A split refused (the tablet changed meanwhile) is
/// looked at again at the next check.
async fn split_large(
    local: &LocalNode,
    cluster: &ClusterNode,
    map: &ClusterMap,
    me: NodeId,
    threshold: u64,
) {
    let Some(bits) = map.min_prefix_bits else { return };
    if threshold == 0 || !map.is_up(me) {
        return;
    }
    let first = |t: &&neardup_cluster::map::Tablet| {
        t.nodes.first() == Some(&me) && map.is_settled(t.unit())
    };
    for t in map.tablets.iter().filter(first) {
        let unit = t.unit();
        match local.split_point(unit, bits, threshold).await {
            Ok(Some(at)) => match cluster.split_tablet(t.table, t.start, at).await {
                Ok(_) => tracing::info!(?unit, at = format!("{at:#x}"), "tablet split"),
                Err(e) => tracing::warn!(?unit, error = %e, "cannot split the tablet yet"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(?unit, error = %e, "cannot count the tablet's entries"),
        }
    }
}

/// Copies `unit` from one of its serving replicas a page at a time (`page_entries`: see
/// [`CopyConfig::page`]), paced by `pace`, and reconciles this
/// node's replica with each page ([`LocalNode::reconcile_tablet`], [`PartitionFill`]), the
/// next page read while one is stored: a copy holds two pages in memory, whatever the
/// unit's size.
async fn fill_one(
    local: &LocalNode,
    map: &ClusterMap,
    unit: Unit,
    me: NodeId,
    nodes: &NodeResolver,
    page_entries: u32,
    pace: &Mutex<Pace>,
) -> DataResult<()> {
    let sources: Vec<NodeId> = map.serving(unit).into_iter().filter(|&n| n != me).collect();
    let Some(&from) = sources.first() else {
        return Err(DataError::Unavailable(format!("no serving replica of {unit:?} to copy")));
    };
    let api = nodes(from);
    let epoch = map.epoch;
    // Each page within its own deadline: a capped copy of a large unit takes longer than one.
    let deadline = || Some(Instant::now() + COPY_DEADLINE);
    match unit {
        Unit::Tablet { table, start } => {
            let end = map
                .tablet(table, start)
                .map(|t| t.end)
                .ok_or_else(|| DataError::Internal(format!("no tablet {unit:?} in the map")))?;
            let scan = |at| api.tablet_scan(epoch, table, start, end, at, page_entries, deadline());
            let mut at = start;
            let mut page = scan(at).await?;
            loop {
                let to = match page.next {
                    Some(next) if next > at && next <= end => next - 1,
                    Some(next) => {
                        return Err(DataError::Internal(format!(
                            "node {from} sent a page of {unit:?} from {at:#x} that ends at {next:#x}"
                        )));
                    }
                    None => end,
                };
                let (bytes, next) = (entries_bytes(page.items.len()), page.next);
                let stored = local.reconcile_tablet(unit, at, to, page.items);
                match store_while_reading(stored, next, &scan, pace, bytes).await? {
                    Some(read) => (at, page) = read,
                    None => return Ok(()),
                }
            }
        }
        Unit::Partition(p) => {
            let mut fill = local.partition_fill(unit).await?;
            let scan = |at| api.partition_scan(epoch, p, at, page_entries.div_ceil(8), deadline());
            let mut cursor = 0;
            let mut page = scan(cursor).await?;
            loop {
                let next = match page.next {
                    Some(next) if next > cursor => Some(next),
                    Some(next) => {
                        return Err(DataError::Internal(format!(
                            "node {from} sent a page of {unit:?} from {cursor} that ends at {next}"
                        )));
                    }
                    None => None,
                };
                let bytes = docs_bytes(&page.items);
                let stored = local.reconcile_docs(&mut fill, page.items);
                match store_while_reading(stored, next, &scan, pace, bytes).await? {
                    Some(read) => (cursor, page) = read,
                    None => return local.finish_partition_fill(fill).await,
                }
            }
        }
    }
}

/// Stores a page (`store`) while the source reads the next one, from `next` if there is
/// one (`scan`), then waits as `pace` says for the page's `bytes`. Returns where the next
/// page starts and the page.
async fn store_while_reading<P, F>(
    store: impl Future<Output = DataResult<()>>,
    next: Option<u64>,
    scan: impl Fn(u64) -> F,
    pace: &Mutex<Pace>,
    bytes: u64,
) -> DataResult<Option<(u64, P)>>
where
    F: Future<Output = DataResult<P>>,
{
    let read = async {
        match next {
            Some(n) => Some(scan(n).await.map(|page| (n, page))),
            None => None,
        }
    };
    let (stored, read) = tokio::join!(store, read);
    stored?;
    paced(pace, bytes).await;
    read.transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_waits_until_the_bytes_fit_the_rate() {
        let ms = Duration::from_millis;
        let mut unlimited = Pace::new(0);
        assert_eq!(unlimited.wait_after(1 << 40, ms(1)), Duration::ZERO);
        // 1 MB a second: 500 kB after 100 ms waits until 500 ms; 500 kB more after 1.2 s
        // is late already.
        let mut pace = Pace::new(1_000_000);
        assert_eq!(pace.wait_after(500_000, ms(100)), ms(400));
        assert_eq!(pace.wait_after(500_000, ms(1200)), Duration::ZERO);
        assert_eq!(pace.wait_after(1_000_000, ms(1200)), ms(800));
        let doc = DocInfo {
            gid: 1,
            name: "ab".into(),
            fp: 0,
            ts_ms: 0,
            cluster: 1,
            sketch: Some(vec![0; 6]),
        };
        assert_eq!(docs_bytes(&[doc]), 40);
        assert_eq!(entries_bytes(3), 48);
    }
}
