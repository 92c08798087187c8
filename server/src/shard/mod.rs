//! The shard: the in-memory index and document table, made durable.
//!
//! # Writes
//! A write resolves caller ids to internal ids under the state's write lock, encodes what it
//! does as log records ([`crate::record`]), appends them to the `log` keyspace, applies them
//! to memory, and releases the lock. The caller then waits for group commit
//! ([`crate::commit`]) before it answers: a write is acknowledged only once its records are
//! durable. Queries may see a write a moment before it is durable; an answer that depends on
//! it (a CheckAndInsert that joined its cluster) is itself acknowledged only after a later
//! sync, which covers it too.
//!
//! # Runs, checkpoints and snapshots
//! The index's write buffer becomes a run at record boundaries, so "every record up to
//! sequence F is in the runs" always holds for some F (`covered`). The maintenance thread
//! merges runs off the request path, flushes an idle buffer, and now and then writes a
//! checkpoint: the runs not yet stored, the deletion marks that changed, and a manifest
//! naming the runs and F ([`crate::persist`]). Deletion marks are rewritten in place and may
//! get ahead of F; that is harmless because replaying a delete is a no-op on a marked
//! document and internal ids are never reused. Document data (names, clusters) is kept by
//! the log and by document snapshots, written while writes go on; the log is truncated below
//! what both the manifest and the latest snapshot cover.
//!
//! # Recovery
//! Load the document snapshot and replay the log after it; load the manifest's runs
//! (verifying every checksum; a damaged table is rebuilt from an intact one, a run that
//! cannot be loaded makes the tablet corrupt: it is reported and not served) and replay the
//! log after F into them. What is recovered must match the expectation record the last
//! checkpoint wrote beside the database ([`crate::expect`]), or the tablet is corrupt.
//! Only then does the shard serve.
//!
//! # A failed sync
//! Once a sync of the store fails, the shard acknowledges nothing more and serves nothing
//! ([`Status::Failed`]) until it is restarted; [`crate::commit`] says why.
//!
//! # Where things are
//! This file holds the state and [`Shard::open`]; the rest is split by concern: the types
//! of the shard's API (`shard_types`), the data-directory check (`dir_check`), the status
//! (`status`), recovery (`recovery`), writes and admissions (`write_path`), probes and
//! statistics (`read_path`), background merges and rebuilds (`maintenance`), checkpoints
//! and document snapshots (`checkpoint`).

mod backup;
mod caller_ids;
mod checkpoint;
mod dir_check;
mod maintenance;
mod read_path;
mod recent_puts;
mod recovery;
mod shard_types;
mod status;
mod write_path;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use neardup_core::index::{Run, SealJob};
use neardup_core::{Index, IndexConfig};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::commit::Committer;
use crate::doc_table::DocTable;
use crate::error::{Error, Result};
use crate::expect::{ExpectFile, Expectation};
use crate::metrics::ShardMetrics;
use crate::persist::{self, DocSnapshot, Manifest, Spaces};
use crate::storage::{SledStore, Store};

pub use backup::{BackupCopy, BackupTail, MAX_RESTORED_ID};
pub use caller_ids::EntryOp;
pub use dir_check::{check_data_dir, free_bytes};
pub use shard_types::{
    Admission, DocMatch, NewDocument, ProbeBudget, ProbeHits, ShardStats, TableFootprint, Verify,
    WriteOutcome,
};
pub use status::Status;

/// Longest document id a shard accepts (the log stores lengths as u16).
pub const MAX_ID_BYTES_LIMIT: usize = u16::MAX as usize;

