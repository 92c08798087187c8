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
//! log after F into them. Only then does the shard serve.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use neardup_core::index::{MergeJob, QueryScratch, Run};
use neardup_core::{Doc, Index, IndexConfig, Match};
use neardup_proto::internal::ShardDocument;
use neardup_proto::v1::{
    self as pb, CheckAndInsertResponse, QueryResult, StatsResponse, TableStats,
};
use parking_lot::{Condvar, Mutex, RwLock};
use rayon::prelude::*;

use crate::commit::Committer;
use crate::docs::{DocEntry, DocTable};
use crate::error::{Error, Result};
use crate::metrics::ShardMetrics;
use crate::persist::{self, DocSnapshot, Manifest, Spaces, key64};
use crate::record::{self, Op, RecordWriter};
use crate::storage::{SledStore, Store};

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
    /// Largest log record; bigger writes are split (each record is atomic).
    pub max_record_bytes: usize,
    /// Rebuild the whole index as one run, in the background, when it has more runs than
    /// this and the merge policy has nothing to merge (runs pile up when writes outpace
    /// merges; every query visits every run).
    pub max_runs: usize,
    /// The storage engine's page cache.
    pub cache_bytes: u64,
    /// Refuse to start when the data directory's file system has less free space.
    pub min_free_bytes: u64,
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
            max_record_bytes: 64 << 10,
            max_runs: 12,
            cache_bytes: 256 << 20,
            min_free_bytes: 64 << 20,
        }
    }
}

/// Whether a shard answers requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Loading runs and replaying the log; requests are refused (retry later).
    Recovering,
    /// Answering requests.
    Serving,
    /// A tablet could not be loaded; nothing is served. The message says what is damaged.
    Corrupt(String),
    /// Shutting down; requests are refused.
    ShuttingDown,
}

const RECOVERING: u8 = 0;
const SERVING: u8 = 1;
const CORRUPT: u8 = 2;
const SHUTTING_DOWN: u8 = 3;

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
}

/// A run the last checkpoint stored.
struct StoredRun {
    /// Keeps the run alive, so its address identifies it.
    _run: Arc<Run>,
    sid: u64,
    deletes_written: usize,
}

/// What the checkpoint lock protects.
struct Checkpoints {
    /// Stored runs by address of their `Run`.
    stored: HashMap<usize, StoredRun>,
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
}

/// What a write did; `seq` is the log sequence to wait for before acknowledging it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Documents stored.
    pub inserted: u64,
    /// Of those, replacements.
    pub replaced: u64,
    /// Documents removed.
    pub deleted: u64,
    /// Delete ids that were not stored.
    pub missing: Vec<String>,
    /// Wait for this sequence to be durable before acknowledging.
    pub seq: u64,
}

/// A shard node's data: see the module docs.
pub struct Shard {
    config: ShardConfig,
    path: PathBuf,
    store: Arc<dyn Store>,
    spaces: Spaces,
    state: RwLock<State>,
    status: AtomicU8,
    corrupt: Mutex<String>,
    status_tx: tokio::sync::watch::Sender<Status>,
    commit: std::sync::OnceLock<Committer>,
    /// Taken before `state` whenever both are held.
    checkpoints: Mutex<Checkpoints>,
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    maintenance: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// One round of maintenance at a time (merges must not overlap).
    maintaining: Mutex<()>,
    metrics: ShardMetrics,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).field("status", &self.status()).finish()
    }
}

/// Checks the data directory can be used: it exists or can be created, is writable, and
/// its file system has at least `min_free` bytes free. Errors say which and why.
pub fn check_data_dir(path: &Path, min_free: u64) -> Result<()> {
    let fail = |reason: String| Error::DataDir { path: path.display().to_string(), reason };
    if path.exists() && !path.is_dir() {
        return Err(fail("exists and is not a directory".into()));
    }
    std::fs::create_dir_all(path).map_err(|e| fail(format!("cannot be created: {e}")))?;
    let probe = path.join(".write-probe");
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&probe)?;
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| fail(format!("is not writable: {e}")))?;
    let free = free_bytes(path).map_err(|e| fail(format!("cannot read free space: {e}")))?;
    if free < min_free {
        return Err(fail(format!(
            "its file system is full: {free} bytes free, at least {min_free} needed \
             (set min_free_bytes to change the limit)"
        )));
    }
    Ok(())
}

/// Bytes available to unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("path contains a NUL byte"))?;
    // SAFETY: statvfs is a plain C struct of integers, for which all-zero bytes are valid.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

/// Checks a caller id.
fn check_name(name: &str, max: usize) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidInput("a document id must not be empty".into()));
    }
    if name.len() > max {
        return Err(Error::InvalidInput(format!(
            "document id is {} bytes, more than the limit of {max}",
            name.len()
        )));
    }
    Ok(())
}

