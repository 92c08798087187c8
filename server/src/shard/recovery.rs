//! Recovery: the stored runs and document snapshot loaded, the log replayed after them,
//! before the shard serves (see the shard's module docs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use neardup_core::{Doc, Index};
use rayon::prelude::*;

use super::{RunKey, Shard, State, Status, StoredRun};
use crate::commit::Committer;
use crate::doc_table::{DocEntry, DocTable};
use crate::error::{Error, Result};
use crate::expect::{Expectation, LogTail};
use crate::persist::{self, DocSnapshot, Manifest, key64};
use crate::record::{self, Op};

impl Shard {
    /// Loads the stored data and starts the background threads; blocks until done.
    ///
    /// Recovery is tried once, so a failure is final until the shard is restarted: on
    /// damaged data (a run that cannot be loaded, a panic in the storage engine, a store that
    /// holds less than the expectation record says, see [`crate::expect`]) the shard becomes
    /// [`Status::Corrupt`] (requests get DATA_LOSS); on any other failure (an I/O error)
    /// [`Status::Failed`]. Either way the error is logged and returned.
    pub fn recover(self: &Arc<Self>) -> Result<()> {
        let started = Instant::now();
        match crate::storage::guarded("recovery", || self.recover_inner()) {
            Ok(()) => {
                let secs = started.elapsed().as_secs_f64();
                self.metrics.recovered(secs);
                self.refresh_gauges(true);
                let st = self.state.read();
                tracing::info!(
                    documents = self.live(&st),
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
                self.start_sealer();
                Ok(())
            }
            Err(e) => {
                if let Error::CorruptTablet(msg) = &e {
                    tracing::error!(error = %msg, path = %self.path.display(),
                        "tablet is corrupt; it is not served");
                    self.metrics.set_corrupt(true);
                    self.set_status(Status::Corrupt(msg.clone()));
                } else {
                    tracing::error!(error = %e, path = %self.path.display(),
                        "recovery failed; nothing is served until a restart");
                    self.set_status(Status::Failed(e.to_string()));
                }
                Err(e)
            }
        }
    }

    pub(super) fn recover_inner(&self) -> Result<()> {
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
        let after = self.expect.as_ref().and_then(|(_, e)| *e).map_or(u64::MAX, |e| e.seq);
        let (docs_part, index_part) = rayon::join(
            || crate::storage::guarded("recovery", || self.recover_docs(&docsnap, after)),
            || crate::storage::guarded("recovery", || self.recover_index(&manifest)),
        );
        let (docs, mut last_seq, log_bytes, tail) = docs_part?;
        let (index, stored_runs, rebuilt, buffer_empty) = index_part?;
        let sids: Vec<u64> = stored_runs.iter().map(|&(sid, _)| sid).collect();
        // Runs the manifest does not name yet, added by log records replayed after it.
        let next_sid = sids.iter().map(|&sid| sid + 1).fold(manifest.next_sid, u64::max);
        last_seq = last_seq.max(manifest.last_seq).max(manifest.covered).max(docsnap.covered);
        let covered = if buffer_empty { last_seq } else { manifest.covered };
        let live = if self.config.names { docs.len() } else { index.len() };
        if self.config.names && docs.len() != index.len() {
            return Err(Error::CorruptTablet(format!(
                "documents ({}) and index ({}) disagree after recovery",
                docs.len(),
                index.len()
            )));
        }
        match &self.expect {
            Some((_, Some(e))) => e.check(last_seq, live as u64, tail)?,
            // A new directory has nothing to check: the record is written now, quietly.
            Some((_, None)) if last_seq == 0 && live == 0 => {}
            Some((file, None)) => tracing::warn!(path = %file.path().display(),
                "no expectation record (a data directory from an earlier release?); the \
                 recovered data cannot be checked against one, and one is written now"),
            None => {}
        }
        // Remember what is stored; repair rebuilt tables; drop garbage.
        {
            let mut ck = self.checkpoints.lock();
            // Deletion marks as stored, not as replayed from the log: the next checkpoint
            // writes the replayed ones before its manifest passes their records.
            // The recovered index is installed below as generation 0.
            for (run, &(sid, deletes_written)) in index.runs().iter().zip(&stored_runs) {
                let key = RunKey { generation: 0, run: run.id() };
                ck.stored.insert(key, StoredRun { sid, deletes_written });
            }
            for (sid, tables) in &rebuilt {
                if let Some(pos) = sids.iter().position(|s| s == sid) {
                    persist::rewrite_tables(s, *sid, &index.runs()[pos], tables)?;
                }
            }
            // Sketches of documents whose records a crash lost (the database kept them, the
            // log did not): their ids are handed out again, so they go.
            if self.config.names {
                s.sketches.remove_range(&key64(docs.next_id()), &[0xFF; 9])?;
            }
            for sid in persist::stored_run_ids(s)? {
                if !sids.contains(&sid) {
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
            ck.manifest = Manifest { last_seq, next_sid, ..manifest };
            ck.docsnap = docsnap;
            ck.snapshot_bytes = log_bytes.min(self.config.snapshot_log_bytes);
        }
        self.sync()?;
        // A fresh record before anything is truncated: the last manifest may cover more than
        // the record on disk when a crash fell between the two (see `crate::expect`).
        if let Some((file, _)) = &self.expect {
            file.write(&Expectation { seq: last_seq, live: live as u64 })?;
        }
        let mut st = self.state.write();
        *st = State {
            index,
            docs,
            last_seq,
            covered,
            last_write: Instant::now(),
            log_bytes,
            generation: 0,
            seals: Default::default(),
        };
        drop(st);
        let status = self.status.clone();
        let on_failure = move |msg: &str| {
            status.send_replace(Status::Failed(msg.to_string()));
        };
        let committer =
            Committer::start(self.store.clone(), last_seq, self.metrics.clone(), on_failure);
        self.commit.set(committer).ok();
        Ok(())
    }

    /// Recovery of the document table: the snapshot, then every later log record. Returns
    /// the table, the last log sequence, the log's size, and the operations in log records
    /// after sequence `after` (the expectation record's).
    pub(super) fn recover_docs(
        &self,
        docsnap: &DocSnapshot,
        after: u64,
    ) -> Result<(DocTable, u64, u64, LogTail)> {
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
                            Op::Put { id, fp, ts, cluster, name, sketch: _ } => {
                                Ok(DocEntry { id, fp, ts, cluster, name: name.into() })
                            }
                            Op::Remove { .. } | Op::RemoveRange { .. } | Op::AddRun { .. } => {
                                Err(Error::CorruptTablet(format!(
                                    "document snapshot chunk {c} holds no put"
                                )))
                            }
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
        let (mut last_seq, mut log_bytes, mut tail) = (0, 0u64, LogTail::default());
        for e in s.log.scan(&key64(0), &[0xFF; 9]) {
            let (k, v) = e?;
            let seq = persist::log_seq(&k)?;
            log_bytes += v.len() as u64;
            last_seq = last_seq.max(seq);
            if seq > docsnap.covered || seq > after {
                for op in record::decode(&v)? {
                    if seq > after {
                        match op {
                            Op::Put { .. } => tail.puts += 1,
                            Op::Remove { .. } => tail.removes += 1,
                            Op::RemoveRange { count, .. } => tail.removes += count,
                            Op::AddRun { count, .. } => tail.puts += count,
                        }
                    }
                    if self.config.names && matches!(op, Op::RemoveRange { .. } | Op::AddRun { .. })
                    {
                        return Err(Error::CorruptTablet(format!(
                            "log record {seq} holds an operation of tablets in a shard with \
                             names"
                        )));
                    }
                    if seq > docsnap.covered && self.config.names {
                        docs.apply(&op);
                        // An acknowledged sketch is in the log; the sketch store may have
                        // lost it with the crash. Writing it again is harmless.
                        Self::store_sketch(s, &op)?;
                    }
                }
            }
        }
        Ok((docs, last_seq, log_bytes, tail))
    }

    /// Reports the tables of run `sid` that loading rebuilt (if any) and adds them to
    /// `rebuilt`, for recovery to store again.
    fn note_rebuilt(&self, sid: u64, tables: &[usize], rebuilt: &mut Vec<(u64, Vec<usize>)>) {
        if !tables.is_empty() {
            tracing::warn!(run = sid, tables = ?tables,
                "damaged or missing tables were rebuilt from intact ones");
            self.metrics.rebuilt(tables.len());
            rebuilt.push((sid, tables.to_vec()));
        }
    }

    /// Recovery of the index: the manifest's runs (checksums verified, damaged tables
    /// rebuilt), then the log records after the manifest. Returns the index, each stored
    /// run's storage id and deletion count as stored (the manifest's runs, then those the
    /// log adds), the rebuilt tables, and whether the write buffer is empty.
    #[allow(clippy::type_complexity)]
    pub(super) fn recover_index(
        &self,
        manifest: &Manifest,
    ) -> Result<(Index, Vec<(u64, usize)>, Vec<(u64, Vec<usize>)>, bool)> {
        let s = &self.spaces;
        let mut index = Index::new(self.config.index.clone())?;
        let loaded: Vec<(u64, persist::LoadedRun)> = manifest
            .runs
            .par_iter()
            .map(|&sid| {
                persist::load_run(s, sid, &index, self.config.stored_tables).map(|l| (sid, l))
            })
            .collect::<Result<_>>()?;
        let mut rebuilt = Vec::new();
        for (sid, l) in &loaded {
            self.note_rebuilt(*sid, &l.rebuilt, &mut rebuilt);
        }
        let mut stored: Vec<(u64, usize)> =
            loaded.iter().map(|(sid, l)| (*sid, l.run.deleted())).collect();
        index.restore(loaded.into_iter().map(|(_, l)| l.run).collect())?;
        // Replayed puts not yet removed again. A shard without names may see one entry
        // `(id, fp)` put, removed and put again (a tablet copied back), so a removal takes
        // back the latest put of that very entry, not every put of the id.
        let mut pending: Vec<Option<Doc>> = Vec::new();
        let mut pending_at: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
        for e in s.log.scan(&key64(manifest.covered + 1), &[0xFF; 9]) {
            let (k, v) = e?;
            let seq = persist::log_seq(&k)?;
            for op in record::decode(&v)? {
                match op {
                    Op::Put { id, fp, ts, .. } => {
                        pending_at.entry((id, fp)).or_default().push(pending.len());
                        pending.push(Some(Doc { id, fp, ts }));
                    }
                    Op::Remove { id, fp } => {
                        match pending_at.get_mut(&(id, fp)).and_then(|at| at.pop()) {
                            Some(i) => pending[i] = None,
                            None => {
                                index.delete_doc(id, fp)?;
                            }
                        }
                    }
                    Op::RemoveRange { lo, hi, count } => {
                        // The replayed puts before it in the range, and the runs' entries.
                        let mut removed = 0u64;
                        for p in pending.iter_mut() {
                            if p.is_some_and(|d| (lo..=hi).contains(&d.fp)) {
                                *p = None;
                                removed += 1;
                            }
                        }
                        pending_at.retain(|&(_, fp), _| !(lo..=hi).contains(&fp));
                        removed += index.delete_range(lo, hi)? as u64;
                        if removed != count {
                            return Err(Error::CorruptTablet(format!(
                                "a logged removal of {lo:#x}..={hi:#x} took {count} entries, \
                                 its replay {removed}"
                            )));
                        }
                    }
                    // A run added in bulk (`Shard::add_entries`), covered by the runs from
                    // its record on, so no manifest covering less can have been written
                    // after it. Its storage id was taken under the checkpoint lock, held
                    // until the run was in the index: a manifest counting past the id
                    // would have been.
                    Op::AddRun { sid, .. } if sid < manifest.next_sid => {
                        return Err(Error::CorruptTablet(format!(
                            "log record {seq} adds the run stored as {sid}, which the \
                             manifest's storage ids pass but its sequence does not cover"
                        )));
                    }
                    Op::AddRun { sid, count } => {
                        let l = persist::load_run(s, sid, &index, self.config.stored_tables)?;
                        if l.run.len() as u64 != count {
                            return Err(Error::CorruptTablet(format!(
                                "the run stored as {sid} holds {} entries, its log record {count}",
                                l.run.len()
                            )));
                        }
                        self.note_rebuilt(sid, &l.rebuilt, &mut rebuilt);
                        stored.push((sid, l.run.deleted()));
                        index.add_run(l.run)?;
                    }
                }
            }
        }
        let pending: Vec<Doc> = pending.into_iter().flatten().collect();
        // Restored runs leave the buffer empty; replayed documents form one run, or stay in
        // the buffer when they are fewer than it holds.
        index.insert_batch(&pending)?;
        let empty = index.buffered().is_empty();
        Ok((index, stored, rebuilt, empty))
    }
}
