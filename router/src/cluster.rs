//! The router of a cluster: [`ClusterRouter`] implements [`ShardApi`] over the nodes that
//! hold tablets (fingerprint entries) and document partitions, so the public service
//! ([`crate::service::Router`]) runs over a cluster unchanged.
//!
//! It reads the cluster map from a `watch` channel, reaches nodes through a
//! [`NodeResolver`] (in-process for the node itself, [`GrpcNodes`] for the others) and takes
//! document ids (gids) from an [`IdSource`] (blocks granted through the map).
//!
//! # Reads
//! For each query and each table the query's k needs (`Design::tables_for_k`), the tablet
//! holding the query's permuted value; one serving replica per tablet (the local node
//! first, then spread); **one `TabletProbe` call per node**. Hits are merged by gid,
//! resolved with **one `DocResolve` call per node** (by the gid's partition), entries whose
//! document is absent are dropped, and the rest are ordered like the single node (distance,
//! timestamp, then gid, the cluster's "first stored"), cut to `limit` and the response's
//! budgets (`max_matches`, `max_bytes`). Verification by sketches is the single node's.
//! Reads of a few queries that arrive while others are out are sent together (`Coalesce`).
//! A probe or resolve call that has not answered within the recent calls' 90th percentile
//! is sent again to the other serving replicas of its units, and the first answer is taken
//! ([`crate::hedge`]): a node pausing (a merge installed, a copy's page written) does not
//! hold up the reads that go to it.
//! A node whose call fails (unanswered or UNAVAILABLE) is avoided by reads for
//! [`SUSPECT_FOR`] when another replica serves, and a read that failed so is tried once
//! more: a node that dies costs reads one attempt, not every read until the map marks it
//! down.
//!
//! # Writes
//! `DocLookup` on every writer of the partitions (old gids: replicas may differ after a write
//! that failed halfway) -> new gids -> `TabletWrite` of the new entries to every writer
//! of each tablet (one call per node) -> `DocWrite` (removal of the replaced document,
//! then the new one) to every writer of each partition -> `TabletWrite` removing the old
//! entries. Deletes: `DocLookup` -> `DocWrite` removal -> `TabletWrite` removal. A write is
//! acknowledged only when every writer (replicas not marked Down) acknowledged durably; a
//! writer that fails makes the call fail (UNAVAILABLE) and the write may be half applied,
//! which readers never see: a document is present only once its partition holds it, and
//! entries without their document are dropped. `wait_durable` is a no-op.
//!
//! A node answering "epoch moved" makes the router wait (at most [`EPOCH_WAIT`]) for its
//! map to reach that epoch and retry the whole operation once (every step is idempotent).
//!
//! # Admission (CheckAndInsert)
//! Check, insert, re-check. The check finds the near-duplicates stored; the document joins
//! the cluster of the earliest (timestamp, then gid) or founds its own. When it would be an
//! original, it is inserted and the check is run again: a near-duplicate found now and not
//! before was admitted concurrently (a "rival"). Rivals that are duplicates already do not
//! matter. The document yields (becomes a duplicate of the earliest rival, and is removed
//! again under `skip_insert_if_duplicate`) at once when a rival has a smaller gid. When
//! every rival has a larger gid and claims to be an original, it looks at them again a few
//! times ([`SETTLE_POLLS`]): a rival that found this document yields (rewrites its cluster
//! or removes itself); one that still claims to be an original after that did not, and the
//! document yields to it.
//!
//! **Guarantee**: two near-identical documents admitted concurrently, with every write
//! acknowledged, are never both reported originals. Each inserts (durably, on every serving
//! replica) before it re-checks, so at least one of the two re-checks finds the other.
//! The finder stays an original only if the other has a larger gid and was seen to give
//! up its claim, so the other is not an original either way. Liveness is weaker: when the
//! larger gid's admission is slower to yield than the polls last, both end as duplicates
//! (no original; under `skip_insert_if_duplicate` neither is stored). Admissions that do
//! not overlap in time behave exactly as on a single node. (The contract's rule alone,
//! "yield to a new near-duplicate with a smaller gid", lets both be originals when only the
//! smaller gid's re-check finds the other; the test
//! `concurrent_admissions_of_near_duplicates_never_both_become_originals` catches that.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_cluster::map::{ClusterMap, MAX_GRANT};
use neardup_cluster::{NodeId, Unit};
use neardup_core::Design;
use neardup_core::sketch::Sketch;
use neardup_proto::admin::{RestoreStart, SnapshotChunk, SnapshotEnd, SnapshotInfo};
use neardup_proto::internal::{
    AdmitRequest, AdmitResponse, ProbeRequest, ProbeResponse, WriteRequest, WriteResponse,
};
use neardup_proto::v1::{CheckAndInsertResponse, Match, QueryResult, StatsResponse};
use neardup_server::data_types::{GID_PARTITION_BITS, gid_partition, make_gid};
use neardup_server::{
    DataError, DataResult, DocInfo, DocOp, NodeApi, NodeStats, Resolve, TabletHit, TabletOp,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tonic::Status;

/// Maps and sets of gids on a read's path, with a fast hash (gids are not chosen by
/// clients): std's SipHash was a few percent of a router's CPU under QueryBatch.
type FastMap<K, V> = hashbrown::HashMap<K, V>;
type FastSet<T> = hashbrown::HashSet<T>;

use crate::hedge::Hedger;
#[cfg(test)]
use crate::node_client::Unreachable;
pub use crate::node_client::{GrpcNode, GrpcNodes};
use crate::shard::{ShardApi, ShardHealth};

/// Gids asked from the id source at a time (more when one write needs more). Each grant is a
/// Raft entry, synced on every node, and a sync behind a loading node's data writes can
/// stall its Raft thread for seconds: a block lasts a loading router ten seconds or more,
/// and the numbers a restart leaves unused are a small part of the 2^56 there are.
pub const ID_BLOCK: u64 = 1 << 20;

/// Times an admission looks again at a concurrent admission with a larger gid that claims
/// to be an original, waiting for it to yield (5 ms, doubling: 315 ms in all at most).
pub const SETTLE_POLLS: usize = 6;

/// Longest wait for the local map to reach the epoch a node reported, before the retry.
pub const EPOCH_WAIT: Duration = Duration::from_secs(2);

/// Most matches and bytes of matches in one answer when a request leaves them unset (the
/// single node's bound).
const DEFAULT_BUDGET: (usize, usize) = (100_000, 3 << 20);

/// Bytes a match counts for in the response budget: its id plus 40 (as the single node).
fn wire_bytes(id: &str) -> usize {
    id.len() + 40
}

/// Where gids come from: blocks of sequence numbers granted through the map
/// (`ClusterNode::grant_ids`), never granted twice.
#[tonic::async_trait]
pub trait IdSource: Send + Sync + 'static {
    /// A block of at least one sequence number, `count` asked.
    async fn grant(&self, count: u64) -> Result<Range<u64>, Status>;
}

/// How the router reaches a node.
pub type NodeResolver = Arc<dyn Fn(NodeId) -> Arc<dyn NodeApi> + Send + Sync>;

/// One attempt's view: the map and its design.
#[derive(Clone)]
struct Ctx {
    map: Arc<ClusterMap>,
    design: Arc<Design>,
}

/// The serving replicas of every tablet, looked up once per read instead of once per
/// probe: by table, the tablets in permuted order with their replicas to read from
/// (suspects left out while another serves).
struct Routes {
    by_table: Vec<Vec<(u64, u64, Vec<NodeId>)>>,
}

impl Routes {
    fn new(ctx: &Ctx, avoid: &HashSet<NodeId>) -> Routes {
        let mut by_table: Vec<Vec<(u64, u64, Vec<NodeId>)>> =
            vec![Vec::new(); ctx.design.tables().len()];
        for t in &ctx.map.tablets {
            let Some(slot) = by_table.get_mut(t.table as usize) else { continue };
            let unit = Unit::Tablet { table: t.table, start: t.start };
            slot.push((t.start, t.end, readable(&ctx.map, unit, avoid)));
        }
        for slot in &mut by_table {
            slot.sort_unstable_by_key(|&(start, _, _)| start);
        }
        Routes { by_table }
    }

    /// The tablet of table `t` holding fingerprint `fp`: its unit and readable replicas.
    fn tablet(&self, ctx: &Ctx, t: usize, fp: u64) -> DataResult<(Unit, &[NodeId])> {
        let tablets = self.by_table.get(t).map_or(&[][..], |v| v);
        let pv = ctx.design.tables()[t].perm.apply(fp);
        let i = tablets.partition_point(|&(start, _, _)| start <= pv);
        let Some((start, _, serving)) =
            i.checked_sub(1).map(|i| &tablets[i]).filter(|&&(_, end, _)| pv <= end)
        else {
            return Err(DataError::Unavailable(format!(
                "no tablet of table {t} holds fingerprint {fp:#x}"
            )));
        };
        Ok((Unit::Tablet { table: t as u32, start: *start }, serving))
    }

