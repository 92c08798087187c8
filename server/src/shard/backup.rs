//! Backups of a shard with names, online: the document table read while writes go on, then
//! the log records written meanwhile, so the copy is the state at one log sequence; and the
//! restore of such a copy under the documents' own ids.
//!
//! A copy is made as a document snapshot is ([`Shard::snapshot_docs`]): the table is read a
//! chunk at a time under the read lock, so a write may land in a slot already read. The log
//! records after the sequence the reading began at are kept (the log is not truncated past
//! it while the copy is open) and read at the end: their puts are added and their removals
//! listed. A document is in the state at the end if it was read or put after the start and
//! is not listed as removed: internal ids are never reused. Documents stored after the start
//! (ids from the table's next id then) are taken from the log only, so none is sent twice.

use std::sync::Arc;

use super::Shard;
use super::caller_ids::{check_doc, plan_doc_put};
use super::write_path::RecordPlan;
use crate::data_types::DocInfo;
use crate::error::{Error, Result};
use crate::persist::{self, key64};
use crate::record::{self, Op};

/// Largest internal id a restore accepts: ids are counted up from there, and the log and
/// the snapshots refuse larger ones as damage elsewhere.
pub const MAX_RESTORED_ID: u64 = 1 << 62;

/// An open copy of a shard's documents ([`Shard::backup`]): read it with
/// [`next_docs`](Self::next_docs), then [`finish`](Self::finish). While it is open, the log
/// keeps every record after its start.
#[derive(Debug)]
pub struct BackupCopy {
    shard: Arc<Shard>,
    /// The log sequence the reading began at: every record after it is kept.
    from: u64,
    /// The first internal id a document stored after the start can have: such documents
    /// are taken from the log, not from the table, so that none is sent twice.
    first_new: u64,
    /// The next slot of the document table to read.
    slot: usize,
    /// The table's generation at the first read: slots mean nothing after a compaction.
    generation: Option<u32>,
    done: bool,
}

/// The end of a copy: what the log says changed while the table was read.
#[derive(Debug, Default)]
pub struct BackupTail {
    /// Documents put since the start (some may also have been read).
    pub puts: Vec<DocInfo>,
    /// Internal ids removed since the start: a restore leaves them out.
    pub removed: Vec<u64>,
    /// The copy is the state at this log sequence.
    pub seq: u64,
    /// Documents in that state.
    pub documents: u64,
}

impl Shard {
    /// Opens a copy of the documents ([`BackupCopy`]).
    pub fn backup(self: &Arc<Self>) -> Result<BackupCopy> {
        self.check_serving()?;
        self.check_names()?;
        let mut pins = self.backup_pins.lock();
        let (from, first_new) = {
            let st = self.state.read();
            (st.last_seq, st.docs.next_id())
        };
        pins.push(from);
        Ok(BackupCopy {
            shard: self.clone(),
            from,
            first_new,
            slot: 0,
            generation: None,
            done: false,
        })
    }

    /// The log may be truncated up to this sequence, no further: below every open copy's
    /// start.
    pub(super) fn backup_floor(&self, upto: u64) -> u64 {
        self.backup_pins.lock().iter().fold(upto, |u, &p| u.min(p))
    }

    /// Stores `docs` under their own internal ids, timestamps, clusters and sketches (a
    /// restore), in one group of log records; returns the sequence to wait for. A document
    /// whose id is held already is skipped (a restore may be run again); one whose name
    /// another document holds replaces it only if its `(timestamp, id)` is larger, as
    /// [`write_docs`](Self::write_docs) decides. Ids must be below [`MAX_RESTORED_ID`]; a
    /// request that fails validation changes nothing.
    pub fn restore_docs(&self, docs: &[DocInfo]) -> Result<u64> {
        let winners = self.check_restored(docs)?;
        let mut st = self.state.write();
        let st = &mut *st;
        let mut plan = RecordPlan::new();
        for d in docs {
            if std::ptr::eq(winners[d.name.as_str()], d) {
                plan_doc_put(&st.docs, d, &mut plan);
            }
        }
        self.append(st, &plan)
    }
}

