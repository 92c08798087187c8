//! The recent documents' tables: one hash table per permutation over the fingerprints of the
//! write buffer and of every small run, so that a query probes them all at once.
//!
//! Live inserts leave a few large runs and many small ones; probing a run costs a directory
//! lookup in every table, so each small run costs a query about as many memory accesses as
//! the large ones, and the buffer a linear scan. Here the permuted fingerprints of all of
//! them sit in one open-addressing table per permutation, keyed by the table's prefix: a
//! query probes each table once (one cache line at the home slot, usually), whatever the
//! number of small runs, and collects the values sharing its prefix within `k`. Only those
//! matches are then looked up in the small runs' key columns and in the buffer.
//!
//! Exact by the same pigeonhole argument as the runs' tables: a fingerprint within `k` of the
//! query shares the query's prefix in at least one probed table, and every value with that
//! prefix lies in the home slot's probe sequence before its first empty slot. The tables may
//! hold fingerprints no small run holds any more (merged into a large run, or deleted): those
//! are looked up in the small runs and found in none, so they cost time, never an answer; the
//! tables are rebuilt when such stale entries outnumber the live ones.
//!
//! Inserting a document costs one insertion per table, so the tables follow the buffer as it
//! fills, with no merge; a run leaving the small set costs nothing until the next rebuild.
//!
//! All values sharing a prefix share a probe sequence, so a crowded prefix (simhash clusters
//! similar documents) would make inserts and queries there scan it whole. An insertion that
//! probes more than [`MAX_PROBE`] slots marks the tables overflowed instead: they are
//! emptied and the index probes every run and scans the buffer, as without them, until the
//! small runs and the buffer are gone (merged into a large run); the runs' own tables handle
//! crowded prefixes with sub-indexes.

use crate::design::Design;
use crate::util::{huge_page_vec, prefetch};

/// `n` empty slots, in huge pages when large (queries read them at random).
fn empty_slots(n: usize) -> Vec<u64> {
    let mut v = huge_page_vec(n);
    v.resize(n, EMPTY);
    v
}

/// The empty slot. The fingerprint whose permuted value is `u64::MAX` is kept apart.
const EMPTY: u64 = u64::MAX;

/// The longest probe sequence an insertion may walk before the tables count as overflowed.
const MAX_PROBE: usize = 256;

/// Fibonacci hashing of a prefix to a slot.
const MULT: u64 = 0x9E37_79B9_7F4A_7C15;

/// One table's values, by prefix.
#[derive(Debug, Clone)]
struct PrefixTable {
    /// `64 - prefix bits`: a value's prefix is `v >> shift` (0 for a 0-bit prefix).
    shift: u32,
    /// Slots (a power of two), [`EMPTY`] or a permuted value.
    slots: Vec<u64>,
    /// `64 - log2(slots.len())`.
    slot_shift: u32,
    /// Values held (distinct; `u64::MAX` counted when `has_max`).
    len: usize,
    /// Whether `u64::MAX` is held (it cannot sit in a slot).
    has_max: bool,
}

impl PrefixTable {
    fn new(prefix_bits: u32) -> PrefixTable {
        PrefixTable {
            shift: 64 - prefix_bits,
            slots: empty_slots(16),
            slot_shift: 60,
            len: 0,
            has_max: false,
        }
    }

    #[inline(always)]
    fn prefix(&self, v: u64) -> u64 {
        v.checked_shr(self.shift).unwrap_or(0)
    }

    #[inline(always)]
    fn home(&self, v: u64) -> usize {
        (self.prefix(v).wrapping_mul(MULT) >> self.slot_shift) as usize
    }

