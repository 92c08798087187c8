//! Exact Jaccard similarity self-join: every pair of documents whose shingle sets have
//! Jaccard similarity `|A ∩ B| / |A ∪ B| >= t`.
//!
//! # Why this module exists
//!
//! Simhash at Hamming distance `k` is a fast *approximation* of "these two pages are nearly
//! the same text". To say how good the approximation is (precision and recall, see
//! [`crate::quality`]) we need the ground truth it approximates: the pairs whose word 3-gram
//! shingle sets overlap by at least `t` in Jaccard similarity. That truth must be exact — a
//! sampled or MinHash truth would blur the very errors we measure — and it must be cheap
//! enough to compute on evaluation corpora of tens of thousands of web-page-sized documents.
//! Comparing all `n (n - 1) / 2` pairs does not scale (50k documents are 1.25 billion
//! pairs), so this module implements a filter-and-verify join in the AllPairs / PPJoin
//! family (Bayardo, Ma & Srikant 2007; Xiao, Wang, Lin & Yu 2008), which prunes most pairs
//! without losing any.
//!
//! # Input and output
//!
//! Each document is a set of `u64` token ids (the caller hashes word 3-gram shingles),
//! given as a **strictly ascending** slice (sorted, no repeats). [`similarity_join`] returns
//! every pair `(i, j)` with `i < j` whose Jaccard similarity reaches `t`, with the exact
//! intersection and union sizes, sorted by `(i, j)`.
//!
//! The test is exactly the one [`brute_force_join`] applies:
//! `intersection as f64 / union as f64 >= t` (one correctly rounded division, so a pair whose
//! similarity equals `t` as a fraction, e.g. `2/3` against `t = 2.0 / 3.0`, is included).
//! All filters are computed with a small safety margin in the permissive direction, so
//! floating-point rounding can only let through extra candidates, which verification then
//! rejects; it can never drop a pair.
//!
//! **Empty sets**: a document with no tokens is never part of a pair, not even with another
//! empty document (Jaccard similarity of two empty sets is taken to be 0, see [`jaccard`]).
//!
//! # How it works
//!
//! 1. **Global token order.** Tokens are renamed to ranks in order of ascending document
//!    frequency (rarest first, ties by token id). Tokens found in only one document can
//!    never be shared; they are kept only as a count per document (they still count in the
//!    set sizes) and, as the rarest tokens, they come first in every document.
//! 2. **Length filter.** If `J(x, y) >= t` and `|y| <= |x|` then `|y| >= t |x|`.
//! 3. **Prefix filter.** Two sets reaching overlap `α` share a token among the first
//!    `|x| - α + 1` tokens of `x` (in the global order) and the first `|y| - α + 1` of `y`.
//!    With `|y| <= |x|`, `α >= t |x|` and `α >= 2t / (1 + t) |y|`, so each document is
//!    *indexed* by its first `|y| - ⌈2t|y| / (1+t)⌉ + 1` tokens and *probes* with its first
//!    `|x| - ⌈t|x|⌉ + 1` tokens against documents no longer than itself. Rare tokens first
//!    make these prefixes short inverted lists.
//! 4. **Positional filter** (PPJoin). When probe token `x[i]` meets `y[j]`, the overlap is
//!    at most (matches seen so far) `+ 1 + min(|x| - i - 1, |y| - j - 1)`; a candidate that
//!    cannot reach the required overlap `⌈t (|x| + |y|) / (1 + t)⌉` is dropped for good.
//! 5. **Verification** merges the two sorted lists of shared tokens, stopping as soon as the
//!    required overlap is out of reach.
//!
//! Probes are independent once the index is built, so they run in parallel with rayon.

use rayon::prelude::*;

use crate::error::{DedupError, Result};

