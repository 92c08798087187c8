//! An immutable run: a batch of documents with all of its permuted tables.
//!
//! The index is log-structured: the write buffer is turned into a run when it fills, and
//! runs are merged as they accumulate. A run holds each distinct fingerprint once per table
//! and each document once, in the [`DocStore`]; the identity table's encoded table is also
//! the document store's key column.

use std::sync::Arc;

use rayon::prelude::*;

use super::doc_columns::DocStore;
use super::permuted_table::{Candidates, CrowdPolicy, NO_RANK, PermutedTable};
use super::{Doc, Match};
use crate::codec::{EncodedTable, HxTable, Layout, TableHit, TableOptions};
use crate::design::{Design, TableSpec};
use crate::error::{Error, Result};
use crate::permute::VisitMap;
use crate::util::{Values, sort_on_top_bits};

/// What building a run needs besides its documents.
#[derive(Debug, Clone)]
pub(crate) struct BuildContext {
    pub design: Design,
    pub opts: TableOptions,
    pub policy: CrowdPolicy,
    /// Build the tables in parallel on rayon's pool.
    pub parallel: bool,
}

/// A run in blocks whose packed directory would have at most this many bits more than its
/// tables' shortest prefix may be packed instead: a lookup then walks at most 2^3 directory
/// entries, where a block costs decoding half of it.
const PACK_SMALL_RUNS_WITHIN: u32 = 3;

/// ... and only beside a run at least this many times its size, so that the few bits a
/// value packing costs more fall on a small part of the index.
const PACK_SMALL_RUNS_BESIDE: usize = 8;

impl BuildContext {
    /// The options a run of `distinct` fingerprints is laid out with in memory, beside a
    /// largest other run of `beside`: the index's, except that a small run in blocks next
    /// to a much larger one is packed, if its packed directory reaches every prefix in a
    /// few steps. Live inserts make such runs; in blocks each costs every query a block
    /// decoded in every table, packed a directory entry and a value or two. Stored runs
    /// are blocks either way, and are loaded as stored.
    pub(crate) fn opts_for(&self, distinct: usize, beside: usize) -> TableOptions {
        let small = crate::codec::packed_dir_bits(distinct)
            <= self.design.min_prefix_bits() + PACK_SMALL_RUNS_WITHIN
            && beside >= distinct.max(1).saturating_mul(PACK_SMALL_RUNS_BESIDE);
        if self.opts.layout == Layout::Blocks && small {
            TableOptions { layout: Layout::Packed, ..self.opts }
        } else {
            self.opts
        }
    }
}

const META_MAGIC: [u8; 4] = *b"NDRN";
/// Version of the run metadata record.
const META_VERSION: u16 = 1;
/// The largest run id: ids count up from 1 by one a run, so no index comes near it, and one
/// above it in stored metadata is damage (it would leave no id for the runs after it).
const MAX_RUN_ID: u64 = 1 << 62;

/// One table of a stored run: its encoded table's header and blocks, as stored.
#[derive(Debug, Clone, Copy)]
pub struct StoredTable<'a> {
    /// The header of the table from [`Run::stored_table`].
    pub header: &'a [u8],
    /// Its blocks, in order.
    pub blocks: &'a [&'a [u8]],
}

/// An immutable batch of documents and its permuted tables.
#[derive(Debug)]
pub struct Run {
    id: u64,
    /// Distinct fingerprints in identity order; shared with the identity table.
    fps: Arc<EncodedTable>,
    docs: DocStore,
    tables: Vec<PermutedTable>,
    /// How the tables are laid out in memory, and how they are stored.
    opts: TableOptions,
}

/// What stages 1 and 2 of a query leave for the rest of it in one run (see
/// [`Run::finish`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staged<'a> {
    /// The tables probed.
    pub tables: &'a [usize],
    /// The query permuted for each.
    pub pqs: &'a [u64],
    /// Where each searches in this run.
    pub cands: &'a [Candidates],
}

/// Reusable buffers for the stages of a query that [`Run::finish`] runs.
#[derive(Debug, Default)]
pub(crate) struct HitScratch {
    /// What the probed tables found; a hit's probe is its table's index into the probed
    /// tables.
    hits: Vec<TableHit>,
    /// One per fingerprint hit.
    found: Vec<FingerprintHit>,
}

/// A fingerprint a query found in a run, whichever tables found it.
#[derive(Debug, Clone, Copy)]
struct FingerprintHit {
    /// The fingerprint (identity order).
    fp: u64,
    /// Its rank in the key column, or [`NO_RANK`] until it is looked up there.
    rank: u32,
    /// Where the key column searches for the rank (when there is one to look up).
    candidates: (usize, usize),
}

/// Up to this many hits in a query's tables are merged per fingerprint one by one, more
/// by sorting.
const FEW_HITS: usize = 16;