    /// Adds `v` (a no-op if present); false, leaving it out, if that would take a probe
    /// sequence longer than [`MAX_PROBE`].
    #[must_use]
    fn insert(&mut self, v: u64) -> bool {
        if v == EMPTY {
            self.len += !self.has_max as usize;
            self.has_max = true;
            return true;
        }
        // At most 5/8 full: probe sequences stay short.
        if (self.len + 1) * 8 > self.slots.len() * 5 {
            self.reserve(1);
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(v);
        for _ in 0..MAX_PROBE {
            let s = self.slots[i];
            if s == v {
                return true;
            }
            if s == EMPTY {
                self.slots[i] = v;
                self.len += 1;
                return true;
            }
            i = (i + 1) & mask;
        }
        false
    }

    /// Inserts many values, loading each one's home slot a few insertions ahead; false if
    /// one was left out (see [`insert`](Self::insert)).
    #[must_use]
    fn insert_many(&mut self, values: &[u64]) -> bool {
        const AHEAD: usize = 8;
        self.reserve(values.len());
        for (i, &v) in values.iter().enumerate() {
            if let Some(&next) = values.get(i + AHEAD) {
                self.prefetch(next);
            }
            if !self.insert(v) {
                return false;
            }
        }
        true
    }

    /// The fewest slots (a power of two, at least 16) that keep `n` values at most 5/8
    /// full.
    fn slots_for(n: usize) -> usize {
        (n.saturating_mul(8).div_ceil(5)).next_power_of_two().max(16)
    }

    /// Makes room for `extra` more values with at most one rehash, into the final size
    /// (growing by doubling would allocate, fill and rehash every size on the way).
    fn reserve(&mut self, extra: usize) {
        let want = Self::slots_for(self.len + extra);
        if want > self.slots.len() {
            self.resize(want);
        }
    }

    /// Empties the table for about `n` values, into the slots `n` needs: those already
    /// allocated, filled empty, when they are that many (the rebuilds that follow merges
    /// then reuse pages already backed instead of faulting in fresh ones, which the kernel
    /// zeroes before the slots are filled again), new ones otherwise (a table never holds
    /// more slots than its values need).
    fn clear_for(&mut self, n: usize) {
        let want = Self::slots_for(n);
        if self.slots.len() == want {
            self.slots.fill(EMPTY);
        } else {
            self.slots = empty_slots(want);
            self.slot_shift = 64 - want.trailing_zeros();
        }
        self.len = 0;
        self.has_max = false;
    }

    /// Rehashes every value into `n` slots (a power of two, more than now).
    fn resize(&mut self, n: usize) {
        debug_assert!(n.is_power_of_two() && n > self.slots.len());
        let bigger = empty_slots(n);
        let old = std::mem::replace(&mut self.slots, bigger);
        self.slot_shift = 64 - n.trailing_zeros();
        self.len = self.has_max as usize;
        for v in old.into_iter().filter(|&v| v != EMPTY) {
            // More slots: every probe sequence is at most as long as before.
            let fits = self.insert(v);
            debug_assert!(fits);
        }
    }

    #[inline(always)]
    fn prefetch(&self, pq: u64) {
        prefetch(&self.slots, self.home(pq));
    }

    /// Calls `hit(v)` for every value sharing `pq`'s prefix within `k` of it.
    #[inline]
    fn probe(&self, pq: u64, k: u32, mut hit: impl FnMut(u64)) {
        let mask = self.slots.len() - 1;
        let prefix = self.prefix(pq);
        let mut i = self.home(pq);
        loop {
            let v = self.slots[i];
            if v == EMPTY {
                break;
            }
            if self.prefix(v) == prefix && (v ^ pq).count_ones() <= k {
                hit(v);
            }
            i = (i + 1) & mask;
        }
        if self.has_max && self.prefix(EMPTY) == prefix && (EMPTY ^ pq).count_ones() <= k {
            hit(EMPTY);
        }
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 8
    }
}

/// The hash tables over the recent documents' fingerprints: one per table of the design.
#[derive(Debug, Clone)]
pub(crate) struct RecentTables {
    tables: Vec<PrefixTable>,
    /// An insertion found a crowded prefix: the tables are empty and not to be used.
    overflowed: bool,
}

impl RecentTables {
    /// Empty tables for `design`.
    pub(crate) fn new(design: &Design) -> RecentTables {
        RecentTables {
            tables: design.tables().iter().map(|t| PrefixTable::new(t.prefix_bits)).collect(),
            overflowed: false,
        }
    }