/// A pair of documents whose Jaccard similarity reaches the join threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimilarPair {
    /// Index of the first document (`i < j`).
    pub i: usize,
    /// Index of the second document.
    pub j: usize,
    /// `|A ∩ B|`: the number of tokens the two documents share.
    pub intersection: usize,
    /// `|A ∪ B|`.
    pub union: usize,
    /// `intersection as f64 / union as f64`.
    pub jaccard: f64,
}

/// Counters from one join, to see how much the filters pruned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// Documents in the input.
    pub documents: usize,
    /// Documents with no tokens (never in a pair).
    pub empty_documents: usize,
    /// Tokens over all documents.
    pub tokens: usize,
    /// Distinct tokens.
    pub distinct_tokens: usize,
    /// Distinct tokens found in two or more documents (the only ones that can be shared).
    pub shared_tokens: usize,
    /// Entries in the prefix index.
    pub index_entries: usize,
    /// Candidate pairs that passed the length, prefix and positional filters and were
    /// verified by merging.
    pub verified: u64,
    /// Candidate pairs dropped by the positional filter.
    pub positional_pruned: u64,
    /// Pairs in the answer.
    pub pairs: usize,
}

/// Size of the intersection of two strictly ascending slices (a linear merge).
///
/// On slices that are not strictly ascending the result is meaningless but the call does not
/// panic.
pub fn intersection_size(a: &[u64], b: &[u64]) -> usize {
    neardup_core::util::sorted_intersection(a, b)
}

/// Jaccard similarity `|A ∩ B| / |A ∪ B|` of two strictly ascending slices.
///
/// Two empty sets have similarity `0.0` by this crate's convention (so they never form a
/// pair at any threshold `t > 0`). On slices that are not strictly ascending the result is
/// meaningless but the call does not panic.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    let inter = intersection_size(a, b);
    let union = a.len() + b.len() - inter;
    if union == 0 { 0.0 } else { inter as f64 / union as f64 }
}

/// Every pair `(i, j)`, `i < j`, of `docs` with Jaccard similarity `>= threshold`, sorted by
/// `(i, j)`. Exact: the same answer as [`brute_force_join`], much faster.
///
/// Each document must be strictly ascending (sorted token ids without repeats); `threshold`
/// must be in `(0, 1]`. Otherwise the call returns [`DedupError::Usage`] naming the
/// problem. Empty documents are allowed and are in no pair.
pub fn similarity_join<D>(docs: &[D], threshold: f64) -> Result<Vec<SimilarPair>>
where
    D: AsRef<[u64]> + Sync,
{
    similarity_join_with_stats(docs, threshold).map(|(pairs, _)| pairs)
}

/// [`similarity_join`], also returning counters that show how much the filters pruned.
pub fn similarity_join_with_stats<D>(
    docs: &[D],
    threshold: f64,
) -> Result<(Vec<SimilarPair>, JoinStats)>
where
    D: AsRef<[u64]> + Sync,
{
    validate(docs, threshold)?;
    let t = threshold;
    let mut stats = JoinStats { documents: docs.len(), ..JoinStats::default() };
    let corpus = Corpus::build(docs, &mut stats);
    let index = PrefixIndex::build(&corpus, t);
    stats.index_entries = index.entries.len();

    // Probe in chunks of consecutive (by length) documents; each chunk reuses one scratch
    // array. Later documents are longer and meet longer lists, so chunks are kept small for
    // the work-stealing scheduler to balance.
    let n = corpus.len.len();
    let chunk = 64usize;
    let results: Vec<(Vec<SimilarPair>, u64, u64)> = (0..n.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let mut scratch = Scratch::new(n);
            let mut out = Vec::new();
            let (mut verified, mut pruned) = (0u64, 0u64);
            for o in c * chunk..((c + 1) * chunk).min(n) {
                let (v, p) = probe(&corpus, &index, t, o, &mut scratch, &mut out);
                verified += v;
                pruned += p;
            }
            (out, verified, pruned)
        })
        .collect();
    let mut pairs = Vec::with_capacity(results.iter().map(|r| r.0.len()).sum());
    for (p, v, pr) in results {
        pairs.extend(p);
        stats.verified += v;
        stats.positional_pruned += pr;
    }
    pairs.sort_unstable_by_key(|p| (p.i, p.j));
    stats.pairs = pairs.len();
    Ok((pairs, stats))
}