impl Run {
    /// Builds a run from documents in insertion order, to sit beside a largest other run
    /// of `beside` fingerprints (see [`BuildContext::opts_for`]).
    pub(crate) fn build(id: u64, docs: &[Doc], ctx: &BuildContext, beside: usize) -> Result<Run> {
        check_run_size(docs.len())?;
        let (docs, distinct, spare) = DocStore::from_docs(docs);
        Self::assemble(id, docs, distinct, spare, ctx, beside, |_, spec, fps, v, tmp| {
            permuted_sorted(fps, spec, v, tmp)
        })
    }

    /// Builds the tables of a run whose documents and distinct fingerprints are known.
    /// `fill(t, spec, fps, buffer, scratch)` puts the sorted permuted values of
    /// non-identity table `t` into `buffer`, reading the distinct fingerprints from `fps`
    /// (their table in identity order); `scratch` is for it to use as it likes. `spare` is
    /// an empty array to take for the first buffer (or a new one).
    ///
    /// With tables in blocks, the distinct fingerprints are dropped once the identity-order
    /// tables are built: the other tables decode them from `fps` a chunk at a time, so that
    /// the build's memory beyond the finished run is one buffer of values per worker (the
    /// blocks hold a value in 5-6 bytes, the array in 8). Packed tables take 7-8 bytes a
    /// value and decode several times slower, bucket by bucket: they keep the array.
    fn assemble(
        id: u64,
        docs: DocStore,
        distinct: Vec<u64>,
        mut spare: Vec<u64>,
        ctx: &BuildContext,
        beside: usize,
        fill: impl Fn(usize, &TableSpec, &Distinct<'_>, &mut Vec<u64>, &mut Vec<u64>) + Sync,
    ) -> Result<Run> {
        let opts = ctx.opts_for(distinct.len(), beside);
        let fps = Arc::new(EncodedTable::encode(&distinct, opts)?);
        let specs = ctx.design.tables();
        // The identity-order tables first, from the array.
        let mut tables: Vec<Option<PermutedTable>> = specs
            .iter()
            .map(|spec| {
                let build = || {
                    let fps = Some(fps.clone());
                    PermutedTable::build(&distinct, fps, spec.prefix_bits, opts, &ctx.policy, 0)
                };
                spec.perm.is_identity().then(build).transpose()
            })
            .collect::<Result<_>>()?;
        let distinct = Distinct::keep(distinct, &fps);
        let source = Distinct::of(distinct.as_deref(), &fps);
        let build = |t: usize, v: &mut Vec<u64>, tmp: &mut Vec<u64>| -> Result<PermutedTable> {
            let spec = &specs[t];
            fill(t, spec, &source, v, tmp);
            PermutedTable::build(v, None, spec.prefix_bits, opts, &ctx.policy, 0)
        };
        let rest: Vec<usize> = (0..specs.len()).filter(|&t| tables[t].is_none()).collect();
        // Each worker keeps two buffers for the tables it builds, as a sequential build
        // does for all of them: no fresh pages per table. The spare array, its pages
        // backed already, is one worker's buffer for the values, cut to their number.
        spare.shrink_to(fps.len());
        let spare = std::sync::Mutex::new(spare);
        let take_spare = || std::mem::take(&mut *spare.lock().unwrap_or_else(|e| e.into_inner()));
        let built = if ctx.parallel {
            rest.par_iter()
                .map_init(|| (take_spare(), Vec::new()), |(v, tmp), &t| build(t, v, tmp))
                .collect::<Result<Vec<_>>>()?
        } else {
            let (mut values, mut tmp) = (take_spare(), Vec::new());
            rest.iter().map(|&t| build(t, &mut values, &mut tmp)).collect::<Result<Vec<_>>>()?
        };
        for (t, table) in rest.into_iter().zip(built) {
            tables[t] = Some(table);
        }
        let tables = tables.into_iter().map(|t| t.expect("every table built")).collect();
        Ok(Run { id, fps, docs, tables, opts: ctx.opts })
    }

    /// Merges runs (oldest first) into one, dropping deleted documents. Every source is
    /// sorted already, in each table's order: documents and tables are merged, not sorted
    /// again. `beside` is as for [`build`](Self::build).
    pub(crate) fn merge(
        id: u64,
        runs: &[Arc<Run>],
        ctx: &BuildContext,
        beside: usize,
    ) -> Result<Run> {
        let lists: Vec<Vec<(u64, u64, i64)>> = runs
            .iter()
            .map(|r| {
                let mut v = Vec::with_capacity(r.live_len());
                r.for_each_live(|fp, id, ts| v.push((fp, id, ts)));
                v
            })
            .collect();
        // Stable: among equal fingerprints, older runs' documents stay first.
        let all = merge_sorted(lists, |d| d.0);
        check_run_size(all.len())?;
        let (docs, distinct) = DocStore::with_distinct(&all);
        drop(all);
        // Fingerprints some source holds whose documents are all deleted: the merged tables
        // must not keep them.
        let gone: Vec<u64> = if runs.iter().all(|r| r.deleted() == 0) {
            Vec::new()
        } else {
            let mut all_fps = merge_sorted(runs.iter().map(|r| r.fps.to_vec()).collect(), |&x| x);
            all_fps.dedup();
            sorted_difference(&all_fps, &distinct)
        };
        let same_design = runs.iter().all(|r| r.tables.len() == ctx.design.tables().len());
        Self::assemble(id, docs, distinct, Vec::new(), ctx, beside, move |t, spec, fps, v, tmp| {
            if !same_design {
                permuted_sorted(fps, spec, v, tmp);
                return;
            }
            let mut merged =
                merge_sorted(runs.iter().map(|r| r.tables[t].encoded.to_vec()).collect(), |&x| x);
            merged.dedup();
            if !gone.is_empty() {
                let mut drop_t = Vec::new();
                permuted_sorted(gone.as_slice(), spec, &mut drop_t, tmp);
                merged = sorted_difference(&merged, &drop_t);
            }
            *v = merged;
        })
    }

    /// Calls `f(fp, id, ts)` for every live document, in fingerprint order.
    pub(crate) fn for_each_live(&self, mut f: impl FnMut(u64, u64, i64)) {
        let mut rank = 0;
        self.fps.scan_range(0, u64::MAX, |fp, r| {
            debug_assert_eq!(r, rank);
            for pos in self.docs.range_of_rank(rank) {
                if !self.docs.is_deleted(pos) {
                    f(fp, self.docs.id(pos), self.docs.ts(pos));
                }
            }
            rank += 1;
        });
    }

    /// Calls `f(fp, id, ts)` for every live document whose fingerprint is in `lo..=hi`, in
    /// fingerprint order, until `f` returns false.
    pub(crate) fn for_each_live_in(
        &self,
        lo: u64,
        hi: u64,
        mut f: impl FnMut(u64, u64, i64) -> bool,
    ) {
        self.fps.scan_range_while(lo, hi, |fp, rank| {
            self.docs
                .range_of_rank(rank)
                .filter(|&pos| !self.docs.is_deleted(pos))
                .all(|pos| f(fp, self.docs.id(pos), self.docs.ts(pos)))
        });
    }

    /// How many documents, deleted ones included, have a fingerprint below `value`: a seek,
    /// no scan.
    pub(crate) fn docs_below(&self, value: u64) -> usize {
        let mut rank = self.fps.len();
        self.fps.scan_range_while(value, u64::MAX, |_, r| {
            rank = r;
            false
        });
        if rank >= self.fps.len() { self.docs.len() } else { self.docs.range_of_rank(rank).start }
    }

    /// Calls `f(fp)` for every distinct fingerprint, in order.
    pub(crate) fn for_each_fp(&self, f: impl FnMut(u64)) {
        self.for_each_fp_in(0, u64::MAX, f);
    }

    /// Calls `f(fp)` for every distinct fingerprint in `lo..=hi`, in order.
    pub(crate) fn for_each_fp_in(&self, lo: u64, hi: u64, mut f: impl FnMut(u64)) {
        self.fps.scan_range(lo, hi, |fp, _| f(fp));
    }

    /// Appends the live documents with fingerprint `fp`, at their distance from `q`.
    pub(crate) fn matches_of(&self, fp: u64, q: u64, out: &mut Vec<Match>) {
        let Some(rank) = self.fps.rank_of(fp) else { return };
        let distance = (fp ^ q).count_ones();
        for pos in self.docs.range_of_rank(rank) {
            if !self.docs.is_deleted(pos) {
                out.push(Match { id: self.docs.id(pos), fp, distance, ts: self.docs.ts(pos) });
            }
        }
    }

    /// Whether the run's tables are packed in memory (see [`BuildContext::opts_for`]).
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        matches!(*self.fps, EncodedTable::Packed(_))
    }

