//! The documents stored by the last few thousand records, for admissions.
//!
//! An admission ([`Shard::admit`](super::Shard::admit)) finds its candidates under the
//! state's read lock, then decides under the write lock so that two racing admissions see
//! each other. Querying the index a second time under the write lock would hold every other
//! writer and reader for a whole query (tens of microseconds at k = 6), so the admission
//! instead takes what changed in between: the documents its first answer named that are
//! gone, and the documents stored since, which are here. When more was written in between
//! than this remembers, it queries again.

use std::collections::VecDeque;

use neardup_core::Match;
use neardup_core::util::hamming;

/// One stored document: the record that stored it and what a match needs.
#[derive(Debug, Clone, Copy)]
struct Put {
    seq: u64,
    id: u64,
    fp: u64,
    ts: i64,
}

/// The documents stored by the most recent records, oldest first.
#[derive(Debug)]
pub(super) struct RecentPuts {
    puts: VecDeque<Put>,
    /// Every document stored by a record with a sequence at least this is in `puts`.
    floor: u64,
    capacity: usize,
}

impl RecentPuts {
    /// Remembers up to `capacity` documents. Every record appended from now on is
    /// [`push`](Self::push)ed, so "since" any sequence taken from now on is known.
    pub(super) fn new(capacity: usize) -> RecentPuts {
        RecentPuts { puts: VecDeque::with_capacity(capacity), floor: 0, capacity }
    }

    /// Record `seq` stored document `id` with fingerprint `fp` and timestamp `ts`.
    pub(super) fn push(&mut self, seq: u64, id: u64, fp: u64, ts: i64) {
        if self.capacity == 0 {
            self.floor = seq + 1;
            return;
        }
        if self.puts.len() == self.capacity
            && let Some(old) = self.puts.pop_front()
        {
            self.floor = self.floor.max(old.seq + 1);
        }
        self.puts.push_back(Put { seq, id, fp, ts });
    }

    /// Forgets every document stored up to record `seq`, and says so: a record stored
    /// documents this does not list (a run added in bulk).
    pub(super) fn forget_through(&mut self, seq: u64) {
        self.puts.clear();
        self.floor = self.floor.max(seq + 1);
    }

    /// The documents within `k` of `fp` stored by records after `seq`, as matches; `None`
    /// when some of them are no longer remembered.
    pub(super) fn within_since(&self, fp: u64, k: u32, seq: u64) -> Option<Vec<Match>> {
        if seq + 1 < self.floor {
            return None;
        }
        let start = self.puts.partition_point(|p| p.seq <= seq);
        Some(
            self.puts
                .range(start..)
                .filter_map(|p| {
                    let distance = hamming(fp, p.fp);
                    (distance <= k).then_some(Match { id: p.id, fp: p.fp, distance, ts: p.ts })
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_what_it_can_and_says_when_it_cannot() {
        let mut r = RecentPuts::new(3);
        r.push(1, 10, 0b1111, 1);
        r.push(2, 11, 0b0111, 2);
        r.push(2, 12, u64::MAX, 3);
        let ids = |m: Option<Vec<Match>>| m.map(|v| v.iter().map(|m| m.id).collect::<Vec<_>>());
        assert_eq!(ids(r.within_since(0b1111, 1, 0)), Some(vec![10, 11]));
        assert_eq!(ids(r.within_since(0b1111, 1, 1)), Some(vec![11]));
        assert_eq!(ids(r.within_since(0b1111, 1, 2)), Some(vec![]));
        // The put of record 1 is forgotten: since 0 is no longer known, since 1 is.
        r.push(3, 13, 0b1110, 4);
        assert_eq!(ids(r.within_since(0b1111, 1, 0)), None);
        assert_eq!(ids(r.within_since(0b1111, 1, 1)), Some(vec![11, 13]));
        // Half of record 2 forgotten: since 1 is no longer known.
        r.push(4, 14, 0, 5);
        assert_eq!(ids(r.within_since(0b1111, 1, 1)), None);
        assert_eq!(ids(r.within_since(0b1111, 64, 2)), Some(vec![13, 14]));
        let m = r.within_since(0b1111, 1, 2).unwrap();
        assert_eq!((m[0].id, m[0].fp, m[0].distance, m[0].ts), (13, 0b1110, 1, 4));
        // Nothing remembered at all.
        let mut none = RecentPuts::new(0);
        none.push(5, 1, 0, 0);
        assert!(none.within_since(0, 64, 4).is_none());
        assert_eq!(ids(none.within_since(0, 64, 5)), Some(vec![]));
    }
}
