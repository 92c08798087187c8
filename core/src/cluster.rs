//! Duplicate clusters: from near-duplicate pairs to a cluster id and an original for every
//! document.
//!
//! # Why this module exists
//!
//! The index answers "which stored documents are within `k` of this one?": pairs. A crawl
//! (and the reference wiki, see the design notes) needs more: every document gets a
//! duplicate-cluster id, and each cluster names its *original*, the earliest document, the
//! one to keep and to credit. The evaluation needs the same to compare predicted and true
//! duplicate structure. This module turns pairs into clusters, with no I/O and no index.
//!
//! # The near-duplicate relation is not transitive
//!
//! If `a ~ b` and `b ~ c` (each within `k` bits, or Jaccard `>= t`), `a` and `c` may be far
//! apart. So "cluster" has no single right meaning; two rules are offered ([`Rule`]):
//!
//! * [`Rule::ConnectedComponents`]: a cluster is a connected component of the graph whose
//!   edges are the pairs (union-find with union by size and path halving). Every pair is
//!   inside one cluster, but a member may be many pairs away from its original: a chain
//!   `a ~ b ~ c ~ …` becomes one cluster however far its ends drift.
//! * [`Rule::AttachToOriginal`]: documents are taken in *original order*; a document becomes
//!   an original if none of its near-duplicates taken before it is an original; otherwise it
//!   joins the cluster of the earliest of those originals. This guarantees:
//!   1. every member that is not the original is a near-duplicate (one pair) of its
//!      cluster's original, and comes after it in original order; with pairs at Hamming
//!      distance `<= k`, every member is within `k` of its original;
//!   2. no two originals are near-duplicates of each other, and every other document is a
//!      near-duplicate of an earlier original: the originals are the maximal independent set
//!      that a greedy pass in original order picks;
//!   3. the original is the earliest member of its cluster.
//!
//!   A chain `a ~ b ~ c` (with `a ≁ c`) in that order gives clusters `{a, b}` and `{c}`: `b`
//!   joins `a`; `c`'s only earlier near-duplicate, `b`, is not an original, so `c` starts its
//!   own cluster. A document can be a near-duplicate of several originals (earlier or
//!   later); it belongs to exactly one cluster, that of its earliest earlier original.
//!
//! **Original order**: earliest [`DocTime::timestamp`] first; equal timestamps by
//! [`DocTime::first_seen`]; then by document index. Under both rules a cluster's original is
//! its first member in this order and the cluster's id is the original's index.
//!
//! **Nearest**: for each document, the near-duplicate (over all its pairs, whatever the
//! clusters) at the smallest given distance, ties by original order; pairs given without a
//! distance are not considered. A pair listed more than once counts once, at the smallest
//! distance given for it.

use crate::error::{Error, Result};

/// When a document was first seen: the keys of original order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DocTime {
    /// Time the document was fetched or published (any unit, earlier is smaller).
    pub timestamp: i64,
    /// Order of first appearance (a sequence number), used when timestamps are equal.
    pub first_seen: u64,
}

/// One near-duplicate pair of document indices, in either order, with an optional distance
/// (Hamming distance, `1 - Jaccard`, ...; finite and `>= 0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearPair {
    /// One document.
    pub a: usize,
    /// The other document (`!= a`).
    pub b: usize,
    /// How far apart the two are, if known.
    pub distance: Option<f64>,
}

impl From<(usize, usize)> for NearPair {
    fn from((a, b): (usize, usize)) -> Self {
        NearPair { a, b, distance: None }
    }
}

impl From<(usize, usize, f64)> for NearPair {
    fn from((a, b, d): (usize, usize, f64)) -> Self {
        NearPair { a, b, distance: Some(d) }
    }
}

impl From<(usize, usize, u32)> for NearPair {
    fn from((a, b, d): (usize, usize, u32)) -> Self {
        NearPair { a, b, distance: Some(d as f64) }
    }
}

/// How pairs become clusters (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Clusters are the connected components of the pair graph.
    ConnectedComponents,
    /// Greedy in original order: each document joins its earliest earlier original
    /// near-duplicate, or becomes an original. Every member is one pair from its original.
    AttachToOriginal,
}