    /// The run's id, unique within its index and increasing with creation.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of documents, deleted ones included.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether the run holds no documents.
    pub fn is_empty(&self) -> bool {
        self.docs.len() == 0
    }

    /// Number of deleted documents.
    pub fn deleted(&self) -> usize {
        self.docs.deleted()
    }

    /// Number of documents not deleted.
    pub fn live_len(&self) -> usize {
        self.docs.len() - self.docs.deleted()
    }

    /// Number of distinct fingerprints.
    pub fn distinct(&self) -> usize {
        self.fps.len()
    }

    /// Positions (in fingerprint order) of deleted documents.
    pub fn deleted_positions(&self) -> Vec<u32> {
        self.docs.deleted_positions()
    }

    /// The deletion marks as they are now, for [`deleted_since`](Self::deleted_since).
    pub(crate) fn deletion_marks(&self) -> Vec<u64> {
        self.docs.deletion_marks()
    }

    /// Positions of the documents deleted since `before` (from
    /// [`deletion_marks`](Self::deletion_marks)), ascending.
    pub(crate) fn deleted_since(&self, before: &[u64]) -> Vec<u32> {
        self.docs.deleted_since(before)
    }

    /// The `(id, fp)` of the document at `pos`.
    pub(crate) fn doc_at(&self, pos: usize) -> Option<(u64, u64)> {
        if pos >= self.docs.len() {
            return None;
        }
        // Find the rank whose range holds `pos`: ranks and positions differ by the extra
        // documents of duplicated fingerprints before it.
        let mut lo = pos.saturating_sub(self.docs.len() - self.fps.len());
        let mut hi = pos.min(self.fps.len() - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.docs.range_of_rank(mid).start <= pos { lo = mid } else { hi = mid - 1 }
        }
        self.fps.get(lo).map(|fp| (self.docs.id(pos), fp))
    }

