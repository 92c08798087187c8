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
use neardup_core::{Design, Doc, Index, IndexConfig};

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
/// core index (a design chosen by `Design::auto` for `fps.len()`, `k` and `budget_bytes`),
/// sorted.
pub fn near_pairs(
    fps: &[u64],
    k: u32,
    budget_bytes: u64,
) -> Result<Vec<(u32, u32, u32)>, DedupError> {
    if fps.len() < 2 {
        return Ok(Vec::new());
    }
    let design = Design::auto(fps.len() as u64, k, budget_bytes)?;
    let docs: Vec<Doc> =
        fps.iter().enumerate().map(|(i, &fp)| Doc { id: i as u64, fp, ts: 0 }).collect();
    let index = Index::build(IndexConfig { design, ..Default::default() }, &docs)?;
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
