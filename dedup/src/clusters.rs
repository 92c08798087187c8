//! From fingerprints to clusters: exact-duplicate groups, the self-join with the core
//! tables, and every document's cluster, original and nearest near-duplicate.
//!
//! # Why this module exists
//!
//! `neardup_core::cluster` turns pairs into clusters. A corpus adds two things to handle
//! before that, kept here apart from all I/O so they can be tested against brute force:
//!
//! * **Exact duplicates.** Documents with the same content hash (identical normalised text)
//!   are one *group*. Only the group's first document in original order (its
//!   *representative*) takes part in the self-join and the clustering; the others follow it.
//!   This is exactly what clustering the full pair graph would give (every member of a group
//!   is a near-duplicate, at distance 0, of every other and has the same other
//!   near-duplicates; under either rule only the representative can be an original and all
//!   members land in its cluster), and it keeps a text copied 10,000 times from making 50
//!   million pairs.
//! * **The self-join.** Every pair of representatives within Hamming distance `k` comes from
//!   the core index ([`near_pairs`]), built once over all fingerprints and queried with each:
//!   exact by construction, no pair missed.
//!
//! **Original order** is the one of `neardup_core::cluster`: the earliest timestamp first,
//! documents without a timestamp after all those with one, then input order.

use neardup_core::cluster::{DocTime, NearPair, Rule, cluster};
use neardup_core::util::hamming;
use neardup_core::{Doc, Index, IndexConfig};

use crate::error::DedupError;

/// What clustering needs of one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocKey {
    /// Its simhash.
    pub fp: u64,
    /// Its content hash (equal for identical normalised text).
    pub content_hash: u128,
    /// Milliseconds since the epoch, if known.
    pub timestamp: Option<i64>,
}

impl DocKey {
    /// The key of original order for document number `index`.
    pub fn time(&self, index: usize) -> DocTime {
        DocTime { timestamp: self.timestamp.unwrap_or(i64::MAX), first_seen: index as u64 }
    }
}

/// Exact-duplicate groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactGroups {
    /// For each document, its group's representative (itself for a representative).
    pub rep: Vec<u32>,
    /// The representatives, in ascending document number.
    pub reps: Vec<u32>,
    /// Each document's position in original order.
    pub rank: Vec<u32>,
}

impl ExactGroups {
    /// Groups `docs` by content hash; the representative is the earliest in original order.
    pub fn new(docs: &[DocKey]) -> Result<ExactGroups, DedupError> {
        let n = docs.len();
        if n > u32::MAX as usize - 1 {
            return Err(DedupError::Usage(format!("{n} documents: at most 2^32 - 2 per run")));
        }
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by_key(|&i| {
            let t = docs[i as usize].time(i as usize);
            (t.timestamp, t.first_seen)
        });
        let mut rank = vec![0u32; n];
        for (r, &i) in order.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        let mut first: std::collections::HashMap<u128, u32> =
            std::collections::HashMap::with_capacity(n);
        let mut rep = vec![0u32; n];
        for &i in &order {
            rep[i as usize] = *first.entry(docs[i as usize].content_hash).or_insert(i);
        }
        let reps = (0..n as u32).filter(|&i| rep[i as usize] == i).collect();
        Ok(ExactGroups { rep, reps, rank })
    }

    /// Documents that are an exact duplicate of an earlier one.
    pub fn duplicates(&self) -> usize {
        self.rep.len() - self.reps.len()
    }
}

/// Every pair `(i, j, distance)`, `i < j`, of `fps` within Hamming distance `k`, from the
/// core index (design and table layout chosen by `IndexConfig::auto` for `fps.len()`,
/// `k` and `budget_bytes`), sorted.
pub fn near_pairs(
    fps: &[u64],
    k: u32,
    budget_bytes: u64,
) -> Result<Vec<(u32, u32, u32)>, DedupError> {
    if fps.len() < 2 {
        return Ok(Vec::new());
    }
    if fps.len() > u32::MAX as usize {
        return Err(DedupError::Usage(format!(
            "{} documents: at most 2^32 - 1 per run",
            fps.len()
        )));
    }
    let config = IndexConfig::auto(fps.len() as u64, k, budget_bytes)?;
    let docs: Vec<Doc> =
        fps.iter().enumerate().map(|(i, &fp)| Doc { id: i as u64, fp, ts: 0 }).collect();
    let index = Index::build(config, &docs)?;
    drop(docs);
    let mut pairs = Vec::new();
    const CHUNK: usize = 1 << 16;
    for (c, chunk) in fps.chunks(CHUNK).enumerate() {
        let answers = index.query_batch(chunk, k)?;
        for (off, matches) in answers.iter().enumerate() {
            let i = (c * CHUNK + off) as u64;
            for m in matches {
                if m.id > i {
                    pairs.push((i as u32, m.id as u32, m.distance));
                }
            }
        }
    }
    pairs.sort_unstable();
    Ok(pairs)
}