    /// Marks the document with this id and fingerprint deleted; true if it was live here.
    pub(crate) fn delete_doc(&self, id: u64, fp: u64) -> bool {
        let Some(rank) = self.fps.rank_of(fp) else { return false };
        self.docs
            .range_of_rank(rank)
            .find(|&p| self.docs.id(p) == id && !self.docs.is_deleted(p))
            .is_some_and(|p| self.docs.mark_deleted(p))
    }

    /// The positions of the documents whose fingerprint is in `lo..=hi`, deleted ones
    /// included: two seeks.
    pub(crate) fn positions_in(&self, lo: u64, hi: u64) -> std::ops::Range<usize> {
        let end = hi.checked_add(1).map_or(self.docs.len(), |v| self.docs_below(v));
        self.docs_below(lo)..end
    }

    /// How many live documents have a fingerprint in `lo..=hi`: two seeks and a look at
    /// the deletion mark of each document in the range, no decoding.
    pub(crate) fn live_in_range(&self, lo: u64, hi: u64) -> usize {
        self.positions_in(lo, hi).filter(|&p| !self.docs.is_deleted(p)).count()
    }

    /// Marks deleted every live document whose fingerprint is in `lo..=hi`; returns how
    /// many.
    pub(crate) fn delete_range(&self, lo: u64, hi: u64) -> usize {
        self.positions_in(lo, hi).filter(|&p| self.docs.mark_deleted(p)).count()
    }

    /// Marks deleted every live document whose id is in `ids`; returns how many.
    pub(crate) fn delete_ids(&self, ids: &std::collections::HashSet<u64>) -> usize {
        (0..self.docs.len())
            .filter(|&p| ids.contains(&self.docs.id(p)) && self.docs.mark_deleted(p))
            .count()
    }

    /// Stage 1 of a query (see [`finish`](Self::finish)): starts loading the directory
    /// entries of the probed tables `tables` for the permuted queries `pqs` (one each).
    #[inline]
    pub(crate) fn prefetch(&self, tables: &[usize], pqs: &[u64]) {
        for (&t, &pq) in tables.iter().zip(pqs) {
            self.tables[t].prefetch_directory(pq);
        }
    }

    /// Stage 2: reads those entries, starts loading the candidates, and appends where each
    /// table searches (`None` where it has nothing to search).
    #[inline]
    pub(crate) fn candidates(&self, tables: &[usize], pqs: &[u64], out: &mut Vec<Candidates>) {
        out.extend(tables.iter().zip(pqs).map(|(&t, &pq)| self.tables[t].candidates(pq)));
    }

