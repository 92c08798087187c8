//! A cluster node's own data, as routers call it: [`LocalNode`] answers the [`NodeApi`] over
//! the node's [`NodeStore`], under the node's own copy of the cluster map.
//!
//! # What a node accepts
//! Every operation names units implicitly: a tablet op by its table and the permuted
//! fingerprint, a document op by its name's partition, a resolve by the gid's partition.
//! The node checks each against its own map:
//! - writes (tablet and document writes, lookups made for writes) need the node among the
//!   unit's writers (serving or filling, not marked down);
//! - reads (probes, resolves, scans) need it among the unit's serving replicas, and the node
//!   in contact with the Raft leader ([`ClusterNode::in_contact`](neardup_cluster::ClusterNode)):
//!   a node cut off may hold stale replicas, since the others stop writing to it once it is
//!   marked down, and back in contact it counts as in contact only once its map has caught up
//!   with what the cluster committed meanwhile.
//!
//! A refusal is [`DataError::EpochMoved`] with the node's epoch. When the caller's map is
//! ahead of the node's, the node first waits (briefly) for its own map to catch up.
//!
//! # Writes under an older map
//! A write must reach every writer of its units. A router whose map predates a change of a
//! unit's writers (a replica added, marked down or back) would miss the new one, so a node
//! refuses a write sent under an epoch older than the last change of the unit's writers
//! (which the map records: every node refuses alike, whichever maps it skipped); the router
//! refreshes its map and retries. A write is checked against the node's map as it is once
//! the write holds the node's write gate. Scans, which a filling replica copies from, need
//! the node's map at the copier's epoch at least, then wait for the writes in flight here to
//! finish: a copy taken at epoch E holds every write this node accepted under an older map,
//! and every later write under such a map is refused.
//!
//! # After a restart
//! A node that restarts may have missed writes while it was away, and its map may be older
//! than the cluster's. It serves no reads until [`LocalNode::allow_reads`] (called once its
//! replicas are known to be marked for catching up: see `neardup serve`), so a router never
//! reads a replica the cluster stopped writing to.
//!
//! # Filling
//! A replica in a unit's `filling` list takes writes but serves no reads. The node records
//! which gids it put and removed in each filling unit from the moment its map lists it
//! there. [`LocalNode::reconcile`] then brings the unit level with a serving replica's copy:
//! what the source holds is put, unless removed here since; what this node holds and the
//! source does not is removed (deleted while this node was down), unless put here since.
//! Gids are never reused, so those two sets decide every case.
//!
//! # Dropping
//! A copy the map takes away from this node (a replica moved elsewhere, or rebuilt elsewhere
//! after this node was marked lost) is removed a page at a time by
//! [`LocalNode::drop_page`], once [`LocalNode::fence_reads`] has waited for the reads
//! checked under older maps, which may still read it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use neardup_cluster::NodeId;
use neardup_cluster::map::{ClusterMap, Unit};
use neardup_core::{Design, Doc};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::data_api::{
    DataError, DataResult, NodeApi, PARTITION_PAGE, ScanPage, TABLET_PAGE, page_limit,
};
use crate::data_types::{
    DocInfo, DocOp, NodeStats, ProbeAnswer, Resolve, TabletOp, gid_partition, hits_to_resolve,
};
use crate::node_store::{Durable, NodeStore};

/// Probes answered on the caller's thread (a unary query's); more go to the blocking pool.
const INLINE_PROBES: usize = 64;

/// The longest a node waits for its map to reach the caller's epoch.
const EPOCH_WAIT: Duration = Duration::from_millis(500);

/// What a filling replica did to a unit since it started filling.
#[derive(Debug, Default)]
struct FillLog {
    /// The epoch of the map the first write was taken under. A log from before the node was
    /// last marked down ([`NodeInfo::down_epoch`]) is from an earlier filling, void.
    ///
    /// [`NodeInfo::down_epoch`]: neardup_cluster::map::NodeInfo::down_epoch
    since: u64,
    put: HashSet<u64>,
    removed: HashSet<u64>,
}

impl FillLog {
    /// An empty log of a filling whose first write was taken under epoch `since`.
    fn new(since: u64) -> FillLog {
        FillLog { since, ..FillLog::default() }
    }

    /// Whether it records the current filling of a node last marked down at epoch `down`.
    fn current(&self, down: u64) -> bool {
        self.since >= down
    }
}

/// Whether `gid` may have been put to the filling replica of `unit` since its filling began
/// (node last marked down at epoch `down`): the fill log records it, or the log is from an
/// earlier filling and says nothing.
fn put_since(fills: &HashMap<Unit, FillLog>, unit: Unit, down: u64, gid: u64) -> bool {
    fills.get(&unit).is_some_and(|log| !log.current(down) || log.put.contains(&gid))
}

/// A node's data behind the [`NodeApi`]: see the module docs.
pub struct LocalNode {
    id: NodeId,
    store: Arc<NodeStore>,
    design: Design,
    map: watch::Receiver<Arc<ClusterMap>>,
    in_contact: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Shared with the store's write path: a reconcile's puts are judged new under the
    /// table's write lock ([`NodeStore::append_tablets_deciding`]).
    fills: Arc<Mutex<HashMap<Unit, FillLog>>>,
    /// Writes hold it shared from their check to their store write; a scan takes it
    /// exclusively once, to wait for the writes accepted under older maps.
    gate: tokio::sync::RwLock<()>,
    /// The reads in flight, from before their map check to their last store read: dropping
    /// the copies the map took away waits for those begun under older maps, without holding
    /// up the reads that begin meanwhile.
    reading: ReadsInFlight,
    reads: AtomicBool,
}

impl std::fmt::Debug for LocalNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNode").field("id", &self.id).finish()
    }
}