/// A near-duplicate pair of documents for [`assign`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// One document.
    pub a: u32,
    /// The other.
    pub b: u32,
    /// Their exact word-shingle Jaccard similarity, when it was computed (`--verify`); then
    /// the nearest near-duplicate is the most similar one, otherwise the one with the
    /// fewest differing fingerprint bits.
    pub jaccard: Option<f64>,
}

/// Where one document landed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    /// Its cluster, numbered from 0 in input order of the clusters' originals.
    pub cluster: u32,
    /// The cluster's original (a document number).
    pub original: u32,
    /// Whether it is its cluster's original.
    pub is_original: bool,
    /// Its nearest near-duplicate, if it has any.
    pub nearest: Option<u32>,
    /// The Jaccard similarity to `nearest`, if known.
    pub nearest_jaccard: Option<f64>,
    /// The earliest document (in original order) with the same content hash, if it is not
    /// this one.
    pub exact_duplicate_of: Option<u32>,
}

/// The clustering of a corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignments {
    /// One per document.
    pub docs: Vec<Assignment>,
    /// Members per cluster.
    pub cluster_sizes: Vec<u32>,
    /// Documents in at least one near-duplicate pair that is not an exact duplicate of
    /// every other document of its pairs (documents with a near, not only an exact,
    /// duplicate).
    pub near_duplicate_documents: usize,
}

/// Clusters `docs` under `rule` from `edges`, pairs of *representatives* of `groups`.
/// Members of an exact-duplicate group follow their representative (see the module docs).
pub fn assign(
    docs: &[DocKey],
    groups: &ExactGroups,
    edges: &[Edge],
    rule: Rule,
) -> Result<Assignments, DedupError> {
    let n = docs.len();
    // Compact numbering of the representatives.
    let mut compact = vec![u32::MAX; n];
    for (c, &d) in groups.reps.iter().enumerate() {
        compact[d as usize] = c as u32;
    }
    let times: Vec<DocTime> =
        groups.reps.iter().map(|&d| docs[d as usize].time(d as usize)).collect();
    let mut pairs = Vec::with_capacity(edges.len());
    for e in edges {
        let (a, b) = (e.a as usize, e.b as usize);
        if a >= n || b >= n || compact[a] == u32::MAX || compact[b] == u32::MAX {
            return Err(DedupError::Usage(format!(
                "pair ({a}, {b}) is not a pair of exact-group representatives"
            )));
        }
        let distance = match e.jaccard {
            Some(j) => 1.0 - j,
            None => hamming(docs[a].fp, docs[b].fp) as f64,
        };
        pairs.push(NearPair {
            a: compact[a] as usize,
            b: compact[b] as usize,
            distance: Some(distance),
        });
    }
    let clustering = cluster(&times, &pairs, rule)?;
    let similarity: std::collections::HashMap<(u32, u32), f64> =
        edges.iter().filter_map(|e| e.jaccard.map(|j| ((e.a.min(e.b), e.a.max(e.b)), j))).collect();
    let jaccard_of = |x: u32, y: u32| similarity.get(&(x.min(y), x.max(y))).copied();

    // Second member of each group in original order: a representative's exact twin.
    let mut twin = vec![u32::MAX; n];
    for i in 0..n {
        let rep = groups.rep[i] as usize;
        if rep != i {
            let t = &mut twin[rep];
            if *t == u32::MAX || groups.rank[i] < groups.rank[*t as usize] {
                *t = i as u32;
            }
        }
    }

    // Dense cluster numbers in input order of the originals.
    let mut number = vec![u32::MAX; n];
    let mut next = 0u32;
    for (c, &d) in groups.reps.iter().enumerate() {
        if clustering.docs[c].is_original {
            number[d as usize] = next;
            next += 1;
        }
    }
    let mut cluster_sizes = vec![0u32; next as usize];
    let mut has_near = vec![false; n];
    for p in &pairs {
        has_near[groups.reps[p.a] as usize] = true;
        has_near[groups.reps[p.b] as usize] = true;
    }

    let mut out = Vec::with_capacity(n);
    let mut near_duplicate_documents = 0;
    for (i, &rep) in groups.rep.iter().enumerate() {
        let c = compact[rep as usize] as usize;
        let dc = &clustering.docs[c];
        let original = groups.reps[dc.original];
        let near = dc.nearest.map(|x| (x.distance, groups.reps[x.doc]));
        let rank = |d: u32| groups.rank[d as usize];
        // The nearest among: the representative's near-duplicates (shared by the whole
        // group), and the group's own members at distance 0; ties by original order.
        let own =
            if rep as usize == i { (twin[i] != u32::MAX).then_some(twin[i]) } else { Some(rep) };
        let nearest = match (near, own) {
            (Some((d, x)), Some(o)) => {
                if d == 0.0 && rank(x) < rank(o) {
                    Some(x)
                } else {
                    Some(o)
                }
            }
            (Some((_, x)), None) => Some(x),
            (None, o) => o,
        };
        let nearest_jaccard = nearest.and_then(|x| {
            if groups.rep[x as usize] == rep {
                // Identical normalised text: identical shingle sets.
                Some(1.0)
            } else {
                jaccard_of(rep, groups.rep[x as usize])
            }
        });
        if has_near[rep as usize] {
            near_duplicate_documents += 1;
        }
        let cluster = number[original as usize];
        cluster_sizes[cluster as usize] += 1;
        out.push(Assignment {
            cluster,
            original,
            is_original: original as usize == i,
            nearest,
            nearest_jaccard,
            exact_duplicate_of: (rep as usize != i).then_some(rep),
        });
    }
    Ok(Assignments { docs: out, cluster_sizes, near_duplicate_documents })
}

