//! Quality of a near-duplicate detector against a ground truth: precision, recall and F1,
//! counted over pairs and over documents.
//!
//! # Why this module exists
//!
//! The design notes measure simhash at `k = 3` as precise but with recall well under 0.5
//! against word 3-gram Jaccard `>= 0.8`, and users ask for larger `k`. Choosing `k`, the
//! features and the table design needs these numbers computed the same way every time:
//! predicted pairs (from the index) against true pairs (from [`crate::jaccard`], or a
//! labelled set). This module is that one definition.
//!
//! # Definitions
//!
//! Pairs are unordered: `(i, j)` and `(j, i)` are the same pair, and a pair listed twice
//! counts once. Document indices are `< n`.
//!
//! * **Pair level.** `tp` = pairs both predicted and true, `fp` = predicted but not true,
//!   `fn` = true but not predicted. precision = `tp / (tp + fp)`, recall = `tp / (tp + fn)`,
//!   F1 = `2 P R / (P + R)`.
//! * **Document level.** A document is *predicted duplicate* if it is in any predicted pair,
//!   *truly duplicate* if it is in any true pair; the counts and ratios are then as above,
//!   over documents. This asks "did we flag the right documents?" and forgives a flagged
//!   document paired with the wrong partner; the pair level does not.
//!
//! **Empty cases.** With nothing predicted, precision is 1 (no wrong prediction was made);
//! with nothing true, recall is 1 (nothing was missed); F1 is 0 when precision and recall are
//! both 0. So an empty prediction against an empty truth scores 1, 1, 1, and an empty
//! prediction against a non-empty truth scores precision 1, recall 0, F1 0.

use std::collections::HashSet;

use crate::error::{DedupError, Result};

/// Counts and ratios at one level (pairs or documents).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// Predicted and true.
    pub true_positives: usize,
    /// Predicted, not true.
    pub false_positives: usize,
    /// True, not predicted.
    pub false_negatives: usize,
    /// `tp / (tp + fp)`, 1 when nothing was predicted.
    pub precision: f64,
    /// `tp / (tp + fn)`, 1 when nothing is true.
    pub recall: f64,
    /// Harmonic mean of precision and recall, 0 when both are 0.
    pub f1: f64,
}

impl Scores {
    /// Ratios from the three counts, with the empty-case conventions of the module docs.
    pub fn from_counts(
        true_positives: usize,
        false_positives: usize,
        false_negatives: usize,
    ) -> Self {
        let ratio = |num: usize, den: usize| {
            if den == 0 { 1.0 } else { num as f64 / den as f64 }
        };
        let precision = ratio(true_positives, true_positives + false_positives);
        let recall = ratio(true_positives, true_positives + false_negatives);
        let f1 = if precision + recall == 0.0 {
            0.0
        } else {
            2.0 * precision * recall / (precision + recall)
        };
        Scores { true_positives, false_positives, false_negatives, precision, recall, f1 }
    }
}

/// Pair-level and document-level scores of one prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quality {
    /// Over unordered pairs.
    pub pairs: Scores,
    /// Over documents (in any pair or not).
    pub docs: Scores,
    /// Distinct predicted pairs.
    pub predicted_pairs: usize,
    /// Distinct true pairs.
    pub true_pairs: usize,
}

/// Scores `predicted` pairs against `truth` pairs over documents `0..n`.
///
/// Errors ([`DedupError::Usage`]): a pair naming an index `>= n`, or a document paired
/// with itself.
pub fn evaluate(
    n: usize,
    predicted: &[(usize, usize)],
    truth: &[(usize, usize)],
) -> Result<Quality> {
    let p = normalize(n, predicted, "predicted")?;
    let t = normalize(n, truth, "true")?;
    let tp = p.intersection(&t).count();
    let pairs = Scores::from_counts(tp, p.len() - tp, t.len() - tp);

    let mut pd = vec![false; n];
    let mut td = vec![false; n];
    for &(i, j) in &p {
        pd[i] = true;
        pd[j] = true;
    }
    for &(i, j) in &t {
        td[i] = true;
        td[j] = true;
    }
    let (mut dtp, mut dfp, mut dfn) = (0, 0, 0);
    for (&a, &b) in pd.iter().zip(&td) {
        match (a, b) {
            (true, true) => dtp += 1,
            (true, false) => dfp += 1,
            (false, true) => dfn += 1,
            (false, false) => {}
        }
    }
    Ok(Quality {
        pairs,
        docs: Scores::from_counts(dtp, dfp, dfn),
        predicted_pairs: p.len(),
        true_pairs: t.len(),
    })
}