/// One cluster (documents without any pair are clusters of one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The cluster's id: its original's index.
    pub id: usize,
    /// The original: the cluster's earliest member in original order.
    pub original: usize,
    /// All members, the original included, in original order (so the original is first).
    pub members: Vec<usize>,
}

/// A document's nearest near-duplicate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nearest {
    /// Its index.
    pub doc: usize,
    /// The distance given with the pair.
    pub distance: f64,
}

/// Where one document landed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DocCluster {
    /// The id of its cluster (= the cluster original's index).
    pub cluster: usize,
    /// Its cluster's original (equal to `cluster`).
    pub original: usize,
    /// Whether this document is its cluster's original.
    pub is_original: bool,
    /// The distance of the pair (this document, its original), if that pair was given with a
    /// distance; `None` for originals. Under [`Rule::AttachToOriginal`] every non-original
    /// has such a pair.
    pub distance_to_original: Option<f64>,
    /// Its nearest near-duplicate among the pairs given with a distance, if any.
    pub nearest: Option<Nearest>,
}

/// The result of [`cluster`].
#[derive(Debug, Clone, PartialEq)]
pub struct Clustering {
    /// The rule that made it.
    pub rule: Rule,
    /// Every cluster, singletons included, sorted by id.
    pub clusters: Vec<Cluster>,
    /// One entry per input document, by index.
    pub docs: Vec<DocCluster>,
}

impl Clustering {
    /// The cluster with this id, if there is one.
    pub fn cluster(&self, id: usize) -> Option<&Cluster> {
        self.clusters.binary_search_by_key(&id, |c| c.id).ok().map(|i| &self.clusters[i])
    }

    /// The clusters with more than one member.
    pub fn duplicate_clusters(&self) -> impl Iterator<Item = &Cluster> {
        self.clusters.iter().filter(|c| c.members.len() > 1)
    }
}

/// Disjoint sets over `0..n` with union by size and path halving: near-constant time per
/// operation.
#[derive(Debug, Clone)]
pub struct UnionFind {
    parent: Vec<usize>,
    size: Vec<usize>,
}

impl UnionFind {
    /// `n` singleton sets.
    pub fn new(n: usize) -> Self {
        UnionFind { parent: (0..n).collect(), size: vec![1; n] }
    }

    /// The representative of `x`'s set (`x < n`, else this panics like slice indexing).
    pub fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    /// Merges the sets of `a` and `b`; returns whether they were separate.
    pub fn union(&mut self, a: usize, b: usize) -> bool {
        let (mut ra, mut rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        if self.size[ra] < self.size[rb] {
            std::mem::swap(&mut ra, &mut rb);
        }
        self.parent[rb] = ra;
        self.size[ra] += self.size[rb];
        true
    }

    /// Number of elements in `x`'s set.
    pub fn set_size(&mut self, x: usize) -> usize {
        let r = self.find(x);
        self.size[r]
    }
}

/// Clusters `docs.len()` documents from their near-duplicate `pairs` under `rule`.
///
/// Errors ([`Error::InvalidConfig`]): a pair naming a document index `>= docs.len()`, a pair
/// of a document with itself, a distance that is negative, infinite or NaN.
pub fn cluster(docs: &[DocTime], pairs: &[NearPair], rule: Rule) -> Result<Clustering> {
    let n = docs.len();
    for p in pairs {
        if p.a >= n || p.b >= n {
            return Err(Error::InvalidConfig(format!(
                "pair ({}, {}) names a document beyond the {n} given",
                p.a, p.b
            )));
        }
        if p.a == p.b {
            return Err(Error::InvalidConfig(format!(
                "pair ({}, {}) pairs a document with itself",
                p.a, p.b
            )));
        }
        if let Some(d) = p.distance
            && !(d.is_finite() && d >= 0.0)
        {
            return Err(Error::InvalidConfig(format!(
                "pair ({}, {}) has distance {d}; distances must be finite and >= 0",
                p.a, p.b
            )));
        }
    }

    // Original order and each document's rank in it.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (docs[i].timestamp, docs[i].first_seen, i));
    let mut rank = vec![0usize; n];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }

    let adj = Adjacency::build(n, pairs);

