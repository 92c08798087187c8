//! One permuted table of a run ([`PermutedTable`]), with sub-indexes for crowded prefixes.
//!
//! Simhash clusters similar documents, so one prefix of a table can hold far more than
//! `n / 2^p` entries (the paper's Figure 2), and a query landing there would scan them all.
//! When a bucket (the entries sharing a table's prefix) holds more than a threshold, the
//! table applies the same idea again inside it: the bucket's remaining `64 - p` bits are
//! split into `k + 1` blocks, and one sub-table per block, permuted so that block leads,
//! finds every entry within `k` of a query by an exact match on the longer prefix. Sub-tables
//! are themselves tables, so a sub-bucket that is still crowded is split again, a few levels
//! deep at most. A query's cost in a crowded bucket then grows with the bucket's entries
//! divided by `2^(bits of the sub-prefix)` instead of with the bucket's size.

use std::sync::Arc;

use crate::codec::{EncodedTable, TableHit, TableOptions};
use crate::design::{Design, Level};
use crate::error::Result;
use crate::permute::{BitRange, Permutation};

pub(crate) use crate::codec::NO_RANK;

/// Where a table searches for a query: candidate blocks, or a bucket's positions when
/// packed; `None` when it has nothing to search.
pub(crate) type Candidates = Option<(usize, usize)>;

/// When a bucket counts as crowded, and how deep sub-indexes may go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CrowdPolicy {
    /// A bucket with at most this many entries is never crowded.
    pub min: usize,
    /// A bucket is crowded when it holds more than this many times the mean bucket size.
    pub factor: f64,
    /// The largest k the sub-indexes must answer (the design's `max_k`).
    pub k: u32,
    /// Nesting limit for sub-indexes.
    pub max_depth: u32,
}

/// A sorted, compressed table of permuted fingerprints.
#[derive(Debug)]
pub(crate) struct PermutedTable {
    /// The table's values, encoded in the run's layout.
    pub(crate) encoded: Arc<EncodedTable>,
    prefix_bits: u32,
    /// The bits below the prefix (see [`bucket`](Self::bucket)).
    low: u64,
    /// Sub-indexes of crowded buckets, by prefix.
    crowded: Vec<Crowded>,
}

#[derive(Debug)]
struct Crowded {
    prefix: u64,
    /// Sub-tables for each k: the indices into `subs` a query at that k probes.
    for_k: Arc<Vec<Vec<usize>>>,
    subs: Vec<SubTable>,
}

#[derive(Debug)]
struct SubTable {
    /// Acts on the table's permuted values; keeps the outer prefix in place.
    perm: Permutation,
    table: PermutedTable,
}

/// `[lo, hi]`: the values sharing `v`'s top `p` bits.
#[inline(always)]
fn prefix_range(v: u64, p: u32) -> (u64, u64) {
    if p == 0 {
        (0, u64::MAX)
    } else {
        let low = u64::MAX >> p;
        (v & !low, v | low)
    }
}

