//! A cluster node's data: the fingerprint entries of the tablets it holds and the documents
//! of its partitions (the model is in `docs/cluster.md` and [`crate::data_types`]).
//!
//! # Layout
//! - **Tables.** One [`Shard`] without names per table `t` of the design, holding every
//!   entry of table `t` the node has (whichever tablets of it), in permuted order: an index
//!   of design `p{prefix_bits_t}k{max_k}` ([`Design::tablet`]) over `perm_t(fp)`, with the
//!   gid as the index's id. An entry costs what an index entry costs (its value in the
//!   table's Huffman-XOR blocks, its gid in the run's id column, about 9 bytes at a
//!   million entries) and nothing else: no document table, no name. A probe of table `t`
//!   for `q` is a query of `perm_t(q)` there: Hamming distance does not change under a
//!   permutation of bits, so it finds exactly the entries within `k` that share `q`'s prefix
//!   in table `t` (other entries within `k` that a write buffer scan finds are dropped, so
//!   every replica answers alike).
//! - **Documents.** One [`Shard`] with names for every partition the node holds, the gid as
//!   its internal id: the document table maps names to gids and gids to fingerprint,
//!   timestamp and cluster; sketches sit in its sketch keyspace. Its index (design `p16k0`,
//!   never queried) only keeps the shard's recovery checks whole.
//!
//! Every shard is today's: write-ahead log, group commit, runs of Huffman-XOR blocks,
//! checkpoints, recovery with checksums and the expectation file (one per shard, in its own
//! directory). A write returns once its records are synced, so a `kill -9` after it loses
//! nothing.
//!
//! # One database
//! The shards share one sled database (`dir/db`), each under its own prefix of keyspace
//! names ([`PrefixedStore`]): one page cache bounded by [`NodeStoreConfig::cache_bytes`]
//! for the whole node (sled's cache is per database: a database per shard would need the
//! budget split T + 1 ways, or T + 1 times the memory), one file set and one lock. Each
//! shard's write-ahead log has segment files of its own (`dir/db/wal/t{t}_log`,
//! [`crate::wal`]) and its own group commit; a group commit syncs every log with new
//! records, so concurrent writes to several tables mostly share one round.
//!
//! # Order of writes
//! Idempotent, as the router's retries need: a put of an entry (or gid) already there and
//! a removal of one not there log nothing. Two gids of one name: the larger
//! `(ts_ms, gid)` stays whatever the order they arrive in (last writer wins).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use neardup_core::index::QueryScratch;
use neardup_core::permute::Permutation;
use neardup_core::{Design, Doc};

use crate::data_api::ScanPage;
use crate::data_types::{DocInfo, DocOp, TabletHit, TabletOp, gid_partition};
use crate::error::{Error, Result};
use crate::metrics::ShardMetrics;
use crate::shard::{EntryOp, Shard, ShardConfig, ShardStats, Status, check_data_dir};
use crate::storage::{PrefixedStore, SledStore, Store};

/// Where the node records the design its tables were built for.
const DESIGN_FILE: &str = "design";

/// Most partitions a gid can name.
const MAX_PARTITIONS: u32 = 1 << crate::data_types::GID_PARTITION_BITS;

/// How a node stores its data.
#[derive(Debug, Clone)]
pub struct NodeStoreConfig {
    /// The page cache of the node's one database, shared by every table and the documents.
    pub cache_bytes: u64,
    /// Refuse to start when the data directory's file system has less free space.
    pub min_free_bytes: u64,
    /// Every shard's maintenance settings (write buffer, merges, checkpoints, record
    /// sizes, longest name). Its design, `names`, `cache_bytes` and `min_free_bytes` are
    /// set by the store.
    pub shard: ShardConfig,
}

impl Default for NodeStoreConfig {
    fn default() -> Self {
        NodeStoreConfig::of_shard(ShardConfig::default())
    }
}

impl NodeStoreConfig {
    /// A node's store configured as a single node's shard: `shard`'s page cache and free
    /// space floor for the whole store, and its maintenance settings for every shard.
    pub fn of_shard(shard: ShardConfig) -> NodeStoreConfig {
        NodeStoreConfig {
            cache_bytes: shard.cache_bytes,
            min_free_bytes: shard.min_free_bytes,
            shard,
        }
    }
}