    /// The node to probe for table `t` and fingerprint `fp` ([`choose`]).
    fn pick(
        &self,
        ctx: &Ctx,
        t: usize,
        fp: u64,
        salt: usize,
        local: Option<NodeId>,
        used: impl Fn(NodeId) -> bool,
    ) -> DataResult<NodeId> {
        let (unit, serving) = self.tablet(ctx, t, fp)?;
        choose(serving, unit, local, salt, used)
    }

    /// Another readable replica than `not` for the probe of table `t` and `fp`, chosen as
    /// [`pick`](Self::pick) does; `None` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn pick_other(
        &self,
        ctx: &Ctx,
        t: usize,
        fp: u64,
        not: NodeId,
        salt: usize,
        local: Option<NodeId>,
        used: impl Fn(NodeId) -> bool,
    ) -> Option<NodeId> {
        let (unit, serving) = self.tablet(ctx, t, fp).ok()?;
        let others: Vec<NodeId> = serving.iter().copied().filter(|&n| n != not).collect();
        choose(&others, unit, local, salt, used).ok()
    }
}

/// The replicas of `unit` reads may go to: its serving replicas, the suspects (`avoid`)
/// left out while another serves.
fn readable(map: &ClusterMap, unit: Unit, avoid: &HashSet<NodeId>) -> Vec<NodeId> {
    let mut serving = map.serving(unit);
    if serving.iter().any(|n| !avoid.contains(n)) {
        serving.retain(|n| !avoid.contains(n));
    }
    serving
}

/// One of `unit`'s readable replicas: `local` if among them, else one the read already
/// calls (`used`: fewer calls, each carrying more), else one spread by `salt`; UNAVAILABLE
/// when there is none.
fn choose(
    readable: &[NodeId],
    unit: Unit,
    local: Option<NodeId>,
    salt: usize,
    used: impl Fn(NodeId) -> bool,
) -> DataResult<NodeId> {
    if readable.is_empty() {
        return Err(DataError::Unavailable(format!("no serving replica of {unit:?}")));
    }
    if let Some(l) = local.filter(|l| readable.contains(l)) {
        return Ok(l);
    }
    if let Some(&n) = readable.iter().find(|&&n| used(n)) {
        return Ok(n);
    }
    // Mixed, so that salts in steps (a counter several steps share) still spread.
    let mixed = (salt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    Ok(readable[mixed as usize % readable.len()])
}

/// One node's answer to probes: the node, each probe's hits by query index, the documents
/// it resolved, and the partitions those cover.
type NodeAnswer = (NodeId, Vec<(usize, (Vec<TabletHit>, bool))>, Vec<DocInfo>, Vec<u32>);

/// A `TabletProbe` call of `probes` `(query index, table, fp)` to `node`, resolving what the
/// node can, with sketches if `sketches`.
#[allow(clippy::too_many_arguments)]
async fn probe_call(
    api: Arc<dyn NodeApi>,
    node: NodeId,
    epoch: u64,
    probes: Arc<Vec<(usize, u32, u64)>>,
    k: u32,
    cap: usize,
    sketches: bool,
    deadline: Option<Instant>,
) -> DataResult<Vec<NodeAnswer>> {
    let asked: Vec<(u32, u64)> = probes.iter().map(|&(_, t, fp)| (t, fp)).collect();
    let n = asked.len();
    let r = api.tablet_probe(epoch, asked, k, cap, Resolve::docs(sketches), deadline).await?;
    if r.results.len() != n {
        return Err(DataError::Internal(format!("{} answers to {n} probes", r.results.len())));
    }
    let answers = probes.iter().map(|&(qi, _, _)| qi).zip(r.results).collect();
    Ok(vec![(node, answers, r.docs, r.resolved)])
}

/// A `DocResolve` call of `gids`: each gid with its document, if stored (with its sketch if
/// `sketches`).
async fn resolve_call(
    api: Arc<dyn NodeApi>,
    epoch: u64,
    gids: Arc<Vec<u64>>,
    sketches: bool,
    deadline: Option<Instant>,
) -> DataResult<Vec<(u64, Option<DocInfo>)>> {
    let n = gids.len();
    let docs = api.doc_resolve(epoch, gids.to_vec(), sketches, deadline).await?;
    if docs.len() != n {
        return Err(DataError::Internal(format!("{} answers to {n} gids", docs.len())));
    }
    Ok(gids.iter().copied().zip(docs).collect())
}

/// The answers of every call in `calls`, together; the first failure fails them all (the
/// rest are dropped with the set).
async fn join_all<T: Send + 'static>(mut calls: JoinSet<DataResult<Vec<T>>>) -> DataResult<Vec<T>> {
    let mut out = Vec::new();
    while let Some(r) = calls.join_next().await {
        let r = r.map_err(|e| DataError::Internal(format!("a node call failed: {e}")))?;
        out.extend(r?);
    }
    Ok(out)
}

/// A stored document found near a query.
#[derive(Debug, Clone)]
struct Found {
    doc: DocInfo,
    distance: u32,
    /// The sketches' Jaccard similarity when it was verified.
    jaccard: Option<f64>,
}

/// The router of a cluster; see the module documentation.
pub struct ClusterRouter {
    map: watch::Receiver<Arc<ClusterMap>>,
    nodes: NodeResolver,
    ids: Arc<dyn IdSource>,
    local: Option<NodeId>,
    health: watch::Receiver<ShardHealth>,
    block: tokio::sync::Mutex<Range<u64>>,
    spread: AtomicUsize,
    design: Mutex<Option<(String, Arc<Design>)>>,
    /// Nodes whose last call failed (not answered, or answered UNAVAILABLE), until when:
    /// reads go to another serving replica meanwhile, so a node that dies costs reads
    /// one failed attempt instead of every read until the map marks it down.
    suspects: Mutex<HashMap<NodeId, Instant>>,
    /// Small reads waiting to go out together.
    coalesce: Coalesce,
    /// Read calls slow to answer are sent again to other replicas ([`crate::hedge`]).
    hedger: Arc<Hedger>,
}

/// Reads of a few queries each (unary Query, CheckAndInsert's checks) that arrive while
/// others are out go out together: one probe call per node and one resolve for all of them,
/// instead of one each. A read waits for nothing when no other is out, so this adds no
/// latency at low load and divides the per-call costs under load. At most
/// [`COALESCE_FLIGHTS`] groups are out at once, unless one has waited [`COALESCE_WAIT`].
struct Coalesce {
    queue: Mutex<Vec<Pending>>,
    flights: tokio::sync::Semaphore,
}

/// One waiting read.
struct Pending {
    ctx: Ctx,
    queries: Vec<(u64, u32)>,
    cap: usize,
    /// The documents are wanted with their sketches (the read verifies by them).
    sketches: bool,
    deadline: Option<Instant>,
    answer: tokio::sync::oneshot::Sender<DataResult<Vec<FoundSet>>>,
}

/// One query's documents within its distance, and whether a tablet cut its hits.
type FoundSet = (Vec<(DocInfo, u32)>, bool);

/// Reads of at most this many queries are coalesced; larger ones (QueryBatch) go alone.
const COALESCE_MAX: usize = 8;

/// Groups of coalesced reads out at once.
const COALESCE_FLIGHTS: usize = 2;

/// How long a read waits for a flight before it goes with the reads waiting then anyway.
const COALESCE_WAIT: Duration = Duration::from_millis(2);

/// How long a node whose call failed is avoided for reads.
pub const SUSPECT_FOR: Duration = Duration::from_secs(1);

