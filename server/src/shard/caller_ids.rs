//! Writes and reads with ids the caller assigns, for a cluster node's store
//! ([`crate::node_store`]): bare index entries `(id, fp)` in a shard without names, and
//! documents under cluster-wide gids, last writer wins, in a shard with names.
//!
//! Both write paths go through the same log records, group commit, runs and checkpoints
//! as [`Shard::write`]; only the decision of what to log differs. Every write is idempotent:
//! it logs only what changes the state, judged under the write lock.

use neardup_core::index::QueryScratch;
use neardup_core::sketch::MAX_ENCODED_BYTES;
use neardup_core::{Doc, Match};
use parking_lot::RwLockWriteGuard;

use super::write_path::{RecordPlan, check_name};
use super::{RunKey, Shard, StoredRun};
use crate::data_types::{DocInfo, DocOp};
use crate::doc_table::{DocEntry, DocTable};
use crate::error::{Error, Result};
use crate::persist::{self, key64};
use crate::record::Op;

/// One change to a shard without names: store or remove the entry `(id, fp)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryOp {
    /// Store (true) or remove (false).
    pub put: bool,
    /// The entry's id (never 0).
    pub id: u64,
    /// Its value as the index holds it.
    pub fp: u64,
    /// A put of an id never written to this shard before (the caller knows): stored without
    /// looking whether the index holds it. Ignored for removals.
    pub new: bool,
}

/// Refuses entries with id 0 (given as `(id, value)`).
fn check_ids(mut entries: impl Iterator<Item = (u64, u64)>) -> Result<()> {
    match entries.find(|&(id, _)| id == 0) {
        Some((_, fp)) => Err(Error::InvalidInput(format!("entry id 0 (value {fp:#x})"))),
        None => Ok(()),
    }
}

/// Checks a document with a caller-assigned id: its name (at most `max` bytes), an id
/// other than 0, a sketch of a length that can be one.
pub(super) fn check_doc(d: &DocInfo, max: usize) -> Result<()> {
    check_name(&d.name, max)?;
    if d.gid == 0 {
        return Err(Error::InvalidInput(format!("document {:?} has id 0", d.name)));
    }
    if d.sketch.as_ref().is_some_and(|s| s.len() > MAX_ENCODED_BYTES) {
        return Err(Error::InvalidInput(format!(
            "the sketch of {:?} is longer than {MAX_ENCODED_BYTES} bytes",
            d.name,
        )));
    }
    Ok(())
}

/// Documents [`Shard::write_docs`] decides and applies under one hold of the write lock,
/// which reads of documents wait for: a few hundred microseconds of work. On a node whose
/// partitions were being copied or dropped (a million documents), an op took about 8 us,
/// and a hold of 512 ops 2-38 ms.
const DOCS_PER_HOLD: usize = 64;

/// Fingerprints a run [`Shard::add_entries`] adds hashes into the index's recent tables
/// under one hold of the write lock, which probes wait for (see
/// [`Index::add_run_deferred`](neardup_core::Index::add_run_deferred)). In process, a
/// copied page of 65,536 entries took 2 ms hashed whole into a tablet's table, and 0.2 ms
/// a hold of this many (a hold that grows the table, once per doubling, takes longer); a
/// node taking a tablet, descheduled in its holds, held the lock 5-105 ms for a whole page.
const RECENT_STEP: usize = 4096;

/// Plans the put of `d` under its own id as writes of caller ids decide it: nothing if the
/// id is held, or if the name's holder has a larger `(ts_ms, gid)`; else the put, after the
/// removal of the name's holder if there is one. The id of the holder it removes, if any.
pub(super) fn plan_doc_put<'a>(
    docs: &DocTable,
    d: &'a DocInfo,
    plan: &mut RecordPlan<'a>,
) -> Option<u64> {
    if docs.by_id(d.gid).is_some() {
        return None;
    }
    let put = Op::Put {
        id: d.gid,
        fp: d.fp,
        ts: d.ts_ms,
        cluster: d.cluster,
        name: &d.name,
        sketch: d.sketch.as_deref(),
    };
    match docs.by_name(&d.name) {
        Some(old) if (old.ts, old.id) > (d.ts_ms, d.gid) => None,
        Some(old) => {
            plan.push(Op::Remove { id: old.id, fp: old.fp }, Some(put));
            Some(old.id)
        }
        None => {
            plan.push(put, None);
            None
        }
    }
}

