//! The exact, updatable in-memory index.
//!
//! Documents (id, fingerprint, timestamp) go into a small write buffer, scanned linearly by
//! queries. When the buffer fills it becomes an immutable [`Run`]: the documents once, plus
//! one sorted, compressed table per permutation of the [`Design`]. Runs are merged
//! size-tiered: when `merge_fanout` runs of the same size class accumulate, they become one
//! run, so each document is rewritten about `log_fanout(n / buffer)` times while a query
//! visits few runs. Queries see the buffer and every run, so every answer is exact at all
//! times. Deletes mark documents in place; merges drop them.
//!
//! The write buffer and every small run (all but the largest run, fewer than
//! [`IndexConfig::recent_docs`] documents) are also indexed together in hash tables, one per
//! permutation ([`recent`](self::recent)): a query probes those once instead of each small
//! run and instead of scanning the buffer, so its cost stays near that of the large runs
//! alone while documents stream in. A run added whole ([`Index::add_run`]) is hashed into
//! them at once; one added with [`Index::add_run_deferred`] joins them a slice of its values
//! at a time ([`Index::cover_recent`]), probed on its own until it is all in, so that a
//! server holding a lock readers wait for spreads that work over short holds.
//!
//! A server that wants no run built under its write lock freezes the full buffer instead
//! ([`Index::freeze_buffer`]): the frozen buffer stays queryable as the buffer was while the
//! owner builds its run on another thread ([`SealJob::run`]) and installs it
//! ([`Index::finish_seal`]); deletes made in the meantime are carried over.
//!
//! Merges run inline by default ([`IndexConfig::auto_merge`]). A server that wants them off
//! its write path turns that off, takes a [`MergeJob`] with [`Index::next_merge`], runs it on
//! another thread and installs the result with [`Index::finish_merge`]; deletes made in the
//! meantime are carried over.

mod buffer;
mod doc_columns;
mod lsm_run;
mod packed_column;
mod permuted_table;
mod recent;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rayon::prelude::*;

use buffer::Buffer;
use lsm_run::BuildContext;
pub use lsm_run::{Run, StoredTable};
use permuted_table::CrowdPolicy;
use recent::RecentTables;

use crate::codec::{self, Codec, TableOptions};
use crate::design::{Design, LayoutCost};
use crate::error::{Error, Result};

/// A stored document: the caller's id, its simhash fingerprint and a timestamp.
///
/// Ids are opaque to the index and not checked for uniqueness: inserting the same id twice
/// stores two documents (the service layer above enforces one document per id). Timestamps
/// are the caller's (milliseconds since the Unix epoch by convention); the index only orders
/// results by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Doc {
    /// The caller's document id.
    pub id: u64,
    /// The document's 64-bit simhash.
    pub fp: u64,
    /// When the document was seen.
    pub ts: i64,
}

/// One answer to a query: a stored document within the query's distance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Match {
    /// The document's id.
    pub id: u64,
    /// Its fingerprint.
    pub fp: u64,
    /// Hamming distance between its fingerprint and the query.
    pub distance: u32,
    /// Its timestamp.
    pub ts: i64,
}

/// How an [`Index`] stores and maintains its tables.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexConfig {
    /// The permuted-table design; queries may ask for any `k <= design.max_k()`.
    pub design: Design,
    /// How every table is encoded: its in-memory layout, block coding, block size and block
    /// lookup.
    pub tables: TableOptions,
    /// Documents the write buffer holds before it becomes a run.
    pub buffer_docs: usize,
    /// How many runs of one size class are merged at once (at least 2).
    pub merge_fanout: usize,
    /// Past this many runs, the two adjacent runs with the fewest documents are merged
    /// (at least 1): queries visit every run. A backstop for when runs arrive faster than
    /// size-tiered merges absorb them; a low value rewrites small runs over and over.
    pub max_runs: usize,
    /// Merge inline on insert and delete. Off, the owner drives merges with
    /// [`Index::next_merge`] and [`Index::finish_merge`].
    pub auto_merge: bool,
    /// A prefix bucket with at most this many entries never gets a sub-index.
    pub crowd_min: usize,
    /// A prefix bucket with more than this many times the mean bucket size gets a sub-index.
    pub crowd_factor: f64,
    /// Build the tables of a run in parallel.
    pub parallel_build: bool,
    /// Runs with fewer live documents than this, except the largest, are queried through
    /// the recent tables with the write buffer (see the module docs) rather than one by
    /// one; 0 turns the recent tables off (each run probed, the buffer scanned). They cost
    /// 13-26 bytes per such fingerprint per table (8-byte slots, 5/16 to 5/8 full).
    pub recent_docs: usize,
}

impl Default for IndexConfig {
    /// The paper's 10-table design for k <= 3, XOR coding in 1 KiB blocks, a 4096-document
    /// buffer, fanout 4, automatic merges.
    fn default() -> Self {
        IndexConfig {
            design: Design::parse("paper-10").expect("named design"),
            tables: TableOptions::default(),
            buffer_docs: 4096,
            merge_fanout: 4,
            max_runs: 12,
            auto_merge: true,
            crowd_min: 1024,
            crowd_factor: 16.0,
            parallel_build: true,
            recent_docs: 1 << 20,
        }
    }
}

impl IndexConfig {
    /// Checks every option is in range.
    pub fn validate(&self) -> Result<()> {
        self.tables.validate()?;
        if self.buffer_docs == 0 {
            return Err(Error::InvalidConfig("buffer_docs must be at least 1".into()));
        }
        if self.merge_fanout < 2 {
            return Err(Error::InvalidConfig("merge_fanout must be at least 2".into()));
        }
        if self.max_runs == 0 {
            return Err(Error::InvalidConfig("max_runs must be at least 1".into()));
        }
        if self.crowd_factor.is_nan() || self.crowd_factor < 1.0 {
            return Err(Error::InvalidConfig("crowd_factor must be at least 1".into()));
        }
        if self.design.width() != 64 {
            return Err(Error::InvalidConfig("the index stores 64-bit fingerprints".into()));
        }
        if !self.design.tables().first().is_some_and(|t| t.perm.is_identity()) {
            return Err(Error::InvalidConfig("table 0 of the design must be the identity".into()));
        }
        Ok(())
    }