    /// Stages 3 to 6: appends every live document within `k` of `q`, given what stages 1 and
    /// 2 left for this run.
    ///
    /// Memory first, in stages without data-dependent branches between their loads, so that
    /// the cache misses of all tables (and of all runs: the index runs stages 1 and 2 of
    /// every run before this) overlap. Each stage reads what the one before started loading:
    /// 1. permute the query for every table and start loading the directory entries;
    /// 2. read them and start loading the candidates (the first blocks, or the bucket's
    ///    values when packed);
    /// 3. search the candidates, turn the hits back into fingerprints (one each), and for
    ///    those without a rank start loading the key column's directory entry;
    /// 4. for those, read it and start loading their candidates in the key column;
    /// 5. find those ranks, and start loading every hit's documents;
    /// 6. append the live documents.
    pub(crate) fn finish(
        &self,
        q: u64,
        k: u32,
        design: &Design,
        Staged { tables, pqs, cands }: Staged<'_>,
        scratch: &mut HitScratch,
        out: &mut Vec<Match>,
    ) {
        let HitScratch { hits, found } = scratch;
        let specs = design.tables();
        hits.clear();
        for (i, ((&t, &pq), &c)) in tables.iter().zip(pqs).zip(cands).enumerate() {
            if let Some(c) = c {
                self.tables[t].probe(pq, c, k, i as u32, hits);
            }
        }
        if hits.is_empty() {
            return;
        }
        // One entry per fingerprint, preferring one with its rank (from the identity table;
        // NO_RANK is the largest). A fingerprint is usually hit in several tables, by one
        // fingerprint or a few: merging them as they come beats sorting, up to a handful.
        found.clear();
        let few = hits.len() <= FEW_HITS;
        for &TableHit { value, rank, probe } in hits.iter() {
            let perm = &specs[tables[probe as usize]].perm;
            let (fp, rank) =
                if perm.is_identity() { (value, rank) } else { (perm.invert(value), NO_RANK) };
            let seen = if few { found.iter_mut().find(|f| f.fp == fp) } else { None };
            match seen {
                Some(f) => f.rank = f.rank.min(rank),
                None => found.push(FingerprintHit { fp, rank, candidates: (0, 0) }),
            }
        }
        if !few {
            found.sort_unstable_by_key(|f| (f.fp, f.rank));
            found.dedup_by_key(|f| f.fp);
        }
        for f in found.iter().filter(|f| f.rank == NO_RANK) {
            self.fps.prefetch_directory(f.fp);
        }
        for f in found.iter_mut().filter(|f| f.rank == NO_RANK) {
            f.candidates = self.fps.rank_candidates(f.fp);
        }
        for f in found.iter_mut() {
            if f.rank == NO_RANK {
                let rank = self.fps.rank_in(f.candidates, f.fp);
                // A miss here would drop the hit's documents from an exact answer. It cannot
                // happen: every table of a run holds exactly the run's distinct fingerprints,
                // permuted by its table's permutation, and the key column holds them all.
                // `build` permutes `distinct`; `merge` merges its sources' tables (each that
                // of its source's fingerprints) less the permuted fingerprints no live
                // document keeps; `load` keeps a stored table only when every checksum holds
                // and it holds exactly the run's fingerprints permuted, and rebuilds it from
                // the fingerprints otherwise. A hit goes back to identity order through the
                // inverse of its table's permutation (and of its sub-table's, in a crowded
                // bucket), and the index queries a run with the design it was built or loaded
                // for.
                debug_assert!(
                    rank.is_some(),
                    "run {}: fingerprint {:#x} not in its key column",
                    self.id,
                    f.fp
                );
                f.rank = rank.map_or(NO_RANK, |r| r as u32);
            }
            if f.rank != NO_RANK {
                self.docs.prefetch_rank(f.rank as usize);
            }
        }
        for &FingerprintHit { fp, rank, .. } in found.iter().filter(|f| f.rank != NO_RANK) {
            let distance = (fp ^ q).count_ones();
            for pos in self.docs.range_of_rank(rank as usize) {
                if !self.docs.is_deleted(pos) {
                    out.push(Match { id: self.docs.id(pos), fp, distance, ts: self.docs.ts(pos) });
                }
            }
        }
    }

    /// The run's metadata record: ids, counts, the design it was built for, the document
    /// columns, and a CRC-32. Together with every table's
    /// [`stored_table`](Self::stored_table) it is everything
    /// [`Index::load_run`](super::Index::load_run) needs.
    /// Deletion marks are not included: see [`deleted_positions`](Self::deleted_positions).
    pub fn meta_bytes(&self, design: &Design) -> Vec<u8> {
        debug_assert!(self.id <= MAX_RUN_ID);
        let text = design.to_string();
        let mut out = Vec::new();
        out.extend_from_slice(&META_MAGIC);
        out.extend_from_slice(&META_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&(self.docs.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.fps.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.tables.len() as u32).to_le_bytes());
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        self.docs.write(&mut out);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Number of tables.
    pub fn tables(&self) -> usize {
        self.tables.len()
    }

    /// Table `t` as it is stored: its Huffman-XOR table, whose
    /// [`header_bytes`](HxTable::header_bytes) and [`block_slices`](HxTable::block_slices) go to
    /// disk. Tables laid out in blocks are stored as they are; packed ones are encoded here.
    pub fn stored_table(&self, t: usize) -> Result<std::borrow::Cow<'_, HxTable>> {
        self.tables[t].encoded.stored(self.opts)
    }

    /// Marks documents deleted by position (as returned by
    /// [`deleted_positions`](Self::deleted_positions)); positions out of range are an error.
    pub fn restore_deleted(&self, positions: &[u32]) -> Result<()> {
        if positions.iter().any(|&p| p as usize >= self.docs.len()) {
            return Err(Error::corrupt("deleted position outside the run"));
        }
        for &p in positions {
            self.docs.mark_deleted(p as usize);
        }
        Ok(())
    }