impl LocalNode {
    /// The node `id`'s data in `store`, checked against `map`; `in_contact` says whether the
    /// node is in touch with the Raft leader.
    pub fn new(
        id: NodeId,
        store: Arc<NodeStore>,
        map: watch::Receiver<Arc<ClusterMap>>,
        in_contact: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> LocalNode {
        let design = store.design().clone();
        LocalNode {
            id,
            store,
            design,
            map,
            in_contact,
            fills: Arc::new(Mutex::new(HashMap::new())),
            gate: tokio::sync::RwLock::new(()),
            reading: ReadsInFlight::default(),
            reads: AtomicBool::new(false),
        }
    }

    /// Lets the node serve reads (see the module docs: after a restart).
    pub fn allow_reads(&self) {
        self.reads.store(true, Ordering::Release);
    }

    /// The store.
    pub fn store(&self) -> &Arc<NodeStore> {
        &self.store
    }

    /// The node's map, once it has reached `epoch` (or after a short wait, as it is).
    async fn map_at(&self, epoch: u64, deadline: Option<Instant>) -> Arc<ClusterMap> {
        let mut rx = self.map.clone();
        if rx.borrow().epoch < epoch {
            let mut wait = EPOCH_WAIT;
            if let Some(d) = deadline {
                wait = wait.min(d.saturating_duration_since(Instant::now()));
            }
            let _ = tokio::time::timeout(wait, rx.wait_for(|m| m.epoch >= epoch)).await;
        }
        rx.borrow().clone()
    }

    /// The map a write is checked against, and the gate held until it is durable. The map
    /// is read once the gate is held: a scan that passed the gate before this write had its
    /// map at the copier's epoch already, so this write is checked against that map or a
    /// newer one and refused if its sender missed the copier among the writers.
    async fn map_for_write(
        &self,
        epoch: u64,
        deadline: Option<Instant>,
    ) -> (Arc<ClusterMap>, tokio::sync::RwLockReadGuard<'_, ()>) {
        self.map_at(epoch, deadline).await;
        let gate = self.gate.read().await;
        (self.map.borrow().clone(), gate)
    }

    /// The map for a scan a filling replica copies from: at least at the copier's epoch,
    /// else refused. A source behind the copier could still take writes sent under maps that
    /// do not list the copier, after its copy was taken.
    async fn map_for_scan(
        &self,
        epoch: u64,
        deadline: Option<Instant>,
    ) -> DataResult<Arc<ClusterMap>> {
        let map = self.map_at(epoch, deadline).await;
        if map.epoch < epoch {
            return Err(DataError::Unavailable(format!(
                "node {}'s map is at epoch {}, behind the copier's {epoch}",
                self.id, map.epoch
            )));
        }
        Ok(map)
    }

    fn tablet_unit(&self, map: &ClusterMap, table: u32, fp: u64) -> DataResult<Unit> {
        if table as usize >= self.design.tables().len() {
            return Err(DataError::InvalidArgument(format!(
                "no table {table} in design {}",
                self.design
            )));
        }
        map.tablet_unit(&self.design, table, fp)
            .ok_or_else(|| moved(map, format!("no tablet of table {table} holds {fp:#x}")))
    }

    fn partition_unit(map: &ClusterMap, p: u32) -> DataResult<Unit> {
        map.partition(p).map(|_| Unit::Partition(p)).ok_or_else(|| {
            DataError::InvalidArgument(format!("no document partition {p} in the map"))
        })
    }

    fn name_unit(map: &ClusterMap, name: &str) -> DataResult<Unit> {
        let p = map.partition_of(name).ok_or_else(|| moved(map, "no partitions yet".into()))?;
        Self::partition_unit(map, p)
    }

    /// Checks that this node writes `unit` and that the caller's map (at `epoch`) knows the
    /// unit's writers; true when this node is filling it (record the write).
    fn check_writer(&self, map: &ClusterMap, unit: Unit, epoch: u64) -> DataResult<bool> {
        if map.serving(unit).is_empty() {
            return Err(DataError::Unavailable(format!(
                "no serving replica of {unit:?} is up: its writes wait until one is back"
            )));
        }
        if !map.writers(unit).contains(&self.id) {
            return Err(moved(map, format!("node {} does not take writes for {unit:?}", self.id)));
        }
        let since = map.writers_since(unit);
        if epoch < since {
            return Err(moved(
                map,
                format!(
                    "the writers of {unit:?} changed at epoch {since}, after the caller's {epoch}"
                ),
            ));
        }
        Ok(!map.serving(unit).contains(&self.id))
    }

    /// [`check_writer`](Self::check_writer), once per unit of one request (`checked` holds
    /// the answers so far): a write of many entries checks each tablet once, not each entry.
    fn check_writer_once(
        &self,
        checked: &mut HashMap<Unit, bool>,
        map: &ClusterMap,
        unit: Unit,
        epoch: u64,
    ) -> DataResult<bool> {
        if let Some(&filling) = checked.get(&unit) {
            return Ok(filling);
        }
        let filling = self.check_writer(map, unit, epoch)?;
        checked.insert(unit, filling);
        Ok(filling)
    }

    fn check_reader(&self, map: &ClusterMap, unit: Unit) -> DataResult<()> {
        if !map.serving(unit).contains(&self.id) {
            return Err(moved(map, format!("node {} does not serve {unit:?}", self.id)));
        }
        Ok(())
    }

    fn check_contact(&self) -> DataResult<()> {
        if !self.reads.load(Ordering::Acquire) {
            return Err(DataError::Unavailable(format!(
                "node {} restarted and serves no reads until its replicas are marked for catching up",
                self.id
            )));
        }
        if (self.in_contact)() {
            Ok(())
        } else {
            Err(DataError::Unavailable(format!(
                "node {} is out of contact with the cluster's leader; its replicas may be stale",
                self.id
            )))
        }
    }

    fn record(&self, map: &ClusterMap, unit: Unit, put: Option<u64>, removed: Option<u64>) {
        let down = self.down_epoch(map);
        let mut fills = self.fills.lock();
        let log = fills.entry(unit).or_insert_with(|| FillLog::new(map.epoch));
        if !log.current(down) {
            // Left over from a filling before the node was marked down (it came back before
            // the log was pruned): what it recorded says nothing of the writes missed since.
            *log = FillLog::new(map.epoch);
        }
        log.put.extend(put);
        log.removed.extend(removed);
    }

    /// When `map` last marked this node down (0: never).
    fn down_epoch(&self, map: &ClusterMap) -> u64 {
        map.nodes.get(&self.id).map_or(0, |n| n.down_epoch)
    }

    /// The log of `unit`'s current filling, if any write was recorded in it.
    fn fill_log<'a>(&self, fills: &'a HashMap<Unit, FillLog>, unit: Unit) -> Option<&'a FillLog> {
        let down = self.down_epoch(&self.map.borrow());
        fills.get(&unit).filter(|log| log.current(down))
    }

    /// A write to the store: applied and logged on the blocking pool (index lookups, log
    /// writes the kernel may throttle: never on the runtime's workers, which carry Raft's
    /// calls too), then awaited until durable.
    async fn write(
        &self,
        append: impl FnOnce(&NodeStore) -> crate::error::Result<Durable> + Send + 'static,
    ) -> DataResult<()> {
        let store = self.store.clone();
        blocking(move || append(&store)).await?.wait().await.map_err(DataError::from)
    }

    /// This node's map, unless it holds no filling replica of `unit` or is marked down: a
    /// replica that serves is never reconciled, since it records none of the writes it
    /// takes: a copy would remove those that arrived after the source's scan.
    fn filling(&self, unit: Unit) -> DataResult<Arc<ClusterMap>> {
        let now = self.map.borrow().clone();
        if !now.is_filling_on(unit, self.id) || !now.is_up(self.id) {
            return Err(moved(
                &now,
                format!("node {} holds no filling replica of {unit:?} to reconcile", self.id),
            ));
        }
        Ok(now)
    }

    /// Brings this node's replica of `unit` level with `source`, a serving replica's whole
    /// copy, in one step: [`reconcile_tablet`](Self::reconcile_tablet) over the whole
    /// tablet, or a [`PartitionFill`] of one page. The caller then reports the replica ready.
    pub async fn reconcile(&self, unit: Unit, source: Source) -> DataResult<()> {
        match (unit, source) {
            (Unit::Tablet { table, start }, Source::Entries(theirs)) => {
                let map = self.filling(unit)?;
                let end = map
                    .tablet(table, start)
                    .map(|t| t.end)
                    .ok_or_else(|| moved(&map, format!("no tablet {table}/{start:#x}")))?;
                self.reconcile_tablet(unit, start, end, theirs).await
            }
            (Unit::Partition(_), Source::Docs(theirs)) => {
                let mut fill = self.partition_fill(unit).await?;
                self.reconcile_docs(&mut fill, theirs).await?;
                self.finish_partition_fill(fill).await
            }
            (unit, _) => Err(DataError::Internal(format!("a copy of another kind for {unit:?}"))),
        }
    }

    /// Brings the part `[from, to]` (permuted values) of this node's filling replica of the
    /// tablet `unit` level with `theirs`, a page of a serving replica's copy that covers
    /// exactly that part (as the module docs say). A tablet is filled page by page, in any
    /// order: each page's plan concerns its own part alone.
    pub async fn reconcile_tablet(
        &self,
        unit: Unit,
        from: u64,
        to: u64,
        theirs: Vec<(u64, u64)>,
    ) -> DataResult<()> {
        let Unit::Tablet { table, .. } = unit else {
            return Err(DataError::Internal(format!("{unit:?} is no tablet")));
        };
        let store = self.store.clone();
        let ours = blocking(move || store.scan_tablet(table, from, to)).await?;
        self.reconcile_tablet_with(unit, ours, theirs).await
    }

    /// [`reconcile_tablet`](Self::reconcile_tablet) with `ours`, this replica's entries of
    /// the part as scanned before (writes may have been stored since).
    async fn reconcile_tablet_with(
        &self,
        unit: Unit,
        ours: Vec<(u64, u64)>,
        theirs: Vec<(u64, u64)>,
    ) -> DataResult<()> {
        let Unit::Tablet { table, .. } = unit else {
            return Err(DataError::Internal(format!("{unit:?} is no tablet")));
        };
        let map = self.filling(unit)?;
        let held: HashSet<u64> = ours.iter().map(|e| e.0).collect();
        let gid = |e: &(u64, u64)| e.0;
        let (puts, removes) = self.plan(unit, ours, theirs, gid);
        let ops = |items: Vec<(u64, u64)>, put: bool| -> Vec<(u32, TabletOp)> {
            let op = |(gid, fp)| {
                if put { TabletOp::Put { gid, fp } } else { TabletOp::Remove { gid, fp } }
            };
            items.into_iter().map(|e| (table, op(e))).collect()
        };
        let removes = ops(removes, false);
        self.write(move |s| s.append_tablets(removes, &[])).await?;
        // A put of a gid neither held here when the page was scanned nor put here since is
        // stored without the lookup that makes puts idempotent. "Put here since" is asked
        // under the table's write lock: a router's put is recorded before it is stored, so
        // one stored before this put is known by then, and one stored after it looks this
        // one up (puts to a filling replica always do).
        let (fills, down) = (self.fills.clone(), self.down_epoch(&map));
        // Many puts go in bulk, as one run, when the fill log can tell which of them writes
        // may have stored since filling began: those are looked up under the write lock,
        // the others are not (see `NodeStore::add_tablet_entries`).
        let current = fills.lock().get(&unit).is_none_or(|log| log.current(down));
        if current && puts.len() >= self.store.bulk_entries() {
            let entries: Vec<(u64, u64)> =
                puts.iter().filter(|e| !held.contains(&e.0)).copied().collect();
            let may_hold = move |docs: &[Doc]| {
                let fills = fills.lock();
                let since = |d: &Doc| put_since(&fills, unit, down, d.id);
                docs.iter().enumerate().filter(|(_, d)| since(d)).map(|(i, _)| i).collect()
            };
            self.write(move |s| Ok(s.add_tablet_entries(table, &entries, may_hold)?.0)).await?;
        } else {
            let decide =
                move |gid: u64| !held.contains(&gid) && !put_since(&fills.lock(), unit, down, gid);
            let put_ops = ops(puts.clone(), true);
            self.write(move |s| s.append_tablets_deciding(put_ops, &[], decide)).await?;
        }
        let again = ops(self.raced(unit, puts, gid), false);
        self.write(move |s| s.append_tablets(again, &[])).await
    }

    /// Starts filling this node's filling replica of the partition `unit` from a serving
    /// replica's copy, given a page at a time to [`reconcile_docs`](Self::reconcile_docs)
    /// and finished by [`finish_partition_fill`](Self::finish_partition_fill). It holds the
    /// gids this replica had when it started (none on a new replica), 8 bytes each.
    pub async fn partition_fill(&self, unit: Unit) -> DataResult<PartitionFill> {
        let Unit::Partition(p) = unit else {
            return Err(DataError::Internal(format!("{unit:?} is no partition")));
        };
        self.filling(unit)?;
        let store = self.store.clone();
        let ours = blocking(move || store.partition_gids(p)).await?;
        Ok(PartitionFill { unit, ours: ours.into_iter().collect() })
    }

    /// Puts a page of the source's documents: those not removed here since filling began
    /// and not held here already.
    pub async fn reconcile_docs(
        &self,
        fill: &mut PartitionFill,
        theirs: Vec<DocInfo>,
    ) -> DataResult<()> {
        let unit = fill.unit;
        self.filling(unit)?;
        let puts: Vec<DocInfo> = {
            let fills = self.fills.lock();
            let empty = FillLog::default();
            let log = self.fill_log(&fills, unit).unwrap_or(&empty);
            // Held here and at the source: kept (and no longer a candidate for removal).
            theirs
                .into_iter()
                .filter(|d| !fill.ours.remove(&d.gid) && !log.removed.contains(&d.gid))
                .collect()
        };
        let put_ops: Vec<_> = puts.iter().cloned().map(DocOp::Put).collect();
        self.write(move |s| s.append_docs(&put_ops)).await?;
        let again: Vec<_> =
            self.raced(unit, puts, |d: &DocInfo| d.gid).into_iter().map(DocOp::remove_of).collect();
        self.write(move |s| s.append_docs(&again)).await
    }

    /// Ends a partition's fill once every page of the source's copy is reconciled: removes
    /// what this replica held when it started and the source lacks (deleted while this node
    /// was away), unless put here since.
    pub async fn finish_partition_fill(&self, fill: PartitionFill) -> DataResult<()> {
        self.filling(fill.unit)?;
        let gone: Vec<u64> = {
            let fills = self.fills.lock();
            let log = self.fill_log(&fills, fill.unit);
            fill.ours.into_iter().filter(|g| !log.is_some_and(|l| l.put.contains(g))).collect()
        };
        if gone.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        // Their names and ids are what removing them takes.
        let docs = blocking(move || store.resolve(&gone, false)).await?;
        let removes: Vec<_> = docs.into_iter().flatten().map(DocOp::remove_of).collect();
        self.write(move |s| s.append_docs(&removes)).await
    }

    /// What reconciling `unit` puts (the source's items not removed here since filling
    /// began) and removes (this node's items the source lacks and not put here since).
    fn plan<T>(
        &self,
        unit: Unit,
        ours: Vec<T>,
        theirs: Vec<T>,
        gid: impl Fn(&T) -> u64,
    ) -> (Vec<T>, Vec<T>) {
        let fills = self.fills.lock();
        let empty = FillLog::default();
        let log = self.fill_log(&fills, unit).unwrap_or(&empty);
        let have: HashSet<u64> = theirs.iter().map(&gid).collect();
        let removes =
            ours.into_iter().filter(|x| !have.contains(&gid(x)) && !log.put.contains(&gid(x)));
        let puts = theirs.into_iter().filter(|x| !log.removed.contains(&gid(x))).collect();
        (puts, removes.collect())
    }

    /// The items put by a reconcile whose removal was recorded meanwhile: a removal that
    /// arrived while the copy was being put may have been undone by it, so it is applied
    /// again.
    fn raced<T>(&self, unit: Unit, puts: Vec<T>, gid: impl Fn(&T) -> u64) -> Vec<T> {
        let fills = self.fills.lock();
        let Some(log) = self.fill_log(&fills, unit) else { return Vec::new() };
        puts.into_iter().filter(|x| log.removed.contains(&gid(x))).collect()
    }

    /// Whether this node's store holds anything of `unit`: an entry in the tablet's range,
    /// a document of the partition.
    pub async fn holds_data(&self, unit: Unit) -> DataResult<bool> {
        let store = self.store.clone();
        match unit {
            Unit::Tablet { table, start } => {
                let Some(end) = self.map.borrow().tablet(table, start).map(|t| t.end) else {
                    return Ok(false);
                };
                let page = blocking(move || store.scan_tablet_page(table, start, end, 1)).await?;
                Ok(!page.items.is_empty())
            }
            Unit::Partition(p) => Ok(store.partition_documents(p) > 0),
        }
    }

    /// Counts a read in flight from now until the guard drops, under this node's map epoch
    /// (see [`fence_reads`](Self::fence_reads)); taken before the read checks its map.
    fn read_begins(&self) -> ReadInFlight<'_> {
        self.reading.begin(self.map.borrow().epoch)
    }

    /// Where to split the tablet `unit` (see [`NodeStore::split_point`]) once this node's
    /// copy holds more than `threshold` entries, at a multiple of `2^(64 - prefix_bits)`.
    /// `None` when it should not split, or is not in this node's map.
    pub async fn split_point(
        &self,
        unit: Unit,
        prefix_bits: u32,
        threshold: u64,
    ) -> DataResult<Option<u64>> {
        let Unit::Tablet { table, start } = unit else {
            return Err(DataError::Internal(format!("{unit:?} is no tablet")));
        };
        let Some(end) = self.map.borrow().tablet(table, start).map(|t| t.end) else {
            return Ok(None);
        };
        let store = self.store.clone();
        blocking(move || store.split_point(table, start, end, prefix_bits, threshold)).await
    }

    /// Waits for the reads checked under maps older than this node's current one: after it,
    /// no read touches a copy that map took away (later reads are refused by the map), so
    /// [`drop_page`](Self::drop_page) may remove it. Reads that begin meanwhile go on: a
    /// fence waits as long as the slowest older read (a scan page for a copy), and holds up
    /// nothing.
    pub async fn fence_reads(&self) {
        let epoch = self.map.borrow().epoch;
        self.reading.wait_before(epoch).await;
    }

    /// Removes a page of this node's copy of `unit`, which its map no longer gives it (a
    /// replica moved away, or taken from a node marked lost), from `cursor` (0 to start),
    /// durably, once [`fence_reads`](Self::fence_reads) was called under a map that had
    /// taken it away: the entries or documents removed (their bytes, about), and the cursor
    /// of the next page (`None`: done). A tablet goes in one page, a range removal
    /// ([`NodeStore::remove_tablet_range`]: one log record, a deletion mark an entry); a
    /// partition's documents a page at a time. A unit given back to this node meanwhile is left as
    /// it is (`None` at once): its fill brings it level. Writes sent under older maps are
    /// refused once the node's map dropped it from the unit's writers; one accepted just
    /// before may leave an entry behind, never read.
    pub async fn drop_page(&self, unit: Unit, cursor: u64) -> DataResult<(u64, Option<u64>)> {
        let map = self.map.borrow().clone();
        if map.holds(unit, self.id) {
            return Ok((0, None));
        }
        let store = self.store.clone();
        match unit {
            Unit::Tablet { table, start } => {
                let Some(end) = map.tablet(table, start).map(|t| t.end) else {
                    return Ok((0, None));
                };
                // The whole range at once: one log record, a mark an entry.
                let from = cursor.max(start);
                let (durable, removed) =
                    blocking(move || store.remove_tablet_range(table, from, end)).await?;
                durable.wait().await?;
                Ok((crate::data_types::entries_bytes(removed as usize), None))
            }
            Unit::Partition(p) => {
                let page =
                    blocking(move || store.scan_partition_page(p, cursor, PARTITION_PAGE)).await?;
                let bytes = page.items.iter().map(DocInfo::approx_bytes).sum();
                let ops: Vec<DocOp> = page.items.into_iter().map(DocOp::remove_of).collect();
                self.write(move |s| s.append_docs(&ops)).await?;
                if page.next.is_none() {
                    // The partition's slots are free: their memory goes back once at most
                    // three quarters of the table are live.
                    let store = self.store.clone();
                    blocking(move || store.compact_docs()).await?;
                }
                Ok((bytes, page.next))
            }
        }
    }

    /// Forgets what was recorded for units this node now serves or no longer holds.
    pub fn prune_fill_logs(&self) {
        let map = self.map.borrow().clone();
        let up = map.is_up(self.id);
        self.fills.lock().retain(|unit, _| up && map.is_filling_on(*unit, self.id));
    }
}