impl Shard {
    /// Refuses calls that need the document table on a shard without one.
    pub(super) fn check_names(&self) -> Result<()> {
        if self.config.names {
            Ok(())
        } else {
            Err(Error::Internal("this shard keeps no document names".into()))
        }
    }

    fn check_nameless(&self) -> Result<()> {
        if self.config.names {
            Err(Error::Internal("this shard keeps documents: write them with names".into()))
        } else {
            Ok(())
        }
    }

    /// Whether the index holds the live entry `(id, fp)`.
    fn holds(index: &neardup_core::Index, id: u64, fp: u64, out: &mut Vec<Match>) -> Result<bool> {
        index.query_into(fp, 0, &mut QueryScratch::default(), out)?;
        Ok(out.iter().any(|m| m.id == id && m.fp == fp))
    }

    /// Applies entry changes to a shard without names, in order; returns the log sequence
    /// to wait for ([`wait_durable`](Self::wait_durable)). A put of an entry already held
    /// and a removal of one not held change nothing and log nothing. Whether an entry is
    /// held costs a lookup in every run, under the write lock: a put marked
    /// [`new`](EntryOp::new) skips it.
    pub fn write_entries(&self, ops: &[EntryOp]) -> Result<u64> {
        self.write_entries_deciding(ops, |_| false)
    }

    /// [`write_entries`](Self::write_entries), where `new(id)`, asked under the write lock
    /// for each put not marked [`new`](EntryOp::new), may say that the id is new too: a
    /// caller whose knowledge of that changes as other writes arrive decides it here, where
    /// no other write to the shard can come between the decision and the put.
    pub fn write_entries_deciding(
        &self,
        ops: &[EntryOp],
        new: impl Fn(u64) -> bool,
    ) -> Result<u64> {
        self.check_serving()?;
        self.check_nameless()?;
        check_ids(ops.iter().map(|o| (o.id, o.fp)))?;
        let mut st = self.state.write();
        let st = &mut *st;
        // What this batch has decided so far, over what the index holds. Under the write
        // lock, once per entry: a fast hash (std's SipHash took a tenth of loading a node's
        // tablets).
        let mut decided: hashbrown::HashMap<(u64, u64), bool> =
            hashbrown::HashMap::with_capacity(ops.len());
        let mut plan = RecordPlan::new();
        let mut out = Vec::new();
        for op in ops {
            let held = match decided.get(&(op.id, op.fp)) {
                Some(&h) => h,
                None if op.put && (op.new || new(op.id)) => false,
                None => Self::holds(&st.index, op.id, op.fp, &mut out)?,
            };
            if held == op.put {
                continue;
            }
            decided.insert((op.id, op.fp), op.put);
            plan.push(
                if op.put {
                    Op::Put { id: op.id, fp: op.fp, ts: 0, cluster: 0, name: "", sketch: None }
                } else {
                    Op::Remove { id: op.id, fp: op.fp }
                },
                None,
            );
        }
        self.append(st, &plan)
    }