impl Shard {
    /// Checks documents to restore (see [`restore_docs`](Self::restore_docs)); returns, for
    /// each name, the one document kept: the largest (timestamp, id).
    fn check_restored<'a>(
        &self,
        docs: &'a [DocInfo],
    ) -> Result<hashbrown::HashMap<&'a str, &'a DocInfo>> {
        self.check_serving()?;
        self.check_names()?;
        let max = self.config.max_id_bytes;
        for d in docs {
            check_doc(d, max)?;
            if d.gid >= MAX_RESTORED_ID {
                return Err(Error::InvalidInput(format!(
                    "document {:?} has id {}, past 2^62",
                    d.name, d.gid
                )));
            }
        }
        let mut winners: hashbrown::HashMap<&str, &DocInfo> =
            hashbrown::HashMap::with_capacity(docs.len());
        for d in docs {
            let w = winners.entry(d.name.as_str()).or_insert(d);
            if (d.ts_ms, d.gid) > (w.ts_ms, w.gid) {
                *w = d;
            }
        }
        Ok(winners)
    }

    /// Whether the shard holds nothing: no document, no index entry, nothing buffered.
    fn is_empty(st: &super::State) -> bool {
        st.docs.is_empty() && st.index.is_empty() && st.index.buffered().is_empty()
    }

    /// Restores `docs` into an empty shard at once, as [`restore_docs`](Self::restore_docs)
    /// would store them, without the log: the document table and the index are built whole
    /// (one run, no merges), the sketches written, then a document snapshot and a
    /// checkpoint make all of it durable before this returns. Returns the log sequence the
    /// restored state has. Refused (`InvalidInput`) unless the shard is empty, before and
    /// after the build. A crash before the checkpoint leaves a shard whose recovery does
    /// not match its expectation record: it does not serve, and is restored again from an
    /// empty data directory.
    pub fn restore_bulk(&self, docs: &[DocInfo]) -> Result<u64> {
        let winners = self.check_restored(docs)?;
        let empty = || -> Result<()> {
            if Self::is_empty(&self.state.read()) {
                Ok(())
            } else {
                Err(Error::InvalidInput("a bulk restore needs an empty node".into()))
            }
        };
        empty()?;
        let mut seen = hashbrown::HashSet::with_capacity(docs.len());
        let kept: Vec<&DocInfo> = docs
            .iter()
            .filter(|d| std::ptr::eq(winners[d.name.as_str()], *d) && seen.insert(d.gid))
            .collect();
        drop(winners);
        let index = neardup_core::Index::build(
            self.config.index.clone(),
            &kept
                .iter()
                .map(|d| neardup_core::Doc { id: d.gid, fp: d.fp, ts: d.ts_ms })
                .collect::<Vec<_>>(),
        )?;
        let table = crate::doc_table::DocTable::from_entries(
            kept.iter()
                .map(|d| crate::doc_table::DocEntry {
                    id: d.gid,
                    fp: d.fp,
                    ts: d.ts_ms,
                    cluster: d.cluster,
                    name: d.name.as_str().into(),
                })
                .collect(),
        );
        // Sixteen a batch, as `drain_sketches` writes them. A crash leaves sketches of no
        // recovered document, which recovery drops.
        let sketched: Vec<(Vec<u8>, Option<Vec<u8>>)> = kept
            .iter()
            .filter_map(|d| d.sketch.as_ref().map(|s| (key64(d.gid).to_vec(), Some(s.clone()))))
            .collect();
        for chunk in sketched.chunks(16) {
            self.spaces.sketches.apply(chunk.to_vec())?;
        }
        let seq = {
            let mut st = self.state.write();
            if !Self::is_empty(&st) {
                return Err(Error::InvalidInput(
                    "a bulk restore needs an empty node: documents were written meanwhile".into(),
                ));
            }
            st.docs = table;
            st.index = index;
            st.generation += 1;
            st.seals.clear();
            st.last_seq += 1;
            st.covered = st.last_seq;
            st.last_write = std::time::Instant::now();
            // No log record has this sequence; group commit counts it appended, so that a
            // wait for it (a later write that logs nothing answers with it) ends once the
            // next sync has run, as the checkpoint below makes everything durable.
            self.committer()?.appended(st.last_seq);
            st.last_seq
        };
        self.snapshot_docs()?;
        self.checkpoint()?;
        Ok(seq)
    }
}