    /// Rebuilds a run from its stored parts, verifying every checksum and count. A table
    /// whose blocks are damaged or missing is rebuilt from an intact one (every table holds
    /// the same fingerprints), and so are all tables when the run was built for another
    /// design; the indices of rebuilt tables are returned. Fails when the metadata is
    /// damaged or no table is intact.
    pub(crate) fn load(
        meta: &[u8],
        tables: &[StoredTable<'_>],
        ctx: &BuildContext,
    ) -> Result<(Run, Vec<usize>)> {
        let (id, n_docs, distinct, built_for, docs) = Self::parse_meta(meta)?;
        let stored_design = Design::parse(&built_for)
            .map_err(|e| Error::corrupt(format!("run {id}: stored design: {e}")))?;
        let same_design = stored_design == ctx.design;
        // Decode what is intact and encoded as this index encodes.
        let decoded: Vec<Option<HxTable>> = tables
            .iter()
            .map(|st| {
                HxTable::from_parts(st.header, st.blocks.iter().copied(), ctx.opts.search)
                    .ok()
                    .filter(|hx| hx.len() == distinct)
            })
            .collect();
        let usable = |hx: &HxTable| {
            let o = hx.options();
            o.codec == ctx.opts.codec && o.block_bytes == ctx.opts.block_bytes
        };
        // The fingerprints in identity order, from table 0 or else any intact table.
        let fps_sorted: Vec<u64> = match decoded.first().and_then(Option::as_ref) {
            Some(hx) => hx.to_vec(),
            None => {
                let (t, hx) = decoded
                    .iter()
                    .enumerate()
                    .find_map(|(t, d)| d.as_ref().map(|hx| (t, hx)))
                    .ok_or_else(|| Error::corrupt(format!("run {id}: every table is damaged")))?;
                let perm = &stored_design
                    .tables()
                    .get(t)
                    .ok_or_else(|| {
                        Error::corrupt(format!("run {id}: more tables than its design"))
                    })?
                    .perm;
                let mut v: Vec<u64> = hx.to_vec().into_iter().map(|x| perm.invert(x)).collect();
                v.sort_unstable();
                v
            }
        };
        if fps_sorted.len() != distinct || docs.len() != n_docs {
            return Err(Error::corrupt(format!("run {id}: counts disagree with its metadata")));
        }
        let mut decoded: Vec<Option<HxTable>> =
            decoded.into_iter().map(|d| d.filter(|hx| usable(hx))).collect();
        let mut rebuilt = Vec::new();
        let packed = ctx.opts.layout == Layout::Packed;
        let fps = Arc::new(match decoded.first_mut().and_then(Option::take) {
            Some(hx) if !packed => EncodedTable::Blocks(hx),
            intact => {
                if intact.is_none() {
                    rebuilt.push(0);
                }
                EncodedTable::encode(&fps_sorted, ctx.opts)?
            }
        });
        let mut built = Vec::with_capacity(ctx.design.tables().len());
        // As in a build: once table 0 is built, tables in blocks read the fingerprints back
        // from it, and the tables rebuilt share one buffer.
        let mut fps_sorted = Some(fps_sorted);
        let (mut v, mut tmp) = (Vec::new(), Vec::new());
        for (t, spec) in ctx.design.tables().iter().enumerate() {
            let table = if t == 0 {
                let table = PermutedTable::build(
                    fps_sorted.as_deref().unwrap_or_default(),
                    Some(fps.clone()),
                    spec.prefix_bits,
                    ctx.opts,
                    &ctx.policy,
                    0,
                )?;
                fps_sorted = fps_sorted.and_then(|a| Distinct::keep(a, &fps));
                table
            } else {
                let intact =
                    if same_design { decoded.get_mut(t).and_then(Option::take) } else { None };
                let source = Distinct::of(fps_sorted.as_deref(), &fps);
                // A table whose checksums hold is still checked against the run's
                // fingerprints: one missing from it would drop matches from exact answers.
                let intact = intact
                    .map(|mut hx| {
                        hx.drop_ranks();
                        let v = hx.to_vec();
                        (hx, v)
                    })
                    .filter(|(_, v)| holds_permuted(v, &source, spec));
                match intact {
                    Some((hx, v)) => {
                        // Kept as it is, or packed from its values.
                        let kept = (!packed).then(|| Arc::new(EncodedTable::Blocks(hx)));
                        PermutedTable::build(&v, kept, spec.prefix_bits, ctx.opts, &ctx.policy, 0)?
                    }
                    None => {
                        rebuilt.push(t);
                        permuted_sorted(&source, spec, &mut v, &mut tmp);
                        PermutedTable::build(&v, None, spec.prefix_bits, ctx.opts, &ctx.policy, 0)?
                    }
                }
            };
            built.push(table);
        }
        Ok((Run { id, fps, docs, tables: built, opts: ctx.opts }, rebuilt))
    }

    fn parse_meta(meta: &[u8]) -> Result<(u64, usize, usize, String, DocStore)> {
        let bad = |what: &str| Error::corrupt(format!("run metadata: {what}"));
        let (body, crc) = meta.split_last_chunk::<4>().ok_or_else(|| bad("truncated"))?;
        if body.len() < 4 || body[..4] != META_MAGIC {
            return Err(bad("not a neardup run"));
        }
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err(bad("checksum mismatch"));
        }
        // Magic, version, reserved: a record with a valid checksum may still stop short.
        if body.len() < 8 {
            return Err(bad("truncated"));
        }
        let version = u16::from_le_bytes([body[4], body[5]]);
        if version != META_VERSION {
            return Err(Error::UnsupportedVersion {
                found: version as u32,
                supported: META_VERSION as u32,
            });
        }
        let rest = body.get(8..).ok_or_else(|| bad("truncated"))?;
        let (id, rest) = super::packed_column::take_u64(rest).ok_or_else(|| bad("truncated"))?;
        if id > MAX_RUN_ID {
            return Err(bad(&format!("run id {id} is beyond any an index makes")));
        }
        let (n_docs, rest) =
            super::packed_column::take_u64(rest).ok_or_else(|| bad("truncated"))?;
        let (distinct, rest) =
            super::packed_column::take_u64(rest).ok_or_else(|| bad("truncated"))?;
        let (_tables, rest) = rest.split_first_chunk::<4>().ok_or_else(|| bad("truncated"))?;
        let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| bad("truncated"))?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(bad("truncated"));
        }
        let (text, rest) = rest.split_at(len);
        let text = std::str::from_utf8(text).map_err(|_| bad("design is not UTF-8"))?.to_string();
        let distinct = usize::try_from(distinct).map_err(|_| bad("too large"))?;
        let n_docs = usize::try_from(n_docs).map_err(|_| bad("too large"))?;
        let (docs, rest) = DocStore::read(rest, distinct).ok_or_else(|| bad("document columns"))?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok((id, n_docs, distinct, text, docs))
    }

    /// Memory of each table (the identity table's encoded table counted with the documents), of the
    /// documents, and the crowded-bucket statistics of each table.
    pub(crate) fn memory(&self) -> RunMemory {
        let tables = self
            .tables
            .iter()
            .map(|t| {
                let (crowded, crowded_entries) = t.crowded_stats();
                TableBytes { bytes: t.heap_bytes(true), entries: t.len(), crowded, crowded_entries }
            })
            .collect();
        RunMemory {
            tables,
            doc_bytes: self.docs.heap_bytes(),
            column_bits: self.docs.column_bits(),
        }
    }
}