    /// Chooses the design and the tables' layout (packed, or blocks of a size and coding)
    /// for about `n` documents and queries up to distance `k`: the lowest estimated query
    /// cost whose estimated memory fits `budget_bytes` (see [`Design::estimate_query_ns`]
    /// and [`Design::estimate_bytes`]), or the smallest configuration when nothing fits.
    /// Packed tables are stored as Huffman-XOR tables in the default blocks. Other options
    /// keep their defaults.
    pub fn auto(n: u64, k: u32, budget_bytes: u64) -> Result<IndexConfig> {
        if k > 16 {
            return Err(Error::KOutOfRange { k, max: 16 });
        }
        let mut choices =
            vec![TableOptions { layout: codec::Layout::Packed, ..TableOptions::default() }];
        for codec in [Codec::Xor, Codec::Gap] {
            for block_bytes in [128, 256, 512, 1024, 2048] {
                choices.push(TableOptions { codec, block_bytes, ..TableOptions::default() });
            }
        }
        let mut best: Option<(f64, u64, Design, TableOptions)> = None;
        let mut smallest: Option<(u64, Design, TableOptions)> = None;
        for d in Design::candidates(n, k) {
            for &tables in &choices {
                let layout = LayoutCost::of(&tables);
                let bytes = d.estimate_bytes(n, layout);
                let cost = d.estimate_query_ns(n, layout);
                if smallest.as_ref().is_none_or(|s| bytes < s.0) {
                    smallest = Some((bytes, d.clone(), tables));
                }
                let better = best.as_ref().is_none_or(|b| (cost, bytes) < (b.0, b.1));
                if bytes <= budget_bytes && better {
                    best = Some((cost, bytes, d.clone(), tables));
                }
            }
        }
        let (design, tables) = match (best, smallest) {
            (Some((_, _, d, r)), _) | (None, Some((_, d, r))) => (d, r),
            (None, None) => return Err(Error::InvalidDesign(format!("no design answers k = {k}"))),
        };
        Ok(IndexConfig { design, tables, ..IndexConfig::default() })
    }

    fn build_context(&self) -> BuildContext {
        BuildContext {
            design: self.design.clone(),
            opts: self.tables,
            policy: CrowdPolicy {
                min: self.crowd_min,
                factor: self.crowd_factor,
                k: self.design.max_k(),
                max_depth: 3,
            },
            parallel: self.parallel_build,
        }
    }
}

/// Reusable buffers for queries, so a hot loop allocates nothing.
#[derive(Debug, Default)]
pub struct QueryScratch {
    /// Per probed table: the query permuted for it.
    pqs: Vec<u64>,
    /// Per run and probed table: where the table searches for the query.
    cands: Vec<permuted_table::Candidates>,
    /// What each run's later stages use (see [`Run::finish`]).
    hits: lsm_run::HitScratch,
    /// Fingerprints the recent tables found.
    recent: Vec<u64>,
}

/// A merge the owner runs off the write path: see [`Index::next_merge`].
#[derive(Debug)]
pub struct MergeJob {
    /// The merged run's id and context; the largest run not merged is its neighbour.
    builder: RunBuilder,
    sources: Vec<Arc<Run>>,
    /// Each source's deletion marks when the job was made.
    marks_at_start: Vec<Vec<u64>>,
}

impl MergeJob {
    /// Builds the merged run. Needs no access to the index; may run on any thread.
    pub fn run(&self) -> Result<Run> {
        self.builder.merge(&self.sources)
    }

    /// Ids of the runs being merged.
    pub fn source_ids(&self) -> Vec<u64> {
        self.sources.iter().map(|r| r.id()).collect()
    }
}

/// A frozen write buffer to build into a run off the write path: see
/// [`Index::freeze_buffer`].
#[derive(Debug)]
pub struct SealJob {
    builder: RunBuilder,
    docs: Vec<Doc>,
}

impl SealJob {
    /// Builds the run. Needs no access to the index; may run on any thread.
    pub fn run(&self) -> Result<Run> {
        self.builder.build(&self.docs)
    }

    /// The id the run will have.
    pub fn id(&self) -> u64 {
        self.builder.id
    }
}

/// A run to build off the index's lock from documents the caller brings (a bulk load into a
/// live index), then to add with [`Index::add_run`]: see [`Index::run_builder`].
#[derive(Debug)]
pub struct RunBuilder {
    id: u64,
    ctx: Arc<BuildContext>,
    /// Fingerprints in the largest run.
    beside: usize,
}

impl RunBuilder {
    /// Builds the run of `docs` (any order). Needs no access to the index; may run on any
    /// thread.
    pub fn build(&self, docs: &[Doc]) -> Result<Run> {
        Run::build(self.id, docs, &self.ctx, self.beside)
    }

    /// Builds the run merging `sources`, as [`build`](Self::build) does `docs`.
    fn merge(&self, sources: &[Arc<Run>]) -> Result<Run> {
        Run::merge(self.id, sources, &self.ctx, self.beside)
    }
}

/// Memory held by one table across all runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TableMemory {
    /// Bytes of this table's runs and crowded-prefix sub-indexes.
    pub bytes: usize,
    /// Distinct fingerprints it holds.
    pub entries: usize,
    /// `bytes * 8 / entries`.
    pub bits_per_fp: f64,
    /// Buckets with a sub-index.
    pub crowded_buckets: usize,
    /// Entries in those buckets.
    pub crowded_entries: usize,
}

/// Where an index's memory goes.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryReport {
    /// Every byte the index holds: tables, documents, buffer.
    pub total_bytes: usize,
    /// Per table, in design order. Table 0's encoded table is also the document store's key column.
    pub tables: Vec<TableMemory>,
    /// Document ids and timestamps (bit-packed), duplicate lists and delete marks.
    pub doc_bytes: usize,
    /// The write buffer.
    pub buffer_bytes: usize,
    /// The recent tables over the buffer and the small runs.
    pub recent_bytes: usize,
    /// Bits per document id and per timestamp in the largest run.
    pub column_bits: (u32, u32),
}

impl MemoryReport {
    /// Mean bits per distinct fingerprint per table, over all tables.
    pub fn bits_per_fp_per_table(&self) -> f64 {
        let bytes: usize = self.tables.iter().map(|t| t.bytes).sum();
        let entries: usize = self.tables.iter().map(|t| t.entries).sum();
        if entries == 0 { 0.0 } else { bytes as f64 * 8.0 / entries as f64 }
    }
}

/// Counts of what an index holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexStats {
    /// Live documents.
    pub docs: usize,
    /// Documents in the write buffer and in frozen buffers.
    pub buffered: usize,
    /// Immutable runs.
    pub runs: usize,
    /// Deleted documents still held by runs (until their next merge).
    pub deleted_pending: usize,
    /// Merges done so far.
    pub merges: u64,
    /// Documents written by merges so far.
    pub merged_docs: u64,
}