    /// Adds the entries `docs` (ids not 0) to a shard without names in bulk, for a copy of a
    /// tablet: one run built and stored off the write lock, then added under it by one log
    /// record that names the run ([`Op::AddRun`]), not the entries. No log record, write
    /// buffer, seal or merge an entry, as [`write_entries`](Self::write_entries) costs.
    ///
    /// The caller keeps out of `docs` every entry the shard holds. Those it cannot rule out
    /// because writes may store them meanwhile, `may_hold(docs)` names (by position),
    /// asked under the write lock once the run is built: each that the shard holds then is
    /// removed by the same record, before the run adds it again, so that no entry is held
    /// twice.
    ///
    /// The run is durable before the record that names it, and a checkpoint stores it like
    /// any other run. The write buffers become runs first (under the write lock), as the
    /// runs must hold exactly the records up to some sequence. The run's values join the
    /// index's recent tables after, a few thousand a hold ([`RECENT_STEP`]). Returns the log
    /// sequence to wait for and the entries added.
    pub fn add_entries(
        &self,
        docs: &[Doc],
        may_hold: impl FnOnce(&[Doc]) -> Vec<usize>,
    ) -> Result<(u64, u64)> {
        self.check_serving()?;
        self.check_nameless()?;
        check_ids(docs.iter().map(|d| (d.id, d.fp)))?;
        if docs.is_empty() {
            return Ok((self.state.read().last_seq, 0));
        }
        // No rebuild of the index (which numbers its runs afresh and replays the log, where
        // this record cannot be applied from its bytes) while the run is made; and its
        // storage id is taken and the run added under the checkpoint lock, which recovery
        // relies on (see `recover_index`).
        let _one = self.maintaining.lock();
        let mut ck = self.checkpoints.lock();
        let builder = self.state.write().index.run_builder();
        let run = builder.build(docs)?;
        let count = run.len() as u64;
        let sid = ck.manifest.next_sid.max(1);
        ck.manifest.next_sid = sid + 1;
        persist::write_run(
            &self.spaces,
            sid,
            &run,
            &self.config.index.design,
            self.config.stored_tables,
        )?;
        // Durable before the record that names it.
        self.sync()?;
        let mut guard = self.state.write();
        let st = &mut *guard;
        self.check_serving()?;
        // The runs hold exactly the records up to `covered`: the write buffers go into runs
        // first, so that the run and its record are covered together. Replaying the log
        // after a manifest then never meets an entry of this run before its record.
        st.cover_all()?;
        let mut ops = Vec::new();
        let mut held = Vec::new();
        let mut out = Vec::new();
        for i in may_hold(docs) {
            let Some(&d) = docs.get(i) else { continue };
            if Self::holds(&st.index, d.id, d.fp, &mut out)? {
                ops.push(Op::Remove { id: d.id, fp: d.fp });
                held.push(d);
            }
        }
        ops.push(Op::AddRun { sid, count });
        let seq = self.log_record(st, &ops)?;
        for d in held {
            st.index.delete_doc(d.id, d.fp)?;
        }
        let key = RunKey::of(st, &run);
        st.index.add_run_deferred(run, RECENT_STEP)?;
        st.covered = seq;
        ck.stored.insert(key, StoredRun { sid, deletes_written: 0 });
        // Admissions asking what was stored since an earlier sequence query again.
        self.recent.lock().forget_through(seq);
        self.applied(st, 1);
        drop(guard);
        drop(ck);
        self.cover_recent();
        Ok((seq, count))
    }

    /// Hashes the runs waiting to join the index's recent tables ([`add_entries`]' runs,
    /// and what merges make of them, once small), [`RECENT_STEP`] fingerprints under each
    /// write lock, handed fairly to the readers waiting between two.
    ///
    /// [`add_entries`]: Self::add_entries
    pub(super) fn cover_recent(&self) {
        if !self.state.read().index.recent_waiting() {
            return;
        }
        loop {
            let mut st = self.state.write();
            let more = st.index.cover_recent();
            RwLockWriteGuard::unlock_fair(st);
            if !more {
                break;
            }
        }
    }

    /// Removes every entry whose value is in `lo..=hi` (a shard without names: a tablet
    /// that moved away) in one log record that names the range, not the entries: two seeks
    /// a run and a mark an entry, under the write lock. Returns the log sequence to wait
    /// for and how many entries it removed (none: nothing logged).
    pub fn remove_range(&self, lo: u64, hi: u64) -> Result<(u64, u64)> {
        self.check_serving()?;
        self.check_nameless()?;
        if lo > hi {
            return Err(Error::InvalidInput(format!("an empty range {lo:#x}..={hi:#x}")));
        }
        let mut st = self.state.write();
        let st = &mut *st;
        let count = st.index.live_count_in(lo, hi) as u64;
        if count == 0 {
            return Ok((st.last_seq, 0));
        }
        let mut plan = RecordPlan::new();
        plan.push(Op::RemoveRange { lo, hi, count }, None);
        Ok((self.append(st, &plan)?, count))
    }