/// Memory of one table in one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableBytes {
    pub bytes: usize,
    pub entries: usize,
    pub crowded: usize,
    pub crowded_entries: usize,
}

/// Memory of one run.
#[derive(Debug, Clone)]
pub(crate) struct RunMemory {
    pub tables: Vec<TableBytes>,
    pub doc_bytes: usize,
    pub column_bits: (u32, u32),
}

/// Ranks and positions are `u32`: a run holds fewer than `2^32 - 1` documents.
fn check_run_size(docs: usize) -> Result<()> {
    if docs > u32::MAX as usize - 1 {
        return Err(Error::InvalidConfig("a run holds fewer than 2^32 - 1 documents".into()));
    }
    Ok(())
}

/// A run's distinct fingerprints while its tables are built: in an array, or read back from
/// their identity-order table.
pub(crate) enum Distinct<'a> {
    Array(&'a [u64]),
    Table(&'a EncodedTable),
}

impl<'a> Distinct<'a> {
    /// The array of distinct fingerprints, once their identity-order table `fps` is built,
    /// if the other tables should read them from it rather than from `fps`: tables in
    /// blocks are read back (the array is dropped), packed ones keep it (see
    /// [`Run::assemble`]).
    fn keep(distinct: Vec<u64>, fps: &EncodedTable) -> Option<Vec<u64>> {
        matches!(fps, EncodedTable::Packed(_)).then_some(distinct)
    }

    /// Where to read them: the array kept, else `fps`.
    fn of(kept: Option<&'a [u64]>, fps: &'a EncodedTable) -> Distinct<'a> {
        kept.map_or(Distinct::Table(fps), Distinct::Array)
    }
}

impl Values for Distinct<'_> {
    fn len(&self) -> usize {
        match self {
            Distinct::Array(a) => a.len(),
            Distinct::Table(t) => t.len(),
        }
    }

    fn for_each_chunk(&self, f: impl FnMut(&[u64])) {
        match self {
            Distinct::Array(a) => a.for_each_chunk(f),
            Distinct::Table(t) => t.for_each_chunk(f),
        }
    }
}

/// Whether `values` (a stored table's) are exactly `source`'s fingerprints permuted by
/// `spec`: as many, strictly increasing, and with the same order-free digest (a sum of
/// SplitMix64 hashes). Checksums catch damage on disk, not a table written wrong.
fn holds_permuted<S: Values + ?Sized>(values: &[u64], source: &S, spec: &TableSpec) -> bool {
    if values.len() != source.len() || values.windows(2).any(|w| w[0] >= w[1]) {
        return false;
    }
    let stored = values.iter().fold(0u64, |a, &v| a.wrapping_add(crate::sketch::mix64(v)));
    let mut expected = 0u64;
    source.for_each_chunk(|chunk| {
        for &fp in chunk {
            expected = expected.wrapping_add(crate::sketch::mix64(spec.perm.apply(fp)));
        }
    });
    stored == expected
}