/// The reference answer: every pair compared by [`intersection_size`], `O(n²)` merges.
/// Same contract and errors as [`similarity_join`]; meant for tests and small inputs.
pub fn brute_force_join<D>(docs: &[D], threshold: f64) -> Result<Vec<SimilarPair>>
where
    D: AsRef<[u64]>,
{
    validate(docs, threshold)?;
    let mut out = Vec::new();
    for i in 0..docs.len() {
        let a = docs[i].as_ref();
        for (j, b) in docs.iter().enumerate().skip(i + 1) {
            let b = b.as_ref();
            if a.is_empty() || b.is_empty() {
                continue;
            }
            let inter = intersection_size(a, b);
            let union = a.len() + b.len() - inter;
            let jac = inter as f64 / union as f64;
            if jac >= threshold {
                out.push(SimilarPair { i, j, intersection: inter, union, jaccard: jac });
            }
        }
    }
    Ok(out)
}

fn validate<D: AsRef<[u64]>>(docs: &[D], threshold: f64) -> Result<()> {
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(DedupError::Usage(format!(
            "Jaccard threshold must be in (0, 1], got {threshold}"
        )));
    }
    if docs.len() > u32::MAX as usize - 1 {
        return Err(DedupError::Usage(format!(
            "too many documents for one join: {} (at most {})",
            docs.len(),
            u32::MAX - 1
        )));
    }
    for (i, d) in docs.iter().enumerate() {
        let d = d.as_ref();
        if d.len() > u32::MAX as usize - 1 {
            return Err(DedupError::Usage(format!(
                "document {i} has {} tokens (at most {})",
                d.len(),
                u32::MAX - 1
            )));
        }
        if let Some(w) = d.windows(2).position(|w| w[0] >= w[1]) {
            return Err(DedupError::Usage(format!(
                "document {i} is not a strictly ascending token set: token {} ({}) is followed by {}",
                w,
                d[w],
                d[w + 1]
            )));
        }
    }
    Ok(())
}

/// `⌈v⌉`, lowered by a margin far above f64 rounding error for the sizes involved (sets of at
/// most 2^32 tokens), so that a bound computed from it can only be permissive.
#[inline]
fn ceil_lb(v: f64) -> usize {
    let c = (v - 1e-6 - v.abs() * 1e-12).ceil();
    if c <= 0.0 { 0 } else { c as usize }
}

/// The documents renamed into the global token order and sorted by length.
///
/// Document `o` in this structure is the `o`-th shortest input document (ties by input
/// index); `doc[o]` is its input index. Its tokens are `uniq[o]` tokens found nowhere else
/// (conceptually at positions `0..uniq[o]`) followed by its shared tokens as ascending ranks
/// `shared[off[o]..off[o + 1]]` (positions `uniq[o]..len[o]`).
struct Corpus {
    doc: Vec<u32>,
    len: Vec<u32>,
    uniq: Vec<u32>,
    off: Vec<usize>,
    shared: Vec<u32>,
    ranks: usize,
}