    // cluster id (= original index) per document.
    let mut cid = vec![usize::MAX; n];
    match rule {
        Rule::ConnectedComponents => {
            let mut uf = UnionFind::new(n);
            for p in pairs {
                uf.union(p.a, p.b);
            }
            // The first member met in original order is the component's original.
            let mut root_original = vec![usize::MAX; n];
            for &i in &order {
                let r = uf.find(i);
                if root_original[r] == usize::MAX {
                    root_original[r] = i;
                }
                cid[i] = root_original[r];
            }
        }
        Rule::AttachToOriginal => {
            for &i in &order {
                // The earliest neighbour already decided to be an original.
                let mut best: Option<usize> = None;
                for &(j, _) in adj.of(i) {
                    if rank[j] < rank[i]
                        && cid[j] == j
                        && best.is_none_or(|b: usize| rank[j] < rank[b])
                    {
                        best = Some(j);
                    }
                }
                cid[i] = best.unwrap_or(i);
            }
        }
    }

    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &i in &order {
        members[cid[i]].push(i);
    }
    let clusters: Vec<Cluster> = members
        .into_iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(id, members)| Cluster { id, original: id, members })
        .collect();

    let docs_out = (0..n)
        .map(|i| {
            let c = cid[i];
            let mut nearest: Option<Nearest> = None;
            let mut to_original = None;
            for &(j, d) in adj.of(i) {
                let Some(d) = d else { continue };
                if j == c {
                    to_original = Some(d);
                }
                let better = match nearest {
                    None => true,
                    Some(b) => d < b.distance || (d == b.distance && rank[j] < rank[b.doc]),
                };
                if better {
                    nearest = Some(Nearest { doc: j, distance: d });
                }
            }
            DocCluster {
                cluster: c,
                original: c,
                is_original: c == i,
                distance_to_original: to_original,
                nearest,
            }
        })
        .collect();

    Ok(Clustering { rule, clusters, docs: docs_out })
}

/// Deduplicated adjacency lists; each neighbour with the smallest distance given for the pair.
struct Adjacency {
    start: Vec<usize>,
    list: Vec<(usize, Option<f64>)>,
}