/// A run joining the recent tables a slice of its values at a time: slice `i` of
/// `2^slices_log2` holds the values whose top bits are `i`.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    slices_log2: u32,
    /// Slices in so far.
    done: usize,
}

impl Deferred {
    fn slices(&self) -> usize {
        1 << self.slices_log2
    }

    /// The values of slice `i`.
    fn slice(&self, i: usize) -> (u64, u64) {
        if self.slices_log2 == 0 {
            return (0, u64::MAX);
        }
        let shift = 64 - self.slices_log2;
        let lo = (i as u64) << shift;
        (lo, lo | (u64::MAX >> self.slices_log2))
    }
}

/// An exact near-duplicate index over 64-bit simhash fingerprints. See the module docs.
#[derive(Debug)]
pub struct Index {
    config: IndexConfig,
    ctx: Arc<BuildContext>,
    /// Tables to probe for each `k` in `0..=max_k`.
    for_k: Vec<Vec<usize>>,
    runs: Vec<Arc<Run>>,
    buffer: Buffer,
    /// Frozen buffers whose runs are being built elsewhere, by the id their run will have,
    /// oldest first; queried as the buffer is.
    frozen: Vec<(u64, Buffer)>,
    /// The buffer's and the small runs' fingerprints (see the module docs); empty when
    /// `recent_docs` is 0.
    recent: RecentTables,
    /// Ids of runs whose fingerprints are all in `recent`.
    covered: HashSet<u64>,
    /// Runs joining `recent` a slice of their values at a time (see
    /// [`add_run_deferred`](Index::add_run_deferred)), by id; probed one by one until in.
    deferred: HashMap<u64, Deferred>,
    /// Positions in `runs` of the runs probed one by one...
    direct: Vec<usize>,
    /// ... and of the small runs, queried through `recent`.
    small: Vec<usize>,
    next_run_id: u64,
    merges: u64,
    merged_docs: u64,
    /// [`insert_many`](Self::insert_many)'s buffer for each table's permuted values.
    permuted_scratch: Vec<u64>,
}

impl Index {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Result<Index> {
        config.validate()?;
        let ctx = Arc::new(config.build_context());
        let for_k = (0..=config.design.max_k()).map(|k| config.design.tables_for_k(k)).collect();
        let recent = RecentTables::new(&config.design);
        Ok(Index {
            recent,
            config,
            ctx,
            for_k,
            runs: Vec::new(),
            buffer: Buffer::default(),
            frozen: Vec::new(),
            covered: HashSet::new(),
            deferred: HashMap::new(),
            direct: Vec::new(),
            small: Vec::new(),
            next_run_id: 1,
            merges: 0,
            merged_docs: 0,
            permuted_scratch: Vec::new(),
        })
    }

    /// An index holding `docs`, built as one run (the fast path for bulk loads).
    pub fn build(config: IndexConfig, docs: &[Doc]) -> Result<Index> {
        let mut index = Index::new(config)?;
        if !docs.is_empty() {
            let run = Run::build(index.take_run_id(), docs, &index.ctx, 0)?;
            index.runs.push(Arc::new(run));
        }
        index.sync_recent();
        Ok(index)
    }

    /// Rebuilds a stored run for this index (see [`Run::meta_bytes`]), verifying every
    /// checksum. Tables that are damaged, missing or built for another design or encoding
    /// are rebuilt from an intact one; their indices are returned with the run. Add the run
    /// with [`restore`](Self::restore).
    pub fn load_run(&self, meta: &[u8], tables: &[StoredTable<'_>]) -> Result<(Run, Vec<usize>)> {
        Run::load(meta, tables, &self.ctx)
    }

    /// Replaces the index's runs with `runs` (oldest first) and empties the buffer, as at
    /// start-up after loading stored runs. Run ids must be distinct; new runs get larger ids.
    pub fn restore(&mut self, runs: Vec<Run>) -> Result<()> {
        let mut ids: Vec<u64> = runs.iter().map(|r| r.id()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::InvalidConfig("two runs with the same id".into()));
        }
        self.next_run_id = ids.last().map_or(1, |&m| m + 1).max(self.next_run_id);
        self.runs = runs.into_iter().map(Arc::new).collect();
        self.buffer.clear();
        self.frozen.clear();
        self.recent = RecentTables::new(&self.config.design);
        self.covered.clear();
        self.deferred.clear();
        self.sync_recent();
        Ok(())
    }

    /// What builds a run of documents the caller brings, off this index's lock, to add with
    /// [`add_run`](Self::add_run); it takes the next run id.
    pub fn run_builder(&mut self) -> RunBuilder {
        RunBuilder { id: self.take_run_id(), ctx: self.ctx.clone(), beside: self.largest_run() }
    }

    /// Adds `run` as the newest run, as it is: no merge, and its documents join the recent
    /// tables when it is small. Built by a [`RunBuilder`] of this index, or loaded
    /// ([`load_run`](Self::load_run)). Refused, changing nothing, when a run with its id is
    /// present; later runs get larger ids. The caller keeps ids unique within the index:
    /// the run must hold no document the index holds.
    pub fn add_run(&mut self, run: Run) -> Result<()> {
        self.add_run_as(run, None)
    }

    /// As [`add_run`](Self::add_run), but a small run joins the recent tables later, about
    /// `per_step` fingerprints at each [`cover_recent`](Self::cover_recent), and is probed
    /// one by one until it is all in. Joining hashes every fingerprint into every table; a
    /// caller that holds a lock readers wait for while it adds a large run takes that work
    /// out of the one hold and spreads it over short ones.
    pub fn add_run_deferred(&mut self, run: Run, per_step: usize) -> Result<()> {
        let slices = run.distinct().div_ceil(per_step.max(1)).next_power_of_two();
        self.add_run_as(run, Some(slices.min(1 << 16).trailing_zeros()))
    }

    fn add_run_as(&mut self, run: Run, slices_log2: Option<u32>) -> Result<()> {
        if self.runs.iter().any(|r| r.id() == run.id())
            || self.frozen.iter().any(|(id, _)| *id == run.id())
        {
            return Err(Error::InvalidConfig(format!("a run with id {} is present", run.id())));
        }
        self.next_run_id = self.next_run_id.max(run.id() + 1);
        if !run.is_empty() {
            if let (Some(slices_log2), true) = (slices_log2, self.recent_on()) {
                self.deferred.insert(run.id(), Deferred { slices_log2, done: 0 });
            }
            self.runs.push(Arc::new(run));
        }
        self.sync_recent();
        Ok(())
    }