impl BackupCopy {
    /// The next documents of the table, at most `max`; `None` once every slot is read.
    pub fn next_docs(&mut self, max: usize) -> Result<Option<Vec<DocInfo>>> {
        if self.done {
            return Ok(None);
        }
        let shard = &self.shard;
        shard.check_serving()?;
        let (entries, next, end) = {
            let st = shard.state.read();
            let now = st.docs.generation();
            if *self.generation.get_or_insert(now) != now {
                return Err(Error::BeginAgain(
                    "the document table was compacted during the backup; begin it again".into(),
                ));
            }
            let (entries, next) = st.docs.entries_from(self.slot, max.max(1));
            let entries: Vec<_> =
                entries.into_iter().filter(|e| e.id < self.first_new).cloned().collect();
            (entries, next, next >= st.docs.slot_count())
        };
        self.slot = next;
        self.done = end;
        let docs = entries
            .into_iter()
            .map(|e| {
                Ok(DocInfo {
                    gid: e.id,
                    sketch: shard.sketch_bytes(e.id)?,
                    name: e.name.into(),
                    fp: e.fp,
                    ts_ms: e.ts,
                    cluster: e.cluster,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(docs))
    }

    /// Reads the log records written since the copy began ([`BackupTail`]).
    pub fn finish(self) -> Result<BackupTail> {
        let shard = &self.shard;
        shard.check_serving()?;
        let (seq, documents) = {
            let st = shard.state.read();
            (st.last_seq, st.docs.len() as u64)
        };
        let mut tail = BackupTail { seq, documents, ..Default::default() };
        let from = key64(self.from.saturating_add(1));
        let to = key64(seq.saturating_add(1));
        let mut next = self.from + 1;
        for e in shard.spaces.log.scan(&from, &to) {
            let (k, v) = e?;
            let at = persist::log_seq(&k)?;
            if at != next {
                return Err(Error::Internal(format!(
                    "log record {next} is missing while a backup holds the log from {}",
                    self.from
                )));
            }
            next += 1;
            for op in record::decode(&v)? {
                match op {
                    Op::Put { id, fp, ts, cluster, name, sketch } => tail.puts.push(DocInfo {
                        gid: id,
                        name: name.into(),
                        fp,
                        ts_ms: ts,
                        cluster,
                        sketch: sketch.map(<[u8]>::to_vec),
                    }),
                    Op::Remove { id, .. } => tail.removed.push(id),
                    Op::RemoveRange { .. } | Op::AddRun { .. } => {
                        return Err(Error::Internal(
                            "a shard with names logged an operation of tablets".into(),
                        ));
                    }
                }
            }
        }
        if next != seq + 1 {
            return Err(Error::Internal(format!(
                "the log ends at {} while the shard has written up to {seq}",
                next - 1
            )));
        }
        Ok(tail)
    }
}

impl Drop for BackupCopy {
    fn drop(&mut self) {
        let mut pins = self.shard.backup_pins.lock();
        if let Some(i) = pins.iter().position(|&p| p == self.from) {
            pins.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use neardup_core::sketch::MAX_ENCODED_BYTES;
    use neardup_core::util::SplitMix64;

    use super::super::shard_tests::{config, doc};
    use super::*;
    use crate::ShardMetrics;
    use crate::shard::Verify;

    fn open(dir: &std::path::Path) -> Arc<Shard> {
        let s = Shard::open(dir, config(), ShardMetrics::default()).unwrap();
        s.recover().unwrap();
        s
    }

    /// Every stored document, by name, with what a backup keeps of it.
    fn state(shard: &Shard) -> BTreeMap<String, DocInfo> {
        shard.docs_where(|_| true).unwrap().into_iter().map(|d| (d.name.clone(), d)).collect()
    }

    /// What a restore stores from a copy: the documents read and put, the removed left out.
    fn restored(docs: Vec<DocInfo>, tail: &BackupTail) -> Vec<DocInfo> {
        let removed: HashSet<u64> = tail.removed.iter().copied().collect();
        let mut seen = HashSet::new();
        docs.into_iter()
            .chain(tail.puts.iter().cloned())
            .filter(|d| !removed.contains(&d.gid) && seen.insert(d.gid))
            .collect()
    }

    /// Writes land in slots already read and slots not read yet while a copy is open; the
    /// copy, restored into a fresh shard, is exactly the state when it finished: same ids,
    /// names, fingerprints, timestamps, clusters and sketches, and exact queries.
    #[test]
    fn a_copy_taken_under_writes_restores_the_state_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir.path().join("a"));
        let mut rng = SplitMix64::new(7);
        let config = neardup_core::fingerprint::FingerprintConfig::default();
        let mut f = neardup_core::fingerprint::Fingerprinter::new(config).unwrap();
        let sketch =
            neardup_core::sketch::Sketch::of_text(&mut f, "a text with a few words in it").unwrap();
        let mut docs: Vec<_> =
            (0..3000).map(|i| doc(&format!("d{i}"), rng.next_u64(), i)).collect();
        for d in docs.iter_mut().step_by(7) {
            d.sketch = Some(sketch.clone());
        }
        let out = shard.write(&docs, &[], false).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
        // Admissions that join clusters (a near-duplicate of d1 and of d2).
        for (i, base) in [1u64, 2].into_iter().enumerate() {
            let fp = docs[base as usize].fingerprint ^ 1;
            let (_, seq) = shard
                .admit(&doc(&format!("near{i}"), fp, 5000), 3, Verify::OFF, 10, false)
                .unwrap();
            shard.wait_durable_blocking(seq).unwrap();
        }
        let mut copy = shard.backup().unwrap();
        let mut read = copy.next_docs(1000).unwrap().unwrap();
        // Deletes of documents read and not read yet (freeing slots), replacements, new
        // documents (reusing the freed slots, some before the cursor).
        let dels: Vec<String> = ["d3", "d2500", "d10", "d2900"].map(String::from).to_vec();
        let out = shard.write(&[], &dels, true).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
        let mut news: Vec<_> =
            (0..6).map(|i| doc(&format!("new{i}"), rng.next_u64(), 10_000 + i)).collect();
        news.push(doc("d5", rng.next_u64(), 20_000));
        news.push(doc("d2700", rng.next_u64(), 20_001));
        let out = shard.write(&news, &[], false).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
        while let Some(more) = copy.next_docs(1000).unwrap() {
            read.extend(more);
        }
        // Writes after the table is read, before the copy ends, are in it too.
        let out =
            shard.write(&[doc("late", rng.next_u64(), 30_000)], &["d20".into()], true).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
        // A rebuild, a checkpoint and a document snapshot, which together cover every
        // record, while the copy is open: they must not take the log it needs.
        shard.compact_all().unwrap();
        shard.checkpoint().unwrap();
        shard.snapshot_docs().unwrap();
        let tail = copy.finish().unwrap();
        assert!(!tail.removed.is_empty() && !tail.puts.is_empty());
        let want = state(&shard);
        let ids: HashSet<u64> = read.iter().map(|d| d.gid).collect();
        assert_eq!(ids.len(), read.len());
        assert!(tail.puts.iter().all(|d| !ids.contains(&d.gid)), "a document sent twice");
        let copied = restored(read, &tail);
        assert_eq!(copied.len(), want.len());
        assert_eq!(tail.documents, want.len() as u64);

        // Through the log, into one fresh shard, and whole, into another.
        let logged = open(&dir.path().join("logged"));
        let seq = logged.restore_docs(&copied).unwrap();
        logged.wait_durable_blocking(seq).unwrap();
        assert_eq!(state(&logged), want);
        let fresh = open(&dir.path().join("b"));
        fresh.restore_bulk(&copied).unwrap();
        assert_eq!(state(&fresh), want);
        assert_eq!(fresh.stats().unwrap().runs, 1);
        // Whole again: refused, the shard holds documents.
        let e = fresh.restore_bulk(&copied).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
        // Again through the log (a resumed restore): nothing changes.
        let seq = fresh.restore_docs(&copied).unwrap();
        fresh.wait_durable_blocking(seq).unwrap();
        assert_eq!(state(&fresh), want);

        // Queries against brute force over the state, after a restart.
        fresh.shutdown().unwrap();
        drop(fresh);
        let fresh = open(&dir.path().join("b"));
        assert_eq!(state(&fresh), want);
        for q in want.values().take(300).map(|d| d.fp ^ 3) {
            let mut got: Vec<String> = fresh.probe(&[q], 3, 10_000).unwrap()[0]
                .matches
                .iter()
                .map(|m| m.id.clone())
                .collect();
            got.sort();
            let brute: Vec<String> = want
                .values()
                .filter(|d| (d.fp ^ q).count_ones() <= 3)
                .map(|d| d.name.clone())
                .collect();
            assert_eq!(got, brute, "query {q:#x}");
        }
        // New documents after a restore get ids past the restored ones.
        let out = fresh.write(&[doc("after", rng.next_u64(), 40_000)], &[], false).unwrap();
        fresh.wait_durable_blocking(out.seq).unwrap();
        let after = state(&fresh);
        let max = want.values().map(|d| d.gid).max().unwrap();
        assert!(after["after"].gid > max);
        assert_eq!(after.len(), want.len() + 1);
    }

    #[test]
    fn a_restore_refuses_bad_documents_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(dir.path());
        let good = DocInfo { gid: 5, name: "a".into(), fp: 1, ts_ms: 0, cluster: 5, sketch: None };
        for bad in [
            DocInfo { gid: 0, ..good.clone() },
            DocInfo { gid: MAX_RESTORED_ID, ..good.clone() },
            DocInfo { name: String::new(), ..good.clone() },
            DocInfo { sketch: Some(vec![0; MAX_ENCODED_BYTES + 1]), ..good.clone() },
        ] {
            let batch = [good.clone(), bad];
            for e in
                [shard.restore_docs(&batch).unwrap_err(), shard.restore_bulk(&batch).unwrap_err()]
            {
                assert!(matches!(e, Error::InvalidInput(_)), "{e}");
            }
            assert!(state(&shard).is_empty());
        }
    }
}