/// The reads in flight on a node, counted by the epoch of the node's map when each began
/// (a read then checks a map at least that new).
#[derive(Debug, Default)]
struct ReadsInFlight {
    by_epoch: Mutex<BTreeMap<u64, usize>>,
    ended: tokio::sync::Notify,
}

/// A read in flight, counted until dropped.
struct ReadInFlight<'a> {
    reads: &'a ReadsInFlight,
    epoch: u64,
}

impl ReadsInFlight {
    /// Counts a read beginning while the node's map is at `epoch`.
    fn begin(&self, epoch: u64) -> ReadInFlight<'_> {
        *self.by_epoch.lock().entry(epoch).or_default() += 1;
        ReadInFlight { reads: self, epoch }
    }

    /// Waits until no read begun under a map older than `epoch` is in flight. Reads that
    /// begin meanwhile go on (they check a map at `epoch` or newer).
    async fn wait_before(&self, epoch: u64) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.by_epoch.lock().range(..epoch).next().is_none() {
                return;
            }
            ended.await;
        }
    }
}

impl Drop for ReadInFlight<'_> {
    fn drop(&mut self) {
        let mut by_epoch = self.reads.by_epoch.lock();
        if let Some(n) = by_epoch.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                by_epoch.remove(&self.epoch);
            }
        }
        drop(by_epoch);
        self.reads.ended.notify_waiters();
    }
}

