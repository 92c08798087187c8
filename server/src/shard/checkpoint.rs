//! Checkpoints and document snapshots: the runs and deletion marks not yet stored, the
//! manifest, the document table written while writes go on, and the log truncated below
//! what both cover.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use neardup_core::index::Run;

use super::{RunKey, Shard, StoredRun};
use crate::error::Result;
use crate::expect::Expectation;
use crate::persist::{self, DocSnapshot, Manifest, key64};
use crate::record::{Op, RecordWriter};

/// Documents per chunk of a document snapshot: a few hundred KiB a value, over sled's blob
/// threshold like the runs' chunks ([`persist::CHUNK_BYTES`]), so an old snapshot's space
/// comes back when it is removed.
const SNAPSHOT_CHUNK_DOCS: usize = 4096;

impl Shard {
    /// Writes a checkpoint: new runs, changed deletion marks, the manifest, the expectation
    /// record ([`crate::expect`]); then removes runs no longer needed and truncates the log.
    pub fn checkpoint(&self) -> Result<()> {
        let mut ck = self.checkpoints.lock();
        let (runs, covered, last_seq, live) = {
            let st = self.state.read();
            let runs: Vec<(RunKey, Arc<Run>)> =
                st.index.runs().iter().map(|r| (RunKey::of(&st, r), r.clone())).collect();
            (runs, st.covered, st.last_seq, self.live(&st) as u64)
        };
        // The records the runs hold are durable before anything that names them is written:
        // the log and the database are synced apart (see `Store::sync`).
        self.sync()?;
        let design = self.config.index.design.clone();
        let mut bytes = 0u64;
        let mut sids = Vec::with_capacity(runs.len());
        let mut next_sid = ck.manifest.next_sid.max(1);
        let mut current = HashSet::new();
        for (key, run) in &runs {
            let key = *key;
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
                    bytes += persist::write_run(
                        &self.spaces,
                        sid,
                        run,
                        &design,
                        self.config.stored_tables,
                    )?;
                    ck.stored.insert(key, StoredRun { sid, deletes_written: deleted });
                    sids.push(sid);
                }
            }
        }
        let manifest = Manifest { covered, next_sid, runs: sids, last_seq };
        self.spaces.meta.put(b"manifest", &manifest.encode())?;
        self.sync()?;
        // What the next start must find (see `crate::expect`): written before anything the
        // manifest allows is removed, and before the manifest is taken as the last one.
        if let Some((file, _)) = &self.expect {
            file.write(&Expectation { seq: last_seq, live })?;
        }
        let gone: Vec<RunKey> =
            ck.stored.keys().filter(|k| !current.contains(k)).copied().collect();
        let mut removed = false;
        for key in gone {
            if let Some(stored) = ck.stored.remove(&key) {
                persist::remove_run(&self.spaces, stored.sid)?;
                removed = true;
            }
        }
        if removed {
            // Durable now, not at the next checkpoint: the store frees the space of what
            // it removed only after a sync (see `SledStore::flush_db`), and a shard that
            // goes quiet after a merge may not write another checkpoint for a long time.
            self.sync()?;
        }
        ck.manifest = manifest;
        ck.last = Instant::now();
        self.metrics.checkpointed(bytes);
        tracing::debug!(covered, runs = runs.len(), bytes, "checkpoint written");
        // Without names, nothing but the runs needs the log.
        let upto = if self.config.names {
            ck.manifest.covered.min(ck.docsnap.covered)
        } else {
            ck.manifest.covered
        };
        drop(ck);
        self.truncate_log(upto)
    }

    /// Removes log records with sequence `<= upto`, and none an open backup copy needs.
    pub(super) fn truncate_log(&self, upto: u64) -> Result<()> {
        let upto = self.backup_floor(upto);
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
        // Records up to `covered` leave the log once the snapshot is written, and recovery
        // writes no sketch of theirs again: they are stored and durable first.
        self.drain_sketches()?;
        self.sync()?;
        let id = ck.docsnap.id + 1;
        let mut slot = 0;
        let mut chunks = 0u32;
        let mut bytes = 0u64;
        loop {
            let (rec, next, end) = {
                let st = self.state.read();
                let mut w = RecordWriter::new();
                let (entries, next) = st.docs.entries_from(slot, SNAPSHOT_CHUNK_DOCS);
                for e in entries {
                    w.push(&Op::Put {
                        id: e.id,
                        fp: e.fp,
                        ts: e.ts,
                        cluster: e.cluster,
                        name: &e.name,
                        sketch: None,
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
        self.sync()?;
        let old = key64(ck.docsnap.id);
        let mut to = old.to_vec();
        to.extend_from_slice(&[0xFF; 5]);
        if ck.docsnap.id != 0 {
            self.spaces.docs.remove_range(&old, &to)?;
            // As after a checkpoint's removals: the space goes after a sync.
            self.sync()?;
        }
        ck.docsnap = header;
        ck.snapshot_bytes = bytes;
        self.metrics.doc_snapshot();
        tracing::debug!(covered, chunks, bytes, "document snapshot written");
        let upto = ck.manifest.covered.min(covered);
        drop(ck);
        self.truncate_log(upto)
    }
}
