//! An immutable run: a batch of documents with all of its permuted tables.
//!
//! The index is log-structured: the write buffer is turned into a run when it fills, and
//! runs are merged as they accumulate. A run holds each distinct fingerprint once per table
//! and each document once, in the [`DocStore`]; the identity table's compressed run is also
//! the document store's key column.

use std::sync::Arc;

use rayon::prelude::*;

use super::docs::DocStore;
use super::table::{CrowdPolicy, NO_RANK, TableRun};
use super::{Doc, Match, QueryScratch};
use crate::codec::{HxRun, RunOptions, scan_lanes};
use crate::design::Design;
use crate::error::{Error, Result};

/// What building a run needs besides its documents.
#[derive(Debug, Clone)]
pub(crate) struct BuildContext {
    pub design: Design,
    pub opts: RunOptions,
    pub policy: CrowdPolicy,
    /// Build the tables in parallel on rayon's pool.
    pub parallel: bool,
}

/// An immutable batch of documents and its permuted tables.
#[derive(Debug)]
pub struct Run {
    id: u64,
    /// Distinct fingerprints in identity order; shared with the identity table.
    fps: Arc<HxRun>,
    docs: DocStore,
    tables: Vec<TableRun>,
}

impl Run {
    /// Builds a run from documents in insertion order.
    pub(crate) fn build(id: u64, docs: &[Doc], ctx: &BuildContext) -> Result<Run> {
        // (fp, position) pairs sort to fingerprint order with ties in insertion order.
        let mut order: Vec<(u64, u32)> =
            docs.iter().enumerate().map(|(i, d)| (d.fp, i as u32)).collect();
        order.sort_unstable();
        let sorted: Vec<(u64, u64, i64)> = order
            .iter()
            .map(|&(fp, i)| {
                let d = &docs[i as usize];
                (fp, d.id, d.ts)
            })
            .collect();
        Self::from_sorted(id, &sorted, ctx)
    }

    /// Builds a run from `(fp, id, ts)` sorted by fingerprint (ties in insertion order).
    fn from_sorted(id: u64, sorted: &[(u64, u64, i64)], ctx: &BuildContext) -> Result<Run> {
        if sorted.len() > u32::MAX as usize - 1 {
            return Err(Error::InvalidConfig("a run holds fewer than 2^32 - 1 documents".into()));
        }
        let mut distinct: Vec<u64> = sorted.iter().map(|d| d.0).collect();
        distinct.dedup();
        let docs = DocStore::new(sorted);
        let fps = Arc::new(HxRun::encode(&distinct, ctx.opts)?);
        let build_table = |t: usize| -> Result<TableRun> {
            let spec = &ctx.design.tables()[t];
            if spec.perm.is_identity() {
                TableRun::build(
                    &distinct,
                    Some(fps.clone()),
                    spec.prefix_bits,
                    ctx.opts,
                    &ctx.policy,
                    0,
                )
            } else {
                let mut v: Vec<u64> = distinct.iter().map(|&x| spec.perm.apply(x)).collect();
                v.sort_unstable();
                TableRun::build(&v, None, spec.prefix_bits, ctx.opts, &ctx.policy, 0)
            }
        };
        let n = ctx.design.tables().len();
        let tables = if ctx.parallel {
            (0..n).into_par_iter().map(build_table).collect::<Result<Vec<_>>>()?
        } else {
            (0..n).map(build_table).collect::<Result<Vec<_>>>()?
        };
        Ok(Run { id, fps, docs, tables })
    }

    /// Merges runs (oldest first) into one, dropping deleted documents.
    pub(crate) fn merge(id: u64, runs: &[Arc<Run>], ctx: &BuildContext) -> Result<Run> {
        let total: usize = runs.iter().map(|r| r.live_len()).sum();
        let mut all: Vec<(u64, u64, i64)> = Vec::with_capacity(total);
        for r in runs {
            r.for_each_live(|fp, id, ts| all.push((fp, id, ts)));
        }
        // Sorting (fp, position) keeps older runs first among equal fingerprints.
        let mut order: Vec<(u64, u32)> =
            all.iter().enumerate().map(|(i, d)| (d.0, i as u32)).collect();
        order.sort_unstable();
        let sorted: Vec<(u64, u64, i64)> = order.iter().map(|&(_, i)| all[i as usize]).collect();
        Self::from_sorted(id, &sorted, ctx)
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

    /// Marks deleted every live document whose id is in `ids`; returns how many.
    pub(crate) fn delete_ids(&self, ids: &std::collections::HashSet<u64>) -> usize {
        (0..self.docs.len())
            .filter(|&p| ids.contains(&self.docs.id(p)) && self.docs.mark_deleted(p))
            .count()
    }

    /// Appends every live document within `k` of `q`, probing the tables `tables`.
    pub(crate) fn query(
        &self,
        q: u64,
        k: u32,
        design: &Design,
        tables: &[usize],
        scratch: &mut QueryScratch,
        out: &mut Vec<Match>,
    ) {
        let QueryScratch { hits, pqs, hints } = scratch;
        hits.clear();
        pqs.clear();
        hints.clear();
        // Memory first, in independent stages so the cache misses of all tables overlap:
        // the directory entries, then the blocks they point at, then the decoding.
        for &t in tables {
            let pq = design.tables()[t].perm.apply(q);
            hints.push(self.tables[t].block_hint(pq));
            pqs.push(pq);
        }
        for (&t, &hint) in tables.iter().zip(hints.iter()) {
            self.tables[t].prefetch(hint);
        }
        let mut lanes = Vec::with_capacity(tables.len());
        for (i, (&t, &pq)) in tables.iter().zip(pqs.iter()).enumerate() {
            self.tables[t].plan(pq, k, i as u32, &mut lanes, hits);
        }
        scan_lanes(self.fps.codec(), &mut lanes, k, hits);
        if hits.is_empty() {
            return;
        }
        // Back to fingerprints; one entry per fingerprint, preferring one with its rank.
        for h in hits.iter_mut() {
            let perm = &design.tables()[tables[h.2 as usize]].perm;
            if !perm.is_identity() {
                *h = (perm.invert(h.0), NO_RANK, h.2);
            }
        }
        hits.sort_unstable();
        hits.dedup_by_key(|h| h.0);
        for &(fp, rank, _) in hits.iter() {
            let rank = if rank == NO_RANK {
                match self.fps.rank_of(fp) {
                    Some(r) => r,
                    None => continue, // unreachable: every table holds the same values
                }
            } else {
                rank as usize
            };
            let distance = (fp ^ q).count_ones();
            for pos in self.docs.range_of_rank(rank) {
                if !self.docs.is_deleted(pos) {
                    out.push(Match { id: self.docs.id(pos), fp, distance, ts: self.docs.ts(pos) });
                }
            }
        }
    }

    /// Memory of each table (the identity table's run counted with the documents), of the
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
