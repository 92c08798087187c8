//! Reads: probes against the index, matches resolved to documents, statistics.

use neardup_core::Match;
use neardup_core::index::QueryScratch;
use rayon::prelude::*;

use super::{DocMatch, ProbeHits, RunKey, Shard, ShardStats, TableFootprint};
use crate::doc_table::DocTable;
use crate::error::{Error, Result};

impl Shard {
    /// Answers queries: `result[i]` holds the documents within `k` of `fps[i]`, ordered by
    /// distance, timestamp and id, at most `limit`. Large batches use every core.
    pub fn probe(&self, fps: &[u64], k: u32, limit: usize) -> Result<Vec<ProbeHits>> {
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

    /// Turns index matches into the documents they name, skipping internal id `skip`.
    pub(super) fn result(
        docs: &DocTable,
        fp: u64,
        matches: &[Match],
        limit: usize,
        skip: Option<u64>,
    ) -> Result<ProbeHits> {
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
        Ok(ProbeHits { matches: out, truncated: total > limit, fingerprint: fp })
    }

    pub(super) fn to_match(docs: &DocTable, m: &Match) -> Result<DocMatch> {
        let e = docs.by_id(m.id).ok_or_else(|| {
            Error::Internal(format!("index returned internal id {} that has no document", m.id))
        })?;
        Ok(DocMatch {
            id: e.name.to_string(),
            fingerprint: m.fp,
            distance: m.distance,
            timestamp_ms: m.ts,
            cluster_id: e.cluster,
        })
    }

    /// What the shard holds.
    pub fn stats(&self) -> Result<ShardStats> {
        self.check_serving()?;
        let checkpoint_pending = {
            // The checkpoint lock before the state lock, as `checkpoint` takes them.
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            ck.runs_changed(&st)
                || st.last_seq != ck.manifest.covered
                || st.index.runs().iter().any(|run| {
                    ck.stored
                        .get(&RunKey::of(&st, run))
                        .is_none_or(|s| s.deletes_written != run.deleted())
                })
        };
        let st = self.state.read();
        let s = st.index.stats();
        let mem = st.index.memory();
        Ok(ShardStats {
            documents: st.docs.len() as u64,
            design: st.index.design().to_string(),
            max_k: st.index.max_k(),
            tables: mem
                .tables
                .iter()
                .map(|t| TableFootprint {
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
}