impl PermutedTable {
    /// Builds a table from its sorted, distinct, permuted values. `encoded`, if given, is the
    /// already encoded table of exactly these values (the identity table shares the
    /// document store's).
    pub(crate) fn build(
        sorted: &[u64],
        encoded: Option<Arc<EncodedTable>>,
        prefix_bits: u32,
        opts: TableOptions,
        policy: &CrowdPolicy,
        depth: u32,
    ) -> Result<PermutedTable> {
        let encoded = match encoded {
            Some(encoded) => encoded,
            None => {
                // Only the document store's key column (passed in) needs ranks.
                let mut encoded = EncodedTable::encode(sorted, opts)?;
                encoded.drop_ranks();
                Arc::new(encoded)
            }
        };
        let mut crowded = Vec::new();
        let rest = 64 - prefix_bits;
        if prefix_bits > 0 && depth < policy.max_depth && rest > policy.k {
            let mean = sorted.len() as f64 / 2f64.powi(prefix_bits as i32);
            let limit = (policy.min as f64).max(policy.factor * mean) as usize;
            if sorted.len() > limit {
                let mut sub_design: Option<(Design, Arc<Vec<Vec<usize>>>)> = None;
                // A bucket of more than `limit` entries holds two consecutive multiples of
                // `step`, so comparing the prefixes at those positions finds every one
                // without reading each value.
                let step = limit.div_ceil(2).max(1);
                let mut next = 0; // the first position past the buckets looked at
                let mut at = 0;
                while at + step < sorted.len() {
                    let (p, q) = (at, at + step);
                    at = q;
                    let (lo, hi) = prefix_range(sorted[p], prefix_bits);
                    if p < next || sorted[q] > hi {
                        continue;
                    }
                    let i = sorted.partition_point(|&v| v < lo);
                    let j = sorted.partition_point(|&v| v <= hi);
                    next = j;
                    if j - i > limit {
                        if sub_design.is_none() {
                            let d = Design::new(
                                rest,
                                vec![Level { blocks: policy.k + 1, widths: None, choose: 1 }],
                            )?;
                            let for_k = (0..=policy.k).map(|k| d.tables_for_k(k)).collect();
                            sub_design = Some((d, Arc::new(for_k)));
                        }
                        let (d, for_k) = sub_design.as_ref().expect("set above");
                        crowded.push(Self::sub_index(
                            &sorted[i..j],
                            prefix_bits,
                            d,
                            for_k,
                            opts,
                            policy,
                            depth,
                        )?);
                    }
                }
            }
        }
        let low = prefix_range(0, prefix_bits).1;
        Ok(PermutedTable { encoded, prefix_bits, low, crowded })
    }

    fn sub_index(
        bucket: &[u64],
        prefix_bits: u32,
        design: &Design,
        for_k: &Arc<Vec<Vec<usize>>>,
        opts: TableOptions,
        policy: &CrowdPolicy,
        depth: u32,
    ) -> Result<Crowded> {
        let mut subs = Vec::with_capacity(design.tables().len());
        for spec in design.tables() {
            // Lift the sub-design's permutation of the low bits to 64 bits.
            let mut ranges = vec![BitRange { start: 0, len: prefix_bits }];
            ranges.extend(
                spec.perm
                    .ranges()
                    .iter()
                    .map(|r| BitRange { start: r.start + prefix_bits, len: r.len }),
            );
            let perm = Permutation::from_ranges(64, &ranges)?;
            let mut vals: Vec<u64> = bucket.iter().map(|&v| perm.apply(v)).collect();
            vals.sort_unstable();
            let table = PermutedTable::build(
                &vals,
                None,
                prefix_bits + spec.prefix_bits,
                opts,
                policy,
                depth + 1,
            )?;
            subs.push(SubTable { perm, table });
        }
        Ok(Crowded { prefix: bucket[0] >> (64 - prefix_bits), for_k: for_k.clone(), subs })
    }

    /// `[lo, hi]`: the values sharing the permuted query `pq`'s prefix.
    #[inline(always)]
    fn bucket(&self, pq: u64) -> (u64, u64) {
        (pq & !self.low, pq | self.low)
    }

    /// Stage 1 of a probe: starts loading the directory entry for `pq`.
    #[inline(always)]
    pub(crate) fn prefetch_directory(&self, pq: u64) {
        self.encoded.prefetch_directory(self.bucket(pq).0)
    }

    /// Stage 2: where `pq`'s bucket lies (one directory load), whose loading it starts;
    /// `None` when the directory entry alone shows that the probe would find nothing (an
    /// empty bucket of a packed table without crowded prefixes).
    #[inline(always)]
    pub(crate) fn candidates(&self, pq: u64) -> Candidates {
        let (lo, hi) = self.bucket(pq);
        let c = self.encoded.candidates(lo, hi);
        (!self.encoded.holds_none(c) || !self.crowded.is_empty()).then_some(c)
    }