    /// Empties the tables (overflowed or not) for about `n` fingerprints, keeping their
    /// slots where they fit (see [`PrefixTable::clear_for`]).
    pub(crate) fn clear_for(&mut self, n: usize) {
        for t in &mut self.tables {
            t.clear_for(n);
        }
        self.overflowed = false;
    }

    /// Whether an insertion met a crowded prefix (see the module docs): the tables hold
    /// nothing and answer nothing until they are replaced.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn overflow(&mut self, design: &Design) {
        *self = RecentTables::new(design);
        self.overflowed = true;
    }

    /// Adds fingerprints to every table, a table at a time (a no-op for one already there;
    /// `scratch` is for the permuted values).
    pub(crate) fn insert_many(
        &mut self,
        design: &Design,
        fps: impl Iterator<Item = u64> + Clone,
        scratch: &mut Vec<u64>,
    ) {
        if self.overflowed {
            return;
        }
        for (t, spec) in self.tables.iter_mut().zip(design.tables()) {
            scratch.clear();
            scratch.extend(fps.clone().map(|fp| spec.perm.apply(fp)));
            if !t.insert_many(scratch) {
                self.overflow(design);
                return;
            }
        }
    }

    /// Values held by the identity table: the distinct fingerprints, stale ones included.
    pub(crate) fn len(&self) -> usize {
        self.tables.first().map_or(0, |t| t.len)
    }

    /// Starts loading the home slots of the probed tables `tables` for the permuted queries
    /// `pqs` (one each).
    #[inline]
    pub(crate) fn prefetch(&self, tables: &[usize], pqs: &[u64]) {
        for (&t, &pq) in tables.iter().zip(pqs) {
            self.tables[t].prefetch(pq);
        }
    }