/// A partition being filled page by page: see [`LocalNode::partition_fill`].
#[derive(Debug)]
pub struct PartitionFill {
    unit: Unit,
    /// The gids this replica held when the fill started that no page has brought yet.
    ours: HashSet<u64>,
}

/// A serving replica's copy of a unit, for [`LocalNode::reconcile`].
#[derive(Debug)]
pub enum Source {
    /// A tablet's entries `(gid, fp)`.
    Entries(Vec<(u64, u64)>),
    /// A partition's documents.
    Docs(Vec<DocInfo>),
}

fn moved(map: &ClusterMap, why: String) -> DataError {
    DataError::EpochMoved { epoch: map.epoch, why }
}

/// Runs CPU or storage work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::error::Result<T> + Send + 'static,
) -> DataResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DataError::Internal(format!("a storage task failed: {e}")))?
        .map_err(DataError::from)
}

fn check_deadline(deadline: Option<Instant>) -> DataResult<()> {
    match deadline {
        Some(d) if Instant::now() >= d => {
            Err(DataError::DeadlineExceeded("before the node started on it".into()))
        }
        _ => Ok(()),
    }
}

#[tonic::async_trait]
impl NodeApi for LocalNode {
    async fn tablet_write(
        &self,
        epoch: u64,
        ops: Vec<(u32, TabletOp)>,
        new_gids: bool,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        check_deadline(deadline)?;
        let (map, _gate) = self.map_for_write(epoch, deadline).await;
        let mut checked = HashMap::new();
        // New gids are sent once, to every writer under one epoch, so their puts are new
        // here: unless the unit is filling (its copy may have put the gid already), or the
        // sender's map is older than ours (it may have sent them while the unit was filling
        // here, and the copy taken then may hold them).
        let current = new_gids && map.epoch == epoch;
        let mut new = Vec::with_capacity(ops.len());
        for &(table, op) in &ops {
            let (TabletOp::Put { fp, .. } | TabletOp::Remove { fp, .. }) = op;
            let unit = self.tablet_unit(&map, table, fp)?;
            let filling = self.check_writer_once(&mut checked, &map, unit, epoch)?;
            if filling {
                match op {
                    TabletOp::Put { gid, .. } => self.record(&map, unit, Some(gid), None),
                    TabletOp::Remove { gid, .. } => self.record(&map, unit, None, Some(gid)),
                }
            }
            new.push(current && !filling);
        }
        self.write(move |s| s.append_tablets(ops, &new)).await
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
        check_deadline(deadline)?;
        let _reading = self.read_begins();
        let map = self.map_at(epoch, deadline).await;
        self.check_contact()?;
        // Of every probe (thousands in a QueryBatch call): a fast hash.
        let mut units = hashbrown::HashSet::new();
        for &(table, fp) in &probes {
            units.insert(self.tablet_unit(&map, table, fp)?);
        }
        for unit in units {
            self.check_reader(&map, unit)?;
        }
        let (store, id) = (self.store.clone(), self.id);
        // Stored sketches are file reads, which wait for the disk when not cached: never on
        // this thread.
        let inline = probes.len() <= INLINE_PROBES && !resolve.sketches();
        // `None` without `wait` when a lock is not free at once.
        let probe = move |wait: bool| -> crate::error::Result<Option<ProbeAnswer>> {
            let Some(results) = store.probe_tablets_if(&probes, k, max_matches, wait)? else {
                return Ok(None);
            };
            if resolve == Resolve::No {
                return Ok(Some(ProbeAnswer { results, ..Default::default() }));
            }
            // Only under a map at least as new as the sender's: a map this node has not
            // caught up from may still list it on a partition that moved away since, whose
            // copy here no longer takes writes.
            let current = map.epoch >= epoch;
            let (gids, resolved) = hits_to_resolve(&results, |p| {
                current && map.serving(Unit::Partition(p)).contains(&id)
            });
            let Some(docs) = store.resolve_if(&gids, wait, resolve.sketches())? else {
                return Ok(None);
            };
            let docs = docs.into_iter().flatten().collect();
            Ok(Some(ProbeAnswer { results, docs, resolved }))
        };
        let missing = || DataError::Internal("a probe that waits got no answer".into());
        // A few probes cost microseconds: answered here, not behind a hand-over to the
        // blocking pool, whose wake-up alone may take milliseconds on a busy machine; but
        // only when the locks are free, as this thread must not wait for a writer (a
        // merge installed, a page of a copy), and a caller racing a slow answer against
        // another replica ([`NodeApi`] reads may be hedged) must get to run meanwhile.
        if inline && let Some(answer) = probe(false)? {
            return Ok(answer);
        }
        blocking(move || probe(true)).await?.ok_or_else(missing)
    }

    async fn doc_write(
        &self,
        epoch: u64,
        ops: Vec<DocOp>,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        check_deadline(deadline)?;
        let (map, _gate) = self.map_for_write(epoch, deadline).await;
        let mut checked = HashMap::new();
        for op in &ops {
            let (unit, put, removed) = match op {
                DocOp::Put(d) => {
                    let unit = Self::name_unit(&map, &d.name)?;
                    if gid_partition(d.gid) != unit_partition(unit) {
                        return Err(DataError::InvalidArgument(format!(
                            "gid {} is not of the partition of {:?}",
                            d.gid, d.name
                        )));
                    }
                    (unit, Some(d.gid), None)
                }
                DocOp::Remove { gid, .. } => {
                    (Self::partition_unit(&map, gid_partition(*gid))?, None, Some(*gid))
                }
            };
            if self.check_writer_once(&mut checked, &map, unit, epoch)? {
                self.record(&map, unit, put, removed);
            }
        }
        self.write(move |s| s.append_docs(&ops)).await
    }

    async fn doc_lookup(
        &self,
        epoch: u64,
        names: Vec<String>,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        check_deadline(deadline)?;
        let _reading = self.read_begins();
        let map = self.map_at(epoch, deadline).await;
        let mut checked = HashMap::new();
        for name in &names {
            let unit = Self::name_unit(&map, name)?;
            self.check_writer_once(&mut checked, &map, unit, epoch)?;
        }
        let store = self.store.clone();
        blocking(move || {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            store.lookup_names(&refs)
        })
        .await
    }