/// What a node holds, for stats and benchmarks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStoreStats {
    /// The design's text.
    pub design: String,
    /// Entries held per table.
    pub entries: Vec<u64>,
    /// Bytes in memory per table (its index).
    pub table_bytes: Vec<u64>,
    /// Documents held.
    pub documents: u64,
    /// Bytes in memory for the documents: the document table and its (small) index.
    pub document_bytes: u64,
    /// ... of which the document table (names, timestamps, clusters).
    pub document_table_bytes: u64,
    /// Every byte above.
    pub memory_bytes: u64,
    /// Bytes the database takes on disk.
    pub disk_bytes: u64,
    /// Runs of every shard.
    pub runs: u64,
    /// Documents and entries in the shards' write buffers.
    pub buffered: u64,
    /// Deleted documents and entries not merged away yet.
    pub deleted_pending: u64,
    /// Merges done since the start, over every shard.
    pub merges: u64,
    /// Bytes of write-ahead log records stored.
    pub wal_bytes: u64,
    /// Whether a shard has changes no checkpoint covers yet.
    pub checkpoint_pending: bool,
    /// Whether a shard is merging.
    pub merging: bool,
}

/// Writes applied and logged, not yet known durable: [`Durable::wait`] waits for their syncs.
#[must_use = "a write is acknowledged only once durable"]
pub struct Durable(Vec<(Arc<Shard>, u64)>);

impl Durable {
    /// Returns once every write is synced (or a sync failed).
    pub async fn wait(self) -> Result<()> {
        for (shard, seq) in self.0 {
            shard.wait_durable(seq).await?;
        }
        Ok(())
    }
}

/// One probe's hits, and whether they were cut at the most asked.
pub type ProbeHitsCut = (Vec<TabletHit>, bool);

/// A cluster node's tablets and partitions: see the module docs.
pub struct NodeStore {
    dir: PathBuf,
    design: Design,
    tables: Vec<Arc<Shard>>,
    docs: Arc<Shard>,
    store: Arc<dyn Store>,
    status: Arc<tokio::sync::watch::Sender<Status>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore")
            .field("dir", &self.dir)
            .field("design", &self.design.to_string())
            .field("status", &*self.status.borrow())
            .finish()
    }
}

/// The status of a node from its shards': the worst of them.
fn combined(shards: &[&Arc<Shard>]) -> Status {
    let all: Vec<(usize, Status)> = shards.iter().map(|s| s.status()).enumerate().collect();
    let rank = |s: &Status| match s {
        Status::Corrupt(_) => 0,
        Status::Failed(_) => 1,
        Status::ShuttingDown => 2,
        Status::Recovering => 3,
        Status::Serving => 4,
    };
    let (i, worst) = all.into_iter().min_by_key(|(_, s)| rank(s)).unwrap_or((0, Status::Serving));
    let part = if i + 1 == shards.len() { "documents".to_string() } else { format!("table {i}") };
    match worst {
        Status::Corrupt(m) => Status::Corrupt(format!("{part}: {m}")),
        Status::Failed(m) => Status::Failed(format!("{part}: {m}")),
        s => s,
    }
}

impl NodeStore {
    /// A node holds the tables of a full design: a tablet design (one table) is refused.
    fn check_full(design: &Design) -> Result<()> {
        if design.is_tablet() {
            return Err(Error::InvalidInput(format!(
                "a node stores the tables of a full design, not the tablet design {design}"
            )));
        }
        Ok(())
    }