/// Puts the strictly increasing `values` through table `spec`'s permutation, sorted, into
/// `out` (`tmp` is scratch). Designs keep the bits after a table's prefix in order, so a
/// stable sort on the prefix is enough; any other permutation is sorted on all 64 bits.
fn permuted_sorted<S: Values + ?Sized>(
    values: &S,
    spec: &TableSpec,
    out: &mut Vec<u64>,
    tmp: &mut Vec<u64>,
) {
    let perm = &spec.perm;
    let on_prefix = perm.width() == 64 && perm.keeps_order_after(spec.prefix_bits);
    let bits = if on_prefix { spec.prefix_bits } else { 64 };
    struct Sort<'a, S: ?Sized> {
        values: &'a S,
        bits: u32,
        out: &'a mut Vec<u64>,
        tmp: &'a mut Vec<u64>,
    }
    impl<S: Values + ?Sized> VisitMap for Sort<'_, S> {
        type Output = ();
        fn call(self, map: impl Fn(u64) -> u64 + Copy) {
            sort_on_top_bits(self.values, map, self.bits, self.out, self.tmp);
        }
    }
    perm.with_apply(Sort { values, bits, out, tmp });
}

/// Merges sorted lists into one sorted list, stably: among equal keys, elements of earlier
/// lists come first. Pairs of neighbouring lists are merged until one is left.
fn merge_sorted<T: Copy>(mut lists: Vec<Vec<T>>, key: impl Fn(&T) -> u64 + Copy) -> Vec<T> {
    while lists.len() > 1 {
        let mut next = Vec::with_capacity(lists.len().div_ceil(2));
        let mut it = lists.into_iter();
        while let Some(a) = it.next() {
            match it.next() {
                Some(b) => next.push(merge_two(&a, &b, key)),
                None => next.push(a),
            }
        }
        lists = next;
    }
    lists.pop().unwrap_or_default()
}

/// Merges two sorted lists; on equal keys, `a`'s element first.
///
/// Without a branch on the comparison: the sources interleave at random, and a branch
/// would be mispredicted about every other element. Each step picks one element by a
/// conditional move and advances one of the two indices by the comparison's outcome.
fn merge_two<T: Copy>(a: &[T], b: &[T], key: impl Fn(&T) -> u64) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        let take_b = key(&y) < key(&x);
        out.push(if take_b { y } else { x });
        j += take_b as usize;
        i += !take_b as usize;
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// The values of sorted `a` that are not in sorted `b`.
fn sorted_difference(a: &[u64], b: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(a.len().saturating_sub(b.len()));
    let mut j = 0;
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if j >= b.len() || b[j] != x {
            out.push(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permute::{BitRange, Permutation};
    use crate::util::SplitMix64;

    /// Both ways of sorting a table: on the prefix alone when the permutation keeps the
    /// other bits in order (every design's), fully otherwise.
    #[test]
    fn permuted_values_come_out_sorted_either_way() {
        let mut r = SplitMix64::new(3);
        let mut values: Vec<u64> = (0..30_000).map(|_| r.next_u64()).collect();
        // Clustered too: a tenth share their top 24 bits.
        for v in values.iter_mut().step_by(10) {
            *v = 0x1234_5600_0000_0000 | (*v >> 24);
        }
        // And many that agree on the 32 prefix bits below (positions 16..32 and 48..64):
        // only there does the order of the other bits decide.
        for v in values.iter_mut().skip(1).step_by(3) {
            let (a, b) = (r.below(3), r.below(3));
            *v = (*v & 0xFFFF_0000_FFFF_0000) | (a << 32) | b;
        }
        values.sort_unstable();
        values.dedup();
        let spec = |ranges: &[(u32, u32)], prefix_bits| TableSpec {
            perm: Permutation::from_ranges(
                64,
                &ranges.iter().map(|&(start, len)| BitRange { start, len }).collect::<Vec<_>>(),
            )
            .unwrap(),
            prefix_bits,
            choice: Vec::new(),
        };
        let keeps = spec(&[(16, 16), (48, 16), (0, 16), (32, 16)], 32);
        let scrambles = spec(&[(16, 16), (48, 16), (32, 16), (0, 16)], 32);
        assert!(keeps.perm.keeps_order_after(32) && !scrambles.perm.keeps_order_after(32));
        for s in [keeps, scrambles] {
            let (mut out, mut tmp) = (Vec::new(), Vec::new());
            permuted_sorted(values.as_slice(), &s, &mut out, &mut tmp);
            let mut want: Vec<u64> = values.iter().map(|&x| s.perm.apply(x)).collect();
            want.sort_unstable();
            assert_eq!(out, want);
        }
    }
}