/// How a shard stores and maintains its data.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// The index: table design, block coding, write buffer size, merge fanout. `auto_merge`
    /// is ignored (the shard merges in the background).
    pub index: IndexConfig,
    /// Longest document id, in bytes.
    pub max_id_bytes: usize,
    /// Write a checkpoint once this many log operations are not covered by the last one.
    pub checkpoint_ops: u64,
    /// Write a checkpoint this long after the last one when anything changed.
    pub checkpoint_interval: Duration,
    /// Turn the write buffer into a run after this long without writes.
    pub idle_flush: Duration,
    /// Merge every run into one, and write a checkpoint, after this long without writes.
    pub compact_idle: Duration,
    /// Write a document snapshot (and truncate the log) once the log holds this many bytes.
    pub snapshot_log_bytes: u64,
    /// Largest log record; bigger writes are split (each record is atomic). Small records
    /// keep sled's leaves of the log (16 records) inline in its log file: larger leaves
    /// become blob files, rewritten whole every ten appends.
    pub max_record_bytes: usize,
    /// Tables of each run written to disk: the first this many of the design (at least 1).
    /// Every table holds the same fingerprints, so the others are rebuilt from them when a
    /// run is loaded: fewer bytes on disk for a longer start. Two keep a damaged table
    /// repairable from the other.
    pub stored_tables: usize,
    /// Rebuild the whole index as one run, in the background, when it has more runs than
    /// this and the merge policy has nothing to merge (runs pile up when writes outpace
    /// merges; every query visits every run).
    pub max_runs: usize,
    /// The storage engine's page cache.
    pub cache_bytes: u64,
    /// Refuse to start when the data directory's file system has less free space.
    pub min_free_bytes: u64,
    /// Keep a document table (names, clusters, document snapshots). Off, the shard holds
    /// bare index entries `(id, fp)` with ids the caller assigns: no names, nothing per
    /// entry beyond the index's columns (a cluster node's tablets, see
    /// [`crate::node_store`]); it is written with [`Shard::write_entries`] only.
    pub names: bool,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            index: IndexConfig::default(),
            max_id_bytes: 1024,
            checkpoint_ops: 1_000_000,
            checkpoint_interval: Duration::from_secs(60),
            idle_flush: Duration::from_secs(1),
            compact_idle: Duration::from_secs(30),
            snapshot_log_bytes: 256 << 20,
            max_record_bytes: 4 << 10,
            stored_tables: 2,
            max_runs: 12,
            cache_bytes: 256 << 20,
            min_free_bytes: 64 << 20,
            names: true,
        }
    }
}

/// What the write lock protects.
struct State {
    index: Index,
    docs: DocTable,
    /// Sequence of the last log record appended.
    last_seq: u64,
    /// Every record up to this sequence is in the index's runs (none in its buffer).
    covered: u64,
    /// When the last write was applied.
    last_write: Instant,
    /// Bytes of log records stored.
    log_bytes: u64,
    /// Which index the runs belong to: a rebuilt index ([`Shard::compact_all`]) numbers
    /// its runs afresh, so a run is named by this and its id ([`RunKey`]).
    generation: u64,
    /// Frozen write buffers whose runs the sealing thread is building, oldest first
    /// ([`Shard::freeze_if_full`]).
    seals: VecDeque<PendingSeal>,
}

impl State {
    /// Builds the write buffer and every frozen buffer into runs here and now, so that the
    /// runs hold every record up to `covered` (and no seal job is pending any more).
    fn seal_all(&mut self, covered: u64) -> Result<()> {
        self.index.flush()?;
        self.covered = covered;
        self.seals.clear();
        Ok(())
    }

    /// Whether some record is not in the runs yet: entries buffered, or records past
    /// `covered` (removes, already marked in the runs).
    fn behind(&self) -> bool {
        self.index.unsealed() > 0 || self.covered < self.last_seq
    }

    /// Makes the runs hold every record appended ([`seal_all`](Self::seal_all)), if they
    /// do not yet.
    fn cover_all(&mut self) -> Result<()> {
        if self.behind() {
            let last = self.last_seq;
            self.seal_all(last)?;
        }
        Ok(())
    }
}

/// A frozen write buffer whose run is being built off the write lock.
#[derive(Debug, Clone, Copy)]
struct PendingSeal {
    /// The index it belongs to ([`State::generation`]).
    generation: u64,
    /// The id its run will have.
    run: u64,
    /// Its run holds every record up to this sequence that the runs before it do not:
    /// `covered` once it is installed.
    upto: u64,
}

/// Frozen write buffers the write path may leave to the sealing thread before it builds
/// them under its lock itself (the thread is behind).
const MAX_FROZEN: usize = 4;