    /// Hashes the next slice of a run added by [`add_run_deferred`](Self::add_run_deferred)
    /// into the recent tables; a run all in is then queried through them. Returns whether a
    /// run is still waiting (false also when the recent tables are off or overflowed: the
    /// runs are probed one by one then anyway).
    pub fn cover_recent(&mut self) -> bool {
        let Some(id) = self.waiting() else { return false };
        let d = self.deferred.get_mut(&id).expect("a waiting run is deferred");
        let run = self.runs.iter().find(|r| r.id() == id).expect("a waiting run is present");
        let (lo, hi) = d.slice(d.done);
        d.done += 1;
        let all_in = d.done == d.slices();
        let mut fps = Vec::new();
        run.for_each_fp_in(lo, hi, |fp| fps.push(fp));
        self.recent.insert_many(&self.config.design, fps.into_iter(), &mut self.permuted_scratch);
        if all_in {
            self.deferred.remove(&id);
            self.covered.insert(id);
        }
        if all_in || self.recent.overflowed() {
            self.sync_recent();
        }
        self.waiting().is_some()
    }

    /// Whether a run waits to join the recent tables a slice at a time (see
    /// [`cover_recent`](Self::cover_recent)).
    pub fn recent_waiting(&self) -> bool {
        self.waiting().is_some()
    }

    /// The oldest run waiting to join the recent tables that is small now (a run that is
    /// the largest waits without being hashed: it is probed one by one anyway).
    fn waiting(&self) -> Option<u64> {
        if !self.recent_on() {
            return None;
        }
        let small = Self::small_enough(&self.runs, self.config.recent_docs);
        (0..self.runs.len())
            .filter(|&i| small(i))
            .map(|i| self.runs[i].id())
            .filter(|id| self.deferred.contains_key(id))
            .min()
    }

    /// The configuration.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// The table design.
    pub fn design(&self) -> &Design {
        &self.config.design
    }

    /// The largest k queries may ask for.
    pub fn max_k(&self) -> u32 {
        self.config.design.max_k()
    }

    fn take_run_id(&mut self) -> u64 {
        let id = self.next_run_id;
        self.next_run_id += 1;
        id
    }

    /// Inserts one document.
    pub fn insert(&mut self, doc: Doc) -> Result<()> {
        self.insert_many(std::slice::from_ref(&doc))
    }

    /// Inserts documents in order, as one by one: the recent tables take each buffer-full
    /// at once, a table at a time, loading slots a few insertions ahead (one by one, every
    /// insertion waits for its slot's cache miss).
    pub fn insert_many(&mut self, docs: &[Doc]) -> Result<()> {
        let mut rest = docs;
        while !rest.is_empty() {
            let room = self.config.buffer_docs.saturating_sub(self.buffer.len()).max(1);
            let (now, later) = rest.split_at(room.min(rest.len()));
            for &d in now {
                self.buffer.push(d);
            }
            if self.recent_on() {
                let fps = now.iter().map(|d| d.fp);
                self.recent.insert_many(&self.config.design, fps, &mut self.permuted_scratch);
                if self.recent.overflowed() {
                    self.sync_recent();
                }
            }
            if self.buffer.len() >= self.config.buffer_docs {
                self.seal_and_tidy()?;
            }
            rest = later;
        }
        Ok(())
    }

    /// Turns inline merges on or off (see [`IndexConfig::auto_merge`]).
    pub fn set_auto_merge(&mut self, on: bool) {
        self.config.auto_merge = on;
    }

    /// Whether the recent tables are in use: configured, and not overflowed by a crowded
    /// prefix (see [`recent`](self::recent)).
    fn recent_on(&self) -> bool {
        self.config.recent_docs > 0 && !self.recent.overflowed()
    }

    /// Splits the runs into those probed one by one and the small ones, whose fingerprints
    /// it adds to the recent tables if they are not there yet; rebuilds the recent tables
    /// when stale entries outnumber live ones. Called after every change of the runs.
    fn sync_recent(&mut self) {
        self.direct.clear();
        self.small.clear();
        if self.config.recent_docs == 0 {
            self.direct.extend(0..self.runs.len());
            return;
        }
        if self.recent.overflowed() {
            // Usable again once nothing it should cover is left: no small run, no buffer.
            let small_left =
                (0..self.runs.len()).any(Self::small_enough(&self.runs, self.config.recent_docs));
            if small_left || !self.buffer.is_empty() || !self.frozen.is_empty() {
                self.direct.extend(0..self.runs.len());
                return;
            }
            self.recent = RecentTables::new(&self.config.design);
            self.uncover();
        }
        let present: HashSet<u64> = self.runs.iter().map(|r| r.id()).collect();
        self.covered.retain(|id| present.contains(id));
        self.deferred.retain(|id, _| present.contains(id));
        let mut held = self.buffer.len() + self.frozen_len();
        let small = Self::small_enough(&self.runs, self.config.recent_docs);
        for (i, r) in self.runs.iter().enumerate() {
            if let Some(d) = self.deferred.get(&r.id()) {
                // Joining a slice at a time: what is in so far counts as held.
                held += r.distinct() / d.slices() * d.done;
                self.direct.push(i);
            } else if small(i) {
                self.small.push(i);
                held += r.distinct();
                if self.covered.insert(r.id()) {
                    let mut fps = Vec::with_capacity(r.distinct());
                    r.for_each_fp(|fp| fps.push(fp));
                    self.recent.insert_many(
                        &self.config.design,
                        fps.iter().copied(),
                        &mut Vec::new(),
                    );
                }
            } else {
                self.direct.push(i);
            }
        }
        drop(small);
        if self.recent.overflowed() {
            // Overflowed just now: every run is probed.
            self.small.clear();
            self.direct.clear();
            self.direct.extend(0..self.runs.len());
        } else if self.recent.len() > 2 * held + 4096 {
            self.uncover();
            let mut fps: Vec<u64> = Vec::with_capacity(held);
            fps.extend(self.buffer.docs().iter().map(|d| d.fp));
            for (_, b) in &self.frozen {
                fps.extend(b.docs().iter().map(|d| d.fp));
            }
            for &i in &self.small {
                let r = &self.runs[i];
                self.covered.insert(r.id());
                r.for_each_fp(|fp| fps.push(fp));
            }
            self.recent.clear_for(fps.len());
            self.recent.insert_many(&self.config.design, fps.iter().copied(), &mut Vec::new());
            if self.recent.overflowed() {
                self.small.clear();
                self.direct.clear();
                self.direct.extend(0..self.runs.len());
            }
        }
    }