impl ClusterRouter {
    /// A router over the map in `map`, reaching nodes with `nodes`, taking gids from `ids`.
    /// `local` is this process's node, preferred for reads. Its health follows the map:
    /// serving once the cluster is bootstrapped with a design and partitions. Needs a tokio
    /// runtime.
    pub fn new(
        map: watch::Receiver<Arc<ClusterMap>>,
        nodes: NodeResolver,
        ids: Arc<dyn IdSource>,
        local: Option<NodeId>,
    ) -> Self {
        let (tx, health) = watch::channel(ShardHealth::NotServing("no cluster map yet".into()));
        let mut watch_map = map.clone();
        tokio::spawn(async move {
            loop {
                let h = {
                    let m = watch_map.borrow_and_update();
                    match (&m.design, m.partitions.is_empty()) {
                        (Some(_), false) => ShardHealth::Serving,
                        (None, _) => {
                            ShardHealth::NotServing("the cluster is not bootstrapped".into())
                        }
                        (Some(_), true) => {
                            ShardHealth::NotServing("the cluster map has no partitions".into())
                        }
                    }
                };
                tx.send_if_modified(|cur| {
                    let changed = *cur != h;
                    *cur = h;
                    changed
                });
                if watch_map.changed().await.is_err() || tx.is_closed() {
                    return;
                }
            }
        });
        ClusterRouter {
            map,
            nodes,
            ids,
            local,
            health,
            block: tokio::sync::Mutex::new(0..0),
            spread: AtomicUsize::new(0),
            suspects: Mutex::new(HashMap::new()),
            design: Mutex::new(None),
            coalesce: Coalesce {
                queue: Mutex::new(Vec::new()),
                flights: tokio::sync::Semaphore::new(COALESCE_FLIGHTS),
            },
            hedger: Arc::new(Hedger::default()),
        }
    }

    /// This router with `hedger` (one whose counts are registered) in place of its own.
    pub fn with_hedger(mut self, hedger: Arc<Hedger>) -> Self {
        self.hedger = hedger;
        self
    }

    /// The current map and its design; UNAVAILABLE before bootstrap.
    fn ctx(&self) -> DataResult<Ctx> {
        let map = self.map.borrow().clone();
        let info = map
            .design
            .as_ref()
            .ok_or_else(|| DataError::Unavailable("the cluster is not bootstrapped".into()))?;
        if map.partitions.is_empty() {
            return Err(DataError::Unavailable("the cluster map has no partitions".into()));
        }
        let mut cached = self.design.lock().unwrap_or_else(|p| p.into_inner());
        let design = match &*cached {
            Some((name, d)) if *name == info.name => d.clone(),
            _ => {
                let d = Arc::new(Design::parse(&info.name).map_err(|e| {
                    DataError::Internal(format!("the map's design {}: {e}", info.name))
                })?);
                *cached = Some((info.name.clone(), d.clone()));
                d
            }
        };
        Ok(Ctx { map, design })
    }

    /// Waits (at most [`EPOCH_WAIT`], and not past `deadline`) for the map to reach `epoch`.
    async fn wait_epoch(&self, epoch: u64, deadline: Option<Instant>) {
        let mut until = Instant::now() + EPOCH_WAIT;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let mut rx = self.map.clone();
        let _ = tokio::time::timeout_at(until.into(), rx.wait_for(|m| m.epoch >= epoch)).await;
    }

    /// One serving replica of a unit: the local node if it serves, else one the step
    /// already calls (`used`), else one spread by `salt`; replicas whose last call failed
    /// only when no other serves.
    /// `avoid`: the suspects, taken once per step ([`suspects_now`](Self::suspects_now)).
    fn pick(
        &self,
        ctx: &Ctx,
        unit: Unit,
        salt: usize,
        avoid: &HashSet<NodeId>,
        used: impl Fn(NodeId) -> bool,
    ) -> DataResult<NodeId> {
        choose(&readable(&ctx.map, unit, avoid), unit, self.local, salt, used)
    }

    /// The nodes reads avoid now (their last call failed within [`SUSPECT_FOR`]).
    fn suspects_now(&self) -> HashSet<NodeId> {
        let now = Instant::now();
        let mut suspects = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        suspects.retain(|_, until| *until > now);
        suspects.keys().copied().collect()
    }

    /// The writers of a unit; UNAVAILABLE when it has none (no serving replica is up: a
    /// filling one alone takes no writes, see [`ClusterMap::writers`]).
    fn writers(ctx: &Ctx, unit: Unit) -> DataResult<Vec<NodeId>> {
        let w = ctx.map.writers(unit);
        if w.is_empty() {
            return Err(DataError::Unavailable(format!(
                "no serving replica of {unit:?} is up: its writes wait until one is back"
            )));
        }
        Ok(w)
    }

    /// The tablet unit of table `t` holding fingerprint `fp`.
    fn tablet_unit(ctx: &Ctx, t: usize, fp: u64) -> DataResult<Unit> {
        ctx.map.tablet_unit(&ctx.design, t as u32, fp).ok_or_else(|| {
            DataError::Unavailable(format!("no tablet of table {t} holds fingerprint {fp:#x}"))
        })
    }

    /// The partition unit of a name.
    fn partition_unit(ctx: &Ctx, name: &str) -> DataResult<u32> {
        ctx.map
            .partition_of(name)
            .ok_or_else(|| DataError::Unavailable("the cluster map has no partitions".into()))
    }

    /// `n` fresh gid sequence numbers (never 0).
    async fn next_seqs(&self, n: usize) -> DataResult<Vec<u64>> {
        let mut block = self.block.lock().await;
        let mut out = Vec::with_capacity(n);
        // Bounded: each grant yields at least one number (0 is skipped, once at most).
        let mut grants = 0;
        while out.len() < n {
            if block.is_empty() {
                grants += 1;
                if grants > n + 2 {
                    return Err(DataError::Unavailable(
                        "the id source grants no usable ids".into(),
                    ));
                }
                let want = ID_BLOCK.max((n - out.len()) as u64);
                let got = self.ids.grant(want).await.map_err(|s| DataError::from_status(&s))?;
                if got.is_empty() {
                    return Err(DataError::Unavailable("the id source granted no ids".into()));
                }
                *block = got;
            }
            if let Some(seq) = block.next()
                && seq != 0
            {
                out.push(seq);
            }
        }
        Ok(out)
    }