    async fn doc_resolve(
        &self,
        epoch: u64,
        gids: Vec<u64>,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Option<DocInfo>>> {
        check_deadline(deadline)?;
        let _reading = self.read_begins();
        let map = self.map_at(epoch, deadline).await;
        self.check_contact()?;
        let units: HashSet<u32> = gids.iter().map(|&g| gid_partition(g)).collect();
        for p in units {
            self.check_reader(&map, Self::partition_unit(&map, p)?)?;
        }
        let store = self.store.clone();
        blocking(move || store.resolve(&gids, sketches)).await
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
        check_deadline(deadline)?;
        let _reading = self.read_begins();
        let map = self.map_for_scan(epoch, deadline).await?;
        self.check_contact()?;
        let tablet = map
            .tablet(table, start)
            .filter(|t| t.end == end)
            .ok_or_else(|| moved(&map, format!("no tablet {table} [{start:#x}, {end:#x}]")))?;
        self.check_reader(&map, Unit::Tablet { table, start: tablet.start })?;
        drop(self.gate.write().await);
        let (store, from, limit) =
            (self.store.clone(), from.max(start), page_limit(limit, TABLET_PAGE));
        blocking(move || store.scan_tablet_page(table, from, end, limit)).await
    }

    async fn partition_scan(
        &self,
        epoch: u64,
        partition: u32,
        cursor: u64,
        limit: u32,
        deadline: Option<Instant>,
    ) -> DataResult<ScanPage<DocInfo>> {
        check_deadline(deadline)?;
        let _reading = self.read_begins();
        let map = self.map_for_scan(epoch, deadline).await?;
        self.check_contact()?;
        let unit = Self::partition_unit(&map, partition)?;
        self.check_reader(&map, unit)?;
        // A cursor names a slot of this node's document table, which a restart renumbers.
        // A node that restarts is marked down first, which changes its units' writers, so a
        // pass begun under a map from before that is refused from its second page on, and
        // the copier begins it again.
        if cursor != 0 && map.writers_since(unit) > epoch {
            return Err(moved(
                &map,
                format!(
                    "the writers of partition {partition} changed at epoch {}, after the \
                     copy's first page (epoch {epoch}): begin it again",
                    map.writers_since(unit)
                ),
            ));
        }
        drop(self.gate.write().await);
        let (store, limit) = (self.store.clone(), page_limit(limit, PARTITION_PAGE));
        blocking(move || store.scan_partition_page(partition, cursor, limit)).await
    }

    async fn stats(&self, _epoch: u64, _deadline: Option<Instant>) -> DataResult<NodeStats> {
        let s = self.store.stats();
        let map = self.map.borrow().clone();
        let partitions = map
            .partitions
            .iter()
            .filter(|p| map.holds(Unit::Partition(p.index), self.id))
            .map(|p| (p.index, self.store.partition_documents(p.index)))
            .collect();
        let stats = neardup_proto::v1::StatsResponse {
            documents: s.documents,
            design: self.design.to_string(),
            max_k: self.design.max_k(),
            index_bytes: s.memory_bytes - s.document_table_bytes,
            document_bytes: s.document_table_bytes,
            disk_bytes: s.disk_bytes,
            buffered: s.buffered,
            runs: s.runs,
            deleted_pending: s.deleted_pending,
            merges: s.merges,
            wal_bytes: s.wal_bytes,
            checkpoint_pending: s.checkpoint_pending,
            merging: s.merging,
            version: crate::version().to_string(),
            ..Default::default()
        };
        Ok(NodeStats { stats, partitions })
    }
}

fn unit_partition(unit: Unit) -> u32 {
    match unit {
        Unit::Partition(p) => p,
        Unit::Tablet { .. } => u32::MAX,
    }
}

#[cfg(test)]
mod tests {
    use neardup_cluster::map::{DesignInfo, NodeInfo, NodeState, Partition, Tablet, TabletState};

    use super::*;
    use crate::ShardMetrics;
    use crate::data_types::make_gid;
    use crate::node_store::NodeStoreConfig;

    const DESIGN: &str = "4c1";

    /// Nodes 1 and 2; every unit served by 2, and by 1 too unless `filling` (then 1 fills).
    fn map(filling: bool, epoch: u64) -> ClusterMap {
        let design = Design::parse(DESIGN).unwrap();
        let node = |id| NodeInfo::active_voter(id, format!("p{id}"), format!("i{id}"));
        let (nodes, fill) = if filling { (vec![2], vec![1]) } else { (vec![1, 2], vec![]) };
        ClusterMap {
            cluster_id: "t".into(),
            epoch,
            design: Some(DesignInfo { name: DESIGN.into(), tables: 4, max_k: 3 }),
            nodes: [(1, node(1)), (2, node(2))].into_iter().collect(),
            tablets: (0..design.tables().len() as u32)
                .map(|table| Tablet {
                    table,
                    start: 0,
                    end: u64::MAX,
                    nodes: nodes.clone(),
                    state: TabletState::Active,
                    filling: fill.clone(),
                    writers_epoch: 1,
                })
                .collect(),
            partitions: (0..2)
                .map(|index| Partition {
                    index,
                    nodes: nodes.clone(),
                    filling: fill.clone(),
                    writers_epoch: 1,
                })
                .collect(),
            replicas: 2,
            ..Default::default()
        }
    }

    /// `m` with every unit's writers changed at `epoch` (as the map's own commands stamp
    /// them).
    fn stamped(mut m: ClusterMap, epoch: u64) -> ClusterMap {
        m.tablets.iter_mut().for_each(|t| t.writers_epoch = epoch);
        m.partitions.iter_mut().for_each(|p| p.writers_epoch = epoch);
        m
    }

    /// [`map`] at `epoch` with node `id` marked down then, every unit's writers stamped.
    fn down_map(filling: bool, epoch: u64, id: NodeId) -> ClusterMap {
        let mut m = map(filling, epoch);
        let node = m.nodes.get_mut(&id).unwrap();
        (node.state, node.down_epoch) = (NodeState::Down, epoch);
        stamped(m, epoch)
    }

    fn config() -> NodeStoreConfig {
        let mut c =
            NodeStoreConfig { cache_bytes: 8 << 20, min_free_bytes: 0, ..Default::default() };
        // Pages of 2 puts or more go in bulk ([`NodeStore::bulk_entries`]), 1 one by one.
        c.shard.index.buffer_docs = 2;
        c
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        node: LocalNode,
        map: watch::Sender<Arc<ClusterMap>>,
        contact: Arc<AtomicBool>,
    }

    fn fixture(filling: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let design = Design::parse(DESIGN).unwrap();
        let store =
            NodeStore::open(dir.path(), &design, config(), ShardMetrics::default()).unwrap();
        let (tx, rx) = watch::channel(Arc::new(map(filling, 1)));
        let contact = Arc::new(AtomicBool::new(true));
        let c = contact.clone();
        let node = LocalNode::new(1, store, rx, Arc::new(move || c.load(Ordering::Acquire)));
        node.allow_reads();
        Fixture { _dir: dir, node, map: tx, contact }
    }

    fn doc(gid: u64, name: &str, fp: u64) -> DocInfo {
        DocInfo { gid, name: name.into(), fp, ts_ms: 7, cluster: gid, sketch: None }
    }

    fn all_tables(op: impl Fn(u32) -> (u32, TabletOp)) -> Vec<(u32, TabletOp)> {
        (0..4).map(op).collect()
    }

    /// A put of `(gid, fp)` in table 0.
    fn put_in_0(gid: u64, fp: u64) -> Vec<(u32, TabletOp)> {
        vec![(0, TabletOp::Put { gid, fp })]
    }

    /// Table 0's entries on the node, sorted.
    fn held(n: &LocalNode) -> Vec<(u64, u64)> {
        let mut h = n.store().scan_tablet(0, 0, u64::MAX).unwrap();
        h.sort_unstable();
        h
    }