impl Corpus {
    fn build<D: AsRef<[u64]> + Sync>(docs: &[D], stats: &mut JoinStats) -> Corpus {
        let n = docs.len();
        // Length order first: all later arrays are in it.
        let mut doc: Vec<u32> = (0..n as u32).collect();
        doc.sort_by_key(|&d| (docs[d as usize].as_ref().len(), d));
        let len: Vec<u32> = doc.iter().map(|&d| docs[d as usize].as_ref().len() as u32).collect();
        stats.empty_documents = len.iter().filter(|&&l| l == 0).count();
        let total: usize = len.iter().map(|&l| l as usize).sum();
        stats.tokens = total;

        // Every (token, document) occurrence, grouped by token.
        let mut occ: Vec<(u64, u32)> = Vec::with_capacity(total);
        for (o, &d) in doc.iter().enumerate() {
            occ.extend(docs[d as usize].as_ref().iter().map(|&t| (t, o as u32)));
        }
        occ.par_sort_unstable();

        // Runs of equal tokens: a run of length 1 is a unique token; the others get ranks.
        let mut uniq = vec![0u32; n];
        let mut shared_count = vec![0u32; n];
        // (document frequency, start of run); runs are found in ascending token order.
        let mut runs: Vec<(u32, usize)> = Vec::new();
        let mut distinct = 0usize;
        let mut s = 0usize;
        while s < occ.len() {
            let mut e = s + 1;
            while e < occ.len() && occ[e].0 == occ[s].0 {
                e += 1;
            }
            distinct += 1;
            if e - s == 1 {
                uniq[occ[s].1 as usize] += 1;
            } else {
                runs.push(((e - s) as u32, s));
                for &(_, o) in &occ[s..e] {
                    shared_count[o as usize] += 1;
                }
            }
            s = e;
        }
        stats.distinct_tokens = distinct;
        stats.shared_tokens = runs.len();
        // Global order: ascending document frequency, ties by token (the runs' order).
        runs.sort_by_key(|&(df, start)| (df, start));

        let mut off = Vec::with_capacity(n + 1);
        off.push(0usize);
        for &c in &shared_count {
            off.push(off.last().copied().unwrap_or(0) + c as usize);
        }
        let mut shared = vec![0u32; off[n]];
        let mut cursor: Vec<usize> = off[..n].to_vec();
        // Walking ranks in ascending order fills every document's list in ascending order.
        for (rank, &(df, start)) in runs.iter().enumerate() {
            for &(_, o) in &occ[start..start + df as usize] {
                let c = &mut cursor[o as usize];
                shared[*c] = rank as u32;
                *c += 1;
            }
        }
        Corpus { doc, len, uniq, off, shared, ranks: runs.len() }
    }

    #[inline]
    fn shared_of(&self, o: usize) -> &[u32] {
        &self.shared[self.off[o]..self.off[o + 1]]
    }
}

/// Inverted lists over the indexing prefixes: for each rank, the `(document, position)`
/// entries in ascending document (= length) order.
struct PrefixIndex {
    start: Vec<usize>,
    entries: Vec<(u32, u32)>,
}

impl PrefixIndex {
    fn build(c: &Corpus, t: f64) -> PrefixIndex {
        let n = c.len.len();
        let prefix_shared = |o: usize| -> usize {
            let l = c.len[o] as usize;
            let p = (l + 1).saturating_sub(ceil_lb(2.0 * t / (1.0 + t) * l as f64)).min(l);
            p.saturating_sub(c.uniq[o] as usize)
        };
        let mut count = vec![0usize; c.ranks + 1];
        for o in 0..n {
            for &r in &c.shared_of(o)[..prefix_shared(o)] {
                count[r as usize + 1] += 1;
            }
        }
        for r in 0..c.ranks {
            count[r + 1] += count[r];
        }
        let start = count.clone();
        let mut cursor = count;
        let mut entries = vec![(0u32, 0u32); start[c.ranks]];
        for o in 0..n {
            let uniq = c.uniq[o];
            for (k, &r) in c.shared_of(o)[..prefix_shared(o)].iter().enumerate() {
                let cur = &mut cursor[r as usize];
                entries[*cur] = (o as u32, uniq + k as u32);
                *cur += 1;
            }
        }
        PrefixIndex { start, entries }
    }
}

const PRUNED: u32 = u32::MAX;

/// Per-thread state of a probe: matches seen per candidate, and which candidates were touched.
struct Scratch {
    seen: Vec<u32>,
    touched: Vec<u32>,
}

impl Scratch {
    fn new(n: usize) -> Scratch {
        Scratch { seen: vec![0; n], touched: Vec::new() }
    }
}

