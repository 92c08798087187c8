//! Reads: probes against the index, matches resolved to documents, statistics.

use std::collections::HashMap;

use neardup_core::Match;
use neardup_core::index::QueryScratch;
use neardup_core::sketch::Sketch;
use rayon::prelude::*;

use super::{DocMatch, ProbeBudget, ProbeHits, Shard, ShardStats, TableFootprint, Verify};
use crate::doc_table::DocTable;
use crate::error::{Error, Result};

/// Most queries a probe answers at a time (fewer while the budget has little left, or when
/// each may keep many matches): each slice's raw matches are held at once, and each slice is
/// one fork and join over the cores, so a slice much smaller than this spends more on
/// waking threads than on queries.
pub const PROBE_SLICE: usize = 1024;

/// Most raw matches a slice may hold at once (at 32 bytes a match, 4 MiB): a slice of
/// queries that may each keep `limit + 1` matches holds at most this many queries.
const SLICE_MATCHES: usize = 1 << 17;

/// Queries one core answers at a time within a slice (with one scratch).
const CORE_CHUNK: usize = 64;

/// A design as the configuration names it: `paper-10 (5c2)` for the paper's designs, the
/// text form otherwise.
fn design_name(design: &neardup_core::Design) -> String {
    let text = design.to_string();
    match neardup_core::design::NAMED.iter().find(|(_, t)| *t == text) {
        Some((name, _)) => format!("{name} ({text})"),
        None => text,
    }
}

impl Shard {
    /// Answers queries: `result[i]` holds the documents within `k` of `fps[i]`, ordered by
    /// distance, timestamp and id, at most `limit`, within the default [`ProbeBudget`].
    pub fn probe(&self, fps: &[u64], k: u32, limit: usize) -> Result<Vec<ProbeHits>> {
        self.probe_within(fps, k, limit, ProbeBudget::DEFAULT)
    }

