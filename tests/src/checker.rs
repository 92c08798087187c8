//! A model of what a neardup service must hold, and a check of its answers against a
//! brute-force scan of that model.
//!
//! The model keeps, per document id, the history of the writes sent for it: each write is
//! *pending* (sent, no answer yet), *acknowledged* or *failed* (an error or a timeout: it may
//! or may not have happened). Every event takes a tick of one logical clock, and a read (a
//! Query, a QueryBatch answer, the check part of a CheckAndInsert) is known by the interval
//! of ticks between its start and its answer. The possible states of an id for such a read
//! are the values of the writes that
//! - began before the read ended, and
//! - were not superseded before the read began: a write is superseded by an acknowledged
//!   write that began after it ended and was acknowledged before the read began.
//!
//! Before any write an id is absent (an acknowledged "absent" at tick 0). So an
//! acknowledged write settles the id for every later read, a failed write stays possible
//! until a later acknowledged write to the same id settles it, and writes that overlap a
//! read may or may not be seen by it. An id is **certainly present** for a read when every
//! possible state holds it, within distance k of the query in every one of them;
//! **certainly absent** when no possible state holds it.
//!
//! [`Model::check_query`] checks one answer: every match is possible (its id, fingerprint
//! and timestamp are one of the id's possible states), its distance is the Hamming distance
//! to the query and at most k, no id twice, ordered by (distance, timestamp, id), at most
//! `limit` matches; and every certainly-present document within k is in the answer (when
//! the answer is truncated: every one that sorts before its last match).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use neardup_proto::v1::{CheckAndInsertResponse, Match, QueryResult};

/// One stored state of a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Its fingerprint.
    pub fp: u64,
    /// Its timestamp, ms.
    pub ts_ms: i64,
}

/// How a write ended, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    Acked,
    Failed,
}

/// One write sent for an id.
#[derive(Debug, Clone)]
struct WriteRec {
    begin: u64,
    /// When it was answered (acknowledged or failed); None while pending.
    end: Option<u64>,
    outcome: Outcome,
    /// `Some` for an insert, `None` for a delete.
    value: Option<Version>,
}

/// A write sent and not yet answered: give it back to [`Model::ack`] or [`Model::fail`].
#[derive(Debug)]
#[must_use = "a write must be acknowledged or failed"]
pub struct Pending {
    id: String,
    index: usize,
}

/// The start of a read, from [`Model::begin_read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadStart(u64);

impl fmt::Display for ReadStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "read from tick {}", self.0)
    }
}

/// What one answer got wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A document certainly present within k is not in the answer.
    Missing {
        /// Its id.
        id: String,
        /// Its distance to the query.
        distance: u32,
    },
    /// A match whose id is certainly absent, or whose fingerprint and timestamp were never
    /// possible for that id during the read.
    Extra {
        /// The match as answered.
        id: String,
        /// Its fingerprint as answered.
        fp: u64,
        /// Its timestamp as answered.
        ts_ms: i64,
    },
    /// A match whose distance is not the Hamming distance to the query, or is over k.
    WrongDistance {
        /// Its id.
        id: String,
        /// As answered.
        got: u32,
        /// popcount(fp ^ query).
        want: u32,
    },
    /// The same id twice in one answer.
    DuplicateId(String),
    /// Matches not ordered by (distance, timestamp, id): the one at this position sorts
    /// before the one before it.
    Order(usize),
    /// More matches than the limit.
    OverLimit {
        /// Matches answered.
        got: usize,
        /// The limit.
        limit: usize,
    },
    /// A CheckAndInsert answer that contradicts itself.
    Admission(String),
}

impl Violation {
    /// The id the violation is about, when it names one.
    pub fn id(&self) -> Option<&str> {
        match self {
            Violation::Missing { id, .. }
            | Violation::Extra { id, .. }
            | Violation::WrongDistance { id, .. }
            | Violation::DuplicateId(id) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Missing { id, distance } => {
                write!(f, "missing: {id} (distance {distance}) is certainly present")
            }
            Violation::Extra { id, fp, ts_ms } => {
                write!(
                    f,
                    "extra: {id} with fingerprint {fp:#018x}, timestamp {ts_ms} was not possible"
                )
            }
            Violation::WrongDistance { id, got, want } => {
                write!(f, "wrong distance for {id}: {got}, want {want}")
            }
            Violation::DuplicateId(id) => write!(f, "{id} answered twice"),
            Violation::Order(i) => write!(f, "match {i} is out of order"),
            Violation::OverLimit { got, limit } => {
                write!(f, "{got} matches over the limit {limit}")
            }
            Violation::Admission(why) => write!(f, "admission: {why}"),
        }
    }
}