/// Finds the pairs of document `o` with shorter (earlier) documents. Returns (verified,
/// positionally pruned) counts.
fn probe(
    c: &Corpus,
    index: &PrefixIndex,
    t: f64,
    o: usize,
    s: &mut Scratch,
    out: &mut Vec<SimilarPair>,
) -> (u64, u64) {
    let lx = c.len[o] as usize;
    if lx == 0 {
        return (0, 0);
    }
    let min_len = ceil_lb(t * lx as f64) as u32;
    let probe_len = (lx + 1).saturating_sub(ceil_lb(t * lx as f64)).min(lx);
    let ux = c.uniq[o] as usize;
    let xs = c.shared_of(o);
    let ratio = t / (1.0 + t);
    let mut pruned = 0u64;
    for (k, &r) in xs[..probe_len.saturating_sub(ux)].iter().enumerate() {
        let i = ux + k;
        let list = &index.entries[index.start[r as usize]..index.start[r as usize + 1]];
        // Entries are in length order: skip the too-short ones, stop at `o` itself.
        let from = list.partition_point(|&(y, _)| c.len[y as usize] < min_len);
        for &(y, j) in &list[from..] {
            if y as usize >= o {
                break;
            }
            let a = &mut s.seen[y as usize];
            if *a == PRUNED {
                continue;
            }
            let ly = c.len[y as usize] as usize;
            let need = ceil_lb(ratio * (lx + ly) as f64);
            let ub = *a as usize + 1 + (lx - i - 1).min(ly - j as usize - 1);
            if *a == 0 {
                s.touched.push(y);
            }
            if ub >= need {
                *a += 1;
            } else {
                *a = PRUNED;
                pruned += 1;
            }
        }
    }
    let mut verified = 0u64;
    for &y in &s.touched {
        let a = std::mem::take(&mut s.seen[y as usize]);
        if a == PRUNED {
            continue;
        }
        verified += 1;
        let y = y as usize;
        let ly = c.len[y] as usize;
        let need = ceil_lb(ratio * (lx + ly) as f64);
        if let Some(inter) = overlap_at_least(xs, c.shared_of(y), need) {
            let union = lx + ly - inter;
            let jac = inter as f64 / union as f64;
            if jac >= t {
                let (a, b) = (c.doc[o] as usize, c.doc[y] as usize);
                out.push(SimilarPair {
                    i: a.min(b),
                    j: a.max(b),
                    intersection: inter,
                    union,
                    jaccard: jac,
                });
            }
        }
    }
    s.touched.clear();
    (verified, pruned)
}