    /// Which runs, by position, are small enough to be queried through the recent tables:
    /// all but the largest (by live documents, the newest of equals), each with fewer than
    /// `recent_docs` live documents.
    fn small_enough(runs: &[Arc<Run>], recent_docs: usize) -> impl Fn(usize) -> bool + '_ {
        let largest = (0..runs.len()).max_by_key(|&i| (runs[i].live_len(), i));
        move |i| Some(i) != largest && runs[i].live_len() < recent_docs
    }

    /// For recent tables emptied (or about to be refilled from scratch): no run is in them
    /// any more, and the runs joining a slice at a time start over.
    fn uncover(&mut self) {
        self.covered.clear();
        self.deferred.values_mut().for_each(|d| d.done = 0);
    }

    /// Records that `merged` holds only documents of `sources`: if those were all covered
    /// by the recent tables, so is it (its fingerprints are a subset of theirs). If the rest
    /// are covered and some join a slice at a time, the merged run joins so too, from its
    /// first slice: hashing it whole here would take the hold its sources were spared.
    fn note_merge(&mut self, sources: &[u64], merged: u64) {
        let in_or_waiting = |id| self.covered.contains(id) || self.deferred.contains_key(id);
        if !sources.iter().all(in_or_waiting) {
            return;
        }
        match sources.iter().filter_map(|id| self.deferred.get(id)).map(|d| d.slices_log2).max() {
            None => {
                self.covered.insert(merged);
            }
            Some(slices_log2) => {
                self.deferred.insert(merged, Deferred { slices_log2, done: 0 });
            }
        }
    }

    /// Inserts many documents. A batch at least as large as the buffer becomes a run of its
    /// own directly.
    pub fn insert_batch(&mut self, docs: &[Doc]) -> Result<()> {
        if docs.len() >= self.config.buffer_docs {
            self.seal_buffer()?;
            let beside = self.largest_run();
            let run = Run::build(self.take_run_id(), docs, &self.ctx, beside)?;
            self.runs.push(Arc::new(run));
            self.maybe_merge()?;
            self.sync_recent();
            return Ok(());
        }
        self.insert_many(docs)
    }

    /// Turns the write buffer, and any frozen buffer, into runs now (no-op when both are
    /// empty). Seal jobs of the frozen buffers then fail to finish.
    pub fn flush(&mut self) -> Result<()> {
        if self.buffer.is_empty() && self.frozen.is_empty() {
            return Ok(());
        }
        self.seal_frozen()?;
        self.seal_and_tidy()
    }

    /// Builds the full buffer into a run, then merges as the policy wants (frozen buffers
    /// are left to their seal jobs).
    fn seal_and_tidy(&mut self) -> Result<()> {
        self.seal_buffer()?;
        self.maybe_merge()?;
        self.sync_recent();
        Ok(())
    }

    /// Builds the buffer into the newest run and empties it (no merge).
    fn seal_buffer(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            let beside = self.largest_run();
            let run = Run::build(self.take_run_id(), self.buffer.docs(), &self.ctx, beside)?;
            self.buffer.clear();
            self.push_sealed(run);
        }
        Ok(())
    }

    /// Adds the run built from the buffer or a frozen buffer: every fingerprint of those is
    /// in the recent tables already, so the run is covered by them when they are on.
    fn push_sealed(&mut self, run: Run) {
        if self.recent_on() {
            self.covered.insert(run.id());
        }
        self.runs.push(Arc::new(run));
    }

    /// Freezes the write buffer (`None` when it is empty) and returns the job that builds
    /// its run. The frozen documents stay queryable, and deletable, until the owner installs
    /// the run with [`finish_seal`](Self::finish_seal); no run is built here.
    pub fn freeze_buffer(&mut self) -> Option<SealJob> {
        if self.buffer.is_empty() {
            return None;
        }
        let builder = self.run_builder();
        let buffer = std::mem::take(&mut self.buffer);
        let job = SealJob { docs: buffer.docs().to_vec(), builder };
        self.frozen.push((job.id(), buffer));
        Some(job)
    }

    /// Installs the run built from `job` in place of its frozen buffer. Documents deleted
    /// from the frozen buffer since it was frozen are deleted from the run too. Fails,
    /// changing nothing, if the frozen buffer is gone (sealed by [`flush`](Self::flush)
    /// or [`compact`](Self::compact) meanwhile, or the index restored).
    pub fn finish_seal(&mut self, job: SealJob, run: Run) -> Result<()> {
        if run.id() != job.id() {
            return Err(Error::InvalidConfig("the run does not belong to this seal job".into()));
        }
        let Some(pos) = self.frozen.iter().position(|(id, _)| *id == job.id()) else {
            return Err(Error::InvalidConfig("the frozen buffer is gone from the index".into()));
        };
        let (_, left) = self.frozen.remove(pos);
        let kept: HashSet<u64> = left.docs().iter().map(|d| d.id).collect();
        for d in job.docs.iter().filter(|d| !kept.contains(&d.id)) {
            run.delete_doc(d.id, d.fp);
        }
        self.push_sealed(run);
        self.maybe_merge()?;
        self.sync_recent();
        Ok(())
    }

    /// Frozen buffers not yet installed as runs.
    pub fn frozen_buffers(&self) -> usize {
        self.frozen.len()
    }

    fn frozen_len(&self) -> usize {
        self.frozen.iter().map(|(_, b)| b.len()).sum()
    }

    /// Builds every frozen buffer into its run here and now, oldest first.
    fn seal_frozen(&mut self) -> Result<()> {
        for (id, b) in std::mem::take(&mut self.frozen) {
            let beside = self.largest_run();
            let run = Run::build(id, b.docs(), &self.ctx, beside)?;
            self.push_sealed(run);
        }
        Ok(())
    }

    /// Deletes every document whose id is in `ids`; returns how many were deleted. Scans
    /// the id columns once per call, so batch deletes.
    pub fn delete(&mut self, ids: &[u64]) -> Result<usize> {
        let set: HashSet<u64> = ids.iter().copied().collect();
        let mut n = self.buffer.retain(|d| !set.contains(&d.id));
        for (_, b) in &mut self.frozen {
            n += b.retain(|d| !set.contains(&d.id));
        }
        for r in &self.runs {
            n += r.delete_ids(&set);
        }
        self.compact_deleted()?;
        self.sync_recent();
        Ok(n)
    }

    /// Deletes the document with this id and fingerprint; true if it was found. Costs one
    /// block lookup per run.
    pub fn delete_doc(&mut self, id: u64, fp: u64) -> Result<bool> {
        if self.buffer.remove(id, fp) || self.frozen.iter_mut().any(|(_, b)| b.remove(id, fp)) {
            return Ok(true);
        }
        let found = self.runs.iter().any(|r| r.delete_doc(id, fp));
        if found {
            self.compact_deleted()?;
            self.sync_recent();
        }
        Ok(found)
    }

    /// How many live documents have a fingerprint in `lo..=hi`, exactly: two seeks a run
    /// and a look at the deletion marks of the range, no decoding.
    pub fn live_count_in(&self, lo: u64, hi: u64) -> usize {
        self.runs.iter().map(|r| r.live_in_range(lo, hi)).sum::<usize>()
            + self.buffered_docs().filter(|d| (lo..=hi).contains(&d.fp)).count()
    }

    /// The documents of the frozen buffers and the write buffer.
    fn buffered_docs(&self) -> impl Iterator<Item = &Doc> {
        self.frozen.iter().flat_map(|(_, b)| b.docs()).chain(self.buffer.docs())
    }

    /// Deletes every document whose fingerprint is in `lo..=hi`; returns how many. Costs
    /// two seeks a run and a mark a document, and a pass over the write buffers: a whole
    /// range goes at once, not a lookup a document.
    pub fn delete_range(&mut self, lo: u64, hi: u64) -> Result<usize> {
        if lo > hi {
            return Ok(0);
        }
        let inside = |d: &Doc| (lo..=hi).contains(&d.fp);
        let mut n = self.buffer.retain(|d| !inside(d));
        for (_, b) in &mut self.frozen {
            n += b.retain(|d| !inside(d));
        }
        let in_runs: usize = self.runs.iter().map(|r| r.delete_range(lo, hi)).sum();
        if in_runs > 0 {
            self.compact_deleted()?;
            self.sync_recent();
        }
        Ok(n + in_runs)
    }

    /// Rewrites runs more than half deleted (inline merges only).
    fn compact_deleted(&mut self) -> Result<()> {
        if !self.config.auto_merge {
            return Ok(());
        }
        for i in 0..self.runs.len() {
            if self.runs[i].deleted() * 2 > self.runs[i].len() {
                let id = self.take_run_id();
                let beside = self.largest_run_beside(i..i + 1);
                let merged = Run::merge(id, &self.runs[i..=i], &self.ctx, beside)?;
                self.merges += 1;
                self.merged_docs += merged.len() as u64;
                self.note_merge(&[self.runs[i].id()], id);
                self.runs[i] = Arc::new(merged);
            }
        }
        self.runs.retain(|r| !r.is_empty());
        Ok(())
    }

    fn size_class(&self, docs: usize) -> u32 {
        let f = self.config.merge_fanout;
        let mut cap = self.config.buffer_docs.saturating_mul(f);
        let mut level = 0;
        while docs >= cap {
            level += 1;
            cap = cap.saturating_mul(f);
        }
        level
    }

    /// The next merge the policy wants, as a range of adjacent runs (oldest first):
    ///
    /// 1. size-tiered: `merge_fanout` adjacent runs of one size class, the newest such group
    ///    first (a document is rewritten about `log_fanout(n / buffer_docs)` times);
    /// 2. more than `max_runs` runs: the adjacent pair with the fewest documents, so a
    ///    query never visits many runs, whatever order runs arrived in;
    /// 3. a run more than half deleted, alone, to reclaim its space.
    fn merge_candidates(&self) -> Option<std::ops::Range<usize>> {
        let classes: Vec<u32> = self.runs.iter().map(|r| self.size_class(r.live_len())).collect();
        let f = self.config.merge_fanout;
        let mut end = classes.len();
        while end > 0 {
            let class = classes[end - 1];
            let start = classes[..end].iter().rposition(|&c| c != class).map_or(0, |i| i + 1);
            if end - start >= f {
                return Some(end - f..end);
            }
            end = start;
        }
        if self.runs.len() > self.config.max_runs {
            let i = (0..self.runs.len() - 1)
                .min_by_key(|&i| self.runs[i].live_len() + self.runs[i + 1].live_len())?;
            return Some(i..i + 2);
        }
        self.runs.iter().position(|r| r.deleted() * 2 > r.len()).map(|i| i..i + 1)
    }

    fn maybe_merge(&mut self) -> Result<()> {
        if !self.config.auto_merge {
            return Ok(());
        }
        while let Some(range) = self.merge_candidates() {
            let merged = self.merge_now(range.clone())?;
            self.runs.splice(range, [Arc::new(merged)]);
        }
        Ok(())
    }

    /// Merges the runs in `range` here and now, and counts the merge.
    fn merge_now(&mut self, range: std::ops::Range<usize>) -> Result<Run> {
        let id = self.take_run_id();
        let beside = self.largest_run_beside(range.clone());
        let sources: Vec<u64> = self.runs[range.clone()].iter().map(|r| r.id()).collect();
        let merged = Run::merge(id, &self.runs[range], &self.ctx, beside)?;
        self.count_merge(&merged);
        self.note_merge(&sources, id);
        Ok(merged)
    }

    /// Distinct fingerprints in the largest run: what a new run will sit beside.
    fn largest_run(&self) -> usize {
        self.largest_run_beside(0..0)
    }

    /// Distinct fingerprints in the largest run outside `range` (0 if none): what a run
    /// made from `range` will sit beside.
    fn largest_run_beside(&self, range: std::ops::Range<usize>) -> usize {
        let outside = self.runs[..range.start].iter().chain(&self.runs[range.end..]);
        outside.map(|r| r.distinct()).max().unwrap_or(0)
    }

    fn count_merge(&mut self, merged: &Run) {
        self.merges += 1;
        self.merged_docs += merged.len() as u64;
    }

    /// Whether merging every run into one would change anything: several runs, or one
    /// with deleted documents to drop.
    fn compactable(&self) -> bool {
        self.runs.len() > 1 || self.runs.first().is_some_and(|r| r.deleted() > 0)
    }

    /// A job merging `range` of the runs, for the owner to run off the write path.
    fn job(&mut self, range: std::ops::Range<usize>) -> MergeJob {
        let beside = self.largest_run_beside(range.clone());
        let sources: Vec<Arc<Run>> = self.runs[range].to_vec();
        let marks_at_start = sources.iter().map(|r| r.deletion_marks()).collect();
        let builder = RunBuilder { id: self.take_run_id(), ctx: self.ctx.clone(), beside };
        MergeJob { builder, sources, marks_at_start }
    }

    /// Merges every run into one (and the buffer with them): after a burst of writes, so
    /// queries visit a single run again. Costs a rewrite of every document.
    pub fn compact(&mut self) -> Result<()> {
        self.seal_frozen()?;
        self.seal_buffer()?;
        if self.compactable() {
            let merged = self.merge_now(0..self.runs.len())?;
            self.runs = if merged.is_empty() { Vec::new() } else { vec![Arc::new(merged)] };
        }
        self.sync_recent();
        Ok(())
    }

    /// A job merging every run into one, for the owner to run off the write path (see
    /// [`compact`](Self::compact)); `None` when there is at most one run and nothing to drop.
    pub fn compact_job(&mut self) -> Option<MergeJob> {
        self.compactable().then(|| self.job(0..self.runs.len()))
    }

    /// The next merge the size-tiered policy wants, for the owner to run off the write path
    /// (with `auto_merge` off). The runs stay queryable meanwhile.
    pub fn next_merge(&mut self) -> Option<MergeJob> {
        let range = self.merge_candidates()?;
        Some(self.job(range))
    }

    /// Installs a merged run built from `job`, replacing its sources. Documents deleted from
    /// the sources since the job was taken are deleted from the merged run too. Fails if the
    /// sources are no longer all present (another merge replaced them).
    ///
    /// Returns the replaced runs: a caller holding a lock around the index drops them after
    /// releasing it, since freeing a large run's memory takes a while (a compaction of 10M
    /// documents frees the whole index).
    pub fn finish_merge(&mut self, job: MergeJob, merged: Run) -> Result<Vec<Arc<Run>>> {
        let MergeJob { builder, sources, marks_at_start } = job;
        if merged.id() != builder.id {
            return Err(Error::InvalidConfig("merged run does not belong to this job".into()));
        }
        let positions: Option<Vec<usize>> =
            sources.iter().map(|s| self.runs.iter().position(|r| Arc::ptr_eq(r, s))).collect();
        let Some(mut positions) = positions else {
            return Err(Error::InvalidConfig("merge sources are gone from the index".into()));
        };
        // Under the owner's write lock: the deletions made while the merge ran, found by a
        // pass over each source's marks (not a search per deletion ever made).
        for (src, before) in sources.iter().zip(&marks_at_start) {
            for pos in src.deleted_since(before) {
                if let Some((id, fp)) = src.doc_at(pos as usize) {
                    merged.delete_doc(id, fp);
                }
            }
        }
        positions.sort_unstable();
        let first = positions[0];
        for &p in positions.iter().rev() {
            self.runs.remove(p);
        }
        self.count_merge(&merged);
        let ids: Vec<u64> = sources.iter().map(|s| s.id()).collect();
        self.note_merge(&ids, merged.id());
        self.runs.insert(first, Arc::new(merged));
        self.sync_recent();
        Ok(sources)
    }

    /// Calls `f` with every live document (in the runs, then the write buffer), in no
    /// particular order. Costs a pass over every run's document columns.
    pub fn for_each_live(&self, mut f: impl FnMut(Doc)) {
        for r in &self.runs {
            r.for_each_live(|fp, id, ts| f(Doc { id, fp, ts }));
        }
        for (_, b) in &self.frozen {
            for d in b.docs() {
                f(*d);
            }
        }
        for d in self.buffer.docs() {
            f(*d);
        }
    }

    /// About how many documents have a fingerprint in `lo..=hi`: deleted ones still in a
    /// run count until a merge drops them. Costs two seeks a run and a pass over the write
    /// buffers, not a scan of the range.
    pub fn count_in(&self, lo: u64, hi: u64) -> u64 {
        if lo > hi {
            return 0;
        }
        let in_runs: usize = self.runs.iter().map(|r| r.positions_in(lo, hi).len()).sum();
        (in_runs + self.buffered_docs().filter(|d| (lo..=hi).contains(&d.fp)).count()) as u64
    }

    /// A page of the live documents whose fingerprint is in `lo..=hi`, by fingerprint then
    /// id, and where the next page starts (`None`: the range is done). A page holds every
    /// document of each fingerprint it reaches, about `limit` of them at most in each run
    /// (and the write buffers'): it ends between two fingerprints, so that `lo..=next - 1`
    /// and `next..=hi` split the range. Costs a seek and the page's decoding in each run.
    pub fn live_in(&self, lo: u64, hi: u64, limit: usize) -> (Vec<Doc>, Option<u64>) {
        let limit = limit.max(1);
        let mut out = Vec::new();
        // The page's last fingerprint, once a run had more than `limit` in the range.
        let mut cut: Option<u64> = None;
        for r in &self.runs {
            let (mut n, mut last, mut stopped) = (0usize, None, false);
            r.for_each_live_in(lo, cut.unwrap_or(hi), |fp, id, ts| {
                if n >= limit && last != Some(fp) {
                    stopped = true;
                    return false;
                }
                out.push(Doc { id, fp, ts });
                (n, last) = (n + 1, Some(fp));
                true
            });
            if let (true, Some(l)) = (stopped, last) {
                cut = Some(cut.map_or(l, |c| c.min(l)));
            }
        }
        let end = cut.unwrap_or(hi);
        let buffered = self.buffered_docs();
        out.extend(buffered.filter(|d| (lo..=end).contains(&d.fp)));
        out.retain(|d| d.fp <= end);
        out.sort_unstable_by_key(|d| (d.fp, d.id));
        // A run stopped before a fingerprint above `end`, so `end < hi`.
        (out, cut.map(|c| c + 1))
    }

    /// Every live document within `k` of `fp`, each once, ordered by distance, then
    /// timestamp, then id.
    pub fn query(&self, fp: u64, k: u32) -> Result<Vec<Match>> {
        let mut out = Vec::new();
        self.query_into(fp, k, &mut QueryScratch::default(), &mut out)?;
        Ok(out)
    }

    /// Like [`query`](Self::query), reusing `scratch`; clears `out` and fills it.
    pub fn query_into(
        &self,
        fp: u64,
        k: u32,
        scratch: &mut QueryScratch,
        out: &mut Vec<Match>,
    ) -> Result<()> {
        out.clear();
        let tables = self.probed_tables(k)?;
        self.answer(&[fp], k, tables, scratch, std::slice::from_mut(out));
        Ok(())
    }

    /// Like [`query_into`](Self::query_into) for each of `fps`: `outs[i]` answers `fps[i]`
    /// (`outs` is cleared and refilled). The first memory stages of a few queries run
    /// together, so that their cache misses overlap as those of one query's tables do: what
    /// an index of one table (a cluster node's tablet) needs to answer many probes quickly.
    pub fn query_many_into(
        &self,
        fps: &[u64],
        k: u32,
        scratch: &mut QueryScratch,
        outs: &mut Vec<Vec<Match>>,
    ) -> Result<()> {
        /// Queries whose stages run together.
        const GROUP: usize = 8;
        let tables = self.probed_tables(k)?;
        // Each answer is cleared before it is filled: the vectors a caller reuses keep
        // their memory.
        outs.truncate(fps.len());
        outs.resize_with(fps.len(), Vec::new);
        for (group, outs) in fps.chunks(GROUP).zip(outs.chunks_mut(GROUP)) {
            self.answer(group, k, tables, scratch, outs);
        }
        Ok(())
    }

    /// The tables a query at distance `k` probes.
    fn probed_tables(&self, k: u32) -> Result<&[usize]> {
        self.for_k
            .get(k as usize)
            .map(Vec::as_slice)
            .ok_or_else(|| Error::KOutOfRange { k, max: self.max_k() })
    }

    /// Answers each of `fps` (probing `tables`) into `outs`, one each, cleared first: every
    /// live document within `k`, ordered by distance, then timestamp, then id.
    ///
    /// Stages 1 and 2 (see `Run::finish`) of every query in every run come first, so that
    /// the cache misses of all of them overlap; each table's permutation is applied once
    /// for all runs.
    #[inline]
    fn answer(
        &self,
        fps: &[u64],
        k: u32,
        tables: &[usize],
        scratch: &mut QueryScratch,
        outs: &mut [Vec<Match>],
    ) {
        let design = &self.config.design;
        let specs = design.tables();
        let QueryScratch { pqs, cands, hits, recent } = scratch;
        let on = self.recent_on();
        pqs.clear();
        cands.clear();
        for &fp in fps {
            let from = pqs.len();
            pqs.extend(tables.iter().map(|&t| specs[t].perm.apply(fp)));
            let pqs = &pqs[from..];
            if on {
                self.recent.prefetch(tables, pqs);
            }
            for &i in &self.direct {
                self.runs[i].prefetch(tables, pqs);
            }
            for &i in &self.direct {
                self.runs[i].candidates(tables, pqs, cands);
            }
        }
        let per_query = tables.len();
        let per_runs = self.direct.len() * per_query;
        for (j, (&fp, out)) in fps.iter().zip(outs).enumerate() {
            out.clear();
            let pqs = &pqs[j * per_query..(j + 1) * per_query];
            let cands = &cands[j * per_runs..(j + 1) * per_runs];
            for (&i, c) in self.direct.iter().zip(cands.chunks_exact(per_query.max(1))) {
                let staged = lsm_run::Staged { tables, pqs, cands: c };
                self.runs[i].finish(fp, k, design, staged, hits, out);
            }
            if on {
                // The recent tables find the fingerprints; the small runs and the buffer
                // hold their documents.
                self.recent.probe(design, tables, pqs, k, recent);
                for &f in recent.iter() {
                    for &i in &self.small {
                        self.runs[i].matches_of(f, fp, out);
                    }
                    for (_, b) in &self.frozen {
                        b.matches_of(f, fp, out);
                    }
                    self.buffer.matches_of(f, fp, out);
                }
            } else {
                for (_, b) in &self.frozen {
                    b.scan(fp, k, out);
                }
                self.buffer.scan(fp, k, out);
            }
            if out.len() > 1 {
                out.sort_unstable_by_key(|m| (m.distance, m.ts, m.id));
            }
        }
    }

    /// Answers many queries on all cores; `result[i]` answers `fps[i]`.
    pub fn query_batch(&self, fps: &[u64], k: u32) -> Result<Vec<Vec<Match>>> {
        self.check_k(k)?;
        Ok(fps
            .par_chunks(256)
            .flat_map_iter(|chunk| {
                let mut scratch = QueryScratch::default();
                chunk
                    .iter()
                    .map(|&q| {
                        let mut out = Vec::new();
                        self.query_into(q, k, &mut scratch, &mut out)
                            .map(|_| out)
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    /// Checks `k` against the design.
    pub fn check_k(&self, k: u32) -> Result<()> {
        self.config.design.check_k(k)
    }

    /// Number of live documents.
    pub fn len(&self) -> usize {
        self.unsealed() + self.runs.iter().map(|r| r.live_len()).sum::<usize>()
    }

    /// Whether no live document is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The immutable runs, oldest first.
    pub fn runs(&self) -> &[Arc<Run>] {
        &self.runs
    }

    /// Documents not yet in a run: in the write buffer and in frozen buffers.
    pub fn unsealed(&self) -> usize {
        self.buffer.len() + self.frozen_len()
    }

    /// The documents in the write buffer, oldest first (not those of frozen buffers).
    pub fn buffered(&self) -> &[Doc] {
        self.buffer.docs()
    }

    /// Counts of what the index holds.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            docs: self.len(),
            buffered: self.unsealed(),
            runs: self.runs.len(),
            deleted_pending: self.runs.iter().map(|r| r.deleted()).sum(),
            merges: self.merges,
            merged_docs: self.merged_docs,
        }
    }

    /// Where the index's memory goes.
    pub fn memory(&self) -> MemoryReport {
        let design = &self.config.design;
        let mut tables: Vec<TableMemory> = design
            .tables()
            .iter()
            .map(|_| TableMemory {
                bytes: 0,
                entries: 0,
                bits_per_fp: 0.0,
                crowded_buckets: 0,
                crowded_entries: 0,
            })
            .collect();
        let mut doc_bytes = 0;
        let mut column_bits = (0, 0);
        let mut largest = 0;
        for r in &self.runs {
            let m = r.memory();
            doc_bytes += m.doc_bytes + std::mem::size_of::<Run>();
            if r.len() >= largest {
                largest = r.len();
                column_bits = m.column_bits;
            }
            for (t, b) in tables.iter_mut().zip(&m.tables) {
                t.bytes += b.bytes;
                t.entries += b.entries;
                t.crowded_buckets += b.crowded;
                t.crowded_entries += b.crowded_entries;
            }
        }
        for t in &mut tables {
            t.bits_per_fp =
                if t.entries == 0 { 0.0 } else { t.bytes as f64 * 8.0 / t.entries as f64 };
        }
        let buffer_bytes = self.buffer.heap_bytes()
            + self.frozen.iter().map(|(_, b)| b.heap_bytes()).sum::<usize>();
        let recent_bytes = self.recent.heap_bytes();
        let total_bytes = tables.iter().map(|t| t.bytes).sum::<usize>()
            + doc_bytes
            + buffer_bytes
            + recent_bytes
            + std::mem::size_of::<Self>();
        MemoryReport { total_bytes, tables, doc_bytes, buffer_bytes, recent_bytes, column_bits }
    }
}

#[cfg(test)]
mod tests;