fn normalize(n: usize, pairs: &[(usize, usize)], what: &str) -> Result<HashSet<(usize, usize)>> {
    let mut set = HashSet::with_capacity(pairs.len());
    for &(a, b) in pairs {
        if a >= n || b >= n {
            return Err(DedupError::Usage(format!(
                "{what} pair ({a}, {b}) names a document beyond the {n} given"
            )));
        }
        if a == b {
            return Err(DedupError::Usage(format!(
                "{what} pair ({a}, {b}) pairs a document with itself"
            )));
        }
        set.insert((a.min(b), a.max(b)));
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neardup_core::util::SplitMix64;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_checked() {
        // Truth: {0,1}, {1,2}, {3,4}. Predicted: {1,0} (true), {2,1} (true), {2,5} (false),
        // {0,1} again (counts once).
        let truth = [(0, 1), (1, 2), (3, 4)];
        let pred = [(1, 0), (2, 1), (2, 5), (0, 1)];
        let q = evaluate(7, &pred, &truth).unwrap();
        assert_eq!((q.predicted_pairs, q.true_pairs), (3, 3));
        let s = q.pairs;
        assert_eq!((s.true_positives, s.false_positives, s.false_negatives), (2, 1, 1));
        assert!(close(s.precision, 2.0 / 3.0) && close(s.recall, 2.0 / 3.0));
        assert!(close(s.f1, 2.0 / 3.0));
        // Documents: predicted {0,1,2,5}, true {0,1,2,3,4}: tp 3 (0,1,2), fp 1 (5), fn 2 (3,4).
        let d = q.docs;
        assert_eq!((d.true_positives, d.false_positives, d.false_negatives), (3, 1, 2));
        assert!(close(d.precision, 0.75) && close(d.recall, 0.6));
        assert!(close(d.f1, 2.0 * 0.75 * 0.6 / 1.35));
    }

    #[test]
    fn wrong_partner_counts_at_pair_level_only() {
        // Truth pairs 0-1 and 2-3; prediction pairs 0-2 and 1-3: every document is rightly
        // flagged, no pair is right.
        let q = evaluate(4, &[(0, 2), (1, 3)], &[(0, 1), (2, 3)]).unwrap();
        assert_eq!(q.pairs.true_positives, 0);
        assert_eq!((q.pairs.precision, q.pairs.recall, q.pairs.f1), (0.0, 0.0, 0.0));
        assert_eq!((q.docs.precision, q.docs.recall, q.docs.f1), (1.0, 1.0, 1.0));
    }

    #[test]
    fn empty_conventions() {
        let q = evaluate(3, &[], &[]).unwrap();
        assert_eq!((q.pairs.precision, q.pairs.recall, q.pairs.f1), (1.0, 1.0, 1.0));
        assert_eq!((q.docs.precision, q.docs.recall, q.docs.f1), (1.0, 1.0, 1.0));
        let q = evaluate(3, &[], &[(0, 1)]).unwrap();
        assert_eq!((q.pairs.precision, q.pairs.recall, q.pairs.f1), (1.0, 0.0, 0.0));
        let q = evaluate(3, &[(0, 1)], &[]).unwrap();
        assert_eq!((q.pairs.precision, q.pairs.recall, q.pairs.f1), (0.0, 1.0, 0.0));
        assert_eq!((q.docs.false_positives, q.docs.precision), (2, 0.0));
        let q = evaluate(0, &[], &[]).unwrap();
        assert_eq!(q.docs.f1, 1.0);
    }

    #[test]
    fn invalid_pairs() {
        for bad in [(0, 3), (3, 0), (1, 1)] {
            assert!(matches!(evaluate(3, &[bad], &[]), Err(DedupError::Usage(_))));
            assert!(matches!(evaluate(3, &[], &[bad]), Err(DedupError::Usage(_))));
        }
    }

    /// Brute force: every unordered pair and every document classified one by one.
    #[test]
    fn matches_brute_force() {
        let mut r = SplitMix64::new(5);
        for _ in 0..200 {
            let n = 1 + r.below(25) as usize;
            let gen_pairs = |r: &mut SplitMix64| -> Vec<(usize, usize)> {
                let m = r.below(30);
                (0..m)
                    .map(|_| (r.below(n as u64) as usize, r.below(n as u64) as usize))
                    .filter(|(a, b)| a != b)
                    .collect()
            };
            let pred = gen_pairs(&mut r);
            let truth = gen_pairs(&mut r);
            let has = |v: &[(usize, usize)], i: usize, j: usize| {
                v.iter().any(|&(a, b)| (a, b) == (i, j) || (a, b) == (j, i))
            };
            let (mut tp, mut fp, mut fnn) = (0, 0, 0);
            for i in 0..n {
                for j in i + 1..n {
                    match (has(&pred, i, j), has(&truth, i, j)) {
                        (true, true) => tp += 1,
                        (true, false) => fp += 1,
                        (false, true) => fnn += 1,
                        _ => {}
                    }
                }
            }
            let in_any = |v: &[(usize, usize)], i: usize| v.iter().any(|&(a, b)| a == i || b == i);
            let (mut dtp, mut dfp, mut dfn) = (0, 0, 0);
            for i in 0..n {
                match (in_any(&pred, i), in_any(&truth, i)) {
                    (true, true) => dtp += 1,
                    (true, false) => dfp += 1,
                    (false, true) => dfn += 1,
                    _ => {}
                }
            }
            let q = evaluate(n, &pred, &truth).unwrap();
            assert_eq!(q.pairs, Scores::from_counts(tp, fp, fnn));
            assert_eq!(q.docs, Scores::from_counts(dtp, dfp, dfn));
            assert_eq!(q.predicted_pairs, tp + fp);
            assert_eq!(q.true_pairs, tp + fnn);
            let s = q.pairs;
            if tp + fp > 0 && tp + fnn > 0 {
                assert!(close(s.precision, tp as f64 / (tp + fp) as f64));
                assert!(close(s.recall, tp as f64 / (tp + fnn) as f64));
            }
        }
    }
}