    /// Runs one call per node at once; the first failure (if any) is the answer.
    async fn fan_out<T: Send + 'static, F>(
        &self,
        calls: BTreeMap<NodeId, F>,
    ) -> DataResult<HashMap<NodeId, T>>
    where
        F: std::future::Future<Output = DataResult<T>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for (node, call) in calls {
            set.spawn(async move { (node, call.await) });
        }
        let mut out = HashMap::new();
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok((node, Ok(v))) => {
                    out.insert(node, v);
                }
                Ok((node, Err(e))) => {
                    let e = match e {
                        DataError::EpochMoved { .. } | DataError::InvalidArgument(_) => e,
                        DataError::DeadlineExceeded(m) => DataError::DeadlineExceeded(m),
                        other => {
                            self.suspects
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .insert(node, Instant::now() + SUSPECT_FOR);
                            DataError::Unavailable(format!("node {node}: {other}"))
                        }
                    };
                    // An epoch move wins: it is the one failure a retry fixes.
                    if first_err.is_none() || matches!(e, DataError::EpochMoved { .. }) {
                        first_err = Some(e);
                    }
                }
                Err(e) => first_err = Some(DataError::Internal(format!("a node call failed: {e}"))),
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Documents by name, from serving replicas of their partitions.
    async fn lookup(
        &self,
        ctx: &Ctx,
        names: &[String],
        deadline: Option<Instant>,
    ) -> DataResult<HashMap<String, DocInfo>> {
        let mut by_node: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        let salt = self.spread.fetch_add(1, Ordering::Relaxed);
        let avoid = self.suspects_now();
        for name in names.iter().collect::<HashSet<_>>() {
            let p = Self::partition_unit(ctx, name)?;
            let unit = Unit::Partition(p);
            let node =
                self.pick(ctx, unit, salt + p as usize, &avoid, |n| by_node.contains_key(&n))?;
            by_node.entry(node).or_default().push(name.clone());
        }
        Ok(self.lookup_on(ctx, by_node, deadline).await?.into_iter().collect())
    }

    /// Every document each name has on any writer of its partition, for a write that
    /// replaces or deletes it: replicas may differ after a write that failed halfway (one
    /// holds a gid the other never got), and the write must remove what any of them holds.
    async fn lookup_writers(
        &self,
        ctx: &Ctx,
        names: &[String],
        deadline: Option<Instant>,
    ) -> DataResult<HashMap<String, Vec<DocInfo>>> {
        let mut by_node: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for name in names.iter().collect::<HashSet<_>>() {
            let p = Self::partition_unit(ctx, name)?;
            for node in Self::writers(ctx, Unit::Partition(p))? {
                by_node.entry(node).or_default().push(name.clone());
            }
        }
        let mut out: HashMap<String, Vec<DocInfo>> = HashMap::new();
        for (name, d) in self.lookup_on(ctx, by_node, deadline).await? {
            let held = out.entry(name).or_default();
            if !held.iter().any(|h| h.gid == d.gid) {
                held.push(d);
            }
        }
        Ok(out)
    }

    /// The documents the names have on the nodes asked (one `DocLookup` per node).
    async fn lookup_on(
        &self,
        ctx: &Ctx,
        by_node: BTreeMap<NodeId, Vec<String>>,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<(String, DocInfo)>> {
        let epoch = ctx.map.epoch;
        let calls = by_node
            .into_iter()
            .map(|(node, names)| {
                let api = (self.nodes)(node);
                (node, async move {
                    let n = names.len();
                    let docs = api.doc_lookup(epoch, names.clone(), deadline).await?;
                    if docs.len() != n {
                        return Err(DataError::Internal(format!(
                            "{} answers to {n} names",
                            docs.len()
                        )));
                    }
                    Ok(names.into_iter().zip(docs).collect::<Vec<_>>())
                })
            })
            .collect();
        let mut out = Vec::new();
        for (_, answers) in self.fan_out(calls).await? {
            for (name, doc) in answers {
                if let Some(d) = doc.filter(|d| d.name == name) {
                    out.push((name, d));
                }
            }
        }
        Ok(out)
    }

    /// Documents by gid, from serving replicas of the gids' partitions; with their sketches
    /// if `sketches`.
    async fn resolve(
        &self,
        ctx: &Ctx,
        gids: &FastSet<u64>,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<FastMap<u64, DocInfo>> {
        let mut by_node: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        let salt = self.spread.fetch_add(1, Ordering::Relaxed);
        let avoid = self.suspects_now();
        for &gid in gids {
            let p = gid_partition(gid);
            if ctx.map.partition(p).is_none() {
                continue; // names no partition of this map: not a document.
            }
            let unit = Unit::Partition(p);
            let node =
                self.pick(ctx, unit, salt + p as usize, &avoid, |n| by_node.contains_key(&n))?;
            by_node.entry(node).or_default().push(gid);
        }
        let epoch = ctx.map.epoch;
        let avoid = Arc::new(avoid);
        let calls = by_node
            .into_iter()
            .map(|(node, gids)| {
                let (nodes, hedger, ctx, avoid) =
                    (self.nodes.clone(), self.hedger.clone(), ctx.clone(), avoid.clone());
                let local = self.local;
                (node, async move {
                    let gids = Arc::new(gids);
                    let primary =
                        resolve_call(nodes(node), epoch, gids.clone(), sketches, deadline);
                    // The same gids from their partitions' other serving replicas.
                    let backup = || {
                        let mut by_other: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
                        for &gid in gids.iter() {
                            let p = gid_partition(gid);
                            let unit = Unit::Partition(p);
                            let mut others = readable(&ctx.map, unit, &avoid);
                            others.retain(|&n| n != node);
                            let other = choose(&others, unit, local, salt + p as usize, |n| {
                                by_other.contains_key(&n)
                            })
                            .ok()?;
                            by_other.entry(other).or_default().push(gid);
                        }
                        let mut calls = JoinSet::new();
                        for (n, g) in by_other {
                            let g = Arc::new(g);
                            calls.spawn(resolve_call(nodes(n), epoch, g, sketches, deadline));
                        }
                        Some(join_all(calls))
                    };
                    hedger.run(primary, backup).await
                })
            })
            .collect();
        let mut out = FastMap::default();
        for (_, answers) in self.fan_out(calls).await? {
            for (gid, doc) in answers {
                if let Some(d) = doc.filter(|d| d.gid == gid) {
                    out.insert(gid, d);
                }
            }
        }
        Ok(out)
    }

    /// For each query `(fp, search_k)`, the present documents within `search_k`, unordered,
    /// and whether a tablet cut its hits at `cap`; the documents with their stored sketches
    /// only if `sketches` (a read that verifies by them: for the others, a node answers from
    /// memory). A read of a few queries goes out with the others waiting ([`Coalesce`]).
    async fn find(
        &self,
        ctx: &Ctx,
        queries: &[(u64, u32)],
        cap: usize,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<FoundSet>> {
        if queries.len() > COALESCE_MAX {
            return self.find_now(ctx, queries, cap, sketches, deadline).await;
        }
        let (answer, mut rx) = tokio::sync::oneshot::channel();
        let pending = Pending {
            ctx: ctx.clone(),
            queries: queries.to_vec(),
            cap,
            sketches,
            deadline,
            answer,
        };
        self.coalesce.queue.lock().unwrap_or_else(|p| p.into_inner()).push(pending);
        let until = deadline.map(tokio::time::Instant::from_std);
        let wait = async {
            // Either another read's flight takes this one along, or this one gets a flight
            // and takes every read waiting (its own among them, unless one took it already).
            // No longer than COALESCE_WAIT, though: a flight held up by one slow node (a
            // lock held by a copy, a pause) would otherwise hold up every read behind it.
            let permit = tokio::select! {
                biased;
                r = &mut rx => return r.ok(),
                p = self.coalesce.flights.acquire() => Some(p),
                () = tokio::time::sleep(COALESCE_WAIT) => None,
            };
            let batch =
                std::mem::take(&mut *self.coalesce.queue.lock().unwrap_or_else(|p| p.into_inner()));
            self.fly(batch).await;
            drop(permit);
            (&mut rx).await.ok()
        };
        let answered = match until {
            Some(u) => tokio::time::timeout_at(u, wait).await.map_err(|_| {
                DataError::DeadlineExceeded("waiting for the router's probes".into())
            })?,
            None => wait.await,
        };
        match answered {
            Some(r) => r,
            // The flight that took this read was dropped (its caller went away): alone, now.
            None => self.find_now(ctx, queries, cap, sketches, deadline).await,
        }
    }

    /// Sends coalesced reads: one [`find_now`](Self::find_now) per map epoch, cap and want
    /// of sketches, under the latest deadline among them, each read answered with its own
    /// queries' part.
    async fn fly(&self, mut batch: Vec<Pending>) {
        while !batch.is_empty() {
            let key = |p: &Pending| (p.ctx.map.epoch, p.cap, p.sketches);
            let first = key(&batch[0]);
            let (group, rest): (Vec<Pending>, Vec<Pending>) =
                batch.into_iter().partition(|p| key(p) == first);
            batch = rest;
            let queries: Vec<(u64, u32)> =
                group.iter().flat_map(|p| p.queries.iter().copied()).collect();
            // None when a read has none, else the latest.
            let deadline = group
                .iter()
                .map(|p| p.deadline)
                .collect::<Option<Vec<Instant>>>()
                .and_then(|d| d.into_iter().max());
            let ctx = group[0].ctx.clone();
            let (_, cap, sketches) = first;
            let r = self.find_now(&ctx, &queries, cap, sketches, deadline).await;
            match r {
                Ok(found) => {
                    let mut found = found.into_iter();
                    for p in group {
                        let part: Vec<FoundSet> = found.by_ref().take(p.queries.len()).collect();
                        let _ = p.answer.send(Ok(part));
                    }
                }
                Err(e) => {
                    for p in group {
                        let _ = p.answer.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// [`find`](Self::find) for these queries alone, now.
    async fn find_now(
        &self,
        ctx: &Ctx,
        queries: &[(u64, u32)],
        cap: usize,
        sketches: bool,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<FoundSet>> {
        // Probes, grouped by node: (query index, table, fp).
        let mut by_node: BTreeMap<NodeId, Vec<(usize, u32, u64)>> = BTreeMap::new();
        let salt = self.spread.fetch_add(1, Ordering::Relaxed);
        let routes = Routes::new(ctx, &self.suspects_now());
        let mut tables: Vec<(u32, Vec<usize>)> = Vec::new();
        let mut call_k = 0;
        for (qi, &(fp, k)) in queries.iter().enumerate() {
            call_k = call_k.max(k);
            let i = tables.iter().position(|(tk, _)| *tk == k).unwrap_or_else(|| {
                tables.push((k, ctx.design.tables_for_k(k)));
                tables.len() - 1
            });
            // A query's probes go to as few nodes as hold its tablets: the local node, then
            // the nodes it already probes (one spread by query, not by table).
            let mut mine: Vec<NodeId> = Vec::new();
            for &t in &tables[i].1 {
                let node = routes.pick(ctx, t, fp, salt + qi, self.local, |n| mine.contains(&n))?;
                if !mine.contains(&node) {
                    mine.push(node);
                }
                by_node.entry(node).or_default().push((qi, t as u32, fp));
            }
        }
        let epoch = ctx.map.epoch;
        let routes = Arc::new(routes);
        let calls = by_node
            .into_iter()
            .map(|(node, probes)| {
                let (nodes, hedger, ctx, routes) =
                    (self.nodes.clone(), self.hedger.clone(), ctx.clone(), routes.clone());
                let local = self.local;
                (node, async move {
                    let probes = Arc::new(probes);
                    let primary = probe_call(
                        nodes(node),
                        node,
                        epoch,
                        probes.clone(),
                        call_k,
                        cap,
                        sketches,
                        deadline,
                    );
                    // The same probes from the tablets' other serving replicas.
                    let backup = || {
                        let mut by_other: BTreeMap<NodeId, Vec<(usize, u32, u64)>> =
                            BTreeMap::new();
                        for &(qi, t, fp) in probes.iter() {
                            let other = routes.pick_other(
                                &ctx,
                                t as usize,
                                fp,
                                node,
                                salt + qi,
                                local,
                                |n| by_other.contains_key(&n),
                            )?;
                            by_other.entry(other).or_default().push((qi, t, fp));
                        }
                        let mut calls = JoinSet::new();
                        for (n, p) in by_other {
                            let api = nodes(n);
                            calls.spawn(probe_call(
                                api,
                                n,
                                epoch,
                                Arc::new(p),
                                call_k,
                                cap,
                                sketches,
                                deadline,
                            ));
                        }
                        Some(join_all(calls))
                    };
                    hedger.run(primary, backup).await
                })
            })
            .collect();
        // Each query's hits, deduplicated by gid (two tables may catch one entry).
        let mut hits: Vec<(Vec<TabletHit>, bool)> =
            queries.iter().map(|_| (Vec::new(), false)).collect();
        // Documents the probed nodes resolved, and the gids they resolved: a node's
        // resolved partitions speak for the hits of its own answer only (another node's
        // hits in the same partition may be entries it never saw).
        let mut docs: FastMap<u64, DocInfo> = FastMap::default();
        let mut resolved: FastSet<u64> = FastSet::default();
        let answered = self.fan_out(calls).await?.into_values().flatten();
        for (node, answers, found_docs, mut parts) in answered {
            // Only partitions this map has the node serve: a node whose map lags behind
            // could still take itself for a replica of a partition that moved away.
            parts.retain(|&p| ctx.map.serving(Unit::Partition(p)).contains(&node));
            let trusted = |gid: u64| parts.contains(&gid_partition(gid));
            docs.extend(found_docs.into_iter().filter(|d| trusted(d.gid)).map(|d| (d.gid, d)));
            for (qi, (found, truncated)) in answers {
                let (q, k) = queries[qi];
                let (merged, cut) = &mut hits[qi];
                *cut |= truncated;
                for h in found {
                    if trusted(h.gid) {
                        resolved.insert(h.gid);
                    }
                    if h.distance <= k && h.distance == (h.fp ^ q).count_ones() {
                        merged.push(h);
                    }
                }
            }
        }
        for (merged, _) in hits.iter_mut() {
            merged.sort_unstable_by_key(|h| h.gid);
            merged.dedup_by_key(|h| h.gid);
        }
        // The rest: a second hop to their partitions.
        let gids: FastSet<u64> = hits
            .iter()
            .flat_map(|(m, _)| m.iter().map(|h| h.gid))
            .filter(|g| !resolved.contains(g))
            .collect();
        if !gids.is_empty() {
            docs.extend(self.resolve(ctx, &gids, sketches, deadline).await?);
        }
        Ok(hits
            .into_iter()
            .map(|(merged, cut)| {
                let found = merged
                    .into_iter()
                    .filter_map(|h| {
                        docs.get(&h.gid).filter(|d| d.fp == h.fp).map(|d| (d.clone(), h.distance))
                    })
                    .collect();
                (one_per_name(found), cut)
            })
            .collect())
    }

    /// Verification as the single node does it, then the single node's order.
    fn verified(
        found: Vec<(DocInfo, u32)>,
        sketch: Option<&Sketch>,
        k: u32,
        jaccard: f64,
        candidate_k: u32,
    ) -> Vec<Found> {
        let mut out: Vec<Found> = found
            .into_iter()
            .filter_map(|(doc, distance)| {
                let stored = match sketch {
                    Some(_) if jaccard > 0.0 => doc.sketch.as_deref().and_then(|b| {
                        Sketch::from_bytes(b)
                            .map_err(|e| {
                                tracing::warn!(gid = doc.gid, error = %e, "stored sketch does not decode; unverified");
                            })
                            .ok()
                    }),
                    _ => None,
                };
                match (sketch, stored) {
                    (Some(q), Some(s)) => {
                        let j = q.jaccard(&s);
                        (distance <= candidate_k && j >= jaccard)
                            .then_some(Found { doc, distance, jaccard: Some(j) })
                    }
                    _ => (distance <= k).then_some(Found { doc, distance, jaccard: None }),
                }
            })
            .collect();
        out.sort_by_key(|f| (f.distance, f.doc.ts_ms, f.doc.gid));
        out
    }

    /// Matches within `limit` and the budget left (which they spend); `true` when cut.
    fn cut(found: &[Found], limit: usize, left: &mut (usize, usize)) -> (Vec<Match>, bool) {
        let mut out = Vec::new();
        for f in found {
            if out.len() == limit || left.0 == 0 {
                return (out, true);
            }
            let bytes = wire_bytes(&f.doc.name);
            if bytes > left.1 {
                left.0 = 0;
                return (out, true);
            }
            left.0 -= 1;
            left.1 -= bytes;
            let jaccard = f.jaccard.unwrap_or(0.0);
            out.push(Match {
                id: f.doc.name.clone(),
                fingerprint: f.doc.fp,
                distance: f.distance,
                timestamp_ms: f.doc.ts_ms,
                cluster_id: f.doc.cluster,
                verified: f.jaccard.is_some(),
                jaccard,
            });
        }
        (out, false)
    }

    fn check_k(ctx: &Ctx, name: &str, k: u32) -> DataResult<()> {
        let max = ctx.design.max_k();
        if k > max {
            return Err(DataError::InvalidArgument(format!(
                "{name} = {k} is out of range: this index answers exactly for k <= {max}"
            )));
        }
        Ok(())
    }

    fn verify_of(jaccard: f64, candidate_k: u32) -> DataResult<(f64, u32)> {
        if !(0.0..=1.0).contains(&jaccard) {
            return Err(DataError::InvalidArgument(format!(
                "verify_jaccard is {jaccard}; it must be between 0 and 1"
            )));
        }
        Ok(if jaccard > 0.0 { (jaccard, candidate_k) } else { (0.0, 0) })
    }

    fn sketch_of(bytes: &[u8]) -> DataResult<Option<Sketch>> {
        if bytes.is_empty() {
            return Ok(None);
        }
        Sketch::from_bytes(bytes).map(Some).map_err(|e| DataError::InvalidArgument(e.to_string()))
    }

    async fn probe_once(
        &self,
        ctx: &Ctx,
        req: &ProbeRequest,
        deadline: Option<Instant>,
    ) -> DataResult<ProbeResponse> {
        let (jaccard, candidate_k) = Self::verify_of(req.verify_jaccard, req.candidate_k)?;
        Self::check_k(ctx, "k", req.k)?;
        Self::check_k(ctx, "candidate_k", candidate_k)?;
        let sketches: Vec<Option<Sketch>> = if jaccard > 0.0 && !req.sketches.is_empty() {
            if req.sketches.len() != req.fingerprints.len() {
                return Err(DataError::InvalidArgument(format!(
                    "{} sketches for {} queries",
                    req.sketches.len(),
                    req.fingerprints.len()
                )));
            }
            req.sketches.iter().map(|b| Self::sketch_of(b)).collect::<DataResult<_>>()?
        } else {
            req.fingerprints.iter().map(|_| None).collect()
        };
        let pick = |asked: u64, default: usize| {
            let asked = usize::try_from(asked).unwrap_or(usize::MAX);
            if asked == 0 { default } else { asked.min(default) }
        };
        let mut left =
            (pick(req.max_matches, DEFAULT_BUDGET.0), pick(req.max_bytes, DEFAULT_BUDGET.1));
        let queries: Vec<(u64, u32)> = req
            .fingerprints
            .iter()
            .zip(&sketches)
            .map(|(&fp, s)| (fp, if s.is_some() { req.k.max(candidate_k) } else { req.k }))
            .collect();
        // Stored sketches only for the queries that verify by them.
        let verifies = sketches.iter().any(Option::is_some);
        let found = self.find(ctx, &queries, DEFAULT_BUDGET.0, verifies, deadline).await?;
        let limit = (req.limit as usize).max(1);
        let results = found
            .into_iter()
            .zip(&sketches)
            .zip(&req.fingerprints)
            .map(|(((found, cut), sketch), &fp)| {
                let kept = Self::verified(found, sketch.as_ref(), req.k, jaccard, candidate_k);
                let (matches, truncated) = Self::cut(&kept, limit, &mut left);
                QueryResult { matches, truncated: truncated || cut, fingerprint: fp }
            })
            .collect();
        Ok(ProbeResponse { results })
    }

    /// Stores `puts` (new documents) and removes `olds` (stored documents they replace or
    /// that are deleted): tablets first, then partitions, then the old entries.
    async fn apply(
        &self,
        ctx: &Ctx,
        puts: &[DocInfo],
        olds: &[DocInfo],
        new_gids: bool,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        let epoch = ctx.map.epoch;
        let tablet_ops = |docs: &[DocInfo], remove: bool| -> DataResult<_> {
            let mut by_node: BTreeMap<NodeId, Vec<(u32, TabletOp)>> = BTreeMap::new();
            for d in docs {
                for t in 0..ctx.design.tables().len() {
                    let unit = Self::tablet_unit(ctx, t, d.fp)?;
                    let op = if remove {
                        TabletOp::Remove { gid: d.gid, fp: d.fp }
                    } else {
                        TabletOp::Put { gid: d.gid, fp: d.fp }
                    };
                    for node in Self::writers(ctx, unit)? {
                        by_node.entry(node).or_default().push((t as u32, op));
                    }
                }
            }
            Ok(by_node
                .into_iter()
                .map(|(node, ops)| {
                    let api = (self.nodes)(node);
                    // Puts are of new documents (gids taken for this attempt), unless the
                    // caller says they may be stored already.
                    let new = new_gids && !remove;
                    (node, async move { api.tablet_write(epoch, ops, new, deadline).await })
                })
                .collect::<BTreeMap<_, _>>())
        };
        if !puts.is_empty() {
            self.fan_out(tablet_ops(puts, false)?).await?;
        }
        // Partitions: removals of the old documents, then the new ones.
        let mut by_node: BTreeMap<NodeId, Vec<DocOp>> = BTreeMap::new();
        let ops = olds
            .iter()
            .map(|d| DocOp::Remove { gid: d.gid, name: d.name.clone() })
            .chain(puts.iter().cloned().map(DocOp::Put));
        for op in ops {
            let name = match &op {
                DocOp::Put(d) => &d.name,
                DocOp::Remove { name, .. } => name,
            };
            let p = Self::partition_unit(ctx, name)?;
            for node in Self::writers(ctx, Unit::Partition(p))? {
                by_node.entry(node).or_default().push(op.clone());
            }
        }
        let calls = by_node
            .into_iter()
            .map(|(node, ops)| {
                let api = (self.nodes)(node);
                (node, async move { api.doc_write(epoch, ops, deadline).await })
            })
            .collect();
        self.fan_out(calls).await?;
        if !olds.is_empty() {
            self.fan_out(tablet_ops(olds, true)?).await?;
        }
        Ok(())
    }

    async fn write_once(
        &self,
        ctx: &Ctx,
        req: &WriteRequest,
        deadline: Option<Instant>,
    ) -> DataResult<WriteResponse> {
        let names: Vec<String> =
            req.documents.iter().map(|d| d.id.clone()).chain(req.deletes.iter().cloned()).collect();
        for n in &names {
            if n.is_empty() {
                return Err(DataError::InvalidArgument("a document id is empty".into()));
            }
        }
        let stored = self.lookup_writers(ctx, &names, deadline).await?;
        // The batch in order: documents, then deletes (as the single node's one record).
        // `current`: what each name holds after the steps so far (Some(None): deleted).
        let mut current: HashMap<&str, Option<usize>> = HashMap::new();
        let (mut inserted, mut replaced, mut deleted) = (0, 0, 0);
        let mut missing = Vec::new();
        for (i, d) in req.documents.iter().enumerate() {
            let held = match current.get(d.id.as_str()) {
                Some(c) => c.is_some(),
                None => stored.contains_key(&d.id),
            };
            inserted += 1;
            replaced += u64::from(held);
            current.insert(&d.id, Some(i));
        }
        for name in &req.deletes {
            let held = match current.get(name.as_str()) {
                Some(c) => c.is_some(),
                None => stored.contains_key(name),
            };
            if held {
                deleted += 1;
                current.insert(name, None);
            } else {
                missing.push(name.clone());
            }
        }
        if req.deletes_must_exist && !missing.is_empty() {
            return Err(DataError::NotFound(format!(
                "{} of the ids to delete are not stored, for example {:?}; nothing was deleted",
                missing.len(),
                missing[0]
            )));
        }
        let winners: Vec<usize> = {
            let mut w: Vec<usize> = current.values().filter_map(|c| *c).collect();
            w.sort_unstable();
            w
        };
        let seqs = self.next_seqs(winners.len()).await?;
        let mut puts = Vec::with_capacity(winners.len());
        for (i, seq) in winners.into_iter().zip(seqs) {
            let d = &req.documents[i];
            let gid = make_gid(seq, Self::partition_unit(ctx, &d.id)?);
            let sketch = (!d.sketch.is_empty()).then(|| d.sketch.clone());
            puts.push(DocInfo {
                gid,
                name: d.id.clone(),
                fp: d.fingerprint,
                ts_ms: d.timestamp_ms,
                cluster: gid,
                sketch,
            });
        }
        let olds: Vec<DocInfo> =
            current.keys().filter_map(|name| stored.get(*name)).flatten().cloned().collect();
        self.apply(ctx, &puts, &olds, true, deadline).await?;
        Ok(WriteResponse { inserted, replaced, deleted, missing, seq: 0 })
    }

    /// The cluster a document joins from its near-duplicates (the earliest's) and that
    /// cluster's original: its founder's name, empty when no longer stored or `own`.
    async fn original_of(
        &self,
        ctx: &Ctx,
        near: &[Found],
        own: &str,
        deadline: Option<Instant>,
    ) -> DataResult<Option<(u64, String)>> {
        let Some(joined) = near.iter().min_by_key(|f| (f.doc.ts_ms, f.doc.gid)) else {
            return Ok(None);
        };
        let cluster = joined.doc.cluster;
        let founder = if joined.doc.gid == cluster {
            Some(joined.doc.clone())
        } else {
            // Its name and cluster are what is read: no sketch.
            let founder = FastSet::from_iter([cluster]);
            self.resolve(ctx, &founder, false, deadline).await?.remove(&cluster)
        };
        let name = founder
            .filter(|f| f.cluster == cluster && f.name != own)
            .map(|f| f.name)
            .unwrap_or_default();
        Ok(Some((cluster, name)))
    }

    async fn admit_once(
        &self,
        ctx: &Ctx,
        req: &AdmitRequest,
        deadline: Option<Instant>,
    ) -> DataResult<CheckAndInsertResponse> {
        let doc = req
            .document
            .as_ref()
            .ok_or_else(|| DataError::InvalidArgument("an admission needs a document".into()))?;
        if doc.id.is_empty() {
            return Err(DataError::InvalidArgument("a document id is empty".into()));
        }
        let (jaccard, candidate_k) = Self::verify_of(req.verify_jaccard, req.candidate_k)?;
        Self::check_k(ctx, "k", req.k)?;
        Self::check_k(ctx, "candidate_k", candidate_k)?;
        let sketch = Self::sketch_of(&doc.sketch)?;
        let verifies = jaccard > 0.0 && sketch.is_some();
        let search_k = if verifies { req.k.max(candidate_k) } else { req.k };
        let limit = (req.limit as usize).max(1);
        let check = |found: Vec<(DocInfo, u32)>| {
            let mut kept = Self::verified(found, sketch.as_ref(), req.k, jaccard, candidate_k);
            kept.retain(|f| f.doc.name != doc.id);
            kept
        };
        let names = [doc.id.clone()];
        let query = [(doc.fingerprint, search_k)];
        let (own, first) = tokio::try_join!(
            self.lookup(ctx, &names, deadline),
            self.find(ctx, &query, DEFAULT_BUDGET.0, verifies, deadline)
        )?;
        let old = own.get(&doc.id).cloned();
        let (found, mut cut) = first.into_iter().next().unwrap_or_default();
        let mut near = check(found);
        let mut original = self.original_of(ctx, &near, &doc.id, deadline).await?;
        let mut duplicate = original.is_some();
        let insert = !(duplicate && req.skip_insert_if_duplicate);
        let p = Self::partition_unit(ctx, &doc.id)?;
        let mut me = DocInfo {
            gid: 0,
            name: doc.id.clone(),
            fp: doc.fingerprint,
            ts_ms: doc.timestamp_ms,
            cluster: 0,
            sketch: (!doc.sketch.is_empty()).then(|| doc.sketch.clone()),
        };
        let mut inserted = false;
        if insert {
            let seq = self.next_seqs(1).await?.pop().unwrap_or_default();
            me.gid = make_gid(seq, p);
            me.cluster = original.as_ref().map_or(me.gid, |(c, _)| *c);
            let olds: Vec<DocInfo> = old.iter().cloned().collect();
            self.apply(ctx, std::slice::from_ref(&me), &olds, true, deadline).await?;
            inserted = true;
        }
        if inserted && !duplicate {
            // Re-check: near-duplicates admitted at the same time.
            let seen: HashSet<u64> = near.iter().map(|f| f.doc.gid).collect();
            let again = self.find(ctx, &query, DEFAULT_BUDGET.0, verifies, deadline);
            let (found, cut2) = again.await?.into_iter().next().unwrap_or_default();
            let now = check(found);
            let fresh: Vec<Found> = now
                .iter()
                .filter(|f| !seen.contains(&f.doc.gid) && f.doc.gid != me.gid)
                .filter(|f| f.doc.gid < me.gid || f.doc.cluster == f.doc.gid)
                .cloned()
                .collect();
            let rivals = if fresh.iter().any(|f| f.doc.gid < me.gid) {
                fresh
            } else {
                self.still_claiming(ctx, fresh, deadline).await?
            };
            if !rivals.is_empty() {
                original = self.original_of(ctx, &rivals, &doc.id, deadline).await?;
                duplicate = true;
                near = now.into_iter().filter(|f| f.doc.gid != me.gid).collect();
                cut = cut2;
                let removal = DocOp::Remove { gid: me.gid, name: me.name.clone() };
                if req.skip_insert_if_duplicate {
                    // Taken back: the partition first, then the entries.
                    self.remove_own(ctx, &me, removal, deadline).await?;
                    inserted = false;
                } else if let Some((cluster, _)) = &original {
                    me.cluster = *cluster;
                    let ops = vec![removal, DocOp::Put(me.clone())];
                    self.doc_write_all(ctx, p, ops, deadline).await?;
                }
            }
        }
        let (cluster_id, original_id) = original.unwrap_or((me.gid, doc.id.clone()));
        let mut left = DEFAULT_BUDGET;
        let (matches, truncated) = Self::cut(&near, limit, &mut left);
        Ok(CheckAndInsertResponse {
            duplicate,
            matches,
            truncated: truncated || cut,
            cluster_id,
            original_id,
            inserted,
            replaced: inserted && old.is_some(),
            fingerprint: doc.fingerprint,
        })
    }

    /// Of concurrent admissions with larger gids that claim to be originals, those that
    /// still do after they had time to re-check: each one either found this admission
    /// (and yields, rewriting or removing its document) or did not (and stays an
    /// original). Polled [`SETTLE_POLLS`] times with growing pauses.
    async fn still_claiming(
        &self,
        ctx: &Ctx,
        mut rivals: Vec<Found>,
        deadline: Option<Instant>,
    ) -> DataResult<Vec<Found>> {
        let mut pause = Duration::from_millis(5);
        for _ in 0..SETTLE_POLLS {
            if rivals.is_empty() {
                break;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            let gids: FastSet<u64> = rivals.iter().map(|f| f.doc.gid).collect();
            let now = self.resolve(ctx, &gids, false, deadline).await?;
            rivals.retain(|f| now.get(&f.doc.gid).is_some_and(|d| d.cluster == d.gid));
        }
        Ok(rivals)
    }

    /// Applies `ops` to every writer of partition `p`.
    async fn doc_write_all(
        &self,
        ctx: &Ctx,
        p: u32,
        ops: Vec<DocOp>,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        let epoch = ctx.map.epoch;
        let calls = Self::writers(ctx, Unit::Partition(p))?
            .into_iter()
            .map(|node| {
                let (api, ops) = ((self.nodes)(node), ops.clone());
                (node, async move { api.doc_write(epoch, ops, deadline).await })
            })
            .collect();
        self.fan_out(calls).await.map(drop)
    }

    /// Removes a document this admission stored: partition, then entries.
    async fn remove_own(
        &self,
        ctx: &Ctx,
        me: &DocInfo,
        removal: DocOp,
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        let p = Self::partition_unit(ctx, &me.name)?;
        self.doc_write_all(ctx, p, vec![removal], deadline).await?;
        let epoch = ctx.map.epoch;
        let mut by_node: BTreeMap<NodeId, Vec<(u32, TabletOp)>> = BTreeMap::new();
        for t in 0..ctx.design.tables().len() {
            let unit = Self::tablet_unit(ctx, t, me.fp)?;
            for node in Self::writers(ctx, unit)? {
                by_node
                    .entry(node)
                    .or_default()
                    .push((t as u32, TabletOp::Remove { gid: me.gid, fp: me.fp }));
            }
        }
        let calls = by_node
            .into_iter()
            .map(|(node, ops)| {
                let api = (self.nodes)(node);
                (node, async move { api.tablet_write(epoch, ops, false, deadline).await })
            })
            .collect();
        self.fan_out(calls).await.map(drop)
    }

    async fn stats_once(&self, ctx: &Ctx, deadline: Option<Instant>) -> DataResult<StatsResponse> {
        let epoch = ctx.map.epoch;
        let up: Vec<NodeId> = ctx
            .map
            .nodes
            .values()
            .filter(|n| n.state != neardup_cluster::map::NodeState::Down)
            .map(|n| n.id)
            .collect();
        let calls = up
            .into_iter()
            .map(|node| {
                let api = (self.nodes)(node);
                (node, async move { api.stats(epoch, deadline).await })
            })
            .collect();
        let all = self.fan_out(calls).await?;
        let mut s = StatsResponse {
            design: ctx.design.to_string(),
            max_k: ctx.design.max_k(),
            version: neardup_server::version().to_string(),
            ..Default::default()
        };
        let mut docs = 0;
        // Per partition, the most documents a serving replica holds (replicas are level but
        // for the writes in flight).
        let mut by_partition: HashMap<u32, u64> = HashMap::new();
        for (node, NodeStats { stats: n, partitions }) in all {
            for (p, count) in partitions {
                if ctx.map.serving(Unit::Partition(p)).contains(&node) {
                    let c = by_partition.entry(p).or_default();
                    *c = (*c).max(count);
                }
            }
            docs += n.documents;
            s.index_bytes += n.index_bytes;
            s.document_bytes += n.document_bytes;
            s.buffered += n.buffered;
            s.runs += n.runs;
            s.deleted_pending += n.deleted_pending;
            s.merges += n.merges;
            s.wal_bytes += n.wal_bytes;
            s.disk_bytes += n.disk_bytes;
            s.checkpoint_pending |= n.checkpoint_pending;
            s.merging |= n.merging;
        }
        // Each partition counted once, from a serving replica; nodes that sent no counts
        // (older ones): every document is held by every replica of its partition.
        s.documents = if by_partition.is_empty() {
            let copies = (ctx.map.replicas.max(1) as usize).min(ctx.map.nodes.len().max(1)) as u64;
            docs / copies
        } else {
            by_partition.values().sum()
        };
        Ok(s)
    }
}

/// The status of a failure after the retry: a second epoch move is UNAVAILABLE (the map
/// keeps changing; retry may work).
fn final_status(e: DataError) -> Status {
    match e {
        DataError::EpochMoved { epoch, why } => Status::unavailable(format!(
            "the cluster map moved twice during the request (a node is at epoch {epoch}: \
             {why}); retry"
        )),
        other => Status::from(other),
    }
}

/// Runs an attempt; on "epoch moved", waits for the map and runs it once more.
macro_rules! with_retry {
    ($self:ident, $deadline:expr, |$ctx:ident| $body:expr) => {{
        let first = match $self.ctx() {
            Ok($ctx) => $body.await,
            Err(e) => Err(e),
        };
        let r = match first {
            Err(DataError::EpochMoved { epoch, .. }) => {
                $self.wait_epoch(epoch, $deadline).await;
                match $self.ctx() {
                    Ok($ctx) => $body.await,
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        r.map_err(final_status)
    }};
}

/// Every document of partition `p` on `node`, a page at a time (for a backup, which sends
/// them all).
async fn scan_all(
    node: &dyn NodeApi,
    epoch: u64,
    p: u32,
    deadline: Option<Instant>,
) -> Result<Vec<DocInfo>, DataError> {
    let (mut docs, mut cursor) = (Vec::new(), 0);
    loop {
        let page = node.partition_scan(epoch, p, cursor, 0, deadline).await?;
        docs.extend(page.items);
        match page.next {
            Some(next) if next > cursor => cursor = next,
            Some(next) => {
                return Err(DataError::Internal(format!(
                    "a page of partition {p} from {cursor} ends at {next}"
                )));
            }
            None => return Ok(docs),
        }
    }
}

/// One document per name: the one with the largest (timestamp, gid), which every replica
/// keeps when it is given both. Replicas of a partition may hold different documents under
/// one name after a write that failed halfway (the first try's gid on one replica, a retry's
/// on the other), and a read resolves hits at more than one replica of a partition (each
/// probed node resolves its own).
fn one_per_name(mut found: Vec<(DocInfo, u32)>) -> Vec<(DocInfo, u32)> {
    if found.len() > 1 {
        found.sort_unstable_by(|(a, _), (b, _)| {
            a.name.cmp(&b.name).then_with(|| (b.ts_ms, b.gid).cmp(&(a.ts_ms, a.gid)))
        });
        found.dedup_by(|later, kept| later.0.name == kept.0.name);
    }
    found
}

/// `work`, given up at `deadline` (DEADLINE_EXCEEDED), so a slow node never holds a caller
/// past its deadline whatever the node does with it.
async fn within<T>(
    deadline: Option<Instant>,
    work: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match deadline {
        None => work.await,
        Some(d) => tokio::time::timeout_at(d.into(), work).await.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded("the deadline passed before the nodes answered"))
        }),
    }
}

#[tonic::async_trait]
impl ShardApi for ClusterRouter {
    async fn write(
        &self,
        req: WriteRequest,
        deadline: Option<Instant>,
    ) -> Result<WriteResponse, Status> {
        within(deadline, async {
            with_retry!(self, deadline, |ctx| self.write_once(&ctx, &req, deadline))
        })
        .await
    }

    async fn wait_durable(&self, _seq: u64, _deadline: Option<Instant>) -> Result<(), Status> {
        Ok(()) // Writes return durable.
    }

    async fn probe(
        &self,
        req: ProbeRequest,
        deadline: Option<Instant>,
    ) -> Result<ProbeResponse, Status> {
        within(deadline, async {
            // A node that failed is avoided on the second attempt (see `suspects`): reads
            // go on through another replica before the map marks the node down.
            match with_retry!(self, deadline, |ctx| self.probe_once(&ctx, &req, deadline)) {
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    with_retry!(self, deadline, |ctx| self.probe_once(&ctx, &req, deadline))
                }
                r => r,
            }
        })
        .await
    }

    async fn admit(
        &self,
        req: AdmitRequest,
        deadline: Option<Instant>,
    ) -> Result<AdmitResponse, Status> {
        let decision = within(deadline, async {
            with_retry!(self, deadline, |ctx| self.admit_once(&ctx, &req, deadline))
        })
        .await?;
        Ok(AdmitResponse { decision: Some(decision) })
    }

    async fn stats(&self, deadline: Option<Instant>) -> Result<StatsResponse, Status> {
        within(deadline, async {
            with_retry!(self, deadline, |ctx| self.stats_once(&ctx, deadline))
        })
        .await
    }

    fn health(&self) -> watch::Receiver<ShardHealth> {
        self.health.clone()
    }

    async fn snapshot(&self, tx: mpsc::Sender<Result<SnapshotChunk, Status>>) {
        if let Err(e) = self.snapshot_into(&tx).await {
            let _ = tx.send(Err(e)).await;
        }
    }

    async fn restore(
        &self,
        start: RestoreStart,
        mut docs: mpsc::Receiver<Result<Vec<DocInfo>, Status>>,
    ) -> Result<u64, Status> {
        let deadline = None;
        let ctx = self.ctx().map_err(final_status)?;
        let parts = ctx.map.partitions.len() as u32;
        match &start.info {
            Some(i) if i.kind == "node" => {
                return Err(Status::failed_precondition(
                    "this backup is a single node's: its ids name no partitions of a cluster; \
                     restore it into a single node (`neardup serve`)",
                ));
            }
            Some(i) if i.kind == "cluster" && i.partitions != parts => {
                return Err(Status::failed_precondition(format!(
                    "the backup comes from a cluster of {} document partitions, this one has \
                     {parts}: a document's id names its partition",
                    i.partitions
                )));
            }
            _ => {}
        }
        if !start.resume && ctx.map.next_gid_seq > 1 {
            let held = self.stats(deadline).await?.documents;
            return Err(Status::failed_precondition(format!(
                "this cluster has stored documents before ({held} held now): a restore goes \
                 into a fresh cluster (or is resumed with --resume)"
            )));
        }
        // The backup's ids are taken: no node is granted them for new documents after.
        let max_seq = start.max_id >> GID_PARTITION_BITS;
        let mut block = self.block.lock().await;
        // Bounded: each grant takes up to MAX_GRANT numbers, at least one.
        let mut next = self.map.borrow().next_gid_seq.max(1);
        for _ in 0..max_seq / MAX_GRANT + 3 {
            if next > max_seq {
                break;
            }
            next = next.max(self.ids.grant((max_seq + 1 - next).min(MAX_GRANT)).await?.end);
        }
        if next <= max_seq {
            return Err(Status::unavailable(format!(
                "the ids up to the backup's (sequence {max_seq}) could not be reserved; retry \
                 with --resume"
            )));
        }
        if block.start <= max_seq {
            *block = 0..0;
        }
        drop(block);
        // Chunk by chunk: the writes of each are durable when it returns.
        let mut n = 0u64;
        while let Some(chunk) = docs.recv().await {
            let chunk = chunk?;
            with_retry!(self, deadline, |ctx| self.restore_once(&ctx, &chunk, deadline))?;
            n += chunk.len() as u64;
        }
        Ok(n)
    }
}

impl ClusterRouter {
    /// A snapshot of every partition, one after the other, into `tx` (see
    /// [`ShardApi::snapshot`]).
    async fn snapshot_into(
        &self,
        tx: &mpsc::Sender<Result<SnapshotChunk, Status>>,
    ) -> Result<(), Status> {
        let ctx = self.ctx().map_err(final_status)?;
        let documents = self.stats(None).await?.documents;
        let parts = ctx.map.partitions.len() as u32;
        let info = SnapshotInfo {
            kind: "cluster".into(),
            design: ctx.map.design.as_ref().map(|d| d.name.clone()).unwrap_or_default(),
            partitions: parts,
            documents,
        };
        if tx.send(Ok(SnapshotChunk { info: Some(info), ..Default::default() })).await.is_err() {
            return Ok(());
        }
        let mut sent = 0u64;
        for p in 0..parts {
            let docs = self.scan_partition(p).await?;
            sent += docs.len() as u64;
            for docs in crate::backup::chunks(docs) {
                let chunk = SnapshotChunk { docs, ..Default::default() };
                if tx.send(Ok(chunk)).await.is_err() {
                    return Ok(());
                }
            }
        }
        let end = SnapshotEnd { removed: Vec::new(), seq: 0, documents: sent };
        let _ = tx.send(Ok(SnapshotChunk { end: Some(end), ..Default::default() })).await;
        Ok(())
    }

    /// Every document of partition `p`, from one serving replica (another when one fails,
    /// under the newer map when the map moved).
    async fn scan_partition(&self, p: u32) -> Result<Vec<DocInfo>, Status> {
        let mut last = None;
        for _ in 0..3 {
            let ctx = self.ctx().map_err(final_status)?;
            for node in readable(&ctx.map, Unit::Partition(p), &HashSet::new()) {
                let deadline = Some(Instant::now() + crate::fill::COPY_DEADLINE);
                match scan_all(&*(self.nodes)(node), ctx.map.epoch, p, deadline).await {
                    Ok(docs) => return Ok(docs),
                    Err(DataError::EpochMoved { epoch, why }) => {
                        self.wait_epoch(epoch, None).await;
                        last = Some(DataError::EpochMoved { epoch, why });
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
        }
        Err(final_status(last.unwrap_or_else(|| {
            DataError::Unavailable(format!("no replica of partition {p} serves"))
        })))
    }

    /// Stores documents of a backup under their gids: every gid must name its document's
    /// partition in this map. Puts may be stored already (a resumed restore).
    async fn restore_once(
        &self,
        ctx: &Ctx,
        docs: &[DocInfo],
        deadline: Option<Instant>,
    ) -> DataResult<()> {
        for d in docs {
            let p = Self::partition_unit(ctx, &d.name)?;
            if gid_partition(d.gid) != p {
                return Err(DataError::InvalidArgument(format!(
                    "document {:?} has id {:#x}, of partition {}, but its name is in partition \
                     {p} of this cluster",
                    d.name,
                    d.gid,
                    gid_partition(d.gid)
                )));
            }
        }
        self.apply(ctx, docs, &[], false, deadline).await
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