    /// The stored sketch of internal id `id`, if it has one. A stored sketch that does not
    /// decode (damage) counts as none: its matches are reported unverified.
    pub(super) fn sketch_of(&self, id: u64) -> Result<Option<Sketch>> {
        Ok(self.sketch_bytes(id)?.and_then(|b| match Sketch::from_bytes(&b) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(id, error = %e, "stored sketch does not decode; unverified");
                None
            }
        }))
    }

    /// The matches verification keeps, in their order, with their sketch similarity (see
    /// [`Shard::admit`]): without `sketch` or with `verify` off, those within `k`. Sketches
    /// already in `read` (by internal id) are not read again.
    pub(super) fn verified(
        &self,
        sketch: Option<&Sketch>,
        verify: Verify,
        k: u32,
        raw: &[Match],
        read: &HashMap<u64, Option<Sketch>>,
    ) -> Result<(Vec<Match>, Vec<Option<f64>>)> {
        let (mut out, mut similarity) = (Vec::new(), Vec::new());
        for m in raw {
            // Both sides sketched: verification alone decides (within candidate k).
            let agreed = match sketch {
                Some(q) if verify.on() => match read.get(&m.id) {
                    Some(s) => s.as_ref().map(|s| q.jaccard(s)),
                    None => self.sketch_of(m.id)?.map(|s| q.jaccard(&s)),
                },
                _ => None,
            };
            if let Some(j) = agreed {
                if m.distance <= verify.candidate_k && j >= verify.jaccard {
                    out.push(*m);
                    similarity.push(Some(j));
                }
                continue;
            }
            if m.distance <= k {
                out.push(*m);
                similarity.push(None);
            }
        }
        Ok((out, similarity))
    }

    /// One query, verified (see [`Shard::admit`] for what verification keeps): the
    /// documents kept, by distance, timestamp and id, at most `limit`.
    pub fn probe_verified(
        &self,
        fp: u64,
        sketch: Option<&Sketch>,
        k: u32,
        verify: Verify,
        limit: usize,
        budget: ProbeBudget,
    ) -> Result<ProbeHits> {
        self.check_serving()?;
        self.check_names()?;
        let st = self.state.read();
        st.index.check_k(k)?;
        st.index.check_k(verify.candidate_k)?;
        let search_k = if verify.on() && sketch.is_some() { k.max(verify.candidate_k) } else { k };
        let mut raw = Vec::new();
        st.index.query_into(fp, search_k, &mut QueryScratch::default(), &mut raw)?;
        let (kept, similarity) = self.verified(sketch, verify, k, &raw, &HashMap::new())?;
        let mut left = budget;
        Self::result(&st.docs, fp, &kept, &similarity, limit.max(1), None, &mut left)
    }

    /// As [`probe`](Self::probe), with the whole answer held to `budget`: queries are served
    /// in order, and once it is spent the rest get what is left (possibly nothing), marked
    /// `truncated`. Matches are turned into documents only within the budget, and the batch
    /// runs in slices (each on every core) of at most [`PROBE_SLICE`] queries and about as
    /// many raw matches as the budget has left (never over 2^17), so memory stays bounded
    /// however many documents each query finds.
    pub fn probe_within(
        &self,
        fps: &[u64],
        k: u32,
        limit: usize,
        budget: ProbeBudget,
    ) -> Result<Vec<ProbeHits>> {
        self.check_serving()?;
        self.check_names()?;
        let limit = limit.max(1);
        let st = self.state.read();
        st.index.check_k(k)?;
        let mut left = budget;
        let mut results = Vec::with_capacity(fps.len());
        // Queries answered one at a time turn their matches into documents straight from
        // one reused buffer; only the slices spread over the cores keep each query's raw
        // matches, cut to one more than it may return (enough to tell `truncated`).
        let (mut scratch, mut out) = (QueryScratch::default(), Vec::new());
        let mut rest = fps;
        while !rest.is_empty() {
            // A slice holds at most about what the budget has left, so the raw matches held
            // at once stay within it too.
            let keep = limit.min(left.max_matches) + 1;
            let len = (left.max_matches / limit)
                .min(SLICE_MATCHES / keep)
                .clamp(1, PROBE_SLICE)
                .min(rest.len());
            let (slice, next) = rest.split_at(len);
            rest = next;
            if slice.len() < 32 {
                for &fp in slice {
                    st.index.query_into(fp, k, &mut scratch, &mut out)?;
                    results.push(Self::result(&st.docs, fp, &out, &[], limit, None, &mut left)?);
                }
                continue;
            }
            let found: Vec<Vec<Match>> = slice
                .par_chunks(CORE_CHUNK)
                .map(|c| {
                    let (mut scratch, mut out) = (QueryScratch::default(), Vec::new());
                    c.iter()
                        .map(|&fp| {
                            st.index.query_into(fp, k, &mut scratch, &mut out)?;
                            Ok(out[..out.len().min(keep)].to_vec())
                        })
                        .collect::<Vec<_>>()
                })
                .flatten_iter()
                .collect::<Result<_>>()?;
            for (&fp, matches) in slice.iter().zip(found) {
                results.push(Self::result(&st.docs, fp, &matches, &[], limit, None, &mut left)?);
            }
        }
        Ok(results)
    }

    /// Turns index matches into the documents they name, skipping internal id `skip`: at
    /// most `limit`, and no more than `left` still allows (which they spend).
    /// `similarity[i]` is the verification of `matches[i]` (empty: none verified).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn result(
        docs: &DocTable,
        fp: u64,
        matches: &[Match],
        similarity: &[Option<f64>],
        limit: usize,
        skip: Option<u64>,
        left: &mut ProbeBudget,
    ) -> Result<ProbeHits> {
        let mut out = Vec::with_capacity(matches.len().min(limit).min(left.max_matches));
        let mut truncated = false;
        for (i, m) in matches.iter().enumerate() {
            if Some(m.id) == skip {
                continue;
            }
            if out.len() == limit || left.max_matches == 0 {
                truncated = true;
                break;
            }
            let mut doc = Self::to_match(docs, m)?;
            doc.jaccard = similarity.get(i).copied().flatten();
            let bytes = DocMatch::wire_bytes(&doc.id);
            if bytes > left.max_bytes {
                truncated = true;
                left.max_matches = 0;
                break;
            }
            left.max_matches -= 1;
            left.max_bytes -= bytes;
            out.push(doc);
        }
        Ok(ProbeHits { matches: out, truncated, fingerprint: fp })
    }

    pub(super) fn to_match(docs: &DocTable, m: &Match) -> Result<DocMatch> {
        let e = docs.by_id(m.id).ok_or_else(|| {
            Error::Internal(format!("index returned internal id {} that has no document", m.id))
        })?;
        Ok(DocMatch {
            id: String::from(&*e.name),
            fingerprint: m.fp,
            distance: m.distance,
            timestamp_ms: m.ts,
            cluster_id: e.cluster,
            jaccard: None,
        })
    }

    /// What the shard holds.
    pub fn stats(&self) -> Result<ShardStats> {
        self.check_serving()?;
        let checkpoint_pending = {
            // The checkpoint lock before the state lock, as `checkpoint` takes them.
            let ck = self.checkpoints.lock();
            let st = self.state.read();
            ck.pending(&st)
        };
        let st = self.state.read();
        let s = st.index.stats();
        let mem = st.index.memory();
        Ok(ShardStats {
            documents: self.live(&st) as u64,
            design: design_name(st.index.design()),
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
            document_bytes: if self.config.names { st.docs.heap_bytes() as u64 } else { 0 },
            buffered: s.buffered as u64,
            runs: s.runs as u64,
            deleted_pending: s.deleted_pending as u64,
            merges: s.merges,
            wal_bytes: st.log_bytes,
            disk_bytes: self.store.disk_bytes().unwrap_or(0),
            version: crate::version().to_string(),
            checkpoint_pending,
            merging: self.metrics.merges_running() > 0,
        })
    }

    /// Where the bytes on disk go (see [`crate::persist::DiskUsage`]). Scans every keyspace: a report, slow on a large shard.
    pub fn disk_usage(&self) -> Result<crate::persist::DiskUsage> {
        Ok(crate::persist::DiskUsage {
            spaces: crate::persist::space_usage(&self.spaces)?,
            files: self.store.disk_parts()?,
        })
    }

    /// Bytes of document data held in memory (ids, names, clusters).
    pub fn doc_bytes(&self) -> usize {
        self.state.read().docs.heap_bytes()
    }

    /// Live documents whose internal id's low byte is `b` (on a cluster node: the documents
    /// of partition `b`).
    pub fn documents_with_low_byte(&self, b: u8) -> u64 {
        self.state.read().docs.count_with_low_byte(b)
    }
}
