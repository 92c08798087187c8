//! Writes: ids checked and resolved under the write lock, operations cut into log records,
//! appended and applied; admissions; the wait for group commit.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::{Admission, NewDocument, ProbeBudget, Shard, State, Verify, WriteOutcome};
use crate::doc_table::DocEntry;
use crate::error::{Error, Result};
use crate::metrics::AdmissionStage;
use crate::persist::{Spaces, key64};
use crate::record::{self, Op, RecordWriter};

/// Checks a caller id.
pub(super) fn check_name(name: &str, max: usize) -> Result<()> {
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
#[derive(Default)]
pub(super) struct RecordPlan<'a> {
    groups: Vec<([Option<Op<'a>>; 2], usize)>,
}

impl<'a> RecordPlan<'a> {
    pub(super) fn new() -> Self {
        RecordPlan { groups: Vec::new() }
    }

    pub(super) fn push(&mut self, first: Op<'a>, second: Option<Op<'a>>) {
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
    /// Stores documents and removes ids (see [`WriteOutcome`]). The caller must wait for
    /// `seq` to be durable ([`wait_durable`](Self::wait_durable)) before acknowledging. A
    /// request that fails validation changes nothing.
    pub fn write(
        &self,
        docs: &[NewDocument],
        deletes: &[String],
        must_exist: bool,
    ) -> Result<WriteOutcome> {
        self.check_serving()?;
        self.check_names()?;
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
        let sketches: Vec<Option<Vec<u8>>> =
            docs.iter().map(|d| d.sketch.as_ref().map(|s| s.to_bytes())).collect();
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
            let put = Op::Put {
                id,
                fp: d.fingerprint,
                ts: d.timestamp_ms,
                cluster: id,
                name: &d.id,
                sketch: sketches[i].as_deref(),
            };
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
    pub(super) fn append(&self, st: &mut State, plan: &RecordPlan<'_>) -> Result<u64> {
        let max_puts = self.config.index.buffer_docs - 1;
        let records = plan.records(self.config.max_record_bytes, max_puts);
        for ops in &records {
            let seq = self.log_record(st, ops)?;
            // After the log record: its sketches go to the store off the write path
            // (`queue_sketches`), and recovery writes them again from the log.
            if self.config.names {
                self.queue_sketches(seq, ops);
            }
            self.freeze_if_full(st, seq, ops)?;
            Self::apply(st, seq, ops, self.config.names)?;
            let mut recent = self.recent.lock();
            for op in ops {
                if let Op::Put { id, fp, ts, .. } = *op {
                    recent.push(seq, id, fp, ts);
                }
            }
            drop(recent);
        }
        if !records.is_empty() {
            self.applied(st, records.len() as u64);
        }
        Ok(st.last_seq)
    }

    /// Writes `ops` to the log as the next record, for group commit to sync; returns its
    /// sequence. The caller applies it.
    pub(super) fn log_record(&self, st: &mut State, ops: &[Op<'_>]) -> Result<u64> {
        let commit = self.committer()?;
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
        Ok(seq)
    }

    /// After `records` log records were applied: counts them, and wakes maintenance when
    /// the runs are many enough to merge.
    pub(super) fn applied(&self, st: &mut State, records: u64) {
        self.metrics.appended(records);
        st.last_write = Instant::now();
        if st.index.runs().len() >= self.config.index.merge_fanout {
            self.wake();
        }
    }

    /// Queues what a record's operations do to the sketch store, for the sealing thread to
    /// write ([`drain_sketches`](Self::drain_sketches)): the store is written off the
    /// shard's write lock, and its work (sled rewriting pages, checkpoints removing runs)
    /// never holds up a write. Until written, [`sketch_of`](Self::sketch_of) answers from
    /// the queue. `seq` is the record's log sequence.
    fn queue_sketches(&self, seq: u64, ops: &[Op<'_>]) {
        let mut q = self.pending_sketches.lock();
        for op in ops {
            match *op {
                Op::Put { id, sketch: Some(s), .. } => {
                    q.insert(id, (seq, Some(s.to_vec())));
                }
                // Shards without names keep no sketches.
                Op::Put { sketch: None, .. } | Op::RemoveRange { .. } | Op::AddRun { .. } => {}
                Op::Remove { id, .. } => {
                    q.insert(id, (seq, None));
                }
            }
        }
    }

    /// Writes the queued sketches to the store (see [`queue_sketches`](Self::queue_sketches));
    /// durable at the next full sync. Entries changed meanwhile stay queued. A removal waits
    /// until its record is durable: a crash must not keep the removal of a sketch whose
    /// document the log still holds. (A stored sketch whose record a crash lost is harmless:
    /// recovery drops every sketch past the recovered documents.)
    pub(super) fn drain_sketches(&self) -> Result<()> {
        let durable = self.committer().map(|c| c.durable()).unwrap_or(0);
        let batch: Vec<(u64, super::QueuedSketch)> = self
            .pending_sketches
            .lock()
            .iter()
            .filter(|(_, (seq, v))| v.is_some() || *seq <= durable)
            .map(|(&id, v)| (id, v.clone()))
            .collect();
        if batch.is_empty() {
            return Ok(());
        }
        // Sixteen keys a batch: sled splits a leaf of more than 16 only on a later visit,
        // so a large batch of adjacent ids makes one leaf of thousands that every later
        // read then splits, rewriting it whole as a file of its own (a quarter of a second
        // at ten million documents, in a request).
        for chunk in batch.chunks(16) {
            self.spaces.sketches.apply(
                chunk.iter().map(|(id, (_, v))| (key64(*id).to_vec(), v.clone())).collect(),
            )?;
        }
        let mut q = self.pending_sketches.lock();
        for (id, v) in batch {
            if q.get(&id) == Some(&v) {
                q.remove(&id);
            }
        }
        Ok(())
    }

    /// What an operation does to the sketch store: a put with a sketch stores it, a removal
    /// drops the document's (if it has one).
    pub(super) fn store_sketch(spaces: &Spaces, op: &Op<'_>) -> Result<()> {
        match *op {
            Op::Put { id, sketch: Some(s), .. } => spaces.sketches.put(&key64(id), s),
            Op::Put { sketch: None, .. } | Op::RemoveRange { .. } | Op::AddRun { .. } => Ok(()),
            Op::Remove { id, .. } => spaces.sketches.remove(&key64(id)),
        }
    }

    /// Applies one appended record to memory. The buffer becomes a run only between records.
    fn apply(st: &mut State, seq: u64, ops: &[Op<'_>], names: bool) -> Result<()> {
        if names {
            for op in ops {
                st.docs.apply(op);
            }
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

    /// Crawl-frontier admission: finds the stored documents within `k` of `doc` (other than
    /// one with the same id), joins the cluster of the earliest of them, whose original is
    /// the document that founded it, and
    /// stores it unless `skip_if_duplicate` is set and it is a near-duplicate. Atomic: two
    /// near-duplicates admitted at once see each other in one order.
    ///
    /// With `verify` on and a sketch on `doc`, a candidate with a stored sketch counts only
    /// when it is within `verify.candidate_k` and its estimated Jaccard similarity reaches
    /// `verify.jaccard`; a candidate without one (or any, when `doc` has no sketch) counts
    /// when within `k`.
    pub fn admit(
        &self,
        doc: &NewDocument,
        k: u32,
        verify: Verify,
        limit: usize,
        skip_if_duplicate: bool,
    ) -> Result<(Admission, u64)> {
        self.check_serving()?;
        self.check_names()?;
        check_name(&doc.id, self.config.max_id_bytes)?;
        let limit = limit.max(1);
        let sketch_bytes = doc.sketch.as_ref().map(|s| s.to_bytes());
        let search_k =
            if verify.on() && doc.sketch.is_some() { k.max(verify.candidate_k) } else { k };
        // The candidates, found under the read lock, and their sketches, read before the
        // write lock so that no writer waits for the index or the disk. Under the write lock
        // only what changed in between is looked at (`recent_puts`). Internal ids are never
        // reused and a document's sketch is stored before it is visible, so what is read here
        // still holds under the lock; only candidates that arrive in between are read there.
        let stage = |stage, since: Instant| {
            self.metrics.admission_stage(stage, since.elapsed().as_secs_f64());
            Instant::now()
        };
        let started = Instant::now();
        let (seen_seq, mut raw) = {
            let st = self.state.read();
            st.index.check_k(k)?;
            st.index.check_k(verify.candidate_k)?;
            (st.last_seq, st.index.query(doc.fingerprint, search_k)?)
        };
        let mut at = stage(AdmissionStage::Candidates, started);
        let mut read = HashMap::new();
        if verify.on() && doc.sketch.is_some() && !raw.is_empty() {
            for m in &raw {
                read.insert(m.id, self.sketch_of(m.id)?);
            }
            at = stage(AdmissionStage::SketchReads, at);
        }
        let mut st = self.state.write();
        let at = stage(AdmissionStage::WriteLock, at);
        let st = &mut *st;
        if st.last_seq != seen_seq {
            let stored_since = self.recent.lock().within_since(doc.fingerprint, search_k, seen_seq);
            match stored_since {
                Some(new) => {
                    #[cfg(test)]
                    self.admissions_by_delta.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Gone since: deleted or replaced (ids are never reused).
                    raw.retain(|m| st.docs.by_id(m.id).is_some());
                    raw.extend(new.into_iter().filter(|m| st.docs.by_id(m.id).is_some()));
                    raw.sort_unstable_by_key(|m| (m.distance, m.ts, m.id));
                }
                None => {
                    #[cfg(test)]
                    self.admissions_by_delta.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    raw = st.index.query(doc.fingerprint, search_k)?;
                }
            }
        }
        let (matches, similarity) = self.verified(doc.sketch.as_ref(), verify, k, &raw, &read)?;
        let own = st.docs.by_name(&doc.id).map(|e| (e.id, e.fp));
        let result = Self::result(
            &st.docs,
            doc.fingerprint,
            &matches,
            &similarity,
            limit,
            own.map(|(id, _)| id),
            &mut ProbeBudget::default(),
        )?;
        let own_id = own.map(|(id, _)| id);
        // The cluster to join: that of the earliest stored match (smallest timestamp, then
        // first stored). Its original is the document that founded it (its internal id is
        // the cluster id), whatever the timestamps of those that joined it later: a document
        // once reported a duplicate is never named an original. Empty once the founder is no
        // longer stored (deleted, or replaced, by this very write too).
        let original: Option<(u64, String)> = matches
            .iter()
            .filter(|m| Some(m.id) != own_id)
            .min_by_key(|m| (m.ts, m.id))
            .and_then(|m| st.docs.by_id(m.id))
            .map(|joined: &DocEntry| {
                let cluster = joined.cluster;
                let founder = st
                    .docs
                    .by_id(cluster)
                    .filter(|f| f.cluster == cluster && Some(cluster) != own_id)
                    .map(|f| f.name.to_string());
                (cluster, founder.unwrap_or_default())
            });
        let duplicate = original.is_some();
        let insert = !(duplicate && skip_if_duplicate);
        let id = if insert { st.docs.allocate_id() } else { st.docs.next_id() };
        let (cluster, original_id) = original.unwrap_or_else(|| (id, doc.id.clone()));
        let mut seq = st.last_seq;
        if insert {
            let mut plan = RecordPlan::new();
            let put = Op::Put {
                id,
                fp: doc.fingerprint,
                ts: doc.timestamp_ms,
                cluster,
                name: &doc.id,
                sketch: sketch_bytes.as_deref(),
            };
            match own {
                Some((old, fp)) => plan.push(Op::Remove { id: old, fp }, Some(put)),
                None => plan.push(put, None),
            }
            seq = self.append(st, &plan)?;
        }
        stage(AdmissionStage::Decide, at);
        let response = Admission {
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
}