#[cfg(test)]
mod tests {
    use neardup_core::util::SplitMix64;

    use super::*;

    /// A corpus of fingerprints in families (a base and copies a few bits away), with exact
    /// duplicates (same content hash and fingerprint), distinct texts with equal
    /// fingerprints, and timestamps with ties and gaps.
    fn corpus(r: &mut SplitMix64, n: usize) -> Vec<DocKey> {
        let mut docs: Vec<DocKey> = Vec::with_capacity(n);
        for i in 0..n {
            let timestamp = match r.below(6) {
                0 => None,
                _ => Some(r.below(20) as i64 * 1000),
            };
            let key = if i > 0 && r.below(4) == 0 {
                let src = docs[r.below(i as u64) as usize];
                match r.below(3) {
                    0 => DocKey { timestamp, ..src },
                    1 => DocKey { fp: src.fp, content_hash: r.next_u64() as u128, timestamp },
                    _ => {
                        let bits = r.below(8) as u32;
                        DocKey {
                            fp: r.flip_bits(src.fp, bits),
                            content_hash: r.next_u64() as u128,
                            timestamp,
                        }
                    }
                }
            } else {
                DocKey { fp: r.next_u64(), content_hash: r.next_u64() as u128, timestamp }
            };
            docs.push(key);
        }
        docs
    }

    /// A made-up similarity that exact duplicates share: a function of the content hashes.
    fn similarity(a: &DocKey, b: &DocKey) -> f64 {
        if a.content_hash == b.content_hash {
            return 1.0;
        }
        let (x, y) = (a.content_hash.min(b.content_hash), a.content_hash.max(b.content_hash));
        let h = xxhash_rust::xxh3::xxh3_64(&[x.to_le_bytes(), y.to_le_bytes()].concat());
        (h % 1001) as f64 / 1000.0
    }

    /// Reference: every pair of all documents (exact duplicates included), clustered by the
    /// core on the full graph; `verify` keeps pairs at or above that similarity.
    fn reference(
        docs: &[DocKey],
        k: u32,
        verify: Option<f64>,
        rule: Rule,
    ) -> Vec<(u32, bool, Option<u32>)> {
        let times: Vec<DocTime> = docs.iter().enumerate().map(|(i, d)| d.time(i)).collect();
        let mut pairs = Vec::new();
        for i in 0..docs.len() {
            for j in i + 1..docs.len() {
                let d = hamming(docs[i].fp, docs[j].fp);
                let s = similarity(&docs[i], &docs[j]);
                if d <= k && verify.is_none_or(|t| s >= t) {
                    let distance = if verify.is_some() { 1.0 - s } else { d as f64 };
                    pairs.push(NearPair { a: i, b: j, distance: Some(distance) });
                }
            }
        }
        let c = cluster(&times, &pairs, rule).unwrap();
        c.docs
            .iter()
            .map(|d| (d.original as u32, d.is_original, d.nearest.map(|x| x.doc as u32)))
            .collect()
    }