    /// Opens (creating if new) and recovers the node's data under `dir` for `design`. A
    /// directory written for another design is refused. When a shard's data is damaged the
    /// store still opens: [`watch_status`](Self::watch_status) says
    /// [`Status::Corrupt`] and every call fails with the damage.
    pub fn open(
        dir: &Path,
        design: &Design,
        config: NodeStoreConfig,
        metrics: ShardMetrics,
    ) -> Result<Arc<NodeStore>> {
        Self::check_full(design)?;
        check_data_dir(dir, config.min_free_bytes)?;
        Self::check_design(dir, design)?;
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.join("db"), config.cache_bytes)?);
        Self::open_with_store(dir, store, design, config, metrics)
    }

    /// Like [`open`](Self::open), over `store`, which the caller opened (tests pass a
    /// [`FaultyStore`](crate::fault_store::FaultyStore) to inject faults); the shards'
    /// expectation files and the design file are kept under `dir`, which must exist.
    pub fn open_with_store(
        dir: &Path,
        store: Arc<dyn Store>,
        design: &Design,
        config: NodeStoreConfig,
        metrics: ShardMetrics,
    ) -> Result<Arc<NodeStore>> {
        Self::check_full(design)?;
        Self::check_design(dir, design)?;
        let width = design.width();
        let max_k = design.max_k();
        let mut base = config.shard.clone();
        base.cache_bytes = config.cache_bytes;
        base.min_free_bytes = config.min_free_bytes;
        let mut tables = Vec::with_capacity(design.tables().len());
        for (t, spec) in design.tables().iter().enumerate() {
            let mut c = base.clone();
            c.names = false;
            c.index.design = Design::tablet(width, spec.prefix_bits, max_k)?;
            let space = Arc::new(PrefixedStore::new(store.clone(), format!("t{t}/")));
            tables.push(Shard::open_shared(&dir.join(format!("t{t}")), space, c, metrics.clone())?);
        }
        let mut c = base;
        c.names = true;
        c.index.design = Design::tablet(width, 16.min(width), 0)?;
        c.index.recent_docs = 0;
        let space = Arc::new(PrefixedStore::new(store.clone(), "docs/"));
        let docs = Shard::open_shared(&dir.join("docs"), space, c, metrics)?;
        for s in tables.iter().chain([&docs]) {
            // A damaged shard reports itself through its status (below); the others serve.
            if let Err(e) = s.recover() {
                tracing::error!(error = %e, path = %s.path().display(), "a shard did not recover");
            }
        }
        let all: Vec<&Arc<Shard>> = tables.iter().chain([&docs]).collect();
        let status = Arc::new(tokio::sync::watch::Sender::new(combined(&all)));
        let node = Arc::new(NodeStore {
            dir: dir.to_path_buf(),
            design: design.clone(),
            tables,
            docs,
            store,
            status,
            stop: Arc::new(AtomicBool::new(false)),
        });
        Self::follow_status(&node);
        Ok(node)
    }

    /// Checks (or, when new, records) the design the directory holds tables for.
    fn check_design(dir: &Path, design: &Design) -> Result<()> {
        let path = dir.join(DESIGN_FILE);
        let text = design.to_string();
        let bad = |e: std::io::Error| Error::DataDir {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        match std::fs::read_to_string(&path) {
            Ok(found) if found.trim() == text => Ok(()),
            Ok(found) => Err(Error::Incompatible(format!(
                "{} holds tables of design {:?}, not {text:?}",
                dir.display(),
                found.trim()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::write(&path, format!("{text}\n")).map_err(bad)?;
                std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(bad)
            }
            Err(e) => Err(bad(e)),
        }
    }

    /// Keeps the node's status the worst of its shards' (a sync can fail at any time) until
    /// the store is shut down or dropped: a thread checks every 100 ms.
    fn follow_status(node: &Arc<NodeStore>) {
        let weak: Weak<NodeStore> = Arc::downgrade(node);
        let stop = node.stop.clone();
        let spawned =
            std::thread::Builder::new().name("neardup-node-status".into()).spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                    let Some(node) = weak.upgrade() else { return };
                    node.refresh_status();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no status thread; the status is refreshed by calls");
        }
    }

    fn shards(&self) -> impl Iterator<Item = &Arc<Shard>> {
        self.tables.iter().chain([&self.docs])
    }

    fn refresh_status(&self) {
        let all: Vec<&Arc<Shard>> = self.shards().collect();
        let now = combined(&all);
        self.status.send_if_modified(|s| {
            if *s == now {
                false
            } else {
                *s = now;
                true
            }
        });
    }

    /// The design whose tables the node holds.
    pub fn design(&self) -> &Design {
        &self.design
    }

    fn table(&self, table: u32) -> Result<&Arc<Shard>> {
        self.tables.get(table as usize).ok_or_else(|| {
            Error::InvalidInput(format!(
                "table {table} does not exist: design {} has {}",
                self.design,
                self.tables.len()
            ))
        })
    }

    fn check_partition(p: u32) -> Result<()> {
        if p >= MAX_PARTITIONS {
            return Err(Error::InvalidInput(format!(
                "partition {p} is not below {MAX_PARTITIONS}"
            )));
        }
        Ok(())
    }

    /// Applies ops to table `table`'s entries, durably: returns once they are synced.
    /// Idempotent: a Put of an entry already there and a Remove of one not there are
    /// no-ops. Ops on one table apply in order. A bad table number changes nothing.
    pub async fn write_tablets(&self, ops: Vec<(u32, TabletOp)>) -> Result<()> {
        self.append_tablets(ops, &[])?.wait().await
    }

    /// The first half of [`NodeStore::write_tablets`]: applies and logs the ops, and returns
    /// what to wait for until they are durable. It may block (index lookups, a log write the
    /// kernel throttles), so async callers run it off their runtime's threads.
    ///
    /// `new[i]` (false where absent) says that op `i`, if a put, is of a gid never written
    /// to this node before: it is stored without the lookup that makes puts idempotent
    /// ([`EntryOp::new`]). Only a caller that knows it may say so.
    pub fn append_tablets(&self, ops: Vec<(u32, TabletOp)>, new: &[bool]) -> Result<Durable> {
        self.append_tablets_deciding(ops, new, |_| false)
    }

    /// [`append_tablets`](Self::append_tablets), where `decide(gid)` may also say a put is of
    /// a new gid: asked under the table's write lock (see [`Shard::write_entries_deciding`]).
    pub fn append_tablets_deciding(
        &self,
        ops: Vec<(u32, TabletOp)>,
        new: &[bool],
        decide: impl Fn(u64) -> bool,
    ) -> Result<Durable> {
        let mut by_table: BTreeMap<u32, Vec<EntryOp>> = BTreeMap::new();
        for (i, (t, op)) in ops.iter().enumerate() {
            let perm = self.perm(*t)?;
            let (put, gid, fp) = match *op {
                TabletOp::Put { gid, fp } => (true, gid, fp),
                TabletOp::Remove { gid, fp } => (false, gid, fp),
            };
            if gid == 0 {
                return Err(Error::InvalidInput("gid 0 is never a document's".into()));
            }
            let new = new.get(i).copied().unwrap_or(false);
            by_table.entry(*t).or_default().push(EntryOp { put, id: gid, fp: perm.apply(fp), new });
        }
        let mut waits = Vec::with_capacity(by_table.len());
        for (t, entries) in by_table {
            let shard = self.table(t)?;
            waits.push((shard.clone(), shard.write_entries_deciding(&entries, &decide)?));
        }
        Ok(Durable(waits))
    }

    /// Puts the entries `(gid, fp as the caller sends it)` into table `table` in bulk, as
    /// one run ([`Shard::add_entries`]), and returns what to wait for until that is durable
    /// and how many it put. The caller keeps out the entries the table holds;
    /// `may_hold(entries)` names those that writes may have stored meanwhile (see
    /// [`Shard::add_entries`]; ids are gids). It blocks (the run is built, stored and synced).
    pub fn add_tablet_entries(
        &self,
        table: u32,
        entries: &[(u64, u64)],
        may_hold: impl FnOnce(&[Doc]) -> Vec<usize>,
    ) -> Result<(Durable, u64)> {
        let (shard, perm) = (self.table(table)?, self.perm(table)?);
        let docs: Vec<Doc> =
            entries.iter().map(|&(gid, fp)| Doc { id: gid, fp: perm.apply(fp), ts: 0 }).collect();
        let (seq, put) = shard.add_entries(&docs, may_hold)?;
        Ok((Durable(vec![(shard.clone(), seq)]), put))
    }

    /// The fewest entries worth putting in bulk ([`add_tablet_entries`](Self::add_tablet_entries)):
    /// a write buffer's worth, which the index would build into a run of its own anyway.
    pub fn bulk_entries(&self) -> usize {
        self.tables.first().map_or(usize::MAX, |t| t.config().index.buffer_docs)
    }

    /// The permutation of table `table`, which its entries' values are stored under.
    fn perm(&self, table: u32) -> Result<&Permutation> {
        self.table(table).map(|_| &self.design.tables()[table as usize].perm)
    }

    /// For each probe (table, fp as the caller sent it, NOT permuted), the entries of that
    /// table within `k` that share the probe's prefix in it, by distance then gid, at most
    /// `max_matches` per probe (then `truncated`).
    pub fn probe_tablets(
        &self,
        probes: &[(u32, u64)],
        k: u32,
        max_matches: usize,
    ) -> Result<Vec<ProbeHitsCut>> {
        self.probe_tablets_if(probes, k, max_matches, true)?.ok_or_else(|| {
            Error::Internal("a probe that waits for the locks did not get them".into())
        })
    }

    /// [`probe_tablets`](Self::probe_tablets); without `wait`, `None` when a table's lock
    /// cannot be had at once (a writer holds it or waits for it): the caller, which must
    /// not block (an async thread), then probes where it may wait.
    pub fn probe_tablets_if(
        &self,
        probes: &[(u32, u64)],
        k: u32,
        max_matches: usize,
        wait: bool,
    ) -> Result<Option<Vec<ProbeHitsCut>>> {
        self.design.check_k(k)?;
        let width = self.design.width();
        // One query of each table for all its probes: one lock a table.
        let mut order: Vec<usize> = (0..probes.len()).collect();
        order.sort_by_key(|&i| probes[i].0);
        let mut out: Vec<ProbeHitsCut> = vec![(Vec::new(), false); probes.len()];
        // One set of buffers for every table's group.
        let (mut scratch, mut found, mut pqs) = (QueryScratch::default(), Vec::new(), Vec::new());
        for group in order.chunk_by(|&a, &b| probes[a].0 == probes[b].0) {
            let t = probes[group[0]].0;
            let shard = self.table(t)?;
            let spec = &self.design.tables()[t as usize];
            let shift = width - spec.prefix_bits;
            let prefix = |v: u64| v.checked_shr(shift).unwrap_or(0);
            pqs.clear();
            pqs.extend(group.iter().map(|&i| spec.perm.apply(probes[i].1)));
            if !shard.query_entries_if(&pqs, k, &mut scratch, &mut found, wait)? {
                return Ok(None);
            }
            for ((&i, &pq), matches) in group.iter().zip(&pqs).zip(&found) {
                let mut hits: Vec<TabletHit> = matches
                    .iter()
                    .filter(|m| prefix(m.fp) == prefix(pq))
                    .map(|m| TabletHit {
                        gid: m.id,
                        fp: spec.perm.invert(m.fp),
                        distance: m.distance,
                    })
                    .collect();
                // In order already: the index answers by distance, then timestamp (0 for
                // every entry), then id.
                debug_assert!(hits.is_sorted_by_key(|h| (h.distance, h.gid)));
                let truncated = hits.len() > max_matches;
                hits.truncate(max_matches);
                out[i] = (hits, truncated);
            }
        }
        Ok(Some(out))
    }

    /// Every entry `(gid, fp)` of `table` whose permuted value lies in `[start, end]`, in
    /// permuted order (then by gid), with `fp` as callers send it (not permuted): what a
    /// [`TabletOp::Put`] on another node takes (for copying a tablet there).
    pub fn scan_tablet(&self, table: u32, start: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        Ok(self.scan_tablet_page(table, start, end, usize::MAX)?.items)
    }

    /// A page of [`scan_tablet`](Self::scan_tablet): the entries whose permuted value is in
    /// `[from, end]`, about `limit` of them, cut between two permuted values; with the first
    /// permuted value of the next page (`None`: done). The page covers `[from, next - 1]`.
    pub fn scan_tablet_page(
        &self,
        table: u32,
        from: u64,
        end: u64,
        limit: usize,
    ) -> Result<ScanPage<(u64, u64)>> {
        let perm = self.perm(table)?;
        let (found, next) = self.table(table)?.entries_in(from, end, limit)?;
        Ok(ScanPage { items: found.into_iter().map(|d| (d.id, perm.invert(d.fp))).collect(), next })
    }

    /// Where to split the tablet `[start, end]` of `table` once it holds more than
    /// `threshold` entries (about: see [`Shard::count_entries`](crate::Shard::count_entries)): the multiple of
    /// `2^(64 - prefix_bits)` inside it that leaves the two halves the closest to equal.
    /// `None` below the threshold, and when one prefix holds every entry.
    pub fn split_point(
        &self,
        table: u32,
        start: u64,
        end: u64,
        prefix_bits: u32,
        threshold: u64,
    ) -> Result<Option<u64>> {
        let shard = self.table(table)?;
        let total = shard.count_entries(start, end)?;
        if total <= threshold || prefix_bits == 0 || start >= end {
            return Ok(None);
        }
        let shift = 64 - prefix_bits.min(64);
        // Entries below prefix `p`'s first value, for `p` past the tablet's first prefix.
        let below = |p: u64| shard.count_entries(start, (p << shift) - 1);
        let (first, last) = (start >> shift, end >> shift);
        if first == last {
            return Ok(None);
        }
        let half = total / 2;
        // The first prefix in (first, last] with at least half the entries below it.
        let (mut lo, mut hi) = (first + 1, last);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(mid)? >= half {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut at = lo;
        if lo - 1 > first && below(lo)?.abs_diff(half) > below(lo - 1)?.abs_diff(half) {
            at = lo - 1;
        }
        let b = below(at)?;
        Ok((b > 0 && b < total).then_some(at << shift))
    }

    /// Removes every entry of `table` whose permuted value is in `[start, end]` (a tablet
    /// that moved away), durably.
    pub async fn drop_tablet(&self, table: u32, start: u64, end: u64) -> Result<()> {
        self.remove_tablet_range(table, start, end)?.0.wait().await
    }

    /// The first half of [`drop_tablet`](Self::drop_tablet): removes the range and logs it
    /// ([`Shard::remove_range`](crate::Shard::remove_range)), and returns what to wait for
    /// until that is durable and how many entries it removed. It may block (under the
    /// table's write lock, a pass over the range's deletion marks).
    pub fn remove_tablet_range(&self, table: u32, start: u64, end: u64) -> Result<(Durable, u64)> {
        let shard = self.table(table)?;
        let (seq, removed) = shard.remove_range(start, end)?;
        Ok((Durable(vec![(shard.clone(), seq)]), removed))
    }

    /// Applies document ops durably. A Put whose name is held by another gid replaces it
    /// only if `(ts_ms, gid)` of the new one is larger (last writer wins, so replicas that
    /// see two writers in different orders agree); otherwise it is ignored. Remove removes
    /// the entry if it still has that gid. Idempotent.
    pub async fn write_docs(&self, ops: Vec<DocOp>) -> Result<()> {
        self.append_docs(&ops)?.wait().await
    }

    /// The first half of [`NodeStore::write_docs`], as [`NodeStore::append_tablets`] is of
    /// [`NodeStore::write_tablets`].
    pub fn append_docs(&self, ops: &[DocOp]) -> Result<Durable> {
        Ok(Durable(vec![(self.docs.clone(), self.docs.write_docs(ops)?)]))
    }

    /// Documents by name (`None` if absent).
    pub fn lookup_names(&self, names: &[&str]) -> Result<Vec<Option<DocInfo>>> {
        self.docs.docs_by_names(names)
    }

    /// Documents by gid (`None` if absent); with `sketches`, with their stored sketches (a
    /// storage read a document, which a read that verifies nothing leaves out).
    pub fn resolve(&self, gids: &[u64], sketches: bool) -> Result<Vec<Option<DocInfo>>> {
        self.docs.docs_by_ids(gids, sketches)
    }

    /// [`resolve`](Self::resolve); without `wait`, `None` when the document table's lock
    /// cannot be had at once.
    pub fn resolve_if(
        &self,
        gids: &[u64],
        wait: bool,
        sketches: bool,
    ) -> Result<Option<Vec<Option<DocInfo>>>> {
        self.docs.docs_by_ids_if(gids, wait, sketches)
    }

    /// Every document of partition `p` (`gid & 0xff == p`), by gid, for copying it to
    /// another node.
    pub fn scan_partition(&self, p: u32) -> Result<Vec<DocInfo>> {
        Self::check_partition(p)?;
        self.docs.docs_where(|gid| gid_partition(gid) == p)
    }

    /// A page of [`scan_partition`](Self::scan_partition)'s documents, in no particular
    /// order, from `cursor` (0 to start): at most `limit`, and the cursor of the next page
    /// (`None`: done). A pass holds every document of the partition that was there
    /// throughout it, once; one written or removed meanwhile may be in it or not.
    pub fn scan_partition_page(
        &self,
        p: u32,
        cursor: u64,
        limit: usize,
    ) -> Result<ScanPage<DocInfo>> {
        Self::check_partition(p)?;
        let (items, next) = self.docs.docs_page(|gid| gid_partition(gid) == p, cursor, limit)?;
        Ok(ScanPage { items, next })
    }

    /// The gids of partition `p`'s documents, in no particular order.
    pub fn partition_gids(&self, p: u32) -> Result<Vec<u64>> {
        Self::check_partition(p)?;
        self.docs.ids_where(|gid| gid_partition(gid) == p)
    }

    /// Gives back the memory of the document table's freed slots once at most three quarters
    /// of them are live ([`Shard::compact_docs`]): whether it did.
    pub fn compact_docs(&self) -> Result<bool> {
        self.docs.compact_docs()
    }

    /// Removes every document of partition `p`, durably.
    pub async fn drop_partition(&self, p: u32) -> Result<()> {
        let gone: Vec<DocOp> = self.scan_partition(p)?.into_iter().map(DocOp::remove_of).collect();
        self.write_docs(gone).await
    }

    /// Entries per table, documents, memory and disk bytes (for stats and bench). A shard
    /// that is not serving counts as empty.
    pub fn stats(&self) -> NodeStoreStats {
        let mut out = NodeStoreStats { design: self.design.to_string(), ..Default::default() };
        let mut add = |s: &ShardStats| {
            out.runs += s.runs;
            out.buffered += s.buffered;
            out.deleted_pending += s.deleted_pending;
            out.merges += s.merges;
            out.wal_bytes += s.wal_bytes;
            out.checkpoint_pending |= s.checkpoint_pending;
            out.merging |= s.merging;
        };
        let mut per_table = Vec::with_capacity(self.tables.len());
        for t in &self.tables {
            let s = t.stats().ok();
            if let Some(s) = &s {
                add(s);
            }
            per_table.push(s.map_or((0, 0), |s| (s.documents, s.index_bytes)));
        }
        let docs = self.docs.stats().ok();
        if let Some(s) = &docs {
            add(s);
        }
        out.entries = per_table.iter().map(|p| p.0).collect();
        out.table_bytes = per_table.iter().map(|p| p.1).collect();
        if let Some(s) = docs {
            out.documents = s.documents;
            out.document_table_bytes = s.document_bytes;
            out.document_bytes = s.index_bytes + out.document_table_bytes;
        }
        out.memory_bytes = out.table_bytes.iter().sum::<u64>() + out.document_bytes;
        out.disk_bytes = self.store.disk_bytes().unwrap_or(0);
        out
    }

    /// Where the node's bytes on disk go, by shard (`table 0` .. and `documents`): each
    /// shard's keyspaces, live keys and values counted by scanning them all (a report, not
    /// for the request path), and the one database's files. Fails when a shard does not
    /// serve.
    pub fn disk_usage(&self) -> Result<Vec<(String, crate::persist::DiskUsage)>> {
        let last = self.tables.len();
        self.shards()
            .enumerate()
            .map(|(i, s)| {
                let part = if i == last { "documents".to_string() } else { format!("table {i}") };
                Ok((part, s.disk_usage()?))
            })
            .collect()
    }

    /// Documents held of partition `p` (0 for a partition no gid can name).
    pub fn partition_documents(&self, p: u32) -> u64 {
        u8::try_from(p).map_or(0, |b| self.docs.documents_with_low_byte(b))
    }

    /// Serving / recovering / corrupt / failed, as [`Shard::watch_status`]: the worst of
    /// the node's shards, naming the one.
    pub fn watch_status(&self) -> tokio::sync::watch::Receiver<Status> {
        self.refresh_status();
        self.status.subscribe()
    }

    /// Flushes, checkpoints, syncs (every shard). Call after the servers in front have
    /// drained their requests.
    pub fn shutdown(&self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        let mut first = None;
        for s in self.shards() {
            if let Err(e) = s.shutdown() {
                first.get_or_insert(e);
            }
        }
        self.refresh_status();
        first.map_or(Ok(()), Err)
    }

    /// Stops every shard writing nothing more: the data is left as a crash would leave it
    /// after the last sync. For tests that reopen the data in the same process.
    pub fn close_without_checkpoint(&self) {
        self.stop.store(true, Ordering::Release);
        for s in self.shards() {
            s.close_without_checkpoint();
        }
    }
}

impl Drop for NodeStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

#[cfg(test)]
#[path = "node_store_tests.rs"]
mod tests;
