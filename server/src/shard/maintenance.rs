//! Background maintenance: merges off the request path, idle flushes and compaction, the
//! rebuild of an index with too many runs, and the decision to checkpoint or snapshot.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use neardup_core::index::{MergeJob, Run, SealJob};
use neardup_core::{Doc, Index};

use super::{MAX_FROZEN, PendingSeal, Shard, State, Status};
use crate::doc_table::DocTable;
use crate::error::{Error, Result};
use crate::persist::{self, key64};
use crate::record::{self, Op};

/// The idle compaction waits until the runs besides the largest hold at least
/// 1/`COMPACT_SHARE` of its documents (see [`Shard::maintain_once`]).
const COMPACT_SHARE: usize = 8;

impl Shard {
    pub(super) fn refresh_gauges(&self, disk: bool) {
        let st = self.state.read();
        let mem = st.index.memory();
        let tables: Vec<usize> = mem.tables.iter().map(|t| t.bytes).collect();
        let s = st.index.stats();
        self.metrics.set_index(self.live(&st), s.runs, s.buffered, &tables);
        let log = st.log_bytes;
        drop(st);
        self.metrics.set_sizes(log, if disk { self.store.disk_bytes().ok() } else { None });
    }

    /// The background loop: merges, idle flushes, checkpoints, document snapshots.
    pub(super) fn maintenance_loop(self: Arc<Self>) {
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
    pub(super) fn run_merge(&self, job: MergeJob) -> Result<Option<(usize, f64)>> {
        let started = Instant::now();
        self.metrics.merge_running(true);
        let merged = job.run();
        self.metrics.merge_running(false);
        let merged = merged?;
        let docs = merged.len();
        if self.stop.load(Ordering::Acquire) {
            return Ok(None);
        }
        let replaced = self.state.write().index.finish_merge(job, merged)?;
        // Freed once the write lock is released: freeing the sources of a large merge takes
        // tens of milliseconds, which every query would otherwise wait for.
        drop(replaced);
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.merged(docs, seconds);
        Ok(Some((docs, seconds)))
    }

    /// One round of maintenance; public so tests and benchmarks can drive it.
    pub fn maintain_once(&self) -> Result<()> {
        let _one = self.maintaining.lock();
        // After a failed sync nothing more is written: the shard waits for its restart.
        if matches!(self.status(), Status::Failed(_)) {
            return Ok(());
        }
        // Merges, one at a time, until the policy wants none.
        loop {
            let Some(job) = self.state.write().index.next_merge() else { break };
            let Some((docs, seconds)) = self.run_merge(job)? else { return Ok(()) };
            tracing::debug!(docs, seconds, "merged runs");
        }
        // A run waiting to join the recent tables that merges (or a removed range) made
        // small: its slices, each under a hold of its own.
        self.cover_recent();
        if self.state.read().index.runs().len() > self.config.max_runs {
            self.metrics.merge_running(true);
            let r = self.compact_all();
            self.metrics.merge_running(false);
            r?;
        }
        // After a burst of writes, merge everything into one run so that queries visit a
        // single run again; but only once the other runs (and the deleted documents) add up
        // to a share of the largest run: compacting rewrites the whole index on disk, and a
        // trickle of writes with quiet moments between them would otherwise rewrite it at
        // every quiet moment (a few documents costing the whole index's bytes each time).
        let quiet = {
            let st = self.state.read();
            let runs = st.index.runs();
            let largest = runs.iter().map(|r| r.len()).max().unwrap_or(0);
            let others = runs.iter().map(|r| r.len()).sum::<usize>() - largest;
            let deleted: usize = runs.iter().map(|r| r.deleted()).sum();
            runs.len() > 1
                && st.last_write.elapsed() >= self.config.compact_idle
                && (others + deleted) * COMPACT_SHARE >= largest
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
        // An idle buffer becomes a run, so queries skip its linear scan. With nothing
        // buffered, records past `covered` are removes, already marked in the runs: the runs
        // then cover them too, and the checkpoint below stores them.
        {
            let idle = {
                let st = self.state.read();
                st.behind() && st.last_write.elapsed() >= self.config.idle_flush
            };
            if idle {
                self.state.write().cover_all()?;
            }
        }
        let (due, log_bytes, quiet_log) = {
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            let quiet_log = st.last_write.elapsed() >= self.config.compact_idle;
            let uncovered = st.last_seq.saturating_sub(ck.manifest.covered);
            // Also once writes have been quiet for `compact_idle` (as after an idle
            // compaction): the index is stored while nothing else is going on, and a
            // restart then replays no log.
            let due = uncovered >= self.config.checkpoint_ops
                || (ck.runs_changed(&st) && ck.last.elapsed() >= self.config.checkpoint_interval)
                // Not more often than `compact_idle`, should a checkpoint leave something
                // pending.
                || (quiet_log
                    && ck.last.elapsed() >= self.config.compact_idle
                    && ck.pending(&st));
            (due, st.log_bytes, quiet_log)
        };
        if due {
            self.checkpoint()?;
        }
        // A document snapshot once the log reaches its bound (or the last snapshot's size,
        // so that snapshots cost at most as many bytes as the log they make obsolete); and
        // when writes are quiet, once the log holds an eighth of the last snapshot's size:
        // the log (names with every write's sketch) takes about twice a snapshot's bytes a
        // document, so a shard at rest keeps a snapshot and a short log.
        let snap_due = {
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            let covered = st.last_seq == ck.manifest.covered;
            self.config.names
                && (log_bytes >= self.config.snapshot_log_bytes.max(ck.snapshot_bytes)
                    || (quiet_log
                        && covered
                        && log_bytes > 0
                        && log_bytes.saturating_mul(8) >= ck.snapshot_bytes))
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
            let docs: Vec<Doc> = if self.config.names {
                let (entries, _) = st.docs.entries_from(0, usize::MAX);
                entries.iter().map(|e| Doc { id: e.id, fp: e.fp, ts: e.ts }).collect()
            } else {
                let mut docs = Vec::with_capacity(st.index.len());
                st.index.for_each_live(|d| docs.push(d));
                docs
            };
            (docs, st.last_seq)
        };
        let mut fresh = State {
            index: Index::build(self.config.index.clone(), &docs)?,
            docs: DocTable::new(),
            last_seq: s0,
            covered: s0,
            last_write: Instant::now(),
            log_bytes: 0,
            generation: 0,
            seals: VecDeque::new(),
        };
        drop(docs);
        // Catch up without the lock, then the remainder under it.
        let replay = |fresh: &mut State, upto: u64| -> Result<()> {
            for e in self.spaces.log.scan(&key64(fresh.last_seq + 1), &key64(upto + 1)) {
                let (k, v) = e?;
                let seq = persist::log_seq(&k)?;
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
        if fresh.index.len() != self.live(&st) {
            return Err(Error::Internal(format!(
                "rebuilt index holds {} documents, the shard {}",
                fresh.index.len(),
                self.live(&st)
            )));
        }
        let old = std::mem::replace(&mut st.index, fresh.index);
        st.covered = fresh.covered;
        // Frozen buffers went with the old index; their seal jobs find no match.
        st.seals.clear();
        st.generation += 1;
        drop(st);
        // Freed off the lock, as a merge's sources are.
        drop(old);
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "index rebuilt as one run");
        Ok(())
    }

    /// Before applying a live record that fills the write buffer: freezes the buffer for
    /// the sealing thread ([`seal_loop`]), which builds its run off the write lock, instead of
    /// letting [`apply_index`](Self::apply_index) build it under the lock. With
    /// [`MAX_FROZEN`] frozen already (the thread is behind) or no thread, `apply_index`
    /// builds them all here, as it does when replaying the log.
    ///
    /// The runs always hold exactly the records up to `covered`: frozen buffers are
    /// installed in the order they were frozen, each moving `covered` to the record
    /// before the one that froze it.
    pub(super) fn freeze_if_full(&self, st: &mut State, seq: u64, ops: &[Op<'_>]) -> Result<()> {
        let puts = ops.iter().filter(|o| matches!(o, Op::Put { .. })).count();
        let buffered = st.index.buffered().len();
        if buffered == 0
            || buffered + puts < self.config.index.buffer_docs
            || st.index.frozen_buffers() >= MAX_FROZEN
        {
            return Ok(());
        }
        let sealer = self.sealer.lock();
        let Some((tx, _)) = sealer.as_ref() else { return Ok(()) };
        let Some(job) = st.index.freeze_buffer() else { return Ok(()) };
        let run = job.id();
        if tx.send((st.generation, job)).is_ok() {
            st.seals.push_back(PendingSeal { generation: st.generation, run, upto: seq - 1 });
        } else {
            // The thread is gone (shutting down): build here.
            st.seal_all(seq - 1)?;
        }
        Ok(())
    }

    /// Installs a run the sealing thread built, if its frozen buffer is still the oldest
    /// one pending (it is not when a flush built it meanwhile or the index was rebuilt).
    fn finish_seal(&self, generation: u64, job: SealJob, built: Result<Run>) {
        let mut st = self.state.write();
        let front = st.seals.front().map(|s| (s.generation, s.run));
        if front != Some((generation, job.id())) {
            return;
        }
        let installed = built.and_then(|run| Ok(st.index.finish_seal(job, run)?));
        match installed {
            Ok(()) => {
                if let Some(s) = st.seals.pop_front() {
                    st.covered = s.upto;
                }
                #[cfg(test)]
                self.sealed_off_lock.fetch_add(1, Ordering::Relaxed);
                if st.index.runs().len() >= self.config.index.merge_fanout {
                    self.wake();
                }
            }
            // The frozen buffer stays; the next flush builds it under the lock.
            Err(e) => tracing::error!(error = %e, "building a frozen write buffer failed"),
        }
    }

    /// Starts the sealing thread (after recovery).
    pub(super) fn start_sealer(self: &Arc<Self>) {
        let (tx, rx) = std::sync::mpsc::channel::<(u64, SealJob)>();
        let me = Arc::downgrade(self);
        let handle = std::thread::Builder::new()
            .name("neardup-seal".into())
            .spawn(move || seal_loop(me, rx))
            .expect("spawn the sealing thread");
        *self.sealer.lock() = Some((tx, handle));
    }

    /// Applies a record to the index only (the document table already has it).
    pub(super) fn apply_index(st: &mut State, seq: u64, ops: &[Op<'_>]) -> Result<()> {
        let puts = ops.iter().filter(|o| matches!(o, Op::Put { .. })).count();
        let cap = st.index.config().buffer_docs;
        if st.index.unsealed() > 0 && st.index.buffered().len() + puts >= cap {
            // Builds the frozen buffers too: every record before this one is in the runs.
            st.seal_all(seq - 1)?;
        }
        // Puts go in together up to each removal (a removal may be of a put before it).
        let mut docs = Vec::with_capacity(puts);
        for op in ops {
            match *op {
                Op::Put { id, fp, ts, .. } => docs.push(Doc { id, fp, ts }),
                Op::Remove { id, fp } => {
                    st.index.insert_many(&docs)?;
                    docs.clear();
                    st.index.delete_doc(id, fp)?;
                }
                Op::RemoveRange { lo, hi, .. } => {
                    st.index.insert_many(&docs)?;
                    docs.clear();
                    st.index.delete_range(lo, hi)?;
                }
                // Added by `Shard::add_entries` with the run itself, which the record
                // does not hold.
                Op::AddRun { sid, .. } => {
                    return Err(Error::Internal(format!(
                        "the run stored as {sid} cannot be applied from its record"
                    )));
                }
            }
        }
        st.index.insert_many(&docs)?;
        Ok(())
    }
}

/// The sealing thread: builds each frozen buffer's run and installs it, and writes the
/// queued sketches ([`Shard::drain_sketches`]) at least every 50 ms. Holds the shard only
/// while doing so, so the shard can be dropped while it waits.
fn seal_loop(shard: Weak<Shard>, rx: std::sync::mpsc::Receiver<(u64, SealJob)>) {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let job = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(j) => Some(j),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let built = job.as_ref().map(|(_, job)| job.run().map_err(Error::from));
        let Some(shard) = shard.upgrade() else { return };
        if let (Some((generation, job)), Some(built)) = (job, built) {
            shard.finish_seal(generation, job, built);
        }
        if let Err(e) = shard.drain_sketches() {
            tracing::error!(error = %e, "writing sketches to the store failed; retrying");
        }
    }
}