/// `|a ∩ b|` for ascending lists, or `None` as soon as it cannot reach `need`.
#[inline]
fn overlap_at_least(a: &[u32], b: &[u32], need: usize) -> Option<usize> {
    let (mut i, mut j, mut n) = (0usize, 0usize, 0usize);
    while i < a.len() && j < b.len() {
        if n + (a.len() - i).min(b.len() - j) < need {
            return None;
        }
        let (x, y) = (a[i], b[j]);
        if x == y {
            n += 1;
            i += 1;
            j += 1;
        } else if x < y {
            i += 1;
        } else {
            j += 1;
        }
    }
    (n >= need).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neardup_core::util::SplitMix64;

    fn assert_same(docs: &[Vec<u64>], t: f64) {
        let fast = similarity_join(docs, t).unwrap();
        let slow = brute_force_join(docs, t).unwrap();
        assert_eq!(fast, slow, "threshold {t}");
    }

    /// A random set of `len` distinct tokens from `0..universe`.
    fn random_set(r: &mut SplitMix64, universe: u64, len: usize) -> Vec<u64> {
        let mut v: Vec<u64> = (0..len).map(|_| r.below(universe)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `base` with about `edits` tokens dropped and `edits` new ones added.
    fn mutate(r: &mut SplitMix64, base: &[u64], universe: u64, edits: usize) -> Vec<u64> {
        let mut v: Vec<u64> = base.to_vec();
        for _ in 0..edits {
            if !v.is_empty() {
                let k = r.below(v.len() as u64) as usize;
                v.remove(k);
            }
            v.push(r.below(universe));
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Corpus with clusters of planted near-duplicates, exact copies and unrelated sets over a
    /// universe small enough that unrelated sets also share tokens.
    fn planted_corpus(seed: u64, n: usize, universe: u64, max_len: usize) -> Vec<Vec<u64>> {
        let mut r = SplitMix64::new(seed);
        let mut docs: Vec<Vec<u64>> = Vec::new();
        while docs.len() < n {
            let len = r.below(max_len as u64 + 1) as usize;
            let base = random_set(&mut r, universe, len);
            let copies = r.below(4) as usize;
            docs.push(base.clone());
            for _ in 0..copies {
                let edits = r.below(len as u64 / 3 + 1) as usize;
                let d = if r.below(4) == 0 {
                    base.clone()
                } else {
                    mutate(&mut r, &base, universe, edits)
                };
                docs.push(d);
            }
        }
        docs.truncate(n);
        // Shuffle so duplicates are not neighbours.
        for i in (1..docs.len()).rev() {
            let j = r.below(i as u64 + 1) as usize;
            docs.swap(i, j);
        }
        docs
    }

    #[test]
    fn matches_brute_force_on_planted_corpora() {
        let mut found = 0;
        for seed in 0..30u64 {
            let docs = planted_corpus(seed, 120, 400 + 50 * seed, 60);
            for &t in &[0.05, 0.2, 1.0 / 3.0, 0.5, 0.6, 2.0 / 3.0, 0.75, 0.8, 0.9, 0.99, 1.0] {
                assert_same(&docs, t);
                found += brute_force_join(&docs, t).unwrap().len();
            }
        }
        // The corpora really have pairs at the thresholds tested.
        assert!(found > 1000, "only {found} pairs: the test corpora are too sparse");
    }

    #[test]
    fn thresholds_exactly_at_pair_similarities() {
        // A threshold equal to a pair's own similarity must include that pair.
        for seed in 100..110u64 {
            let docs = planted_corpus(seed, 60, 200, 30);
            let all = brute_force_join(&docs, f64::MIN_POSITIVE).unwrap();
            let mut values: Vec<f64> = all.iter().map(|p| p.jaccard).collect();
            values.sort_by(f64::total_cmp);
            values.dedup();
            for &t in values.iter().step_by(values.len() / 40 + 1) {
                let fast = similarity_join(&docs, t).unwrap();
                assert_eq!(fast, brute_force_join(&docs, t).unwrap(), "t = {t}");
                assert!(fast.iter().any(|p| p.jaccard == t));
            }
        }
    }

    #[test]
    fn fractions_on_the_boundary() {
        // |A ∩ B| = 2, |A ∪ B| = 3: J = 2/3 exactly at t = 2/3, below t slightly above.
        let docs = vec![vec![1, 2, 3], vec![1, 2], vec![9]];
        let p = similarity_join(&docs, 2.0 / 3.0).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].i, p[0].j, p[0].intersection, p[0].union), (0, 1, 2, 3));
        assert!(similarity_join(&docs, 2.0 / 3.0 + 1e-12).unwrap().is_empty());
    }

    #[test]
    fn edge_cases() {
        let empty: Vec<Vec<u64>> = vec![];
        assert!(similarity_join(&empty, 0.5).unwrap().is_empty());
        assert!(similarity_join(&[vec![1u64, 2, 3]], 0.5).unwrap().is_empty());
        // Two empty documents are not a pair, at any threshold.
        let e = vec![vec![], vec![], vec![5u64]];
        for t in [1e-9, 0.5, 1.0] {
            assert!(similarity_join(&e, t).unwrap().is_empty());
            assert!(brute_force_join(&e, t).unwrap().is_empty());
        }
        // Identical sets at t = 1.0; a near-identical one is not.
        let docs = vec![
            vec![1u64, 5, 9, 12],
            vec![1, 5, 9, 13],
            vec![1, 5, 9, 12],
            vec![],
            vec![1, 5, 9, 12],
        ];
        let p = similarity_join(&docs, 1.0).unwrap();
        let ij: Vec<(usize, usize)> = p.iter().map(|p| (p.i, p.j)).collect();
        assert_eq!(ij, [(0, 2), (0, 4), (2, 4)]);
        assert!(p.iter().all(|p| p.jaccard == 1.0 && p.union == 4));
        assert_same(&docs, 1.0);
        assert_same(&docs, 0.6);
        // Singletons: tokens shared by no one else still count in the union.
        let docs = vec![vec![7u64], vec![7], vec![7, 8]];
        let p = similarity_join(&docs, 0.5).unwrap();
        let ij: Vec<(usize, usize, f64)> = p.iter().map(|p| (p.i, p.j, p.jaccard)).collect();
        assert_eq!(ij, [(0, 1, 1.0), (0, 2, 0.5), (1, 2, 0.5)]);
        // Extreme token values.
        let docs = vec![vec![0u64, u64::MAX], vec![0, u64::MAX - 1, u64::MAX]];
        assert_eq!(similarity_join(&docs, 0.6).unwrap().len(), 1);
    }

    #[test]
    fn invalid_input_is_an_error() {
        let ok = vec![vec![1u64, 2]];
        for t in [0.0, -0.1, 1.0000001, f64::NAN, f64::INFINITY] {
            assert!(matches!(similarity_join(&ok, t), Err(DedupError::Usage(_))));
            assert!(matches!(brute_force_join(&ok, t), Err(DedupError::Usage(_))));
        }
        for bad in [vec![2u64, 1], vec![1, 1], vec![1, 3, 2]] {
            let docs = vec![vec![1u64, 2, 3], bad];
            assert!(matches!(similarity_join(&docs, 0.5), Err(DedupError::Usage(_))));
        }
    }

    #[test]
    fn jaccard_helpers() {
        assert_eq!(jaccard(&[], &[]), 0.0);
        assert_eq!(jaccard(&[1], &[]), 0.0);
        assert_eq!(jaccard(&[1, 2, 3], &[2, 3, 4]), 0.5);
        assert_eq!(intersection_size(&[1, 3, 5, 7], &[2, 3, 4, 7, 9]), 2);
        assert_eq!(overlap_at_least(&[1, 2, 3], &[2, 3], 2), Some(2));
        assert_eq!(overlap_at_least(&[1, 2, 3], &[2, 3], 3), None);
        assert_eq!(overlap_at_least(&[], &[], 0), Some(0));
    }

    #[test]
    fn stats_add_up() {
        let docs = planted_corpus(7, 300, 3000, 80);
        let (pairs, st) = similarity_join_with_stats(&docs, 0.5).unwrap();
        assert_eq!(st.documents, 300);
        assert_eq!(st.pairs, pairs.len());
        assert_eq!(st.tokens, docs.iter().map(Vec::len).sum::<usize>());
        let mut all: Vec<u64> = docs.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(st.distinct_tokens, all.len());
        assert!(st.verified as usize >= pairs.len());
        // The filters must prune: far fewer verifications than pairs of documents.
        assert!((st.verified as usize) < 300 * 299 / 2 / 4, "{st:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        #[test]
        fn agrees_with_brute_force(
            sets in proptest::collection::vec(
                proptest::collection::btree_set(0u64..24, 0..12), 0..24),
            t in 0.01f64..=1.0,
        ) {
            let docs: Vec<Vec<u64>> = sets.into_iter().map(|s| s.into_iter().collect()).collect();
            proptest::prop_assert_eq!(
                similarity_join(&docs, t).unwrap(),
                brute_force_join(&docs, t).unwrap()
            );
        }
    }
}