/// A sketch change waiting for the sketch store: its record's log sequence, and the sketch
/// (`None`: removed).
type QueuedSketch = (u64, Option<Vec<u8>>);

/// The sending side of the sealing thread's queue, and the thread.
type Sealer = (std::sync::mpsc::Sender<(u64, SealJob)>, std::thread::JoinHandle<()>);

/// A run of the index in memory: its index's generation and its id there
/// ([`Run::id`], unique within one index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RunKey {
    generation: u64,
    run: u64,
}

impl RunKey {
    fn of(st: &State, run: &Run) -> RunKey {
        RunKey { generation: st.generation, run: run.id() }
    }
}

/// Where a run of the index is stored.
struct StoredRun {
    /// The storage id the checkpoint gave it (runs are stored under it, the manifest names
    /// it).
    sid: u64,
    /// Its deletion marks as last written.
    deletes_written: usize,
}

/// What the checkpoint lock protects.
struct Checkpoints {
    /// The index's runs that are stored, and where.
    stored: HashMap<RunKey, StoredRun>,
    manifest: Manifest,
    docsnap: DocSnapshot,
    last: Instant,
    /// Log bytes the last document snapshot made obsolete: the next one waits for as many.
    snapshot_bytes: u64,
}

impl Checkpoints {
    /// Whether the index's runs or the sequence they cover differ from the last checkpoint.
    fn runs_changed(&self, st: &State) -> bool {
        st.covered != self.manifest.covered || st.index.runs().len() != self.stored.len()
    }

    /// Whether anything the log holds is not yet in the last checkpoint: changed runs, log
    /// records past what it covers (a buffer, or removes), or removes not yet written.
    fn pending(&self, st: &State) -> bool {
        self.runs_changed(st)
            || st.last_seq != self.manifest.covered
            || st.index.runs().iter().any(|run| {
                self.stored
                    .get(&RunKey::of(st, run))
                    .is_none_or(|s| s.deletes_written != run.deleted())
            })
    }
}

/// A shard node's data: see the module docs.
pub struct Shard {
    config: ShardConfig,
    path: PathBuf,
    store: Arc<dyn Store>,
    spaces: Spaces,
    state: RwLock<State>,
    /// The one record of the status (see [`status`]); shared with the committer, which
    /// sets [`Status::Failed`] when a sync fails.
    status: Arc<tokio::sync::watch::Sender<Status>>,
    commit: std::sync::OnceLock<Committer>,
    /// Taken before `state` whenever both are held.
    checkpoints: Mutex<Checkpoints>,
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    maintenance: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Builds frozen write buffers into runs off the write lock (see
    /// [`Shard::freeze_if_full`]) and writes queued sketches; `None` before recovery and
    /// after shutdown.
    sealer: Mutex<Option<Sealer>>,
    /// Sketch changes logged but not yet written to the sketch store, by internal id
    /// (`None`: removed), with the sequence of the record; see [`Shard::queue_sketches`].
    pending_sketches: Mutex<HashMap<u64, QueuedSketch>>,
    /// The start of every open backup copy ([`BackupCopy`]): the log keeps every record
    /// after the smallest.
    backup_pins: Mutex<Vec<u64>>,
    /// One round of maintenance at a time (merges must not overlap).
    maintaining: Mutex<()>,
    metrics: ShardMetrics,
    /// The documents stored by the latest records (taken only under `state`'s write lock),
    /// so an admission need not query the index twice ([`recent_puts`]).
    recent: Mutex<recent_puts::RecentPuts>,
    /// Admissions that took the documents stored since their query from `recent`, and those
    /// that had to query again (tests check both paths run).
    #[cfg(test)]
    admissions_by_delta: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    /// Runs the sealing thread built and installed (tests check the path runs).
    #[cfg(test)]
    sealed_off_lock: std::sync::atomic::AtomicU64,
    /// The expectation file ([`crate::expect`]) and what it held at open; `None` over a
    /// store the caller opened.
    expect: Option<(ExpectFile, Option<Expectation>)>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).field("status", &self.status()).finish()
    }
}