/// Figures of one checked answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// Matches in the answer.
    pub matches: usize,
    /// Of those, ids whose state was uncertain during the read.
    pub uncertain: usize,
    /// Certainly-present documents the answer had to hold.
    pub required: usize,
}

/// The acknowledged set and the writes in flight (see the module docs).
#[derive(Debug, Default)]
pub struct Model {
    clock: u64,
    ids: BTreeMap<String, Vec<WriteRec>>,
}

impl Model {
    /// An empty model: every id absent.
    pub fn new() -> Model {
        Model::default()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn begin(&mut self, id: &str, value: Option<Version>) -> Pending {
        let begin = self.tick();
        let h = self.ids.entry(id.to_string()).or_default();
        h.push(WriteRec { begin, end: None, outcome: Outcome::Pending, value });
        Pending { id: id.to_string(), index: h.len() - 1 }
    }

    /// Records an insert (or replacement) of `id` about to be sent.
    pub fn begin_put(&mut self, id: &str, v: Version) -> Pending {
        self.begin(id, Some(v))
    }

    /// Records a delete of `id` about to be sent.
    pub fn begin_delete(&mut self, id: &str) -> Pending {
        self.begin(id, None)
    }

    fn finish(&mut self, p: Pending, outcome: Outcome) {
        let end = self.tick();
        let rec = &mut self.ids.get_mut(&p.id).expect("begun")[p.index];
        rec.end = Some(end);
        rec.outcome = outcome;
    }

    /// The write was acknowledged: it happened.
    pub fn ack(&mut self, p: Pending) {
        self.finish(p, Outcome::Acked);
    }

    /// The write failed or timed out: it may or may not have happened.
    pub fn fail(&mut self, p: Pending) {
        self.finish(p, Outcome::Failed);
    }

    /// Marks the start of a read.
    pub fn begin_read(&mut self) -> ReadStart {
        ReadStart(self.tick())
    }

    /// The possible states of `id` for a read over [begin, end]: None is "absent".
    fn possible(&self, id: &str, begin: u64, end: u64) -> BTreeSet<Option<Version>> {
        let empty = Vec::new();
        let h = self.ids.get(id).unwrap_or(&empty);
        // The initial "absent", acknowledged at tick 0.
        let initial = WriteRec { begin: 0, end: Some(0), outcome: Outcome::Acked, value: None };
        // w is superseded iff some acknowledged write acknowledged before the read began
        // began after w ended: iff the latest such begin is after w's end.
        let latest = h
            .iter()
            .filter(|a| a.outcome == Outcome::Acked && a.end.is_some_and(|e| e < begin))
            .map(|a| a.begin)
            .max()
            .unwrap_or(0);
        let superseded = |w: &WriteRec| w.end.is_some_and(|e| e < latest);
        std::iter::once(&initial)
            .chain(h.iter())
            .filter(|w| w.begin < end && !superseded(w))
            .map(|w| w.value)
            .collect()
    }

    /// Every id certainly present now (no write in flight or failed since its last
    /// acknowledged one), with its state.
    pub fn certain(&self) -> Vec<(String, Version)> {
        let now = self.clock + 1;
        self.ids
            .keys()
            .filter_map(|id| {
                let p = self.possible(id, now, now);
                match (p.len(), p.first()) {
                    (1, Some(Some(v))) => Some((id.clone(), *v)),
                    _ => None,
                }
            })
            .collect()
    }

    /// Ids whose state is uncertain now (a failed write not yet settled, or one in flight).
    pub fn uncertain(&self) -> Vec<String> {
        let now = self.clock + 1;
        self.ids.keys().filter(|id| self.possible(id, now, now).len() > 1).cloned().collect()
    }

    /// The writes sent for `id`, oldest first, with their ticks and outcomes, and the
    /// clock now: what a report of a violation about `id` needs.
    pub fn history(&self, id: &str) -> String {
        let writes: Vec<String> = self
            .ids
            .get(id)
            .map(|h| {
                h.iter()
                    .map(|w| {
                        let value = match w.value {
                            Some(v) => format!("put {:#018x}@{}", v.fp, v.ts_ms),
                            None => "delete".to_string(),
                        };
                        let end = w.end.map_or("-".to_string(), |e| e.to_string());
                        format!("{value} [{}, {end}] {:?}", w.begin, w.outcome)
                    })
                    .collect()
            })
            .unwrap_or_default();
        format!("writes of {id}: {}; clock now {}", writes.join(", "), self.clock)
    }

    /// Ids ever written.
    pub fn ids(&self) -> usize {
        self.ids.len()
    }

    /// Checks the answer to a query of `q` at distance `k` with `limit`, read since `start`
    /// (and answered now), against a brute-force scan of the model. `skip` names an id not
    /// to consider (the document a CheckAndInsert writes).
    pub fn check_query(
        &mut self,
        start: ReadStart,
        q: u64,
        k: u32,
        limit: usize,
        result: &QueryResult,
    ) -> Result<Checked, Violation> {
        self.check_matches(start, q, k, limit, &result.matches, result.truncated, None)
    }

    /// Checks a CheckAndInsert answer (sent with verification off, `k`, `limit`) for
    /// document `id` with fingerprint `fp`, read since `start`: its matches as a query's
    /// (its own id left out), and `duplicate` and `original_id` consistent with them. The
    /// write itself is recorded by the caller with [`begin_put`](Self::begin_put).
    pub fn check_admission(
        &mut self,
        start: ReadStart,
        id: &str,
        fp: u64,
        k: u32,
        limit: usize,
        r: &CheckAndInsertResponse,
    ) -> Result<Checked, Violation> {
        if r.fingerprint != fp {
            return Err(Violation::Admission(format!(
                "fingerprint {:#x} for {fp:#x}",
                r.fingerprint
            )));
        }
        if r.matches.iter().any(|m| m.id == id) {
            return Err(Violation::Admission(format!("{id} is its own near-duplicate")));
        }
        if r.duplicate == r.matches.is_empty() {
            return Err(Violation::Admission(format!(
                "duplicate {} with {} matches",
                r.duplicate,
                r.matches.len()
            )));
        }
        if !r.duplicate && r.original_id != id {
            return Err(Violation::Admission(format!(
                "not a duplicate, but original {:?}",
                r.original_id
            )));
        }
        self.check_matches(start, fp, k, limit, &r.matches, r.truncated, Some(id))
    }

    #[allow(clippy::too_many_arguments)]
    fn check_matches(
        &mut self,
        start: ReadStart,
        q: u64,
        k: u32,
        limit: usize,
        matches: &[Match],
        truncated: bool,
        skip: Option<&str>,
    ) -> Result<Checked, Violation> {
        let (begin, end) = (start.0, self.tick());
        if matches.len() > limit {
            return Err(Violation::OverLimit { got: matches.len(), limit });
        }
        let key = |m: &Match| (m.distance, m.timestamp_ms, m.id.clone());
        let mut out = Checked { matches: matches.len(), ..Checked::default() };
        let mut seen = BTreeSet::new();
        for (i, m) in matches.iter().enumerate() {
            if !seen.insert(m.id.as_str()) {
                return Err(Violation::DuplicateId(m.id.clone()));
            }
            let want = (m.fingerprint ^ q).count_ones();
            if m.distance != want || m.distance > k {
                return Err(Violation::WrongDistance { id: m.id.clone(), got: m.distance, want });
            }
            if i > 0 && key(m) < key(&matches[i - 1]) {
                return Err(Violation::Order(i));
            }
            let possible = self.possible(&m.id, begin, end);
            let v = Version { fp: m.fingerprint, ts_ms: m.timestamp_ms };
            if !possible.contains(&Some(v)) {
                return Err(Violation::Extra { id: m.id.clone(), fp: v.fp, ts_ms: v.ts_ms });
            }
            out.uncertain += usize::from(possible.len() > 1);
        }
        // The brute-force scan: every id certainly present within k.
        let last = if truncated { matches.last().map(key) } else { None };
        for id in self.ids.keys() {
            if skip == Some(id.as_str()) {
                continue;
            }
            let possible = self.possible(id, begin, end);
            // Within k in every possible state, or not certainly present.
            let within: Option<Vec<Version>> =
                possible.iter().map(|p| p.filter(|v| (v.fp ^ q).count_ones() <= k)).collect();
            let Some(within) = within else { continue };
            // Past a truncation, only those that sort before the last match (in every
            // state) must be there.
            let before_last = |v: &Version| {
                last.as_ref().is_none_or(|l| ((v.fp ^ q).count_ones(), v.ts_ms, id.clone()) < *l)
            };
            if truncated && !within.iter().all(before_last) {
                continue;
            }
            if !seen.contains(id.as_str()) {
                let distance = (within[0].fp ^ q).count_ones();
                return Err(Violation::Missing { id: id.clone(), distance });
            }
            out.required += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, fp: u64, ts: i64, q: u64) -> Match {
        Match {
            id: id.into(),
            fingerprint: fp,
            distance: (fp ^ q).count_ones(),
            timestamp_ms: ts,
            ..Match::default()
        }
    }

    fn result(matches: Vec<Match>) -> QueryResult {
        QueryResult { matches, truncated: false, fingerprint: 0 }
    }

    /// a at distance 1 and b at distance 2 from Q, c far away, all acknowledged.
    const Q: u64 = 0xF0F0_0000_0000_0000;

    fn three() -> Model {
        let mut model = Model::new();
        for (id, fp, ts) in [("a", Q ^ 1, 10), ("b", Q ^ 0b110, 20), ("c", !Q, 30)] {
            let p = model.begin_put(id, Version { fp, ts_ms: ts });
            model.ack(p);
        }
        model
    }

    #[test]
    fn an_exact_answer_passes() {
        let mut model = three();
        let r = model.begin_read();
        let got = model
            .check_query(r, Q, 3, 10, &result(vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)]))
            .unwrap();
        assert_eq!(got, Checked { matches: 2, uncertain: 0, required: 2 });
        // At k = 1 only a.
        let r = model.begin_read();
        model.check_query(r, Q, 1, 10, &result(vec![m("a", Q ^ 1, 10, Q)])).unwrap();
    }