    /// A page of the live entries whose value is in `lo..=hi`, in value order (then id), and
    /// where the next page starts: see [`Index::live_in`](neardup_core::Index::live_in).
    pub fn entries_in(&self, lo: u64, hi: u64, limit: usize) -> Result<(Vec<Doc>, Option<u64>)> {
        self.check_serving()?;
        Ok(self.state.read().index.live_in(lo, hi, limit))
    }

    /// About how many entries have a value in `lo..=hi` (removed ones count until a merge
    /// drops them): see [`Index::count_in`](neardup_core::Index::count_in).
    pub fn count_entries(&self, lo: u64, hi: u64) -> Result<u64> {
        self.check_serving()?;
        Ok(self.state.read().index.count_in(lo, hi))
    }

    /// The raw matches of each query within `k`, by distance, then timestamp, then id, into
    /// `outs` (one each; the vectors and `scratch` are reused, so a caller answering many
    /// groups allocates once).
    pub fn query_entries(
        &self,
        fps: &[u64],
        k: u32,
        scratch: &mut QueryScratch,
        outs: &mut Vec<Vec<Match>>,
    ) -> Result<()> {
        self.query_entries_if(fps, k, scratch, outs, true).map(|_| ())
    }

    /// [`query_entries`](Self::query_entries); without `wait`, nothing is done and `false`
    /// returned when the lock cannot be had at once (a writer holds it or waits for it).
    pub fn query_entries_if(
        &self,
        fps: &[u64],
        k: u32,
        scratch: &mut QueryScratch,
        outs: &mut Vec<Vec<Match>>,
        wait: bool,
    ) -> Result<bool> {
        self.check_serving()?;
        let Some(st) = (if wait { Some(self.state.read()) } else { self.state.try_read() }) else {
            return Ok(false);
        };
        st.index.query_many_into(fps, k, scratch, outs)?;
        Ok(true)
    }

    /// Applies document changes with caller-assigned ids (gids) to a shard with names, in
    /// order; returns the log sequence to wait for. A put whose name another id holds
    /// replaces it only if its `(ts_ms, gid)` is larger, and is ignored otherwise; a put of
    /// an id already held changes nothing; a removal removes the name only while it has
    /// that id. A request that fails validation changes nothing. The ops are applied a few
    /// dozen at a time: other writes may come between those, never inside one op.
    pub fn write_docs(&self, ops: &[DocOp]) -> Result<u64> {
        self.check_serving()?;
        self.check_names()?;
        let max = self.config.max_id_bytes;
        for op in ops {
            match op {
                DocOp::Put(d) => check_doc(d, max)?,
                DocOp::Remove { name, .. } => check_name(name, max)?,
            }
        }
        // `DOCS_PER_HOLD` at a time (why: there); each op decided and applied whole under one
        // hold.
        let mut seq = None;
        for chunk in ops.chunks(DOCS_PER_HOLD) {
            seq = Some(self.write_docs_held(chunk)?);
        }
        Ok(seq.unwrap_or_else(|| self.state.read().last_seq))
    }

    /// [`write_docs`](Self::write_docs) of `ops` (checked) under one hold of the write lock.
    fn write_docs_held(&self, ops: &[DocOp]) -> Result<u64> {
        let mut st = self.state.write();
        let st = &mut *st;
        // Each decision must see what the ones before it did. An op decides on its name's
        // and its id's entries, and changes only those and the holder its put replaces; so
        // ops touching none of the names and ids the ops planned so far touch are decided
        // on the table as it is, and logged together (a page of a partition's copy is a few
        // records, not one each). An op that touches one appends the plan first.
        let mut plan = RecordPlan::new();
        let (mut names, mut ids) = (hashbrown::HashSet::new(), hashbrown::HashSet::new());
        for op in ops {
            let (name, gid) = match op {
                DocOp::Put(d) => (d.name.as_str(), d.gid),
                DocOp::Remove { gid, name } => (name.as_str(), *gid),
            };
            if names.contains(name) || ids.contains(&gid) {
                self.append(st, &std::mem::take(&mut plan))?;
                names.clear();
                ids.clear();
            }
            match op {
                DocOp::Put(d) => ids.extend(plan_doc_put(&st.docs, d, &mut plan)),
                DocOp::Remove { gid, name } => match st.docs.by_name(name) {
                    Some(old) if old.id == *gid => {
                        plan.push(Op::Remove { id: old.id, fp: old.fp }, None)
                    }
                    _ => {}
                },
            }
            names.insert(name);
            ids.insert(gid);
        }
        self.append(st, &plan)
    }