    /// Stage 3: probes this table for the permuted query `pq`: scans its prefix bucket, or,
    /// when the bucket is crowded, probes its sub-index. Each hit's value is in this table's
    /// (permuted) space, its rank is the value's rank in the main table, or [`NO_RANK`] for
    /// hits from a sub-index, and its probe is `probe`.
    #[inline]
    pub(crate) fn probe(
        &self,
        pq: u64,
        candidates: (usize, usize),
        k: u32,
        probe: u32,
        hits: &mut Vec<TableHit>,
    ) {
        if !self.crowded.is_empty() {
            let prefix = pq >> (64 - self.prefix_bits);
            if let Ok(i) = self.crowded.binary_search_by_key(&prefix, |c| c.prefix) {
                self.probe_crowded(&self.crowded[i], pq, k, probe, hits);
                return;
            }
        }
        self.encoded.probe(candidates, self.bucket(pq), pq, k, probe, hits);
    }

    /// Probes a crowded bucket's sub-tables one after the other.
    fn probe_crowded(&self, c: &Crowded, pq: u64, k: u32, probe: u32, hits: &mut Vec<TableHit>) {
        for &s in &c.for_k[k.min(c.for_k.len() as u32 - 1) as usize] {
            let sub = &c.subs[s];
            let start = hits.len();
            let spq = sub.perm.apply(pq);
            if let Some(c) = sub.table.candidates(spq) {
                sub.table.probe(spq, c, k, probe, hits);
            }
            for hit in &mut hits[start..] {
                *hit = TableHit { value: sub.perm.invert(hit.value), rank: NO_RANK, probe };
            }
        }
    }

    /// Number of distinct values in the main table.
    pub(crate) fn len(&self) -> usize {
        self.encoded.len()
    }

    /// Heap bytes of the main table (when `with_main`) and of every sub-index.
    pub(crate) fn heap_bytes(&self, with_main: bool) -> usize {
        let main = if with_main { self.encoded.heap_bytes() } else { 0 };
        main + self.crowded_bytes()
    }

    fn crowded_bytes(&self) -> usize {
        self.crowded
            .iter()
            .flat_map(|c| &c.subs)
            .map(|s| s.table.heap_bytes(true) + std::mem::size_of::<SubTable>())
            .sum()
    }

    /// Number of crowded buckets (at the top level) and the entries they hold.
    pub(crate) fn crowded_stats(&self) -> (usize, usize) {
        let entries =
            self.crowded.iter().map(|c| c.subs.first().map_or(0, |s| s.table.len())).sum();
        (self.crowded.len(), entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    /// The sampled search for crowded buckets finds exactly the buckets a full count finds,
    /// with sizes just below, at and above the limit, alone and side by side.
    #[test]
    fn every_crowded_bucket_is_found() {
        let limit = 40;
        let policy = CrowdPolicy { min: limit, factor: 0.0, k: 3, max_depth: 1 };
        let mut r = SplitMix64::new(9);
        for sizes in [
            vec![40, 41, 3, 85, 41, 0, 40, 120, 1],
            vec![41],
            vec![1, 1, 41, 41, 41, 2, 80, 81, 82],
            vec![39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
        ] {
            let mut values: Vec<u64> = Vec::new();
            for (b, &size) in sizes.iter().enumerate() {
                let mut bucket: Vec<u64> =
                    (0..size).map(|_| ((b as u64) << 56) | (r.next_u64() >> 8)).collect();
                bucket.sort_unstable();
                bucket.dedup();
                assert_eq!(bucket.len(), size);
                values.extend(bucket);
            }
            let table = PermutedTable::build(&values, None, 8, TableOptions::default(), &policy, 0)
                .unwrap();
            let want: Vec<u64> = sizes
                .iter()
                .enumerate()
                .filter(|&(_, &s)| s > limit)
                .map(|(b, _)| b as u64)
                .collect();
            let got: Vec<u64> = table.crowded.iter().map(|c| c.prefix).collect();
            assert_eq!(got, want, "{sizes:?}");
            let entries: usize = sizes.iter().filter(|&&s| s > limit).sum();
            assert_eq!(table.crowded_stats(), (want.len(), entries));
        }
    }
}