    #[test]
    fn a_missing_document_is_caught() {
        let mut model = three();
        let r = model.begin_read();
        let e = model.check_query(r, Q, 3, 10, &result(vec![m("a", Q ^ 1, 10, Q)])).unwrap_err();
        assert_eq!(e, Violation::Missing { id: "b".into(), distance: 2 });
    }

    #[test]
    fn an_extra_document_is_caught() {
        let mut model = three();
        let r = model.begin_read();
        let answer = vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q), m("z", Q ^ 0b111000, 5, Q)];
        let e = model.check_query(r, Q, 3, 10, &result(answer)).unwrap_err();
        assert!(matches!(e, Violation::Extra { ref id, .. } if id == "z"), "{e}");
        // A known id with a fingerprint it never had, and with a wrong timestamp.
        for bad in [m("a", Q ^ 3, 10, Q), m("a", Q ^ 1, 11, Q)] {
            let r = model.begin_read();
            let answer = vec![bad, m("b", Q ^ 6, 20, Q)];
            let e = model.check_query(r, Q, 3, 10, &result(answer)).unwrap_err();
            assert!(matches!(e, Violation::Extra { .. }), "{e}");
        }
        // A deleted one.
        let p = model.begin_delete("b");
        model.ack(p);
        let r = model.begin_read();
        let answer = vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)];
        let e = model.check_query(r, Q, 3, 10, &result(answer)).unwrap_err();
        assert!(matches!(e, Violation::Extra { ref id, .. } if id == "b"), "{e}");
    }

    #[test]
    fn distances_order_duplicates_and_limit_are_checked() {
        let mut model = three();
        let mut wrong = m("a", Q ^ 1, 10, Q);
        wrong.distance = 0;
        let cases = [
            (vec![wrong, m("b", Q ^ 6, 20, Q)], 10, "wrong distance"),
            (vec![m("b", Q ^ 6, 20, Q), m("a", Q ^ 1, 10, Q)], 10, "out of order"),
            (vec![m("a", Q ^ 1, 10, Q), m("a", Q ^ 1, 10, Q)], 10, "answered twice"),
            (vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)], 1, "over the limit"),
        ];
        for (answer, limit, what) in cases {
            let r = model.begin_read();
            let e = model.check_query(r, Q, 3, limit, &result(answer)).unwrap_err();
            assert!(e.to_string().contains(what), "{e} is not {what}");
        }
        // Over k: c is far away.
        let r = model.begin_read();
        let answer = vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q), m("c", !Q, 30, Q)];
        let e = model.check_query(r, Q, 3, 10, &result(answer)).unwrap_err();
        assert!(matches!(e, Violation::WrongDistance { .. }), "{e}");
    }

    #[test]
    fn a_truncated_answer_must_be_the_first_matches() {
        let mut model = three();
        let r = model.begin_read();
        let mut first = result(vec![m("a", Q ^ 1, 10, Q)]);
        first.truncated = true;
        model.check_query(r, Q, 3, 1, &first).unwrap();
        // The second instead of the first is not.
        let r = model.begin_read();
        let mut second = result(vec![m("b", Q ^ 6, 20, Q)]);
        second.truncated = true;
        let e = model.check_query(r, Q, 3, 1, &second).unwrap_err();
        assert_eq!(e, Violation::Missing { id: "a".into(), distance: 1 });
    }

    #[test]
    fn failed_writes_are_uncertain_until_an_acknowledged_one_settles_them() {
        let mut model = three();
        // A failed replacement of a by a far fingerprint: a may be old or new.
        let p = model.begin_put("a", Version { fp: !Q ^ 1, ts_ms: 11 });
        model.fail(p);
        assert_eq!(model.uncertain(), vec!["a".to_string()]);
        for answer in [vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)], vec![m("b", Q ^ 6, 20, Q)]]
        {
            let r = model.begin_read();
            model.check_query(r, Q, 3, 10, &result(answer)).unwrap();
        }
        // A failed delete of b: b may be there or not.
        let p = model.begin_delete("b");
        model.fail(p);
        let r = model.begin_read();
        model.check_query(r, Q, 3, 10, &result(vec![])).unwrap();
        // An acknowledged write settles a: now it must be absent near Q.
        let p = model.begin_put("a", Version { fp: !Q ^ 3, ts_ms: 12 });
        model.ack(p);
        let r = model.begin_read();
        let e = model.check_query(r, Q, 3, 10, &result(vec![m("a", Q ^ 1, 10, Q)])).unwrap_err();
        assert!(matches!(e, Violation::Extra { .. }), "{e}");
        assert_eq!(
            model.certain().iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            ["a", "c"]
        );
    }

    #[test]
    fn writes_overlapping_a_read_may_or_may_not_be_seen() {
        let mut model = three();
        let r = model.begin_read();
        let p = model.begin_put("d", Version { fp: Q, ts_ms: 1 });
        // Answered before the write is acknowledged: either answer is right.
        let base = vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)];
        model.check_query(r, Q, 3, 10, &result(base.clone())).unwrap();
        let mut with_d = vec![m("d", Q, 1, Q)];
        with_d.extend(base.clone());
        let r2 = model.begin_read();
        model.ack(p);
        model.check_query(r2, Q, 3, 10, &result(with_d)).unwrap();
        // A read that starts after the acknowledgement must see it.
        let r = model.begin_read();
        let e = model.check_query(r, Q, 3, 10, &result(base)).unwrap_err();
        assert_eq!(e, Violation::Missing { id: "d".into(), distance: 0 });
    }

    #[test]
    fn two_overlapping_acknowledged_writes_leave_either_state() {
        let mut model = Model::new();
        let far = Version { fp: !Q, ts_ms: 1 };
        let near = Version { fp: Q, ts_ms: 2 };
        let (p1, p2) = (model.begin_put("x", far), model.begin_put("x", near));
        model.ack(p2);
        model.ack(p1);
        // Either write may have landed last: x may be near Q or not.
        for answer in [vec![], vec![m("x", Q, 2, Q)]] {
            let r = model.begin_read();
            model.check_query(r, Q, 3, 10, &result(answer)).unwrap();
        }
        // A later acknowledged delete settles it.
        let p = model.begin_delete("x");
        model.ack(p);
        let r = model.begin_read();
        let e = model.check_query(r, Q, 3, 10, &result(vec![m("x", Q, 2, Q)])).unwrap_err();
        assert!(matches!(e, Violation::Extra { .. }), "{e}");
        assert!(model.certain().is_empty() && model.uncertain().is_empty());
    }

    #[test]
    fn an_admission_is_checked_without_its_own_id() {
        let mut model = three();
        let r = model.begin_read();
        let p = model.begin_put("new", Version { fp: Q, ts_ms: 40 });
        let answer = CheckAndInsertResponse {
            duplicate: true,
            matches: vec![m("a", Q ^ 1, 10, Q), m("b", Q ^ 6, 20, Q)],
            original_id: "a".into(),
            inserted: true,
            fingerprint: Q,
            ..Default::default()
        };
        model.check_admission(r, "new", Q, 3, 10, &answer).unwrap();
        model.ack(p);
        let r = model.begin_read();
        let lonely = CheckAndInsertResponse {
            duplicate: false,
            original_id: "new".into(),
            fingerprint: Q,
            ..Default::default()
        };
        let e = model.check_admission(r, "new", Q, 3, 10, &lonely).unwrap_err();
        assert!(matches!(e, Violation::Missing { .. }), "{e}");
        let r = model.begin_read();
        let inconsistent = CheckAndInsertResponse { duplicate: true, ..answer };
        let mut inconsistent = inconsistent;
        inconsistent.matches.clear();
        let e = model.check_admission(r, "new", Q, 3, 10, &inconsistent).unwrap_err();
        assert!(matches!(e, Violation::Admission(_)), "{e}");
    }
}