    fn run(docs: &[DocKey], k: u32, verify: Option<f64>, rule: Rule) -> Assignments {
        let groups = ExactGroups::new(docs).unwrap();
        let fps: Vec<u64> = groups.reps.iter().map(|&d| docs[d as usize].fp).collect();
        let edges: Vec<Edge> = near_pairs(&fps, k, 1 << 30)
            .unwrap()
            .into_iter()
            .map(|(a, b, _)| {
                let (a, b) = (groups.reps[a as usize], groups.reps[b as usize]);
                let jaccard = verify.map(|_| similarity(&docs[a as usize], &docs[b as usize]));
                Edge { a, b, jaccard }
            })
            .filter(|e| verify.is_none_or(|t| e.jaccard.is_some_and(|s| s >= t)))
            .collect();
        assign(docs, &groups, &edges, rule).unwrap()
    }

    #[test]
    fn matches_the_full_pair_graph() {
        let mut r = SplitMix64::new(7);
        for round in 0..6 {
            let docs = corpus(&mut r, 150 + round * 40);
            for rule in [Rule::AttachToOriginal, Rule::ConnectedComponents] {
                for (k, verify) in [(0, None), (3, None), (6, None), (8, Some(0.5))] {
                    let want = reference(&docs, k, verify, rule);
                    let got = run(&docs, k, verify, rule);
                    let ctx = format!("round {round}, {rule:?}, k {k}, verify {verify:?}");
                    assert!(got.docs.iter().any(|a| !a.is_original), "{ctx}: no duplicates");
                    for (i, (a, w)) in got.docs.iter().zip(&want).enumerate() {
                        assert_eq!((a.original, a.is_original, a.nearest), *w, "{ctx}, doc {i}");
                    }
                    // Dense cluster numbers, in input order of the originals.
                    let mut originals: Vec<u32> = got.docs.iter().map(|a| a.original).collect();
                    originals.sort_unstable();
                    originals.dedup();
                    for a in &got.docs {
                        assert_eq!(originals[a.cluster as usize], a.original, "{ctx}");
                    }
                    let sizes: u32 = got.cluster_sizes.iter().sum();
                    assert_eq!(sizes as usize, docs.len());
                    if rule == Rule::AttachToOriginal {
                        for (i, a) in got.docs.iter().enumerate() {
                            let o = &docs[a.original as usize];
                            assert!(hamming(docs[i].fp, o.fp) <= k, "{ctx}: far from original");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exact_duplicates_point_at_the_earliest_copy() {
        let d = |fp: u64, h: u128, t: Option<i64>| DocKey { fp, content_hash: h, timestamp: t };
        // Doc 2 is the earliest by timestamp; doc 3 has no timestamp (after all dated ones);
        // docs 0 and 4 tie on time and are ordered by input position.
        let docs =
            [d(1, 9, Some(50)), d(7, 5, None), d(1, 9, Some(10)), d(1, 9, None), d(1, 9, Some(50))];
        let groups = ExactGroups::new(&docs).unwrap();
        assert_eq!(groups.rep, [2, 1, 2, 2, 2]);
        assert_eq!(groups.reps, [1, 2]);
        assert_eq!(groups.duplicates(), 3);
        let a = assign(&docs, &groups, &[], Rule::AttachToOriginal).unwrap();
        let dup: Vec<Option<u32>> = a.docs.iter().map(|x| x.exact_duplicate_of).collect();
        assert_eq!(dup, [Some(2), None, None, Some(2), Some(2)]);
        let nearest: Vec<Option<u32>> = a.docs.iter().map(|x| x.nearest).collect();
        // The representative's nearest is the next copy in original order (doc 0 at t=50).
        assert_eq!(nearest, [Some(2), None, Some(0), Some(2), Some(2)]);
        assert_eq!(a.docs[0].nearest_jaccard, Some(1.0));
        assert_eq!(a.near_duplicate_documents, 0);
        assert_eq!(a.cluster_sizes, [1, 4]);
    }
}