impl Adjacency {
    fn build(n: usize, pairs: &[NearPair]) -> Adjacency {
        let mut half: Vec<(usize, usize, Option<f64>)> = Vec::with_capacity(pairs.len() * 2);
        for p in pairs {
            half.push((p.a, p.b, p.distance));
            half.push((p.b, p.a, p.distance));
        }
        half.sort_by_key(|x| (x.0, x.1));
        let mut list: Vec<(usize, Option<f64>)> = Vec::with_capacity(half.len());
        let mut start = vec![0usize; n + 1];
        let mut prev: Option<(usize, usize)> = None;
        for (a, b, d) in half {
            if prev == Some((a, b)) {
                if let Some(last) = list.last_mut() {
                    last.1 = match (last.1, d) {
                        (Some(x), Some(y)) => Some(x.min(y)),
                        (x, y) => x.or(y),
                    };
                }
                continue;
            }
            prev = Some((a, b));
            list.push((b, d));
            start[a + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        Adjacency { start, list }
    }

    fn of(&self, i: usize) -> &[(usize, Option<f64>)] {
        &self.list[self.start[i]..self.start[i + 1]]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::util::SplitMix64;

    fn times(ts: &[i64]) -> Vec<DocTime> {
        ts.iter()
            .enumerate()
            .map(|(i, &t)| DocTime { timestamp: t, first_seen: i as u64 })
            .collect()
    }

    fn pairs(p: &[(usize, usize)]) -> Vec<NearPair> {
        p.iter().map(|&x| x.into()).collect()
    }

    fn member_sets(c: &Clustering) -> Vec<Vec<usize>> {
        c.clusters.iter().map(|c| c.members.clone()).collect()
    }

    /// Is `x` before `y` in original order? Written independently of the module's sort.
    fn before(docs: &[DocTime], x: usize, y: usize) -> bool {
        let (a, b) = (docs[x], docs[y]);
        a.timestamp < b.timestamp
            || (a.timestamp == b.timestamp
                && (a.first_seen < b.first_seen || (a.first_seen == b.first_seen && x < y)))
    }

    fn edge_set(pairs: &[NearPair]) -> BTreeSet<(usize, usize)> {
        pairs.iter().map(|p| (p.a.min(p.b), p.a.max(p.b))).collect()
    }

    /// Brute force connected components: labels relaxed to a fixpoint, the label being the
    /// earliest document reachable.
    fn brute_components(docs: &[DocTime], pairs: &[NearPair]) -> Vec<usize> {
        let mut label: Vec<usize> = (0..docs.len()).collect();
        loop {
            let mut changed = false;
            for p in pairs {
                let (la, lb) = (label[p.a], label[p.b]);
                if la != lb {
                    let m = if before(docs, la, lb) { la } else { lb };
                    label[p.a] = m;
                    label[p.b] = m;
                    changed = true;
                }
            }
            if !changed {
                return label;
            }
        }
    }

    /// Brute force attach-to-original: documents taken by repeated minimum selection, each
    /// checked against every original chosen so far.
    fn brute_attach(docs: &[DocTime], pairs: &[NearPair]) -> Vec<usize> {
        let edges = edge_set(pairs);
        let adjacent = |x: usize, y: usize| edges.contains(&(x.min(y), x.max(y)));
        let n = docs.len();
        let mut done = vec![false; n];
        let mut originals: Vec<usize> = Vec::new(); // in original order
        let mut label = vec![usize::MAX; n];
        for _ in 0..n {
            let mut first = None;
            for (i, _) in done.iter().enumerate().filter(|(_, d)| !**d) {
                if first.is_none_or(|f| before(docs, i, f)) {
                    first = Some(i);
                }
            }
            let i = first.unwrap();
            done[i] = true;
            match originals.iter().find(|&&o| adjacent(o, i)) {
                Some(&o) => label[i] = o,
                None => {
                    label[i] = i;
                    originals.push(i);
                }
            }
        }
        label
    }

    fn random_input(r: &mut SplitMix64, n: usize, edges: usize) -> (Vec<DocTime>, Vec<NearPair>) {
        let docs: Vec<DocTime> = (0..n)
            .map(|_| DocTime { timestamp: r.below(6) as i64 - 3, first_seen: r.below(4) })
            .collect();
        let mut ps = Vec::new();
        if n >= 2 {
            for _ in 0..edges {
                let a = r.below(n as u64) as usize;
                let b = r.below(n as u64) as usize;
                if a != b {
                    let d = if r.below(3) == 0 { None } else { Some(r.below(5) as f64) };
                    ps.push(NearPair { a, b, distance: d });
                }
            }
        }
        (docs, ps)
    }

    /// Everything that must hold of any clustering, checked from scratch.
    fn check_common(docs: &[DocTime], ps: &[NearPair], c: &Clustering) {
        let n = docs.len();
        assert_eq!(c.docs.len(), n);
        let mut seen = vec![false; n];
        for (k, cl) in c.clusters.iter().enumerate() {
            if k > 0 {
                assert!(c.clusters[k - 1].id < cl.id);
            }
            assert_eq!(cl.id, cl.original);
            assert_eq!(cl.members[0], cl.original);
            for w in cl.members.windows(2) {
                assert!(before(docs, w[0], w[1]));
            }
            for &m in &cl.members {
                assert!(!seen[m], "document {m} in two clusters");
                seen[m] = true;
                let d = c.docs[m];
                assert_eq!((d.cluster, d.original, d.is_original), (cl.id, cl.id, m == cl.id));
            }
            assert_eq!(c.cluster(cl.id), Some(cl));
        }
        assert!(seen.iter().all(|&s| s), "a document is in no cluster");
        // Nearest and distance to original, by brute force over the pair list.
        for i in 0..n {
            let mut best: BTreeMap<usize, f64> = BTreeMap::new();
            for p in ps {
                if let Some(d) = p.distance
                    && (p.a == i || p.b == i)
                {
                    let j = if p.a == i { p.b } else { p.a };
                    let e = best.entry(j).or_insert(d);
                    *e = e.min(d);
                }
            }
            let want = best
                .iter()
                .min_by(|x, y| {
                    x.1.total_cmp(y.1).then_with(|| {
                        if before(docs, *x.0, *y.0) {
                            std::cmp::Ordering::Less
                        } else {
                            std::cmp::Ordering::Greater
                        }
                    })
                })
                .map(|(&doc, &distance)| Nearest { doc, distance });
            assert_eq!(c.docs[i].nearest, want, "nearest of {i}");
            let orig = c.docs[i].original;
            let want_orig = if orig == i { None } else { best.get(&orig).copied() };
            assert_eq!(c.docs[i].distance_to_original, want_orig);
        }
    }

    #[test]
    fn components_match_brute_force() {
        let mut r = SplitMix64::new(11);
        for round in 0..300 {
            let n = r.below(40) as usize;
            let (docs, ps) = random_input(&mut r, n, round % 50);
            let c = cluster(&docs, &ps, Rule::ConnectedComponents).unwrap();
            check_common(&docs, &ps, &c);
            let label = brute_components(&docs, &ps);
            for (i, (d, l)) in c.docs.iter().zip(&label).enumerate() {
                assert_eq!(d.cluster, *l, "round {round} doc {i}");
            }
        }
    }

    #[test]
    fn attach_matches_brute_force_and_invariants() {
        let mut r = SplitMix64::new(12);
        let mut multi_hop_components = 0;
        for round in 0..300 {
            let n = r.below(40) as usize;
            let (docs, ps) = random_input(&mut r, n, round % 60);
            let c = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
            check_common(&docs, &ps, &c);
            let label = brute_attach(&docs, &ps);
            let edges = edge_set(&ps);
            let adjacent = |x: usize, y: usize| edges.contains(&(x.min(y), x.max(y)));
            for (i, (d, l)) in c.docs.iter().zip(&label).enumerate() {
                assert_eq!(d.cluster, *l, "round {round} doc {i}");
            }
            for cl in &c.clusters {
                // 1. Every member is one pair from its original, and after it.
                for &m in &cl.members[1..] {
                    assert!(adjacent(m, cl.original));
                    assert!(before(&docs, cl.original, m));
                }
            }
            // 2. Originals are independent, and every other document has an earlier
            // original among its near-duplicates.
            let originals: Vec<usize> = c.clusters.iter().map(|c| c.original).collect();
            for &a in &originals {
                for &b in &originals {
                    assert!(a == b || !adjacent(a, b));
                }
            }
            for i in 0..n {
                if !c.docs[i].is_original {
                    assert!(originals.iter().any(|&o| adjacent(o, i) && before(&docs, o, i)));
                }
            }
            // Components may hold members more than one pair from the original.
            let cc = cluster(&docs, &ps, Rule::ConnectedComponents).unwrap();
            if cc
                .clusters
                .iter()
                .any(|cl| cl.members[1..].iter().any(|&m| !adjacent(m, cl.original)))
            {
                multi_hop_components += 1;
            }
        }
        assert!(multi_hop_components > 10, "generator never made chains");
    }

    #[test]
    fn chain_shows_non_transitivity() {
        // 0 ~ 1 ~ 2 ~ 3, in that order: components join all four; attach gives {0,1}, {2,3}.
        let docs = times(&[10, 20, 30, 40]);
        let ps = pairs(&[(0, 1), (1, 2), (2, 3)]);
        let cc = cluster(&docs, &ps, Rule::ConnectedComponents).unwrap();
        assert_eq!(member_sets(&cc), [vec![0, 1, 2, 3]]);
        let at = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        assert_eq!(member_sets(&at), [vec![0, 1], vec![2, 3]]);
        assert!(at.docs[2].is_original && !at.docs[3].is_original);
        // Reversed timestamps: 3 is the earliest; 3 takes 2, 1 becomes an original, takes 0.
        let docs = times(&[40, 30, 20, 10]);
        let at = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        assert_eq!(member_sets(&at), [vec![1, 0], vec![3, 2]]);
        let cc = cluster(&docs, &ps, Rule::ConnectedComponents).unwrap();
        assert_eq!(member_sets(&cc), [vec![3, 2, 1, 0]]);
        assert_eq!(cc.docs[0].original, 3);
    }

    #[test]
    fn joins_earliest_original_not_earliest_neighbour() {
        // Order 0, 1, 2, 3. 0 ~ 1 (1 joins 0). 2 is alone so far: original. 3 ~ 1 and 3 ~ 2:
        // its earliest earlier neighbour, 1, is not an original; 2 is, so 3 joins 2.
        let docs = times(&[1, 2, 3, 4]);
        let ps = pairs(&[(0, 1), (1, 3), (2, 3)]);
        let at = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        assert_eq!(member_sets(&at), [vec![0, 1], vec![2, 3]]);
        // With two earlier originals, the earlier one wins.
        let ps = pairs(&[(0, 3), (2, 3)]);
        let at = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        assert_eq!(member_sets(&at), [vec![0, 3], vec![1], vec![2]]);
    }

    #[test]
    fn timestamp_ties() {
        // Equal timestamps: first_seen decides, then the index.
        let docs = vec![
            DocTime { timestamp: 5, first_seen: 9 },
            DocTime { timestamp: 5, first_seen: 2 },
            DocTime { timestamp: 5, first_seen: 2 },
            DocTime { timestamp: 4, first_seen: 100 },
        ];
        let ps = pairs(&[(0, 1), (1, 2), (0, 2)]);
        for rule in [Rule::ConnectedComponents, Rule::AttachToOriginal] {
            let c = cluster(&docs, &ps, rule).unwrap();
            assert_eq!(member_sets(&c), [vec![1, 2, 0], vec![3]]);
            assert_eq!(c.docs[0].original, 1);
        }
        let ps = pairs(&[(0, 3), (1, 2), (0, 2)]);
        let c = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        // 3 (ts 4) first; then 1, 2 (ts 5, seen 2) and 0 (seen 9). 0 joins 3.
        assert_eq!(member_sets(&c), [vec![1, 2], vec![3, 0]]);
    }

    #[test]
    fn distances_nearest_and_duplicates() {
        let docs = times(&[0, 1, 2]);
        let ps = vec![
            NearPair::from((0usize, 1usize, 3u32)),
            NearPair::from((1usize, 0usize, 2.0)),
            NearPair::from((1usize, 2usize, 2.0)),
            NearPair::from((0usize, 2usize)),
        ];
        let c = cluster(&docs, &ps, Rule::AttachToOriginal).unwrap();
        assert_eq!(member_sets(&c), [vec![0, 1, 2]]);
        // Pair (0,1) listed twice: smallest distance 2. 1's nearest: 0 and 2 tie at 2, 0 is
        // earlier.
        assert_eq!(c.docs[1].nearest, Some(Nearest { doc: 0, distance: 2.0 }));
        assert_eq!(c.docs[1].distance_to_original, Some(2.0));
        // (0,2) has no distance: 2's distance to its original is unknown; its nearest is 1.
        assert_eq!(c.docs[2].distance_to_original, None);
        assert_eq!(c.docs[2].nearest, Some(Nearest { doc: 1, distance: 2.0 }));
        assert_eq!(c.docs[0].distance_to_original, None);
        check_common(&docs, &ps, &c);
    }

    #[test]
    fn empty_and_invalid() {
        let c = cluster(&[], &[], Rule::AttachToOriginal).unwrap();
        assert!(c.clusters.is_empty() && c.docs.is_empty());
        let docs = times(&[0, 0]);
        let c = cluster(&docs, &[], Rule::ConnectedComponents).unwrap();
        assert_eq!(member_sets(&c), [vec![0], vec![1]]);
        assert_eq!(c.duplicate_clusters().count(), 0);
        for bad in [
            NearPair::from((0usize, 2usize)),
            NearPair::from((1usize, 1usize)),
            NearPair::from((0usize, 1usize, -1.0)),
            NearPair::from((0usize, 1usize, f64::NAN)),
            NearPair::from((0usize, 1usize, f64::INFINITY)),
        ] {
            for rule in [Rule::ConnectedComponents, Rule::AttachToOriginal] {
                assert!(matches!(cluster(&docs, &[bad], rule), Err(Error::InvalidConfig(_))));
            }
        }
    }

    #[test]
    fn union_find() {
        let mut uf = UnionFind::new(6);
        assert!(uf.union(0, 1));
        assert!(uf.union(2, 3));
        assert!(!uf.union(1, 0));
        assert!(uf.union(1, 3));
        assert_eq!(uf.set_size(2), 4);
        assert_eq!(uf.find(0), uf.find(3));
        assert_ne!(uf.find(0), uf.find(4));
        assert_eq!(uf.set_size(5), 1);
    }
}