    fn is_moved(e: &DataError) -> bool {
        matches!(e, DataError::EpochMoved { .. })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_need_a_serving_replica_in_contact_and_writes_a_replica() {
        let f = fixture(true);
        let n = &f.node;
        let fps = [0u64, 0b111, u64::MAX, 0xF0F0];
        for (i, &fp) in fps.iter().enumerate() {
            let gid = make_gid(i as u64 + 1, 0);
            n.tablet_write(1, all_tables(|t| (t, TabletOp::Put { gid, fp })), true, None)
                .await
                .unwrap();
        }
        // Filling: writes are taken, reads refused.
        let e = n.tablet_probe(1, vec![(0, 0)], 3, 100, Resolve::No, None).await.unwrap_err();
        assert!(is_moved(&e), "{e}");
        assert!(is_moved(&n.doc_resolve(1, vec![make_gid(1, 0)], true, None).await.unwrap_err()));
        assert!(is_moved(&n.tablet_scan(1, 0, 0, u64::MAX, 0, 0, None).await.unwrap_err()));
        // Serving: every table's probe equals a scan of what was written.
        f.map.send_replace(Arc::new(map(false, 2)));
        let probes: Vec<(u32, u64)> = (0..4).map(|t| (t, 0)).collect();
        let hits = n.tablet_probe(2, probes, 3, 100, Resolve::No, None).await.unwrap().results;
        let design = Design::parse(DESIGN).unwrap();
        for (t, (h, truncated)) in hits.iter().enumerate() {
            assert!(!truncated);
            let spec = &design.tables()[t];
            let shift = 64 - spec.prefix_bits;
            let mut want: Vec<u64> = fps
                .iter()
                .enumerate()
                .filter(|(_, fp)| {
                    fp.count_ones() <= 3 && spec.perm.apply(**fp) >> shift == 0 >> shift
                })
                .map(|(i, _)| make_gid(i as u64 + 1, 0))
                .collect();
            let mut got: Vec<u64> = h.iter().map(|h| h.gid).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "table {t}");
        }
        // Cut off from the leader: reads refused, as unavailable.
        f.contact.store(false, Ordering::Release);
        let e = n.tablet_probe(2, vec![(0, 0)], 3, 100, Resolve::No, None).await.unwrap_err();
        assert!(matches!(e, DataError::Unavailable(_)), "{e}");
        f.contact.store(true, Ordering::Release);
        // Marked down in its own map: neither reads nor writes.
        f.map.send_replace(Arc::new(down_map(false, 3, 1)));
        assert!(is_moved(
            &n.tablet_probe(3, vec![(0, 0)], 3, 100, Resolve::No, None).await.unwrap_err()
        ));
        let put = all_tables(|t| (t, TabletOp::Put { gid: make_gid(9, 0), fp: 1 }));
        assert!(is_moved(&n.tablet_write(3, put.clone(), true, None).await.unwrap_err()));
        // Node 2 down instead: the writers changed at epoch 4, so a write sent under an older
        // map (which would still send to node 2 and wait for it, or worse, miss a writer) is
        // refused, and one sent under the new map is taken.
        f.map.send_replace(Arc::new(down_map(false, 4, 2)));
        assert!(is_moved(&n.tablet_write(3, put.clone(), true, None).await.unwrap_err()));
        n.tablet_write(4, put, true, None).await.unwrap();
        // A caller ahead of the node: it waits for its map, then answers by it.
        let tx = f.map.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send_replace(Arc::new(stamped(map(false, 5), 5)));
        });
        n.tablet_probe(5, vec![(0, 0)], 3, 100, Resolve::No, None).await.unwrap();
    }

    /// A resolving probe returns the documents of its hits in partitions the node serves,
    /// with their sketches only when asked, says which partitions those were, and leaves
    /// the others to the router; under a map older than the sender's it resolves none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_resolves_the_hits_of_partitions_the_node_serves() {
        let f = fixture(false);
        let n = &f.node;
        let m = map(false, 1);
        let names: Vec<String> = (0..200).map(|i| format!("doc{i}")).collect();
        let in_p = |p| names.iter().find(|x| m.partition_of(x) == Some(p)).unwrap().clone();
        let sketch = [vec![neardup_core::sketch::SKETCH_VERSION, 64], vec![0x5A; 64]].concat();
        let da = DocInfo { sketch: Some(sketch), ..doc(make_gid(1, 0), &in_p(0), 0xA) };
        let db = doc(make_gid(2, 1), &in_p(1), 0xB);
        for d in [&da, &db] {
            let put = all_tables(|t| (t, TabletOp::Put { gid: d.gid, fp: d.fp }));
            n.tablet_write(1, put, true, None).await.unwrap();
        }
        n.doc_write(1, vec![DocOp::Put(da.clone()), DocOp::Put(db.clone())], None).await.unwrap();
        // b's document is deleted; its entries are not (yet).
        n.doc_write(1, vec![DocOp::Remove { gid: db.gid, name: db.name.clone() }], None)
            .await
            .unwrap();
        let probes = vec![(0, 0xA), (0, 0xB)];
        let got = n
            .tablet_probe(1, probes.clone(), 3, 100, Resolve::DocsWithSketches, None)
            .await
            .unwrap();
        let plain = n.tablet_probe(1, probes.clone(), 3, 100, Resolve::No, None).await.unwrap();
        assert_eq!(plain, ProbeAnswer { results: got.results.clone(), ..Default::default() });
        assert!(got.results.iter().all(|(hits, _)| hits.len() == 2));
        assert_eq!(got.docs, vec![da.clone()]);
        assert_eq!(got.resolved, vec![0, 1]);
        // Without sketches: the same documents, their sketches left out.
        let bare = DocInfo { sketch: None, ..da.clone() };
        let names_only = n.tablet_probe(1, probes.clone(), 3, 100, Resolve::Docs, None);
        let names_only = names_only.await.unwrap();
        assert_eq!((&names_only.results, &names_only.docs), (&got.results, &vec![bare.clone()]));
        assert_eq!(names_only.resolved, got.resolved);
        let gids = vec![da.gid, db.gid];
        assert_eq!(
            n.doc_resolve(1, gids.clone(), true, None).await.unwrap(),
            [Some(da.clone()), None]
        );
        assert_eq!(n.doc_resolve(1, gids, false, None).await.unwrap(), [Some(bare), None]);
        // Partition 1 filling here: its hits are left to the router.
        let mut filling = map(false, 2);
        filling.partitions[1].nodes = vec![2];
        filling.partitions[1].filling = vec![1];
        f.map.send_replace(Arc::new(filling));
        let got = n
            .tablet_probe(2, probes.clone(), 3, 100, Resolve::DocsWithSketches, None)
            .await
            .unwrap();
        assert_eq!((got.docs, got.resolved), (vec![da], vec![0]));
        // A sender whose map is newer than this node's (after a short wait): the probes are
        // answered, but no partition is resolved, since one may have moved away since.
        let soon = Some(Instant::now() + Duration::from_millis(50));
        let got = n.tablet_probe(3, probes, 3, 100, Resolve::DocsWithSketches, soon).await.unwrap();
        assert_eq!(got.results, plain.results);
        assert!(got.docs.is_empty() && got.resolved.is_empty(), "{got:?}");
    }

    /// A copier's scan needs this node's map at the copier's epoch; and writes are refused
    /// by the map's record of when the writers changed, even when this node never saw the
    /// map in between.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_source_behind_the_copier_refuses_the_copy_and_old_writes() {
        let f = fixture(false);
        let n = &f.node;
        let soon = || Some(Instant::now() + Duration::from_millis(50));
        let e = n.tablet_scan(3, 0, 0, u64::MAX, 0, 0, soon()).await.unwrap_err();
        assert!(matches!(e, DataError::Unavailable(_)), "{e}");
        let e = n.partition_scan(3, 0, 0, 0, soon()).await.unwrap_err();
        assert!(matches!(e, DataError::Unavailable(_)), "{e}");
        // A write under epoch 1; then epoch 2 (node 2 marked down: writers {1}) never reaches
        // this node, and epoch 3 (node 2 back) has the writers of epoch 1 again, changed at 3.
        let first = all_tables(|t| (t, TabletOp::Put { gid: make_gid(2, 0), fp: 2 }));
        n.tablet_write(1, first, true, None).await.unwrap();
        f.map.send_replace(Arc::new(stamped(map(false, 3), 3)));
        assert_eq!(n.tablet_scan(3, 0, 0, u64::MAX, 0, 0, soon()).await.unwrap().items.len(), 1);
        let put = all_tables(|t| (t, TabletOp::Put { gid: make_gid(1, 0), fp: 1 }));
        assert!(is_moved(&n.tablet_write(2, put.clone(), true, None).await.unwrap_err()));
        let d = doc(make_gid(1, 0), "a", 1);
        let p = map(false, 3).partition_of("a").unwrap();
        let d = DocInfo { gid: make_gid(1, p), ..d };
        assert!(is_moved(&n.doc_write(2, vec![DocOp::Put(d.clone())], None).await.unwrap_err()));
        n.tablet_write(3, put, true, None).await.unwrap();
        n.doc_write(3, vec![DocOp::Put(d)], None).await.unwrap();
        assert_eq!(n.store().scan_tablet(0, 0, u64::MAX).unwrap().len(), 2);
        // A pass over a partition begun under epoch 2 goes on only while the partition's
        // writers have not changed since (they changed at 3: this node may have restarted,
        // renumbering the slots a cursor names); a pass begun under epoch 3 goes on.
        let e = n.partition_scan(2, p, 1, 0, soon()).await.unwrap_err();
        assert!(is_moved(&e), "{e}");
        assert_eq!(n.partition_scan(2, p, 0, 0, soon()).await.unwrap().items.len(), 1);
        // (A cursor names slot 1 of the table as laid out now: generation 0, plus one.)
        n.partition_scan(3, p, (1 << 32) | 1, 0, soon()).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reconcile_keeps_what_was_written_while_filling() {
        let f = fixture(false);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        // Before it went down the node held a and b.
        for (gid, fp) in [(g(1), 0xA), (g(2), 0xB)] {
            n.tablet_write(1, vec![(0, TabletOp::Put { gid, fp })], true, None).await.unwrap();
        }
        let name = |i: u64| format!("doc{i}");
        let in_p0: Vec<u64> =
            (1..200).filter(|&i| map(false, 1).partition_of(&name(i)) == Some(0)).take(5).collect();
        let pdoc = |k: usize| doc(g(in_p0[k]), &name(in_p0[k]), k as u64);
        n.doc_write(1, vec![DocOp::Put(pdoc(0)), DocOp::Put(pdoc(1))], None).await.unwrap();
        // Back and filling: c is put and d removed meanwhile.
        f.map.send_replace(Arc::new(map(true, 2)));
        n.tablet_write(2, vec![(0, TabletOp::Put { gid: g(3), fp: 0xC })], true, None)
            .await
            .unwrap();
        n.tablet_write(2, vec![(0, TabletOp::Remove { gid: g(4), fp: 0xD })], false, None)
            .await
            .unwrap();
        n.doc_write(2, vec![DocOp::Put(pdoc(2))], None).await.unwrap();
        let d3 = pdoc(3);
        n.doc_write(2, vec![DocOp::Remove { gid: d3.gid, name: d3.name.clone() }], None)
            .await
            .unwrap();
        // The source: a was deleted and e added while this node was down; d was there.
        let theirs = vec![(g(2), 0xB), (g(4), 0xD), (g(5), 0xE)];
        n.reconcile(Unit::Tablet { table: 0, start: 0 }, Source::Entries(theirs)).await.unwrap();
        let mut held = n.store().scan_tablet(0, 0, u64::MAX).unwrap();
        held.sort_unstable();
        assert_eq!(held, vec![(g(2), 0xB), (g(3), 0xC), (g(5), 0xE)]);
        let source = vec![pdoc(1), pdoc(3), pdoc(4)];
        n.reconcile(Unit::Partition(0), Source::Docs(source)).await.unwrap();
        let mut docs: Vec<u64> =
            n.store().scan_partition(0).unwrap().into_iter().map(|d| d.gid).collect();
        docs.sort_unstable();
        let mut want = vec![pdoc(1).gid, pdoc(2).gid, pdoc(4).gid];
        want.sort_unstable();
        assert_eq!(docs, want);
    }

    /// A fill in pages, with writes between them: each tablet page is level with its own
    /// part of the source; a partition fill keeps what was written meanwhile and removes,
    /// at its end, what this replica held and the source lacks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fill_in_pages_keeps_the_writes_between_pages() {
        let f = fixture(false);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        let perm = Design::parse(DESIGN).unwrap().tables()[0].perm.clone();
        // Fingerprints whose permuted values in table 0 fall in the lower or upper half.
        let (low, high): (Vec<u64>, Vec<u64>) = (1..40u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .partition(|&fp| perm.apply(fp) >> 63 == 0);
        let mid = 1u64 << 63;
        // Before it went down the node held a (low) and b (high).
        n.tablet_write(1, put_in_0(g(1), low[0]), true, None).await.unwrap();
        n.tablet_write(1, put_in_0(g(2), high[0]), true, None).await.unwrap();
        let name = |i: u64| format!("doc{i}");
        let in_p0: Vec<u64> =
            (1..400).filter(|&i| map(false, 1).partition_of(&name(i)) == Some(0)).take(6).collect();
        let pdoc = |k: usize| doc(g(in_p0[k]), &name(in_p0[k]), k as u64);
        n.doc_write(1, vec![DocOp::Put(pdoc(0)), DocOp::Put(pdoc(1))], None).await.unwrap();
        f.map.send_replace(Arc::new(map(true, 2)));
        let unit = Unit::Tablet { table: 0, start: 0 };
        // The source lacks a and holds c (low) and d, e (high).
        n.reconcile_tablet(unit, 0, mid - 1, vec![(g(3), low[1])]).await.unwrap();
        assert_eq!(held(n), {
            let mut v = vec![(g(2), high[0]), (g(3), low[1])];
            v.sort_unstable();
            v
        });
        // Between pages: f is put in the upper half, d removed.
        n.tablet_write(2, put_in_0(g(6), high[3]), true, None).await.unwrap();
        n.tablet_write(2, vec![(0, TabletOp::Remove { gid: g(4), fp: high[1] })], false, None)
            .await
            .unwrap();
        // The source's page holds f too (its scan came after f): f is stored once.
        let upper = vec![(g(4), high[1]), (g(5), high[2]), (g(6), high[3])];
        n.reconcile_tablet(unit, mid, u64::MAX, upper.clone()).await.unwrap();
        let mut want = vec![(g(3), low[1]), (g(5), high[2]), (g(6), high[3])];
        want.sort_unstable();
        assert_eq!(held(n), want);
        // A put stored between the scan of this replica's part and the page's own puts:
        // known from the fill log, so the page's put of it is looked up, not stored twice.
        let before = n.store().scan_tablet(0, mid, u64::MAX).unwrap();
        n.tablet_write(2, put_in_0(g(7), high[4]), true, None).await.unwrap();
        let mut upper = upper;
        upper.push((g(7), high[4]));
        n.reconcile_tablet_with(unit, before, upper).await.unwrap();
        want.push((g(7), high[4]));
        want.sort_unstable();
        assert_eq!(held(n), want);
        // The partition: the node held docs 0 and 1; the source holds 1, 2, 3, 4.
        let mut fill = n.partition_fill(Unit::Partition(0)).await.unwrap();
        n.reconcile_docs(&mut fill, vec![pdoc(1), pdoc(2)]).await.unwrap();
        // Between pages: 5 is put, 3 removed (before its page arrives), 2 removed (after).
        n.doc_write(2, vec![DocOp::Put(pdoc(5))], None).await.unwrap();
        for d in [pdoc(3), pdoc(2)] {
            n.doc_write(2, vec![DocOp::Remove { gid: d.gid, name: d.name }], None).await.unwrap();
        }
        n.reconcile_docs(&mut fill, vec![pdoc(3), pdoc(4)]).await.unwrap();
        n.finish_partition_fill(fill).await.unwrap();
        let mut docs: Vec<u64> =
            n.store().scan_partition(0).unwrap().into_iter().map(|d| d.gid).collect();
        docs.sort_unstable();
        let mut want = vec![pdoc(1).gid, pdoc(4).gid, pdoc(5).gid];
        want.sort_unstable();
        assert_eq!(docs, want);
        // A page for a replica that serves by now is refused.
        f.map.send_replace(Arc::new(map(false, 3)));
        assert!(is_moved(&n.reconcile_tablet(unit, 0, mid - 1, vec![]).await.unwrap_err()));
        assert!(is_moved(&n.partition_fill(Unit::Partition(0)).await.unwrap_err()));
    }

    /// A node filling a unit that is marked down and back before its record of that filling
    /// is pruned: the old record is void. A document put during the first filling and
    /// deleted while the node was down is removed by the next reconcile, not kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_filling_from_before_a_node_was_down_is_forgotten() {
        let f = fixture(true);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        let unit = Unit::Tablet { table: 0, start: 0 };
        n.tablet_write(1, put_in_0(g(1), 0xA), true, None).await.unwrap();
        // Down at epoch 2 (a is deleted on the serving replica meanwhile), back at 3.
        f.map.send_replace(Arc::new(down_map(true, 2, 1)));
        let mut back = map(true, 3);
        back.nodes.get_mut(&1).unwrap().down_epoch = 2;
        f.map.send_replace(Arc::new(stamped(back, 3)));
        n.reconcile(unit, Source::Entries(vec![(g(2), 0xB)])).await.unwrap();
        assert_eq!(held(n), vec![(g(2), 0xB)]);
        // What this filling takes is kept against a source that lacks it, as ever.
        n.tablet_write(3, put_in_0(g(3), 0xC), true, None).await.unwrap();
        n.reconcile(unit, Source::Entries(vec![(g(2), 0xB)])).await.unwrap();
        assert_eq!(held(n), vec![(g(2), 0xB), (g(3), 0xC)]);
    }

    /// A filling replica whose unit has no serving replica up takes no writes: the serving
    /// replica back would lack them, and serve at once as the last one standing. What the
    /// filling recorded before is kept for its reconcile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_filling_replica_alone_takes_no_writes() {
        let f = fixture(true);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        let unit = Unit::Tablet { table: 0, start: 0 };
        n.tablet_write(1, put_in_0(g(1), 0xA), true, None).await.unwrap();
        // Node 2, the only serving replica, is marked down at epoch 2.
        let down = down_map(true, 2, 2);
        let down_p0 = |x: &str| down.partition_of(x) == Some(0);
        f.map.send_replace(Arc::new(down.clone()));
        let e = n.tablet_write(2, put_in_0(g(2), 0xB), true, None).await.unwrap_err();
        assert!(matches!(e, DataError::Unavailable(_)), "{e:?}");
        let name = (0..).map(|i| format!("doc{i}")).find(|x| down_p0(x)).unwrap();
        let e = n.doc_write(2, vec![DocOp::Put(doc(g(2), &name, 0xB))], None).await.unwrap_err();
        assert!(matches!(e, DataError::Unavailable(_)), "{e:?}");
        assert_eq!(held(n), vec![(g(1), 0xA)]);
        assert!(n.store().scan_partition(0).unwrap().is_empty());
        n.prune_fill_logs();
        // Node 2 back (serving: it went down last). The reconcile keeps a, put while filling.
        f.map.send_replace(Arc::new(stamped(map(true, 3), 3)));
        n.reconcile(unit, Source::Entries(vec![])).await.unwrap();
        assert_eq!(held(n), vec![(g(1), 0xA)]);
    }

    /// A reconcile is refused once the replica serves (a filler that read a map from before
    /// its own "ready"): a serving replica records none of its writes, so the source's older
    /// copy would remove those that arrived after its scan.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_serving_replica_is_not_reconciled() {
        let f = fixture(false);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        let unit = Unit::Tablet { table: 0, start: 0 };
        n.tablet_write(1, put_in_0(g(1), 0xA), true, None).await.unwrap();
        n.tablet_write(1, put_in_0(g(2), 0xB), true, None).await.unwrap();
        // A copy scanned before b was written.
        let e = n.reconcile(unit, Source::Entries(vec![(g(1), 0xA)])).await.unwrap_err();
        assert!(matches!(e, DataError::EpochMoved { .. }), "{e:?}");
        assert_eq!(held(n), vec![(g(1), 0xA), (g(2), 0xB)]);
        // Nor while the node is marked down.
        f.map.send_replace(Arc::new(down_map(true, 2, 1)));
        assert!(n.reconcile(unit, Source::Entries(vec![])).await.is_err());
        assert_eq!(held(n), vec![(g(1), 0xA), (g(2), 0xB)]);
    }

    /// Puts of new gids skip the lookup only on a serving replica under the sender's own
    /// epoch; where a copy may have put the gid already, they are looked up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_gids_are_looked_up_wherever_a_copy_may_hold_them() {
        let f = fixture(true);
        let n = &f.node;
        let g = |i: u64| make_gid(i, 0);
        // Filling: the copy holds a; the router's put of a arrives after it.
        let unit = Unit::Tablet { table: 0, start: 0 };
        n.reconcile(unit, Source::Entries(vec![(g(1), 0xA)])).await.unwrap();
        n.tablet_write(1, put_in_0(g(1), 0xA), true, None).await.unwrap();
        assert_eq!(held(n), vec![(g(1), 0xA)]);
        // Serving now; a put sent under the filling map is looked up too.
        f.map.send_replace(Arc::new(map(false, 2)));
        n.tablet_write(1, put_in_0(g(1), 0xA), true, None).await.unwrap();
        assert_eq!(held(n), vec![(g(1), 0xA)]);
        // Under the current map a new gid is stored without a lookup: a sender that broke
        // its promise would leave a second entry (reads dedupe by gid), which shows the
        // lookup is skipped; without the promise the put is idempotent.
        n.tablet_write(2, put_in_0(g(2), 0xB), true, None).await.unwrap();
        n.tablet_write(2, put_in_0(g(2), 0xB), false, None).await.unwrap();
        assert_eq!(held(n), vec![(g(1), 0xA), (g(2), 0xB)]);
        n.tablet_write(2, put_in_0(g(2), 0xB), true, None).await.unwrap();
        assert_eq!(held(n), vec![(g(1), 0xA), (g(2), 0xB), (g(2), 0xB)]);
    }

    /// Drops every page of `unit` here, as the fill task does once the reads are fenced.
    async fn drop_all(n: &LocalNode, unit: Unit) -> u64 {
        let (mut bytes, mut cursor) = (0, Some(0));
        while let Some(at) = cursor {
            let (b, next) = n.drop_page(unit, at).await.unwrap();
            (bytes, cursor) = (bytes + b, next);
        }
        bytes
    }

    /// A copy the map took away is dropped once the reads checked before are done, and
    /// only it: the units still held, and a unit given back, keep what they hold.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_the_map_took_away_is_dropped_after_the_reads_in_flight() {
        let f = fixture(false);
        let n = &f.node;
        let name = |i: u64| format!("doc{i}");
        let docs: Vec<DocInfo> = (1..60u64)
            .map(|i| {
                let p = map(false, 1).partition_of(&name(i)).unwrap();
                doc(make_gid(i, p), &name(i), i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            })
            .collect();
        for d in &docs {
            let (gid, fp) = (d.gid, d.fp);
            n.tablet_write(1, all_tables(|t| (t, TabletOp::Put { gid, fp })), true, None)
                .await
                .unwrap();
        }
        n.doc_write(1, docs.iter().cloned().map(DocOp::Put).collect(), None).await.unwrap();
        let in_p1 = docs.iter().filter(|d| gid_partition(d.gid) == 1).count() as u64;
        assert!(in_p1 > 0 && in_p1 < docs.len() as u64);
        // Epoch 2: table 0's tablet and partition 0 moved to node 2 alone.
        let mut moved = map(false, 2);
        moved.tablets[0].nodes = vec![2];
        moved.partitions[0].nodes = vec![2];
        let moved = stamped(moved, 2);
        let (tablet, part) = (Unit::Tablet { table: 0, start: 0 }, Unit::Partition(0));
        // A read checked under epoch 1 is still in flight: the fence waits for it.
        let reading = n.reading.begin(1);
        f.map.send_replace(Arc::new(moved.clone()));
        let fence = n.fence_reads();
        tokio::pin!(fence);
        let early = tokio::time::timeout(Duration::from_millis(50), &mut fence).await;
        assert!(early.is_err(), "the fence passed a read in flight");
        // A read begun under the new map meanwhile neither waits nor holds the fence up.
        let later = n.reading.begin(2);
        drop(reading);
        fence.await;
        drop(later);
        // Reads under the new map are refused; the copies are dropped, nothing else.
        let e = n.tablet_probe(2, vec![(0, 0)], 3, 100, Resolve::No, None).await.unwrap_err();
        assert!(is_moved(&e), "{e}");
        assert!(n.holds_data(tablet).await.unwrap() && n.holds_data(part).await.unwrap());
        assert_eq!(drop_all(n, tablet).await, docs.len() as u64 * 16);
        assert!(drop_all(n, part).await > 0);
        assert!(!n.holds_data(tablet).await.unwrap() && !n.holds_data(part).await.unwrap());
        assert!(held(n).is_empty());
        for t in 1..4 {
            assert_eq!(n.store().scan_tablet(t, 0, u64::MAX).unwrap().len(), docs.len());
        }
        assert_eq!(n.store().partition_documents(0), 0);
        assert_eq!(n.store().partition_documents(1), in_p1);
        // A unit still held keeps its data.
        assert_eq!(n.drop_page(Unit::Tablet { table: 1, start: 0 }, 0).await.unwrap(), (0, None));
        assert_eq!(n.drop_page(Unit::Partition(1), 0).await.unwrap(), (0, None));
        assert_eq!(n.store().scan_tablet(1, 0, u64::MAX).unwrap().len(), docs.len());
        // Given back (filling) before its drop: left to its fill.
        let (gid, fp) = (docs[0].gid, docs[0].fp);
        let mut back = moved;
        back.epoch = 3;
        back.tablets[0].filling = vec![1];
        f.map.send_replace(Arc::new(stamped(back, 3)));
        n.tablet_write(3, put_in_0(gid, fp), false, None).await.unwrap();
        assert_eq!(n.drop_page(tablet, 0).await.unwrap(), (0, None));
        assert_eq!(held(n), vec![(gid, fp)]);
    }
}