/// The configuration with the shard's own settings applied, or why it cannot be used.
fn checked(mut config: ShardConfig) -> Result<ShardConfig> {
    config.index.auto_merge = false;
    config.index.validate()?;
    if config.index.buffer_docs < 2 {
        return Err(Error::InvalidInput("buffer_docs must be at least 2".into()));
    }
    if config.max_id_bytes == 0 || config.max_id_bytes > MAX_ID_BYTES_LIMIT {
        return Err(Error::InvalidInput(format!(
            "max_id_bytes must be in 1..={MAX_ID_BYTES_LIMIT}"
        )));
    }
    Ok(config)
}

impl Shard {
    /// Opens the shard's storage (sled, in `path/db`), checking the directory first and
    /// reading the expectation record recovery checks against ([`crate::expect`]); the
    /// shard is [`Status::Recovering`] until [`recover`](Self::recover) has run. A database
    /// that cannot be opened (damaged, unreadable, a damaged record) is an error here.
    pub fn open(path: &Path, config: ShardConfig, metrics: ShardMetrics) -> Result<Arc<Shard>> {
        let config = checked(config)?;
        check_data_dir(path, config.min_free_bytes)?;
        let file = ExpectFile::in_dir(path);
        let expected = file.read().map_err(|e| Error::DataDir {
            path: path.display().to_string(),
            reason: match e {
                Error::CorruptTablet(m) => m,
                e => e.to_string(),
            },
        })?;
        let store = Arc::new(SledStore::open(&path.join("db"), config.cache_bytes)?);
        let mut shard = Shard::open_with_store(path, store, config, metrics)?;
        Arc::get_mut(&mut shard).expect("not shared yet").expect = Some((file, expected));
        Ok(shard)
    }