    /// Appends to `out` every fingerprint (identity order) within `k` of the query, found in
    /// the probed tables `tables` for the permuted queries `pqs`; sorted, each once.
    pub(crate) fn probe(
        &self,
        design: &Design,
        tables: &[usize],
        pqs: &[u64],
        k: u32,
        out: &mut Vec<u64>,
    ) {
        out.clear();
        let specs = design.tables();
        for (&t, &pq) in tables.iter().zip(pqs) {
            let perm = &specs[t].perm;
            self.tables[t].probe(pq, k, |v| out.push(perm.invert(v)));
        }
        if out.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.tables.iter().map(PrefixTable::heap_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    /// Every value within k sharing the prefix is found, whatever the load and clustering
    /// (up to the probe limit), `u64::MAX` and 0 included; against a plain scan.
    #[test]
    fn prefix_table_probe_agrees_with_a_scan() {
        let mut r = SplitMix64::new(5);
        for prefix_bits in [12, 20, 40, 64] {
            let mut t = PrefixTable::new(prefix_bits);
            let mut all = Vec::new();
            for i in 0..3000u64 {
                let v = match i % 5 {
                    0 => r.next_u64(),
                    // Up to 80 values in one prefix of every length tried.
                    1 if i < 400 => 0xABCD_0000_0000_0000 | (r.next_u64() >> 16),
                    1..=3 if i > 200 => r.next_u64(),
                    2 => {
                        let f = r.below(3) as u32;
                        r.flip_bits(u64::MAX, f)
                    }
                    3 => {
                        let f = r.below(3) as u32;
                        r.flip_bits(0, f)
                    }
                    _ => all.last().copied().unwrap_or(7),
                };
                assert!(t.insert(v));
                all.push(v);
            }
            let mut many = PrefixTable::new(prefix_bits);
            for chunk in all.chunks(700) {
                assert!(many.insert_many(chunk));
            }
            all.sort_unstable();
            all.dedup();
            assert_eq!(t.len, all.len());
            assert_eq!(many.len, all.len());
            let mut held: Vec<u64> = many.slots.iter().copied().filter(|&v| v != EMPTY).collect();
            held.extend(many.has_max.then_some(EMPTY));
            held.sort_unstable();
            assert_eq!(held, all);
            assert!(!t.slots.is_empty());
            for j in 0..400 {
                let base = all[r.below(all.len() as u64) as usize];
                let f = r.below(5) as u32;
                let q = if j % 7 == 0 { r.next_u64() } else { r.flip_bits(base, f) };
                for k in [0, 1, 3] {
                    let pre = |v: u64| v.checked_shr(64 - prefix_bits).unwrap_or(0);
                    let want: Vec<u64> = all
                        .iter()
                        .copied()
                        .filter(|&v| pre(v) == pre(q) && (v ^ q).count_ones() <= k)
                        .collect();
                    let mut got = Vec::new();
                    t.probe(q, k, |v| got.push(v));
                    got.sort_unstable();
                    assert_eq!(got, want, "prefix {prefix_bits} k {k}");
                }
            }
        }
    }

    /// Emptied for a new count, a table keeps its slots when they are as many as the count
    /// needs and takes new ones otherwise; either way it holds exactly what is inserted
    /// after, and one reservation makes room for a whole batch in one step.
    #[test]
    fn a_cleared_table_holds_exactly_what_follows() {
        let mut r = SplitMix64::new(11);
        let mut t = PrefixTable::new(20);
        let first: Vec<u64> = (0..5000).map(|_| r.next_u64()).collect();
        assert!(t.insert_many(&first));
        // One rehash into the final size: 5000 values at most 5/8 full.
        assert_eq!(t.slots.len(), 8192);
        assert_eq!(t.slot_shift, 64 - 13);
        for (n, kept) in
            [(4000, true), (3000, true), (1500, false), (100, false), (150, true), (3000, false)]
        {
            let before = t.slots.len();
            t.clear_for(n);
            assert_eq!(t.slots.len() == before, kept, "clear for {n}");
            assert_eq!(t.slots.len(), 1 << (64 - t.slot_shift));
            assert!(t.slots.iter().all(|&v| v == EMPTY) && t.len == 0 && !t.has_max);
            let mut vals: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
            vals.push(EMPTY);
            assert!(t.insert_many(&vals));
            vals.sort_unstable();
            vals.dedup();
            assert_eq!(t.len, vals.len());
            for &v in &vals {
                let mut got = Vec::new();
                t.probe(v, 0, |x| got.push(x));
                assert_eq!(got, vec![v]);
            }
        }
    }

    /// A prefix crowded past the probe limit overflows the tables: they empty themselves and
    /// take nothing more.
    #[test]
    fn a_crowded_prefix_overflows_the_tables() {
        let design = Design::parse("paper-10").unwrap();
        let mut t = RecentTables::new(&design);
        let mut r = SplitMix64::new(8);
        for _ in 0..100 {
            t.insert_many(&design, [r.next_u64()].into_iter(), &mut Vec::new());
        }
        assert!(!t.overflowed() && t.len() == 100);
        // Share the top 40 bits: every table's prefix is inside them.
        let crowded: Vec<u64> =
            (0..2 * MAX_PROBE as u64).map(|i| 0x1234_5678_9A00_0000 | i).collect();
        t.insert_many(&design, crowded.iter().copied(), &mut Vec::new());
        assert!(t.overflowed());
        assert_eq!(t.len(), 0);
        t.insert_many(&design, [5].into_iter(), &mut Vec::new());
        assert_eq!(t.len(), 0);
    }
}