/// Groups of operations (a replacement's remove and put stay together) cut into records.
struct RecordPlan<'a> {
    groups: Vec<([Option<Op<'a>>; 2], usize)>,
}

impl<'a> RecordPlan<'a> {
    fn new() -> Self {
        RecordPlan { groups: Vec::new() }
    }

    fn push(&mut self, first: Op<'a>, second: Option<Op<'a>>) {
        let bytes = first.encoded_len() + second.map_or(0, |o| o.encoded_len());
        self.groups.push(([Some(first), second], bytes));
    }

    /// Records of at most `max_bytes` (unless one group is larger) and `max_puts` puts.
    fn records(&self, max_bytes: usize, max_puts: usize) -> Vec<Vec<Op<'a>>> {
        let mut out = Vec::new();
        let mut cur: Vec<Op<'a>> = Vec::new();
        let (mut bytes, mut puts) = (record::RECORD_OVERHEAD, 0);
        for (ops, b) in &self.groups {
            let p = ops.iter().flatten().filter(|o| matches!(o, Op::Put { .. })).count();
            if !cur.is_empty() && (bytes + b > max_bytes || puts + p > max_puts) {
                out.push(std::mem::take(&mut cur));
                bytes = record::RECORD_OVERHEAD;
                puts = 0;
            }
            cur.extend(ops.iter().flatten().copied());
            bytes += b;
            puts += p;
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }
}

impl Shard {
    /// Opens the shard's storage in `path`, checking the directory first; the shard is
    /// [`Status::Recovering`] until [`recover`](Self::recover) has run.
    pub fn open(path: &Path, mut config: ShardConfig, metrics: ShardMetrics) -> Result<Arc<Shard>> {
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
        check_data_dir(path, config.min_free_bytes)?;
        let store: Arc<dyn Store> =
            Arc::new(SledStore::open(&path.join("db"), config.cache_bytes)?);
        let spaces = Spaces {
            meta: store.space("meta")?,
            log: store.space("log")?,
            run_meta: store.space("run_meta")?,
            run_tables: store.space("run_tables")?,
            run_blocks: store.space("run_blocks")?,
            run_deletes: store.space("run_deletes")?,
            docs: store.space("docs")?,
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
        let (status_tx, _) = tokio::sync::watch::channel(Status::Recovering);
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
            }),
            status: AtomicU8::new(RECOVERING),
            corrupt: Mutex::new(String::new()),
            status_tx,
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
            maintaining: Mutex::new(()),
            metrics,
            config,
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

    /// The largest k the design answers.
    pub fn max_k(&self) -> u32 {
        self.config.index.design.max_k()
    }

    /// The current status.
    pub fn status(&self) -> Status {
        match self.status.load(Ordering::Acquire) {
            RECOVERING => Status::Recovering,
            SERVING => Status::Serving,
            CORRUPT => Status::Corrupt(self.corrupt.lock().clone()),
            _ => Status::ShuttingDown,
        }
    }

    /// Status changes, for health reporting.
    pub fn watch_status(&self) -> tokio::sync::watch::Receiver<Status> {
        self.status_tx.subscribe()
    }

    fn set_status(&self, s: Status) {
        let code = match &s {
            Status::Recovering => RECOVERING,
            Status::Serving => SERVING,
            Status::Corrupt(m) => {
                *self.corrupt.lock() = m.clone();
                CORRUPT
            }
            Status::ShuttingDown => SHUTTING_DOWN,
        };
        self.status.store(code, Ordering::Release);
        self.status_tx.send_replace(s);
    }

    #[inline]
    fn check_serving(&self) -> Result<()> {
        match self.status.load(Ordering::Acquire) {
            SERVING => Ok(()),
            RECOVERING => Err(Error::Recovering),
            CORRUPT => Err(Error::CorruptTablet(self.corrupt.lock().clone())),
            _ => Err(Error::ShuttingDown),
        }
    }

    fn committer(&self) -> Result<&Committer> {
        self.commit.get().ok_or(Error::Recovering)
    }

    /// Loads the stored data and starts the background threads; blocks until done. On a
    /// damaged tablet the shard becomes [`Status::Corrupt`] (and this returns the error); on
    /// other failures it stays [`Status::Recovering`].
    pub fn recover(self: &Arc<Self>) -> Result<()> {
        let started = Instant::now();
        match self.recover_inner() {
            Ok(()) => {
                let secs = started.elapsed().as_secs_f64();
                self.metrics.recovered(secs);
                self.refresh_gauges(true);
                let st = self.state.read();
                tracing::info!(
                    documents = st.docs.len(),
                    runs = st.index.runs().len(),
                    seconds = secs,
                    "recovered"
                );
                drop(st);
                self.set_status(Status::Serving);
                let me = self.clone();
                let handle = std::thread::Builder::new()
                    .name("neardup-maintenance".into())
                    .spawn(move || me.maintenance_loop())
                    .expect("spawn the maintenance thread");
                *self.maintenance.lock() = Some(handle);
                Ok(())
            }
            Err(e) => {
                if let Error::CorruptTablet(msg) = &e {
                    tracing::error!(error = %msg, path = %self.path.display(),
                        "tablet is corrupt; it is not served");
                    self.metrics.set_corrupt(true);
                    self.set_status(Status::Corrupt(msg.clone()));
                }
                Err(e)
            }
        }
    }

    fn recover_inner(&self) -> Result<()> {
        let s = &self.spaces;
        let manifest = match s.meta.get(b"manifest")? {
            Some(b) => Manifest::decode(&b)?,
            None => Manifest { next_sid: 1, ..Default::default() },
        };
        let docsnap = match s.meta.get(b"docsnap")? {
            Some(b) => DocSnapshot::decode(&b)?,
            None => DocSnapshot::default(),
        };
        // Documents (snapshot, then the log after it) and the index (runs, then the log after
        // the manifest) are independent: load them at once.
        let (docs_part, index_part) =
            rayon::join(|| self.recover_docs(&docsnap), || self.recover_index(&manifest));
        let (docs, mut last_seq, log_bytes) = docs_part?;
        let (index, stored_runs, rebuilt, buffer_empty) = index_part?;
        let sids: Vec<u64> = stored_runs.iter().map(|&(sid, _)| sid).collect();
        last_seq = last_seq.max(manifest.last_seq).max(manifest.covered).max(docsnap.covered);
        let covered = if buffer_empty { last_seq } else { manifest.covered };
        if docs.len() != index.len() {
            return Err(Error::CorruptTablet(format!(
                "documents ({}) and index ({}) disagree after recovery",
                docs.len(),
                index.len()
            )));
        }
        // Remember what is stored; repair rebuilt tables; drop garbage.
        {
            let mut ck = self.checkpoints.lock();
            // Deletion marks as stored, not as replayed from the log: the next checkpoint
            // writes the replayed ones before its manifest passes their records.
            for (run, &(sid, deletes_written)) in index.runs().iter().zip(&stored_runs) {
                ck.stored.insert(
                    Arc::as_ptr(run) as usize,
                    StoredRun { _run: run.clone(), sid, deletes_written },
                );
            }
            for (sid, tables) in &rebuilt {
                if let Some(pos) = sids.iter().position(|s| s == sid) {
                    persist::rewrite_tables(s, *sid, &index.runs()[pos], tables)?;
                }
            }
            for sid in persist::stored_run_ids(s)? {
                if !manifest.runs.contains(&sid) {
                    persist::remove_run(s, sid)?;
                }
            }
            // Chunks of older snapshots: every key outside the current snapshot's prefix.
            if docsnap.id == 0 {
                s.docs.remove_range(&[], &[0xFF; 13])?;
            } else {
                s.docs.remove_range(&[], &key64(docsnap.id))?;
                s.docs.remove_range(&key64(docsnap.id + 1), &[0xFF; 13])?;
            }
            ck.manifest = Manifest { last_seq, ..manifest };
            ck.docsnap = docsnap;
            ck.snapshot_bytes = log_bytes.min(self.config.snapshot_log_bytes);
        }
        self.store.sync()?;
        let mut st = self.state.write();
        *st = State { index, docs, last_seq, covered, last_write: Instant::now(), log_bytes };
        drop(st);
        self.commit.set(Committer::start(self.store.clone(), last_seq, self.metrics.clone())).ok();
        Ok(())
    }

    /// Recovery of the document table: the snapshot, then every later log record. Returns
    /// the table, the last log sequence and the log's size.
    fn recover_docs(&self, docsnap: &DocSnapshot) -> Result<(DocTable, u64, u64)> {
        let s = &self.spaces;
        let mut docs = DocTable::new();
        if docsnap.id != 0 {
            // Chunks decoded on every core, then the table built at once.
            let chunks: Vec<Vec<DocEntry>> = (0..docsnap.chunks)
                .into_par_iter()
                .map(|c| {
                    let bytes =
                        s.docs.get(&DocSnapshot::chunk_key(docsnap.id, c))?.ok_or_else(|| {
                            Error::CorruptTablet(format!("document snapshot chunk {c} is missing"))
                        })?;
                    record::decode(&bytes)?
                        .into_iter()
                        .map(|op| match op {
                            Op::Put { id, fp, ts, cluster, name } => {
                                Ok(DocEntry { id, fp, ts, cluster, name: name.into() })
                            }
                            Op::Remove { .. } => Err(Error::CorruptTablet(format!(
                                "document snapshot chunk {c} holds a removal"
                            ))),
                        })
                        .collect()
                })
                .collect::<Result<_>>()?;
            let mut entries = Vec::with_capacity(chunks.iter().map(Vec::len).sum());
            for c in chunks {
                entries.extend(c);
            }
            docs = DocTable::from_entries(entries);
        }
        let (mut last_seq, mut log_bytes) = (0, 0u64);
        for e in s.log.scan(&key64(0), &[0xFF; 9]) {
            let (k, v) = e?;
            let seq = u64::from_be_bytes(
                k.as_slice().try_into().map_err(|_| Error::CorruptTablet("log key".into()))?,
            );
            log_bytes += v.len() as u64;
            last_seq = last_seq.max(seq);
            if seq > docsnap.covered {
                for op in record::decode(&v)? {
                    docs.apply(&op);
                }
            }
        }
        Ok((docs, last_seq, log_bytes))
    }

    /// Recovery of the index: the manifest's runs (checksums verified, damaged tables
    /// rebuilt), then the log records after the manifest. Returns the index, each run's
    /// storage id and deletion count as stored, the rebuilt tables, and whether the write
    /// buffer is empty.
    #[allow(clippy::type_complexity)]
    fn recover_index(
        &self,
        manifest: &Manifest,
    ) -> Result<(Index, Vec<(u64, usize)>, Vec<(u64, Vec<usize>)>, bool)> {
        let s = &self.spaces;
        let mut index = Index::new(self.config.index.clone())?;
        let loaded: Vec<(u64, persist::LoadedRun)> = manifest
            .runs
            .par_iter()
            .map(|&sid| persist::load_run(s, sid, &index).map(|l| (sid, l)))
            .collect::<Result<_>>()?;
        let mut rebuilt = Vec::new();
        for (sid, l) in &loaded {
            if !l.rebuilt.is_empty() {
                tracing::warn!(run = sid, tables = ?l.rebuilt,
                    "damaged or missing tables were rebuilt from intact ones");
                self.metrics.rebuilt(l.rebuilt.len());
                rebuilt.push((*sid, l.rebuilt.clone()));
            }
        }
        let stored: Vec<(u64, usize)> =
            loaded.iter().map(|(sid, l)| (*sid, l.run.deleted())).collect();
        index.restore(loaded.into_iter().map(|(_, l)| l.run).collect())?;
        let mut pending: Vec<Doc> = Vec::new();
        let mut pending_ids: HashSet<u64> = HashSet::new();
        let mut removed: HashSet<u64> = HashSet::new();
        for e in s.log.scan(&key64(manifest.covered + 1), &[0xFF; 9]) {
            let (_, v) = e?;
            for op in record::decode(&v)? {
                match op {
                    Op::Put { id, fp, ts, .. } => {
                        pending.push(Doc { id, fp, ts });
                        pending_ids.insert(id);
                    }
                    Op::Remove { id, fp } => {
                        if pending_ids.remove(&id) {
                            removed.insert(id);
                        } else {
                            index.delete_doc(id, fp)?;
                        }
                    }
                }
            }
        }
        pending.retain(|d| !removed.contains(&d.id));
        // Restored runs leave the buffer empty; replayed documents form one run, or stay in
        // the buffer when they are fewer than it holds.
        index.insert_batch(&pending)?;
        let empty = index.buffered().is_empty();
        Ok((index, stored, rebuilt, empty))
    }

    /// Stores documents and removes ids (see [`WriteOutcome`]). The caller must wait for
    /// `seq` to be durable ([`wait_durable`](Self::wait_durable)) before acknowledging. A
    /// request that fails validation changes nothing.
    pub fn write(
        &self,
        docs: &[ShardDocument],
        deletes: &[String],
        must_exist: bool,
    ) -> Result<WriteOutcome> {
        self.check_serving()?;
        let max = self.config.max_id_bytes;
        for d in docs {
            check_name(&d.id, max)?;
        }
        for name in deletes {
            check_name(name, max)?;
        }
        // The last document with a given id wins.
        let mut last: HashMap<&str, usize> = HashMap::with_capacity(docs.len());
        for (i, d) in docs.iter().enumerate() {
            last.insert(d.id.as_str(), i);
        }
        if let Some(n) = deletes.iter().find(|n| last.contains_key(n.as_str())) {
            return Err(Error::InvalidInput(format!(
                "id {n:?} is both stored and deleted by one request"
            )));
        }
        let mut st = self.state.write();
        let st = &mut *st;
        let mut out = WriteOutcome::default();
        let mut plan = RecordPlan::new();
        let mut deleting: HashSet<u64> = HashSet::new();
        for name in deletes {
            match st.docs.by_name(name) {
                Some(e) if deleting.insert(e.id) => {
                    plan.push(Op::Remove { id: e.id, fp: e.fp }, None);
                    out.deleted += 1;
                }
                Some(_) => {}
                None => out.missing.push(name.clone()),
            }
        }
        if must_exist && !out.missing.is_empty() {
            return Err(Error::NotFound(out.missing));
        }
        for (i, d) in docs.iter().enumerate() {
            if last[d.id.as_str()] != i {
                continue;
            }
            let old = st.docs.by_name(&d.id).map(|e| Op::Remove { id: e.id, fp: e.fp });
            let id = st.docs.allocate_id();
            let put =
                Op::Put { id, fp: d.fingerprint, ts: d.timestamp_ms, cluster: id, name: &d.id };
            out.inserted += 1;
            match old {
                Some(r) => {
                    out.replaced += 1;
                    plan.push(r, Some(put));
                }
                None => plan.push(put, None),
            }
        }
        out.seq = self.append(st, &plan)?;
        Ok(out)
    }

    /// Appends the plan's records and applies each once it is appended; returns the last
    /// sequence. On a storage error, what was appended is applied and the error returned.
    fn append(&self, st: &mut State, plan: &RecordPlan<'_>) -> Result<u64> {
        let max_puts = self.config.index.buffer_docs - 1;
        let records = plan.records(self.config.max_record_bytes, max_puts);
        let commit = self.committer()?;
        for ops in &records {
            let mut w = RecordWriter::new();
            for op in ops {
                w.push(op);
            }
            let bytes = w.finish();
            let seq = st.last_seq + 1;
            self.spaces.log.put(&key64(seq), &bytes)?;
            st.last_seq = seq;
            st.log_bytes += bytes.len() as u64;
            commit.appended(seq);
            Self::apply(st, seq, ops)?;
        }
        if !records.is_empty() {
            self.metrics.appended(records.len() as u64);
            st.last_write = Instant::now();
            if st.index.runs().len() >= self.config.index.merge_fanout {
                self.wake();
            }
        }
        Ok(st.last_seq)
    }

    /// Applies one appended record to memory. The buffer becomes a run only between records.
    fn apply(st: &mut State, seq: u64, ops: &[Op<'_>]) -> Result<()> {
        for op in ops {
            st.docs.apply(op);
        }
        Self::apply_index(st, seq, ops)
    }

    /// Waits until log sequence `seq` is durable.
    pub async fn wait_durable(&self, seq: u64) -> Result<()> {
        let c = self.committer()?;
        if seq > c.appended_seq() {
            return Err(Error::InvalidInput(format!("log sequence {seq} was never written")));
        }
        c.wait(seq).await
    }

    /// Blocking form of [`wait_durable`](Self::wait_durable).
    pub fn wait_durable_blocking(&self, seq: u64) -> Result<()> {
        self.committer()?.wait_blocking(seq)
    }

    /// Answers queries: `result[i]` holds the documents within `k` of `fps[i]`, ordered by
    /// distance, timestamp and id, at most `limit`. Large batches use every core.
    pub fn probe(&self, fps: &[u64], k: u32, limit: usize) -> Result<Vec<QueryResult>> {
        self.check_serving()?;
        let limit = limit.max(1);
        let st = self.state.read();
        st.index.check_k(k)?;
        let one = |fp: u64, scratch: &mut QueryScratch, out: &mut Vec<Match>| {
            st.index.query_into(fp, k, scratch, out)?;
            Self::result(&st.docs, fp, out, limit, None)
        };
        if fps.len() >= 256 {
            fps.par_chunks(64)
                .map(|chunk| {
                    let (mut scratch, mut out) = (QueryScratch::default(), Vec::new());
                    chunk.iter().map(|&fp| one(fp, &mut scratch, &mut out)).collect::<Vec<_>>()
                })
                .flatten_iter()
                .collect()
        } else {
            let (mut scratch, mut out) = (QueryScratch::default(), Vec::new());
            fps.iter().map(|&fp| one(fp, &mut scratch, &mut out)).collect()
        }
    }

    /// Turns index matches into a public result, skipping internal id `skip`.
    fn result(
        docs: &DocTable,
        fp: u64,
        matches: &[Match],
        limit: usize,
        skip: Option<u64>,
    ) -> Result<QueryResult> {
        let mut out = Vec::with_capacity(matches.len().min(limit));
        let mut total = 0;
        for m in matches {
            if Some(m.id) == skip {
                continue;
            }
            total += 1;
            if out.len() < limit {
                out.push(Self::to_match(docs, m)?);
            }
        }
        Ok(QueryResult { matches: out, truncated: total > limit, fingerprint: fp })
    }

    fn to_match(docs: &DocTable, m: &Match) -> Result<pb::Match> {
        let e = docs.by_id(m.id).ok_or_else(|| {
            Error::Internal(format!("index returned internal id {} that has no document", m.id))
        })?;
        Ok(pb::Match {
            id: e.name.to_string(),
            fingerprint: m.fp,
            distance: m.distance,
            timestamp_ms: m.ts,
            cluster_id: e.cluster,
        })
    }

    /// Crawl-frontier admission: finds the stored documents within `k` of `doc` (other than
    /// one with the same id), picks its original (the earliest of them) and cluster, and
    /// stores it unless `skip_if_duplicate` is set and it is a near-duplicate. Atomic: two
    /// near-duplicates admitted at once see each other in one order.
    pub fn admit(
        &self,
        doc: &ShardDocument,
        k: u32,
        limit: usize,
        skip_if_duplicate: bool,
    ) -> Result<(CheckAndInsertResponse, u64)> {
        self.check_serving()?;
        check_name(&doc.id, self.config.max_id_bytes)?;
        let limit = limit.max(1);
        let mut st = self.state.write();
        let st = &mut *st;
        st.index.check_k(k)?;
        let mut matches = Vec::new();
        st.index.query_into(doc.fingerprint, k, &mut QueryScratch::default(), &mut matches)?;
        let own = st.docs.by_name(&doc.id).map(|e| (e.id, e.fp));
        let result =
            Self::result(&st.docs, doc.fingerprint, &matches, limit, own.map(|(id, _)| id))?;
        let original: Option<(u64, String)> = matches
            .iter()
            .filter(|m| Some(m.id) != own.map(|(id, _)| id))
            .min_by_key(|m| (m.ts, m.id))
            .and_then(|m| st.docs.by_id(m.id))
            .map(|o: &DocEntry| (o.cluster, o.name.to_string()));
        let duplicate = original.is_some();
        let insert = !(duplicate && skip_if_duplicate);
        let id = if insert { st.docs.allocate_id() } else { st.docs.next_id() };
        let (cluster, original_id) = original.unwrap_or_else(|| (id, doc.id.clone()));
        let mut seq = st.last_seq;
        if insert {
            let mut plan = RecordPlan::new();
            let put =
                Op::Put { id, fp: doc.fingerprint, ts: doc.timestamp_ms, cluster, name: &doc.id };
            match own {
                Some((old, fp)) => plan.push(Op::Remove { id: old, fp }, Some(put)),
                None => plan.push(put, None),
            }
            seq = self.append(st, &plan)?;
        }
        let response = CheckAndInsertResponse {
            duplicate,
            matches: result.matches,
            truncated: result.truncated,
            cluster_id: cluster,
            original_id,
            inserted: insert,
            replaced: insert && own.is_some(),
            fingerprint: doc.fingerprint,
        };
        Ok((response, seq))
    }

    /// What the shard holds.
    pub fn stats(&self) -> Result<StatsResponse> {
        self.check_serving()?;
        let checkpoint_pending = {
            // The checkpoint lock before the state lock, as `checkpoint` takes them.
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            ck.runs_changed(&st)
                || st.last_seq != ck.manifest.covered
                || st.index.runs().iter().any(|run| {
                    ck.stored
                        .get(&(Arc::as_ptr(run) as usize))
                        .is_none_or(|s| s.deletes_written != run.deleted())
                })
        };
        let st = self.state.read();
        let s = st.index.stats();
        let mem = st.index.memory();
        Ok(StatsResponse {
            documents: st.docs.len() as u64,
            design: st.index.design().to_string(),
            max_k: st.index.max_k(),
            tables: mem
                .tables
                .iter()
                .map(|t| TableStats {
                    bytes: t.bytes as u64,
                    entries: t.entries as u64,
                    bits_per_fingerprint: t.bits_per_fp,
                })
                .collect(),
            index_bytes: mem.total_bytes as u64,
            buffered: s.buffered as u64,
            runs: s.runs as u64,
            deleted_pending: s.deleted_pending as u64,
            merges: s.merges,
            wal_bytes: st.log_bytes,
            disk_bytes: self.store.disk_bytes().unwrap_or(0),
            version: env!("CARGO_PKG_VERSION").to_string(),
            checkpoint_pending,
            merging: self.metrics.merges_running() > 0,
        })
    }

    /// Bytes of document data held in memory (ids, names, clusters).
    pub fn doc_bytes(&self) -> usize {
        self.state.read().docs.heap_bytes()
    }

    fn wake(&self) {
        let mut w = self.wake.0.lock();
        *w = true;
        self.wake.1.notify_one();
    }

    fn refresh_gauges(&self, disk: bool) {
        let st = self.state.read();
        let mem = st.index.memory();
        let tables: Vec<usize> = mem.tables.iter().map(|t| t.bytes).collect();
        let s = st.index.stats();
        self.metrics.set_index(st.docs.len(), s.runs, s.buffered, &tables);
        let log = st.log_bytes;
        drop(st);
        self.metrics.set_sizes(log, if disk { self.store.disk_bytes().ok() } else { None });
    }

    /// The background loop: merges, idle flushes, checkpoints, document snapshots.
    fn maintenance_loop(self: Arc<Self>) {
        let mut last_disk = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            {
                let mut w = self.wake.0.lock();
                if !*w {
                    self.wake.1.wait_for(&mut w, Duration::from_millis(200));
                }
                *w = false;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = self.maintain_once() {
                tracing::error!(error = %e, "background maintenance failed; retrying");
                std::thread::sleep(Duration::from_secs(1));
            }
            let disk = last_disk.elapsed() > Duration::from_secs(5);
            if disk {
                last_disk = Instant::now();
            }
            self.refresh_gauges(disk);
        }
    }

    /// Runs a merge off the lock and installs its run: the documents merged and the seconds
    /// it took, or `None` if the shard began stopping meanwhile (the merge is dropped).
    fn run_merge(&self, job: MergeJob) -> Result<Option<(usize, f64)>> {
        let started = Instant::now();
        self.metrics.merge_running(true);
        let merged = job.run();
        self.metrics.merge_running(false);
        let merged = merged?;
        let docs = merged.len();
        if self.stop.load(Ordering::Acquire) {
            return Ok(None);
        }
        self.state.write().index.finish_merge(job, merged)?;
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.merged(docs, seconds);
        Ok(Some((docs, seconds)))
    }

    /// One round of maintenance; public so tests and benchmarks can drive it.
    pub fn maintain_once(&self) -> Result<()> {
        let _one = self.maintaining.lock();
        // Merges, one at a time, until the policy wants none.
        loop {
            let Some(job) = self.state.write().index.next_merge() else { break };
            let Some((docs, seconds)) = self.run_merge(job)? else { return Ok(()) };
            tracing::debug!(docs, seconds, "merged runs");
        }
        if self.state.read().index.runs().len() > self.config.max_runs {
            self.metrics.merge_running(true);
            let r = self.compact_all();
            self.metrics.merge_running(false);
            r?;
        }
        // After a burst of writes, merge everything into one run so that queries visit a
        // single run again.
        let quiet = {
            let st = self.state.read();
            st.index.runs().len() > 1 && st.last_write.elapsed() >= self.config.compact_idle
        };
        // Take the job in a statement of its own: the write guard must be gone before the
        // merge runs and before finish_merge takes the lock again.
        let job = if quiet { self.state.write().index.compact_job() } else { None };
        if let Some(job) = job {
            let Some((docs, seconds)) = self.run_merge(job)? else { return Ok(()) };
            tracing::info!(docs, seconds, "compacted to one run");
            // Writes are still quiet, so the checkpoint below stores the compacted run now
            // rather than in the middle of busy traffic later.
        }
        // An idle buffer becomes a run, so queries skip its linear scan.
        {
            let idle = {
                let st = self.state.read();
                !st.index.buffered().is_empty() && st.last_write.elapsed() >= self.config.idle_flush
            };
            if idle {
                let mut st = self.state.write();
                if !st.index.buffered().is_empty() {
                    st.index.flush()?;
                    st.covered = st.last_seq;
                }
            }
        }
        let (due, log_bytes) = {
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            let uncovered = st.last_seq.saturating_sub(ck.manifest.covered);
            // Also once writes have been quiet for `compact_idle` (as after an idle
            // compaction): the index is stored while nothing else is going on, and a
            // restart then replays no log.
            let due = uncovered >= self.config.checkpoint_ops
                || (ck.runs_changed(&st)
                    && (ck.last.elapsed() >= self.config.checkpoint_interval
                        || st.last_write.elapsed() >= self.config.compact_idle));
            (due, st.log_bytes)
        };
        if due {
            self.checkpoint()?;
        }
        let snap_due = {
            let ck = self.checkpoints.lock();
            log_bytes >= self.config.snapshot_log_bytes.max(ck.snapshot_bytes)
        };
        if snap_due {
            self.snapshot_docs()?;
        }
        Ok(())
    }

    /// Rebuilds the index as one run from the document table, off the request path: the
    /// documents as of log sequence `s0` are built into a fresh index without any lock, the
    /// records appended meanwhile are replayed into it (most of them without a lock, the
    /// last few under the write lock), and it replaces the old index.
    pub fn compact_all(&self) -> Result<()> {
        let started = Instant::now();
        let (docs, s0) = {
            let st = self.state.read();
            let (entries, _) = st.docs.entries_from(0, usize::MAX);
            let docs: Vec<Doc> =
                entries.iter().map(|e| Doc { id: e.id, fp: e.fp, ts: e.ts }).collect();
            (docs, st.last_seq)
        };
        let mut fresh = State {
            index: Index::build(self.config.index.clone(), &docs)?,
            docs: DocTable::new(),
            last_seq: s0,
            covered: s0,
            last_write: Instant::now(),
            log_bytes: 0,
        };
        drop(docs);
        // Catch up without the lock, then the remainder under it.
        let replay = |fresh: &mut State, upto: u64| -> Result<()> {
            for e in self.spaces.log.scan(&key64(fresh.last_seq + 1), &key64(upto + 1)) {
                let (k, v) = e?;
                let seq = u64::from_be_bytes(
                    k.as_slice().try_into().map_err(|_| Error::CorruptTablet("log key".into()))?,
                );
                let ops = record::decode(&v)?;
                Self::apply_index(fresh, seq, &ops)?;
                fresh.last_seq = seq;
            }
            Ok(())
        };
        let s1 = self.state.read().last_seq;
        replay(&mut fresh, s1)?;
        let mut st = self.state.write();
        let last = st.last_seq;
        replay(&mut fresh, last)?;
        if fresh.index.len() != st.docs.len() {
            return Err(Error::Internal(format!(
                "rebuilt index holds {} documents, the table {}",
                fresh.index.len(),
                st.docs.len()
            )));
        }
        st.index = fresh.index;
        st.covered = fresh.covered;
        drop(st);
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "index rebuilt as one run");
        Ok(())
    }

    /// Applies a record to the index only (the document table already has it).
    fn apply_index(st: &mut State, seq: u64, ops: &[Op<'_>]) -> Result<()> {
        let puts = ops.iter().filter(|o| matches!(o, Op::Put { .. })).count();
        let cap = st.index.config().buffer_docs;
        if !st.index.buffered().is_empty() && st.index.buffered().len() + puts >= cap {
            st.index.flush()?;
            st.covered = seq - 1;
        }
        for op in ops {
            match *op {
                Op::Put { id, fp, ts, .. } => st.index.insert(Doc { id, fp, ts })?,
                Op::Remove { id, fp } => {
                    st.index.delete_doc(id, fp)?;
                }
            }
        }
        Ok(())
    }

    /// Writes a checkpoint: new runs, changed deletion marks, the manifest; then removes
    /// runs no longer needed and truncates the log.
    pub fn checkpoint(&self) -> Result<()> {
        let mut ck = self.checkpoints.lock();
        let (runs, covered, last_seq) = {
            let st = self.state.read();
            (st.index.runs().to_vec(), st.covered, st.last_seq)
        };
        let design = self.config.index.design.clone();
        let mut bytes = 0u64;
        let mut sids = Vec::with_capacity(runs.len());
        let mut next_sid = ck.manifest.next_sid.max(1);
        let mut current = HashSet::new();
        for run in &runs {
            let key = Arc::as_ptr(run) as usize;
            current.insert(key);
            match ck.stored.get_mut(&key) {
                Some(stored) => {
                    if run.deleted() != stored.deletes_written {
                        stored.deletes_written =
                            persist::write_deletes(&self.spaces, stored.sid, run)?;
                    }
                    sids.push(stored.sid);
                }
                None => {
                    let sid = next_sid;
                    next_sid += 1;
                    let deleted = run.deleted();
                    bytes += persist::write_run(&self.spaces, sid, run, &design)?;
                    ck.stored.insert(
                        key,
                        StoredRun { _run: run.clone(), sid, deletes_written: deleted },
                    );
                    sids.push(sid);
                }
            }
        }
        let manifest = Manifest { covered, next_sid, runs: sids, last_seq };
        self.spaces.meta.put(b"manifest", &manifest.encode())?;
        self.store.sync()?;
        let gone: Vec<usize> = ck.stored.keys().filter(|k| !current.contains(k)).copied().collect();
        for key in gone {
            if let Some(stored) = ck.stored.remove(&key) {
                persist::remove_run(&self.spaces, stored.sid)?;
            }
        }
        ck.manifest = manifest;
        ck.last = Instant::now();
        self.metrics.checkpointed(bytes);
        tracing::debug!(covered, runs = runs.len(), bytes, "checkpoint written");
        let upto = ck.manifest.covered.min(ck.docsnap.covered);
        drop(ck);
        self.truncate_log(upto)
    }

    /// Removes log records with sequence `<= upto`.
    fn truncate_log(&self, upto: u64) -> Result<()> {
        if upto == 0 {
            return Ok(());
        }
        let mut freed = 0u64;
        let mut batch = Vec::new();
        for e in self.spaces.log.scan(&key64(0), &key64(upto + 1)) {
            let (k, v) = e?;
            freed += v.len() as u64;
            batch.push((k, None));
            if batch.len() == 1024 {
                self.spaces.log.apply(std::mem::take(&mut batch))?;
            }
        }
        if !batch.is_empty() {
            self.spaces.log.apply(batch)?;
        }
        let mut st = self.state.write();
        st.log_bytes = st.log_bytes.saturating_sub(freed);
        Ok(())
    }

    /// Writes a snapshot of the document table while writes go on, then truncates the log.
    pub fn snapshot_docs(&self) -> Result<()> {
        let mut ck = self.checkpoints.lock();
        let (covered, next_id) = {
            let st = self.state.read();
            (st.last_seq, st.docs.next_id())
        };
        let id = ck.docsnap.id + 1;
        let mut slot = 0;
        let mut chunks = 0u32;
        let mut bytes = 0u64;
        loop {
            let (rec, next, end) = {
                let st = self.state.read();
                let mut w = RecordWriter::new();
                let (entries, next) = st.docs.entries_from(slot, 1024);
                for e in entries {
                    w.push(&Op::Put {
                        id: e.id,
                        fp: e.fp,
                        ts: e.ts,
                        cluster: e.cluster,
                        name: &e.name,
                    });
                }
                (w.finish(), next, next >= st.docs.slot_count())
            };
            bytes += rec.len() as u64;
            self.spaces.docs.put(&DocSnapshot::chunk_key(id, chunks), &rec)?;
            chunks += 1;
            slot = next;
            if end {
                break;
            }
        }
        let header = DocSnapshot { id, covered, chunks, next_id };
        self.spaces.meta.put(b"docsnap", &header.encode())?;
        self.store.sync()?;
        let old = key64(ck.docsnap.id);
        let mut to = old.to_vec();
        to.extend_from_slice(&[0xFF; 5]);
        if ck.docsnap.id != 0 {
            self.spaces.docs.remove_range(&old, &to)?;
        }
        ck.docsnap = header;
        ck.snapshot_bytes = bytes;
        self.metrics.doc_snapshot();
        tracing::debug!(covered, chunks, bytes, "document snapshot written");
        let upto = ck.manifest.covered.min(covered);
        drop(ck);
        self.truncate_log(upto)
    }

    /// Stops taking requests, turns the buffer into a run, writes a checkpoint and syncs.
    /// Call after the servers in front have drained their requests. Waits for a merge under
    /// way to finish.
    pub fn shutdown(&self) -> Result<()> {
        let serving = self.stop_threads();
        if serving {
            {
                let mut st = self.state.write();
                if !st.index.buffered().is_empty() {
                    st.index.flush()?;
                    st.covered = st.last_seq;
                }
            }
            self.checkpoint()?;
        }
        if let Some(c) = self.commit.get() {
            c.stop();
        }
        self.store.sync()?;
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

    /// Refuses new requests and joins the maintenance thread; true if it was serving.
    fn stop_threads(&self) -> bool {
        let serving = self.status.load(Ordering::Acquire) == SERVING;
        self.set_status(Status::ShuttingDown);
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(h) = self.maintenance.lock().take() {
            let _ = h.join();
        }
        serving
    }
}

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