    /// The document's stored sketch bytes, if it has one (queued or in the store).
    pub(super) fn sketch_bytes(&self, id: u64) -> Result<Option<Vec<u8>>> {
        if let Some((_, q)) = self.pending_sketches.lock().get(&id) {
            return Ok(q.clone());
        }
        self.spaces.sketches.get(&key64(id))
    }

    /// `e` as a [`DocInfo`]; with `sketches`, its stored sketch read (from the store unless
    /// queued: a storage read a document), else none.
    fn info(&self, e: DocEntry, sketches: bool) -> Result<DocInfo> {
        Ok(DocInfo {
            gid: e.id,
            sketch: if sketches { self.sketch_bytes(e.id)? } else { None },
            name: e.name.into(),
            fp: e.fp,
            ts_ms: e.ts,
            cluster: e.cluster,
        })
    }

    /// The state, read for documents: without queueing behind a waiting writer while others
    /// read, so that a query's documents are read while [`compact_docs`](Self::compact_docs)
    /// builds a table (writes wait for it); writes still get the lock between reads of
    /// microseconds.
    fn read_docs(&self) -> parking_lot::RwLockReadGuard<'_, super::State> {
        self.state.read_recursive()
    }

    /// Documents by name (`None` if absent).
    pub fn docs_by_names(&self, names: &[&str]) -> Result<Vec<Option<DocInfo>>> {
        self.check_serving()?;
        self.check_names()?;
        self.docs_in(self.read_docs(), names, |docs, n| docs.by_name(n), true)
    }

    /// Documents by id (`None` if absent); with `sketches`, with their stored sketches (a
    /// storage read a document; without, the documents come from memory alone).
    pub fn docs_by_ids(&self, ids: &[u64], sketches: bool) -> Result<Vec<Option<DocInfo>>> {
        self.check_serving()?;
        self.check_names()?;
        if ids.is_empty() {
            return Ok(Vec::new()); // without waiting for a writer's hold
        }
        self.docs_in(self.read_docs(), ids, |docs, &id| docs.by_id(id), sketches)
    }

    /// [`docs_by_ids`](Self::docs_by_ids); without `wait`, `None` when the lock cannot be
    /// had at once (a writer holds it).
    pub fn docs_by_ids_if(
        &self,
        ids: &[u64],
        wait: bool,
        sketches: bool,
    ) -> Result<Option<Vec<Option<DocInfo>>>> {
        if wait || ids.is_empty() {
            return self.docs_by_ids(ids, sketches).map(Some);
        }
        self.check_serving()?;
        self.check_names()?;
        let Some(st) = self.state.try_read_recursive() else { return Ok(None) };
        self.docs_in(st, ids, |docs, &id| docs.by_id(id), sketches).map(Some)
    }

    /// The document `find` gives for each key in the state `st` holds (released before
    /// their sketches are read, with `sketches`).
    fn docs_in<K>(
        &self,
        st: parking_lot::RwLockReadGuard<'_, super::State>,
        keys: &[K],
        find: impl for<'d> Fn(&'d DocTable, &K) -> Option<&'d DocEntry>,
        sketches: bool,
    ) -> Result<Vec<Option<DocInfo>>> {
        let found: Vec<Option<DocEntry>> =
            keys.iter().map(|k| find(&st.docs, k).cloned()).collect();
        drop(st);
        found.into_iter().map(|e| e.map(|e| self.info(e, sketches)).transpose()).collect()
    }

    /// Holds the state's write lock until the guard is dropped: a test's stand-in for a
    /// writer (a merge installed, a page of a copy).
    #[cfg(test)]
    pub(crate) fn hold_write_lock(&self) -> impl Sized + '_ {
        self.state.write()
    }

    /// A page of the documents whose id satisfies `keep`, from `cursor` (0 to start): at most
    /// `limit`, fewer when the page met its bound of slots visited (so that no page holds the
    /// table's lock for long); with the cursor of the next page, `None` at the end. The pages
    /// of one pass hold every document that was there throughout it, once. A cursor names a
    /// slot of the table as it was laid out: one from before a
    /// [`compact_docs`](Self::compact_docs) is refused, and the pass must begin again.
    pub fn docs_page(
        &self,
        keep: impl Fn(u64) -> bool,
        cursor: u64,
        limit: usize,
    ) -> Result<(Vec<DocInfo>, Option<u64>)> {
        /// Slots a page visits at most.
        const VISITS: usize = 1 << 20;
        self.check_serving()?;
        self.check_names()?;
        // A cursor is the slot, with the table's generation plus one above it (0: start).
        let (generation, from) = ((cursor >> 32) as u32, (cursor & u64::from(u32::MAX)) as usize);
        let (found, next): (Vec<DocEntry>, _) = {
            let st = self.state.read();
            let now = st.docs.generation().wrapping_add(1);
            if cursor != 0 && generation != now {
                return Err(Error::BeginAgain(format!(
                    "the document table was compacted since this pass began (cursor \
                     {cursor:#x}): begin the pass again"
                )));
            }
            let (page, next) = st.docs.entries_where_from(from, limit.max(1), VISITS, keep);
            let next = next.map(|n| (u64::from(now) << 32) | n as u64);
            (page.into_iter().cloned().collect(), next)
        };
        let docs = found.into_iter().map(|e| self.info(e, true)).collect::<Result<_>>()?;
        Ok((docs, next))
    }

    /// Gives back the memory of the document table's freed slots once at most three quarters
    /// of them are live ([`DocTable::compacted`](crate::doc_table::DocTable::compacted)), as
    /// after a cluster node dropped a partition. Not while a snapshot of the table is written
    /// (it walks the slots across calls); a backup or a paged scan that meets it begins
    /// again. Whether it did.
    ///
    /// The compacted table is built under an upgradable read lock: writes wait for it (tens
    /// of milliseconds at a million slots), reads of documents
    /// ([`read_docs`](Self::read_docs)) go on; it is swapped in under the write lock, and the
    /// old one freed after.
    pub fn compact_docs(&self) -> Result<bool> {
        self.check_serving()?;
        let _snapshots = self.checkpoints.lock();
        let st = self.state.upgradable_read();
        let Some(compacted) = st.docs.compacted() else { return Ok(false) };
        let mut st = parking_lot::RwLockUpgradableReadGuard::upgrade(st);
        let old = std::mem::replace(&mut st.docs, compacted);
        drop(st);
        drop(old);
        Ok(true)
    }

    /// The ids of the documents whose id satisfies `keep`, in no particular order.
    pub fn ids_where(&self, keep: impl Fn(u64) -> bool) -> Result<Vec<u64>> {
        self.check_serving()?;
        self.check_names()?;
        let st = self.state.read();
        let (found, _) = st.docs.entries_where_from(0, usize::MAX, usize::MAX, keep);
        Ok(found.into_iter().map(|e| e.id).collect())
    }

    /// Every document whose id satisfies `keep`, by id.
    pub fn docs_where(&self, keep: impl Fn(u64) -> bool) -> Result<Vec<DocInfo>> {
        self.check_serving()?;
        self.check_names()?;
        let mut found: Vec<DocEntry> = {
            let st = self.state.read();
            let (found, _) = st.docs.entries_where_from(0, usize::MAX, usize::MAX, keep);
            found.into_iter().cloned().collect()
        };
        found.sort_unstable_by_key(|e| e.id);
        found.into_iter().map(|e| self.info(e, true)).collect()
    }
}