    /// Opens the shard over `store`, which the caller opened: tests pass a
    /// [`FaultyStore`](crate::fault_store::FaultyStore) to inject faults. `path` names the
    /// data directory in messages and [`path`](Self::path); nothing is read from it, and the
    /// config's `cache_bytes` and `min_free_bytes` are the caller's concern. The shard is
    /// [`Status::Recovering`] until [`recover`](Self::recover) has run.
    pub fn open_with_store(
        path: &Path,
        store: Arc<dyn Store>,
        config: ShardConfig,
        metrics: ShardMetrics,
    ) -> Result<Arc<Shard>> {
        let config = checked(config)?;
        let spaces = Spaces {
            meta: store.space("meta")?,
            log: store.log("log")?,
            run_meta: store.space("run_meta")?,
            run_tables: store.space("run_tables")?,
            run_blocks: store.space("run_blocks")?,
            run_deletes: store.space("run_deletes")?,
            docs: store.space("docs")?,
            sketches: store.slots("sketches")?,
        };
        match spaces.meta.get(b"format")? {
            None => {
                spaces.meta.put(b"format", persist::FORMAT)?;
                store.sync()?;
            }
            Some(f) if f == persist::FORMAT => {}
            Some(f) => {
                return Err(Error::Incompatible(format!(
                    "stored format {:?}, this build reads {:?}",
                    String::from_utf8_lossy(&f),
                    String::from_utf8_lossy(persist::FORMAT)
                )));
            }
        }
        let index = Index::new(config.index.clone())?;
        Ok(Arc::new(Shard {
            path: path.to_path_buf(),
            store,
            spaces,
            state: RwLock::new(State {
                index,
                docs: DocTable::new(),
                last_seq: 0,
                covered: 0,
                last_write: Instant::now(),
                log_bytes: 0,
                generation: 0,
                seals: VecDeque::new(),
            }),
            status: Arc::new(tokio::sync::watch::Sender::new(Status::Recovering)),
            commit: std::sync::OnceLock::new(),
            checkpoints: Mutex::new(Checkpoints {
                stored: HashMap::new(),
                manifest: Manifest { next_sid: 1, ..Default::default() },
                docsnap: DocSnapshot::default(),
                last: Instant::now(),
                snapshot_bytes: 0,
            }),
            wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            maintenance: Mutex::new(None),
            sealer: Mutex::new(None),
            pending_sketches: Mutex::new(HashMap::new()),
            backup_pins: Mutex::new(Vec::new()),
            maintaining: Mutex::new(()),
            // Four write buffers of documents: what a shard stores during an admission's
            // query at hundreds of thousands of documents a second.
            recent: Mutex::new(recent_puts::RecentPuts::new(4 * config.index.buffer_docs)),
            #[cfg(test)]
            admissions_by_delta: Default::default(),
            #[cfg(test)]
            sealed_off_lock: Default::default(),
            metrics,
            config,
            expect: None,
        }))
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration in force.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// The shard's metrics (shared with whoever registered them).
    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// The largest k the design answers.
    pub fn max_k(&self) -> u32 {
        self.config.index.design.max_k()
    }

    fn committer(&self) -> Result<&Committer> {
        self.commit.get().ok_or(Error::Recovering)
    }

    /// Syncs the store outside group commit (checkpoints, snapshots, shutdown), under the
    /// same rule: once a sync has failed, no later one is trusted (see [`crate::commit`]).
    fn sync(&self) -> Result<()> {
        match self.commit.get() {
            Some(c) => c.sync(),
            None => self.store.sync(),
        }
    }

    fn wake(&self) {
        let mut w = self.wake.0.lock();
        *w = true;
        self.wake.1.notify_one();
    }

    /// Stops taking requests, turns the buffer into a run, writes a checkpoint and syncs.
    /// Call after the servers in front have drained their requests. Waits for a merge under
    /// way to finish.
    pub fn shutdown(&self) -> Result<()> {
        let serving = self.stop_threads();
        if serving {
            {
                let mut st = self.state.write();
                if st.index.unsealed() > 0 {
                    let last = st.last_seq;
                    st.seal_all(last)?;
                }
            }
            self.drain_sketches()?;
            self.checkpoint()?;
        }
        if let Some(c) = self.commit.get() {
            c.stop();
        }
        self.sync()?;
        tracing::info!(path = %self.path.display(), "shard stopped; data synced");
        Ok(())
    }

    /// Stops taking requests and stops the background threads, writing nothing more: the
    /// data is left as a crash would leave it after the last sync. For tests and tools that
    /// reopen the data in the same process.
    pub fn close_without_checkpoint(&self) {
        self.stop_threads();
        if let Some(c) = self.commit.get() {
            c.stop();
        }
    }

    /// Opens a shard over `store`, shared with other shards (each under its own prefix of
    /// keyspace names, see [`crate::storage::PrefixedStore`]), keeping its expectation file
    /// ([`crate::expect`]) in `dir`, which is created if needed. Like [`open`](Self::open)
    /// otherwise: [`Status::Recovering`] until [`recover`](Self::recover) has run.
    pub fn open_shared(
        dir: &Path,
        store: Arc<dyn Store>,
        config: ShardConfig,
        metrics: ShardMetrics,
    ) -> Result<Arc<Shard>> {
        std::fs::create_dir_all(dir).map_err(|e| Error::DataDir {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let file = ExpectFile::in_dir(dir);
        let expected = file.read().map_err(|e| Error::DataDir {
            path: dir.display().to_string(),
            reason: match e {
                Error::CorruptTablet(m) => m,
                e => e.to_string(),
            },
        })?;
        let mut shard = Shard::open_with_store(dir, store, config, metrics)?;
        Arc::get_mut(&mut shard).expect("not shared yet").expect = Some((file, expected));
        Ok(shard)
    }

    /// Live documents (or, without names, index entries).
    fn live(&self, st: &State) -> usize {
        if self.config.names { st.docs.len() } else { st.index.len() }
    }

    /// Refuses new requests and joins the maintenance thread; true if it was serving.
    fn stop_threads(&self) -> bool {
        let serving = self.status() == Status::Serving;
        self.set_status(Status::ShuttingDown);
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(h) = self.maintenance.lock().take() {
            let _ = h.join();
        }
        // Dropping the sender ends the sealing thread once it has finished its queue.
        let sealer = self.sealer.lock().take();
        if let Some((tx, h)) = sealer {
            drop(tx);
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        serving
    }
}

#[cfg(test)]
mod durability_tests;
#[cfg(test)]
mod shard_tests;
