//! The node store against brute force: tablet entries and documents kept in plain
//! collections, every answer compared, across deletes, re-puts, crashes and restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use neardup_core::Design;
use neardup_core::util::SplitMix64;

use super::*;
use crate::data_types::make_gid;
use crate::storage::{SledStore, Store};
use crate::{ErrorClass, ShardMetrics};

fn config() -> NodeStoreConfig {
    let mut c = NodeStoreConfig { cache_bytes: 8 << 20, min_free_bytes: 0, ..Default::default() };
    c.shard.index.buffer_docs = 64;
    c.shard.checkpoint_ops = 200;
    c.shard.checkpoint_interval = Duration::from_secs(3600);
    c.shard.idle_flush = Duration::from_secs(3600);
    c.shard.max_record_bytes = 2048;
    c.shard.max_runs = 3;
    c
}

fn open(dir: &Path, design: &Design) -> Arc<NodeStore> {
    NodeStore::open(dir, design, config(), ShardMetrics::default()).unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// The truth about the tablets: every entry (table, gid, fp).
#[derive(Default, Clone)]
struct Entries(BTreeSet<(u32, u64, u64)>);

impl Entries {
    /// Table `t`'s probe: its entries sharing q's prefix in table t and within k, by
    /// distance then gid.
    fn probe(&self, design: &Design, t: u32, q: u64, k: u32) -> Vec<TabletHit> {
        let spec = &design.tables()[t as usize];
        let shift = 64 - spec.prefix_bits;
        let pq = spec.perm.apply(q) >> shift;
        let mut v: Vec<TabletHit> = self
            .0
            .iter()
            .filter(|&&(tt, _, fp)| {
                tt == t && spec.perm.apply(fp) >> shift == pq && (fp ^ q).count_ones() <= k
            })
            .map(|&(_, gid, fp)| TabletHit { gid, fp, distance: (fp ^ q).count_ones() })
            .collect();
        v.sort_unstable_by_key(|h| (h.distance, h.gid));
        v
    }
}

/// Random fingerprints near a few centres, so probes find something.
struct Gen {
    rng: SplitMix64,
    centres: Vec<u64>,
    seq: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        let mut rng = SplitMix64::new(seed);
        let centres = (0..8).map(|_| rng.next_u64()).collect();
        Gen { rng, centres, seq: 0 }
    }

    fn fp(&mut self) -> u64 {
        let c = self.centres[self.rng.below(self.centres.len() as u64) as usize];
        let flips = self.rng.below(6) as u32;
        self.rng.flip_bits(c, flips)
    }

    fn gid(&mut self) -> u64 {
        self.seq += 1;
        make_gid(self.seq, self.rng.below(16) as u32)
    }
}

/// Puts new documents' entries in every table, removes some, re-puts some (no-ops), removes
/// absent ones (no-ops): one call per round, as a router would send.
fn tablet_round(node: &NodeStore, model: &mut Entries, g: &mut Gen, tables: u32) {
    let mut ops = Vec::new();
    let live: Vec<(u64, u64)> =
        model.0.iter().filter(|e| e.0 == 0).map(|&(_, gid, fp)| (gid, fp)).collect();
    for _ in 0..40 {
        match g.rng.below(6) {
            0..=2 => {
                let (gid, fp) = (g.gid(), g.fp());
                for t in 0..tables {
                    ops.push((t, TabletOp::Put { gid, fp }));
                    model.0.insert((t, gid, fp));
                }
            }
            3 if !live.is_empty() => {
                let (gid, fp) = live[g.rng.below(live.len() as u64) as usize];
                for t in 0..tables {
                    ops.push((t, TabletOp::Remove { gid, fp }));
                    model.0.remove(&(t, gid, fp));
                }
            }
            4 if !live.is_empty() => {
                // A retried put: a no-op unless removed earlier in this round.
                let (gid, fp) = live[g.rng.below(live.len() as u64) as usize];
                for t in 0..tables {
                    ops.push((t, TabletOp::Put { gid, fp }));
                    model.0.insert((t, gid, fp));
                }
            }
            _ => {
                let t = g.rng.below(tables as u64) as u32;
                ops.push((t, TabletOp::Remove { gid: g.gid(), fp: g.fp() }));
            }
        }
    }
    block_on(node.write_tablets(ops)).unwrap();
}

/// Every probe answer against brute force, per table and as the union over the tables a
/// query at `k` needs.
fn check_tablets(node: &NodeStore, model: &Entries, g: &mut Gen) {
    let design = node.design().clone();
    let all: Vec<(u64, u64)> =
        model.0.iter().filter(|e| e.0 == 0).map(|&(_, gid, fp)| (gid, fp)).collect();
    for k in 0..=design.max_k() {
        for _ in 0..15 {
            let q = if all.is_empty() || g.rng.below(4) == 0 {
                g.fp()
            } else {
                let fp = all[g.rng.below(all.len() as u64) as usize].1;
                let flips = g.rng.below(k as u64 + 2) as u32;
                g.rng.flip_bits(fp, flips)
            };
            let tables: Vec<u32> = (0..design.tables().len() as u32).collect();
            let probes: Vec<(u32, u64)> = tables.iter().map(|&t| (t, q)).collect();
            let got = node.probe_tablets(&probes, k, usize::MAX).unwrap();
            // Several probes of each table in one call, tables out of order, one table
            // with more than the others (the buffers one table's group leaves are reused
            // by the next): each answer is its own probe's.
            let q2 = g.fp();
            let mut mixed: Vec<(u32, u64)> =
                tables.iter().rev().flat_map(|&t| [(t, q2), (t, q)]).collect();
            mixed.insert(3, (1, q ^ 1));
            let answers = node.probe_tablets(&mixed, k, usize::MAX).unwrap();
            assert_eq!(answers.len(), mixed.len());
            for (&(t, p), (hits, _)) in mixed.iter().zip(&answers) {
                assert_eq!(hits, &model.probe(&design, t, p, k), "mixed: table {t} k={k} q={p:#x}");
            }
            let mut union = BTreeSet::new();
            for (&t, (hits, truncated)) in tables.iter().zip(&got) {
                let want = model.probe(&design, t, q, k);
                assert_eq!(hits, &want, "table {t} k={k} q={q:#x}");
                assert!(!truncated);
                if design.tables_for_k(k).contains(&(t as usize)) {
                    union.extend(hits.iter().map(|h| (h.gid, h.fp)));
                }
                // The cap: the first hits, and truncated when more were there.
                let (few, cut) = &node.probe_tablets(&[(t, q)], k, 1).unwrap()[0];
                assert_eq!(few.as_slice(), &want[..want.len().min(1)]);
                assert_eq!(*cut, want.len() > 1);
            }
            let brute: BTreeSet<(u64, u64)> =
                all.iter().copied().filter(|(_, fp)| (fp ^ q).count_ones() <= k).collect();
            assert_eq!(union, brute, "k={k} q={q:#x}: the union over tables");
        }
    }
    let stats = node.stats();
    for t in 0..design.tables().len() as u32 {
        let n = model.0.iter().filter(|e| e.0 == t).count() as u64;
        assert_eq!(stats.entries[t as usize], n, "table {t}");
    }
}

/// Drops a random range of one table's permuted values ([`NodeStore::drop_tablet`]: one
/// range removal), checks it is empty, then puts its entries back, as a tablet that moved
/// away and was copied back (half the time in bulk, as one run): the log holds the removal
/// and the puts after it, and every entry must be there once.
fn drop_some(node: &NodeStore, model: &Entries, g: &mut Gen, design: &Design) {
    let t = g.rng.below(design.tables().len() as u64) as u32;
    let mask = u64::MAX >> (1 + g.rng.below(6));
    let (a, b) = (g.rng.next_u64() & !mask, g.rng.next_u64() | mask);
    let (lo, hi) = (a.min(b), a.max(b));
    let perm = &design.tables()[t as usize].perm;
    let back: Vec<(u32, TabletOp)> = model
        .0
        .iter()
        .filter(|e| e.0 == t && (lo..=hi).contains(&perm.apply(e.2)))
        .map(|&(_, gid, fp)| (t, TabletOp::Put { gid, fp }))
        .collect();
    block_on(node.drop_tablet(t, lo, hi)).unwrap();
    assert!(node.scan_tablet(t, lo, hi).unwrap().is_empty());
    if back.is_empty() || g.rng.below(2) == 0 {
        block_on(node.write_tablets(back)).unwrap();
        return;
    }
    // In bulk, as one run, after a router's puts of some of them: `may_hold` names those
    // (and some never put), so each is held once after.
    let entries: Vec<(u64, u64)> = back
        .iter()
        .map(|(_, op)| match *op {
            TabletOp::Put { gid, fp } | TabletOp::Remove { gid, fp } => (gid, fp),
        })
        .collect();
    let early = back.len() / 4;
    let early_gids: BTreeSet<u64> = entries[..early].iter().map(|&(gid, _)| gid).collect();
    block_on(node.write_tablets(back[..early].to_vec())).unwrap();
    let may_hold = |docs: &[neardup_core::Doc]| {
        docs.iter()
            .enumerate()
            .filter(|&(i, d)| early_gids.contains(&d.id) || i % 3 == 0)
            .map(|(i, _)| i)
            .collect()
    };
    let (durable, put) = node.add_tablet_entries(t, &entries, may_hold).unwrap();
    assert_eq!(put, entries.len() as u64);
    block_on(durable.wait()).unwrap();
}

#[test]
fn tablet_probes_match_brute_force_through_crashes_and_restarts() {
    for (seed, text) in [(1, "5c2"), (2, "paper-16")] {
        let dir = tempfile::tempdir().unwrap();
        let design = Design::parse(text).unwrap();
        let tables = design.tables().len() as u32;
        let (mut model, mut g) = (Entries::default(), Gen::new(seed));
        let node = open(dir.path(), &design);
        for _ in 0..12 {
            tablet_round(&node, &mut model, &mut g, tables);
            if g.rng.below(3) == 0 {
                drop_some(&node, &model, &mut g, &design);
            }
        }
        check_tablets(&node, &model, &mut g);
        // A crash: everything acknowledged is there after recovery (range removals among
        // the records replayed).
        drop_some(&node, &model, &mut g, &design);
        node.close_without_checkpoint();
        drop(node);
        let node = open(dir.path(), &design);
        check_tablets(&node, &model, &mut g);
        for _ in 0..6 {
            tablet_round(&node, &mut model, &mut g, tables);
            drop_some(&node, &model, &mut g, &design);
        }
        // With the runs checkpointed first, the removal's replay meets entries in runs.
        for s in &node.tables {
            s.checkpoint().unwrap();
        }
        tablet_round(&node, &mut model, &mut g, tables);
        drop_some(&node, &model, &mut g, &design);
        check_tablets(&node, &model, &mut g);
        node.close_without_checkpoint();
        drop(node);
        let node = open(dir.path(), &design);
        check_tablets(&node, &model, &mut g);
        // Rebuilt as one run each (from the index's own entries, without names).
        for s in node.tables.iter().chain([&node.docs]) {
            s.compact_all().unwrap();
        }
        check_tablets(&node, &model, &mut g);
        tablet_round(&node, &mut model, &mut g, tables);
        check_tablets(&node, &model, &mut g);
        node.shutdown().unwrap();
        drop(node);
        let node = open(dir.path(), &design);
        check_tablets(&node, &model, &mut g);
        node.shutdown().unwrap();
        drop(node);
        // Another design's directory is refused.
        let other = Design::parse("4c1").unwrap();
        let e = NodeStore::open(dir.path(), &other, config(), ShardMetrics::default());
        assert!(matches!(e, Err(Error::Incompatible(_))), "{e:?}");
    }
}

#[test]
fn tablet_writes_are_idempotent_and_bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let put = TabletOp::Put { gid: make_gid(1, 3), fp: 0xABCD };
    for _ in 0..3 {
        block_on(node.write_tablets(vec![(2, put), (2, put)])).unwrap();
    }
    assert_eq!(node.stats().entries[2], 1);
    let hits = &node.probe_tablets(&[(2, 0xABCD)], 0, 10).unwrap()[0].0;
    assert_eq!(hits, &[TabletHit { gid: make_gid(1, 3), fp: 0xABCD, distance: 0 }]);
    // Same fingerprint, another gid: a second entry.
    block_on(node.write_tablets(vec![(2, TabletOp::Put { gid: make_gid(2, 3), fp: 0xABCD })]))
        .unwrap();
    assert_eq!(node.stats().entries[2], 2);
    let remove = TabletOp::Remove { gid: make_gid(1, 3), fp: 0xABCD };
    for _ in 0..2 {
        block_on(node.write_tablets(vec![(2, remove)])).unwrap();
    }
    assert_eq!(node.stats().entries[2], 1);
    // Removed, then put again: there.
    block_on(node.write_tablets(vec![(2, remove), (2, put)])).unwrap();
    assert_eq!(node.stats().entries[2], 2);
    for bad in [vec![(2, put), (10, put)], vec![(0, TabletOp::Put { gid: 0, fp: 1 })]] {
        let e = block_on(node.write_tablets(bad)).unwrap_err();
        assert_eq!(e.class(), ErrorClass::InvalidInput, "{e}");
    }
    assert_eq!(node.stats().entries[0], 0);
    assert_eq!(node.probe_tablets(&[(0, 1)], 3, 1).unwrap().len(), 1);
    for e in [
        node.probe_tablets(&[(0, 1)], 4, 1).unwrap_err(),
        node.probe_tablets(&[(10, 1)], 1, 1).unwrap_err(),
        node.scan_tablet(10, 0, u64::MAX).unwrap_err(),
        node.scan_partition(256).unwrap_err(),
    ] {
        assert_eq!(e.class(), ErrorClass::InvalidInput, "{e}");
    }
    node.shutdown().unwrap();
}

/// A probe that may not wait (an async thread's) gives way to a writer holding a table's or
/// the document table's lock, and otherwise answers as one that waits.
#[test]
fn a_probe_that_may_not_wait_gives_way_to_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let tables = design.tables().len() as u32;
    let (mut model, mut g) = (Entries::default(), Gen::new(7));
    let node = open(dir.path(), &design);
    tablet_round(&node, &mut model, &mut g, tables);
    let probes: Vec<(u32, u64)> = model.0.iter().take(20).map(|&(t, _, fp)| (t, fp ^ 1)).collect();
    let waited = node.probe_tablets(&probes, 3, usize::MAX).unwrap();
    assert!(waited.iter().any(|(hits, _)| !hits.is_empty()));
    assert_eq!(node.probe_tablets_if(&probes, 3, usize::MAX, false).unwrap(), Some(waited));
    {
        let _writer = node.tables[probes[0].0 as usize].hold_write_lock();
        assert_eq!(node.probe_tablets_if(&probes, 3, usize::MAX, false).unwrap(), None);
    }
    let gid = make_gid(3, 1);
    block_on(node.write_docs(vec![DocOp::Put(info(gid, "a", 1, None))])).unwrap();
    let found = node.resolve(&[gid], true).unwrap();
    assert_eq!(found[0].as_ref().map(|d| d.gid), Some(gid));
    assert_eq!(node.resolve_if(&[gid], false, true).unwrap(), Some(found));
    let _writer = node.docs.hold_write_lock();
    assert_eq!(node.resolve_if(&[gid], false, true).unwrap(), None);
}

#[test]
fn scan_and_drop_tablets_by_range() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let tables = design.tables().len() as u32;
    let node = open(dir.path(), &design);
    let (mut model, mut g) = (Entries::default(), Gen::new(9));
    // Spread values too, so every quarter holds some.
    g.centres.extend((0..24).map(|i| (i as u64) << 59 | 0x1234_5678));
    for _ in 0..8 {
        tablet_round(&node, &mut model, &mut g, tables);
    }
    let split_bits = 2;
    let ranges: Vec<(u64, u64)> = (0..1u64 << split_bits)
        .map(|r| {
            let start = r << (64 - split_bits);
            (start, start | (u64::MAX >> split_bits))
        })
        .collect();
    for t in 0..tables {
        let perm = &design.tables()[t as usize].perm;
        let mut seen = Vec::new();
        for &(start, end) in &ranges {
            let got = node.scan_tablet(t, start, end).unwrap();
            let mut want: Vec<(u64, u64, u64)> = model
                .0
                .iter()
                .filter(|e| e.0 == t && (start..=end).contains(&perm.apply(e.2)))
                .map(|&(_, gid, fp)| (perm.apply(fp), gid, fp))
                .collect();
            want.sort_unstable();
            let want: Vec<(u64, u64)> = want.into_iter().map(|(_, gid, fp)| (gid, fp)).collect();
            assert_eq!(got, want, "table {t} range {start:#x}");
            // Paged: the pages in order are the range, each cut between permuted values.
            for limit in [1, 5, 64] {
                let (mut paged, mut from) = (Vec::new(), Some(start));
                while let Some(f) = from {
                    let ScanPage { items: page, next } =
                        node.scan_tablet_page(t, f, end, limit).unwrap();
                    if let Some(n) = next {
                        assert!(n > f && n <= end && !page.is_empty());
                        let last = perm.apply(page.last().unwrap().1);
                        assert!(
                            last < n,
                            "table {t}: a page from {f:#x} holds {last:#x} >= {n:#x}"
                        );
                        let rest = node.scan_tablet(t, n, end).unwrap();
                        assert!(rest.iter().all(|e| perm.apply(e.1) > last));
                    }
                    paged.extend(page);
                    from = next;
                }
                assert_eq!(paged, want, "table {t} range {start:#x}, pages of {limit}");
            }
            seen.extend(got);
        }
        assert_eq!(seen.len(), model.0.iter().filter(|e| e.0 == t).count());
    }
    // A narrow range inside one quarter.
    let (start, end) = (ranges[1].0 + (1 << 40), ranges[1].0 + (1 << 61));
    let perm = &design.tables()[3].perm;
    let n = model.0.iter().filter(|e| e.0 == 3 && (start..=end).contains(&perm.apply(e.2))).count();
    assert_eq!(node.scan_tablet(3, start, end).unwrap().len(), n);
    // Dropping one quarter of table 1 removes exactly it.
    let (start, end) = ranges[2];
    let perm = design.tables()[1].perm.clone();
    let before = model.0.len();
    model.0.retain(|e| !(e.0 == 1 && (start..=end).contains(&perm.apply(e.2))));
    assert!(model.0.len() < before, "the quarter held entries");
    block_on(node.drop_tablet(1, start, end)).unwrap();
    assert!(node.scan_tablet(1, start, end).unwrap().is_empty());
    let all = node.scan_tablet(1, 0, u64::MAX).unwrap().len();
    assert_eq!(all, model.0.iter().filter(|e| e.0 == 1).count());
    // Probes of table 1 no longer find what was dropped (the union check does not hold
    // for a node missing a tablet, so per table only).
    for _ in 0..50 {
        let q = g.fp();
        for k in 0..=3 {
            let got = &node.probe_tablets(&[(1, q)], k, usize::MAX).unwrap()[0].0;
            assert_eq!(got, &model.probe(&design, 1, q, k));
        }
    }
    node.shutdown().unwrap();
}

#[test]
fn a_split_point_halves_a_tablet_at_a_prefix_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let (mut model, mut g) = (Entries::default(), Gen::new(21));
    g.centres.extend((0..64).map(|i| (i as u64) << 58 | 0x9abc_def0));
    // Puts only: with nothing removed, the counts are exact.
    for _ in 0..6 {
        let mut ops = Vec::new();
        for _ in 0..40 {
            let (gid, fp) = (g.gid(), g.fp());
            ops.push((2, TabletOp::Put { gid, fp }));
            model.0.insert((2, gid, fp));
        }
        block_on(node.write_tablets(ops)).unwrap();
    }
    let bits = design.min_prefix_bits();
    let step = 1u64 << (64 - bits);
    let perm = design.tables()[2].perm.clone();
    let values: Vec<u64> = {
        let mut v: Vec<u64> =
            model.0.iter().filter(|e| e.0 == 2).map(|e| perm.apply(e.2)).collect();
        v.sort_unstable();
        v
    };
    let in_range = |lo: u64, hi: u64| values.iter().filter(|&&v| (lo..=hi).contains(&v)).count();
    for (start, end) in [(0, u64::MAX), (1 << 62, (1 << 63) - 1)] {
        let total = in_range(start, end) as u64;
        assert!(total > 20, "the range holds {total} entries");
        // At or below the threshold: no split.
        assert_eq!(node.split_point(2, start, end, bits, total).unwrap(), None);
        let at = node.split_point(2, start, end, bits, total / 2).unwrap().unwrap();
        assert!(at > start && at <= end && at.is_multiple_of(step), "{at:#x}");
        let (lower, upper) = (in_range(start, at - 1), in_range(at, end));
        assert!(lower > 0 && upper > 0);
        // No other boundary comes closer to halving it: the prefixes next to `at` would
        // leave a larger difference (the count is exact here, nothing was merged away).
        let off = |b: u64| (2 * in_range(start, b - 1) as i64 - total as i64).abs();
        for b in [at - step, at + step] {
            if b > start && b <= end {
                assert!(off(at) <= off(b), "{at:#x} against {b:#x}");
            }
        }
    }
    // Every entry of one prefix: nothing to split.
    let one = values[values.len() / 2] & !(step - 1);
    assert_eq!(node.split_point(2, one, one + step - 1, bits, 0).unwrap(), None);
    node.shutdown().unwrap();
}

/// The truth about documents: name -> document, last writer wins.
#[derive(Default, Clone)]
struct Docs(BTreeMap<String, DocInfo>);

impl Docs {
    fn apply(&mut self, op: &DocOp) {
        match op {
            DocOp::Put(d) => {
                if self.0.values().any(|x| x.gid == d.gid) {
                    return;
                }
                match self.0.get(&d.name) {
                    Some(old) if (old.ts_ms, old.gid) > (d.ts_ms, d.gid) => {}
                    _ => {
                        self.0.insert(d.name.clone(), d.clone());
                    }
                }
            }
            DocOp::Remove { gid, name } => {
                if self.0.get(name).is_some_and(|d| d.gid == *gid) {
                    self.0.remove(name);
                }
            }
        }
    }
}

fn info(gid: u64, name: &str, ts_ms: i64, sketch: Option<Vec<u8>>) -> DocInfo {
    DocInfo {
        gid,
        name: name.into(),
        fp: gid.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ts_ms,
        cluster: gid ^ 1,
        sketch,
    }
}

fn check_docs(node: &NodeStore, model: &Docs, gids: &[u64]) {
    let names: Vec<String> = (0..40).map(|i| format!("https://x/{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let got = node.lookup_names(&refs).unwrap();
    for (n, g) in names.iter().zip(got) {
        assert_eq!(g.as_ref(), model.0.get(n), "{n}");
    }
    let got = node.resolve(gids, true).unwrap();
    for (gid, g) in gids.iter().zip(got) {
        let want = model.0.values().find(|d| d.gid == *gid);
        assert_eq!(g.as_ref(), want, "gid {gid}");
    }
    for p in 0..4 {
        let mut want: Vec<DocInfo> =
            model.0.values().filter(|d| gid_partition(d.gid) == p).cloned().collect();
        want.sort_unstable_by_key(|d| d.gid);
        assert_eq!(node.scan_partition(p).unwrap(), want, "partition {p}");
        let mut gids = node.partition_gids(p).unwrap();
        gids.sort_unstable();
        assert_eq!(gids, want.iter().map(|d| d.gid).collect::<Vec<_>>(), "partition {p}");
        // Paged: every document once, at most `limit` a page.
        for limit in [1, 3, 1000] {
            let (mut paged, mut cursor) = (Vec::new(), Some(0));
            while let Some(c) = cursor {
                let ScanPage { items: page, next } = node.scan_partition_page(p, c, limit).unwrap();
                assert!(page.len() <= limit);
                assert!(next.is_none_or(|n| n > c), "partition {p}: from {c} to {next:?}");
                paged.extend(page);
                cursor = next;
            }
            paged.sort_unstable_by_key(|d| d.gid);
            assert_eq!(paged, want, "partition {p}, pages of {limit}");
        }
    }
    assert_eq!(node.stats().documents, model.0.len() as u64);
}

#[test]
fn documents_last_writer_wins_in_either_order() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    // Either order, one answer: the larger (ts_ms, gid), here the later timestamp with
    // the smaller gid.
    for (i, late_first) in [(0u64, true), (1, false)] {
        let name = format!("order-{i}");
        let late = info(make_gid(10 * i + 5, 1), &name, 20, Some(vec![1, 2, 3]));
        let early = info(make_gid(10 * i + 9, 2), &name, 10, None);
        let ops = if late_first {
            vec![DocOp::Put(late.clone()), DocOp::Put(early)]
        } else {
            vec![DocOp::Put(early), DocOp::Put(late.clone())]
        };
        block_on(node.write_docs(ops.clone())).unwrap();
        let got = node.lookup_names(&[&name]).unwrap().remove(0);
        assert_eq!(got.as_ref(), Some(&late), "{name}");
        assert_eq!(node.resolve(&[late.gid], true).unwrap()[0].as_ref(), Some(&late));
        // Replayed: nothing changes.
        block_on(node.write_docs(ops)).unwrap();
        assert_eq!(node.lookup_names(&[&name]).unwrap()[0].as_ref(), Some(&late));
    }
    // Equal timestamps: the larger gid.
    block_on(node.write_docs(vec![
        DocOp::Put(info(make_gid(30, 0), "tie", 5, None)),
        DocOp::Put(info(make_gid(20, 0), "tie", 5, None)),
    ]))
    .unwrap();
    assert_eq!(node.lookup_names(&["tie"]).unwrap()[0].as_ref().unwrap().gid, make_gid(30, 0));
    // A removal with another gid is ignored; with its own, it removes.
    let tie = make_gid(30, 0);
    block_on(node.write_docs(vec![DocOp::Remove { gid: make_gid(20, 0), name: "tie".into() }]))
        .unwrap();
    assert!(node.lookup_names(&["tie"]).unwrap()[0].is_some());
    block_on(node.write_docs(vec![DocOp::Remove { gid: tie, name: "tie".into() }])).unwrap();
    assert_eq!(node.lookup_names(&["tie"]).unwrap()[0], None);
    assert_eq!(node.resolve(&[tie], true).unwrap()[0], None);
    // Bad input changes nothing.
    for bad in [
        vec![DocOp::Put(info(make_gid(40, 0), "ok", 1, None)), DocOp::Put(info(0, "g0", 1, None))],
        vec![DocOp::Put(info(make_gid(41, 0), "", 1, None))],
        vec![DocOp::Put(info(
            make_gid(42, 0),
            "s",
            1,
            Some(vec![0; neardup_core::sketch::MAX_ENCODED_BYTES + 1]),
        ))],
    ] {
        let e = block_on(node.write_docs(bad)).unwrap_err();
        assert_eq!(e.class(), ErrorClass::InvalidInput, "{e}");
    }
    assert_eq!(node.lookup_names(&["ok"]).unwrap()[0], None);
    node.shutdown().unwrap();
}

#[test]
fn documents_match_a_model_through_crashes_restarts_and_drops() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let (mut model, mut rng) = (Docs::default(), SplitMix64::new(11));
    let mut gids = Vec::new();
    let mut round = |node: &NodeStore, model: &mut Docs, gids: &mut Vec<u64>| {
        let mut ops = Vec::new();
        for _ in 0..30 {
            let name = format!("https://x/{}", rng.below(40));
            if rng.below(4) == 0 {
                // Remove by the gid it has now, or by a stale one.
                let gid = match model.0.get(&name) {
                    Some(d) if rng.below(3) != 0 => d.gid,
                    _ => make_gid(rng.below(1000) + 1, rng.below(4) as u32),
                };
                ops.push(DocOp::Remove { gid, name });
            } else if !gids.is_empty() && rng.below(5) == 0 {
                // A retried put of a document already written (or since replaced).
                let gid: u64 = gids[rng.below(gids.len() as u64) as usize];
                let d = model.0.values().find(|d| d.gid == gid).cloned();
                if let Some(d) = d {
                    ops.push(DocOp::Put(d));
                }
            } else {
                let gid = make_gid(gids.len() as u64 + 1, rng.below(4) as u32);
                gids.push(gid);
                let sketch = (rng.below(2) == 0).then(|| vec![gid as u8; 8]);
                ops.push(DocOp::Put(info(gid, &name, rng.below(100) as i64, sketch)));
            }
        }
        for op in &ops {
            model.apply(op);
        }
        block_on(node.write_docs(ops)).unwrap();
    };
    for _ in 0..20 {
        round(&node, &mut model, &mut gids);
    }
    check_docs(&node, &model, &gids);
    node.close_without_checkpoint();
    drop(node);
    let node = open(dir.path(), &design);
    check_docs(&node, &model, &gids);
    for _ in 0..10 {
        round(&node, &mut model, &mut gids);
    }
    block_on(node.drop_partition(2)).unwrap();
    model.0.retain(|_, d| gid_partition(d.gid) != 2);
    check_docs(&node, &model, &gids);
    node.shutdown().unwrap();
    drop(node);
    let node = open(dir.path(), &design);
    check_docs(&node, &model, &gids);
    node.shutdown().unwrap();
}

/// One call of thousands of document ops (applied a few hundred at a time, those touching
/// distinct names and gids logged together) ends where the model applying them one at a
/// time ends: puts that replace a name's holder then see its gid gone, removals of a gid a
/// put replaced earlier in the call do nothing, and both survive a restart.
#[test]
fn a_large_call_of_document_ops_applies_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let (mut model, mut rng) = (Docs::default(), SplitMix64::new(5));
    let mut ops = Vec::new();
    let mut issued: Vec<DocInfo> = Vec::new();
    for i in 0..3000u64 {
        let name = format!("https://x/{}", rng.below(40));
        let op = match rng.below(5) {
            // A removal by a gid issued earlier in the call (held, replaced, or never stored).
            0 if !issued.is_empty() => {
                let d = &issued[rng.below(issued.len() as u64) as usize];
                DocOp::Remove { gid: d.gid, name: d.name.clone() }
            }
            // A put again of a document issued earlier, whether it still holds its name.
            1 if !issued.is_empty() => {
                DocOp::Put(issued[rng.below(issued.len() as u64) as usize].clone())
            }
            // A gid issued earlier, under another name: stored only once no name holds it.
            2 if !issued.is_empty() => {
                let d = &issued[rng.below(issued.len() as u64) as usize];
                DocOp::Put(info(d.gid, &name, d.ts_ms, None))
            }
            _ => {
                let d =
                    info(make_gid(i + 1, rng.below(4) as u32), &name, rng.below(50) as i64, None);
                issued.push(d.clone());
                DocOp::Put(d)
            }
        };
        model.apply(&op);
        ops.push(op);
    }
    block_on(node.write_docs(ops)).unwrap();
    let gids: Vec<u64> = issued.iter().map(|d| d.gid).collect();
    check_docs(&node, &model, &gids);
    // A put that replaces a name's holder frees its gid for a later op of the same call.
    let (old, new) = (make_gid(9000, 0), make_gid(9001, 0));
    let first = vec![DocOp::Put(info(old, "a", 1, None))];
    let second = vec![DocOp::Put(info(new, "a", 2, None)), DocOp::Put(info(old, "b", 1, None))];
    for call in [first, second] {
        call.iter().for_each(|op| model.apply(op));
        block_on(node.write_docs(call)).unwrap();
    }
    let got = node.lookup_names(&["a", "b"]).unwrap();
    assert_eq!(
        got.iter().map(|d| d.as_ref().map(|d| d.gid)).collect::<Vec<_>>(),
        [Some(new), Some(old)]
    );
    node.close_without_checkpoint();
    drop(node);
    let node = open(dir.path(), &design);
    check_docs(&node, &model, &gids);
    node.shutdown().unwrap();
}

/// Dropping most of the documents and compacting the table gives its memory back and keeps
/// every other document, across a restart; a paged pass begun before the compaction is
/// refused (its cursor names the old slots) and a new one sees every document once.
#[test]
fn a_compacted_document_table_keeps_the_rest_and_restarts_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let docs: Vec<DocInfo> = (1..=3000u64)
        .map(|seq| {
            let p = if seq % 4 == 0 { 1 } else { 0 };
            info(make_gid(seq, p), &format!("https://c/{seq}"), seq as i64, None)
        })
        .collect();
    block_on(node.write_docs(docs.iter().cloned().map(DocOp::Put).collect())).unwrap();
    let mut want: Vec<DocInfo> =
        docs.iter().filter(|d| gid_partition(d.gid) == 1).cloned().collect();
    want.sort_unstable_by_key(|d| d.gid);
    assert!(!node.compact_docs().unwrap(), "a full table is left alone");
    let first = node.scan_partition_page(1, 0, 10).unwrap();
    let cursor = first.next.expect("more than a page");
    let before = node.stats().document_table_bytes;
    block_on(node.drop_partition(0)).unwrap();
    assert!(node.compact_docs().unwrap());
    let after = node.stats().document_table_bytes;
    assert!(after * 2 < before, "{before} then {after} bytes");
    let e = node.scan_partition_page(1, cursor, 10).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
    let check = |node: &NodeStore| {
        let (mut paged, mut cursor) = (Vec::new(), Some(0));
        while let Some(c) = cursor {
            let page = node.scan_partition_page(1, c, 100).unwrap();
            paged.extend(page.items);
            cursor = page.next;
        }
        paged.sort_unstable_by_key(|d| d.gid);
        assert_eq!(paged, want);
        assert_eq!(node.partition_documents(0), 0);
        let names: Vec<String> = docs.iter().map(|d| d.name.clone()).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        for (d, got) in docs.iter().zip(node.lookup_names(&refs).unwrap()) {
            assert_eq!(got.is_some(), gid_partition(d.gid) == 1, "{}", d.name);
        }
    };
    check(&node);
    node.close_without_checkpoint();
    drop(node);
    let node = open(dir.path(), &design);
    check(&node);
    node.shutdown().unwrap();
    drop(node);
    check(&open(dir.path(), &design));
}

/// A failed sync: the write is not acknowledged, the node stops serving, and a restart
/// recovers everything acknowledged before it.
#[test]
fn a_failed_sync_is_not_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let sled = Arc::new(SledStore::open(&dir.path().join("db"), 8 << 20).unwrap());
    let store = crate::fault_store::FaultyStore::new(sled);
    let node = NodeStore::open_with_store(
        dir.path(),
        store.clone(),
        &design,
        config(),
        ShardMetrics::default(),
    )
    .unwrap();
    let (mut model, mut g) = (Entries::default(), Gen::new(21));
    for _ in 0..3 {
        tablet_round(&node, &mut model, &mut g, 10);
    }
    store.fail_syncs(1);
    let ops = vec![(4, TabletOp::Put { gid: make_gid(99_999, 1), fp: 5 })];
    let e = block_on(node.write_tablets(ops)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
    let mut status = node.watch_status();
    block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            status.wait_for(|s| matches!(s, Status::Failed(m) if m.starts_with("table 4"))),
        )
        .await
        .expect("the node reports the failed sync")
        .unwrap();
    });
    let e = node.probe_tablets(&[(4, 5)], 0, 10).unwrap_err();
    assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
    node.close_without_checkpoint();
    drop((node, store));
    let node = open(dir.path(), &design);
    // The write that was not acknowledged may or may not be there (the sync may have
    // written it before failing); the caller cleans it up, as a router does.
    let gone = vec![(4, TabletOp::Remove { gid: make_gid(99_999, 1), fp: 5 })];
    block_on(node.write_tablets(gone)).unwrap();
    check_tablets(&node, &model, &mut g);
    node.shutdown().unwrap();
}

/// Flips a byte of the last stored run's metadata of table 0, as a disk might.
fn damage_table_0(dir: &Path) {
    let store = SledStore::open(&dir.join("db"), 8 << 20).unwrap();
    let meta = store.space("t0/meta").unwrap().get(b"manifest").unwrap().unwrap();
    let sid = *crate::persist::Manifest::decode(&meta).unwrap().runs.last().unwrap();
    let space = store.space("t0/run_meta").unwrap();
    let key = crate::persist::key64(sid);
    let (k, mut v) = space.scan(&key, &crate::persist::key64(sid + 1)).next().unwrap().unwrap();
    let mid = v.len() / 2;
    v[mid] ^= 0x5A;
    space.put(&k, &v).unwrap();
    store.sync().unwrap();
}

#[test]
fn a_damaged_run_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let design = Design::parse("5c2").unwrap();
    let node = open(dir.path(), &design);
    let (mut model, mut g) = (Entries::default(), Gen::new(4));
    for _ in 0..5 {
        tablet_round(&node, &mut model, &mut g, 10);
    }
    block_on(node.write_docs(vec![DocOp::Put(info(make_gid(1, 0), "d", 1, None))])).unwrap();
    node.shutdown().unwrap();
    drop(node);
    damage_table_0(dir.path());
    let node = open(dir.path(), &design);
    let status = node.watch_status().borrow().clone();
    assert!(matches!(&status, Status::Corrupt(m) if m.starts_with("table 0")), "{status:?}");
    let e = node.probe_tablets(&[(0, 1)], 1, 10).unwrap_err();
    assert_eq!(e.class(), ErrorClass::DataLoss, "{e}");
    let e = block_on(node.write_tablets(vec![(0, TabletOp::Put { gid: 7, fp: 1 })])).unwrap_err();
    assert_eq!(e.class(), ErrorClass::DataLoss, "{e}");
    // The other shards still answer.
    assert_eq!(node.probe_tablets(&[(1, 1)], 1, 10).unwrap().len(), 1);
    assert!(node.lookup_names(&["d"]).unwrap()[0].is_some());
    assert_eq!(node.stats().entries[0], 0, "a damaged table counts as empty");
}

/// The memory of a million documents of design 5c2 on one node: as tablets (ten shards
/// without names plus the documents' shard) and as today's single-node shard. Run with
/// `cargo test -p neardup-server --release -- --ignored --nocapture memory_per_entry`.
#[test]
#[ignore]
fn memory_per_entry_at_a_million_documents() {
    const N: u64 = 1_000_000;
    let design = Design::parse("5c2").unwrap();
    let mut rng = SplitMix64::new(77);
    let docs: Vec<DocInfo> = (1..=N)
        .map(|i| DocInfo {
            gid: make_gid(i, (i % 16) as u32),
            name: format!("https://example.com/page/{i}"),
            fp: rng.next_u64(),
            ts_ms: 1_700_000_000_000 + i as i64,
            cluster: make_gid(i, (i % 16) as u32),
            sketch: None,
        })
        .collect();
    let mut c = NodeStoreConfig { min_free_bytes: 0, ..Default::default() };
    c.shard.checkpoint_ops = u64::MAX;
    let dir = tempfile::tempdir().unwrap();
    let node = NodeStore::open(dir.path(), &design, c.clone(), ShardMetrics::default()).unwrap();
    for chunk in docs.chunks(50_000) {
        let ops: Vec<(u32, TabletOp)> = chunk
            .iter()
            .flat_map(|d| (0..10).map(move |t| (t, TabletOp::Put { gid: d.gid, fp: d.fp })))
            .collect();
        block_on(node.write_tablets(ops)).unwrap();
        block_on(node.write_docs(chunk.iter().cloned().map(DocOp::Put).collect())).unwrap();
    }
    for s in &node.tables {
        s.compact_all().unwrap();
    }
    node.docs.compact_all().unwrap();
    let s = node.stats();
    let entries: u64 = s.entries.iter().sum();
    let table_bytes: u64 = s.table_bytes.iter().sum();
    println!(
        "tablets: {entries} entries, {:.2} bytes/entry; documents: {} at {:.1} bytes/doc; \
         node {:.1} bytes/doc",
        table_bytes as f64 / entries as f64,
        s.documents,
        s.document_bytes as f64 / s.documents as f64,
        s.memory_bytes as f64 / s.documents as f64,
    );
    node.shutdown().unwrap();
    drop(node);
    let dir = tempfile::tempdir().unwrap();
    let shard = one_shard(dir.path(), &c, design);
    for chunk in docs.chunks(50_000) {
        let new: Vec<crate::NewDocument> = chunk
            .iter()
            .map(|d| crate::NewDocument {
                id: d.name.clone(),
                fingerprint: d.fp,
                timestamp_ms: d.ts_ms,
                sketch: None,
            })
            .collect();
        let out = shard.write(&new, &[], false).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
    }
    shard.compact_all().unwrap();
    let st = shard.stats().unwrap();
    let index: u64 = st.index_bytes;
    let table_bytes: u64 = st.tables.iter().map(|t| t.bytes).sum();
    let doc_table = shard.doc_bytes() as u64;
    println!(
        "single shard: index {:.1} bytes/doc ({:.2} bytes/entry in its 10 tables), \
         document table {:.1} bytes/doc, total {:.1} bytes/doc",
        index as f64 / N as f64,
        table_bytes as f64 / (10 * N) as f64,
        doc_table as f64 / N as f64,
        (index + doc_table) as f64 / N as f64,
    );
    shard.shutdown().unwrap();
}

/// A single-node shard of `design` in `dir`, with the shard settings of `c`, recovered.
fn one_shard(dir: &Path, c: &NodeStoreConfig, design: Design) -> Arc<Shard> {
    let mut sc = c.shard.clone();
    sc.index.design = design;
    sc.min_free_bytes = 0;
    let shard = Shard::open(dir, sc, ShardMetrics::default()).unwrap();
    shard.recover().unwrap();
    shard
}

/// Prints the time of a query's probes on a node's tables (as a router sends them: each
/// table's tablet probed for a batch of queries) against the same queries on one shard
/// holding the same documents, both in process on one thread; and the time each took to
/// load them.
/// `cargo test --release -p neardup-server --lib probe_cost_against_one_shard -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: run in release with --ignored --nocapture"]
fn probe_cost_against_one_shard() {
    const N: u64 = 1_000_000;
    const Q: usize = 100_000;
    let design = Design::parse("5c2").unwrap();
    let mut rng = SplitMix64::new(78);
    let fps: Vec<u64> = (0..N).map(|_| rng.next_u64()).collect();
    // Queries: half near a stored fingerprint (2 bits flipped), half random.
    let queries: Vec<u64> = (0..Q)
        .map(|i| {
            let r = rng.next_u64();
            if i % 2 == 0 { fps[(r % N) as usize] ^ (1 << (r >> 58)) ^ (1 << 3) } else { r }
        })
        .collect();
    let mut c = NodeStoreConfig { min_free_bytes: 0, ..Default::default() };
    c.shard.checkpoint_ops = u64::MAX;
    let dir = tempfile::tempdir().unwrap();
    let node = NodeStore::open(dir.path(), &design, c.clone(), ShardMetrics::default()).unwrap();
    let loading = std::time::Instant::now();
    for (n, chunk) in fps.chunks(50_000).enumerate() {
        let ops: Vec<(u32, TabletOp)> = chunk
            .iter()
            .enumerate()
            .flat_map(|(i, &fp)| {
                let gid = make_gid((n * 50_000 + i + 1) as u64, 0);
                (0..10).map(move |t| (t, TabletOp::Put { gid, fp }))
            })
            .collect();
        block_on(node.write_tablets(ops)).unwrap();
    }
    let node_load = loading.elapsed().as_secs_f64();
    for s in &node.tables {
        s.compact_all().unwrap();
    }
    let tables = design.tables_for_k(3);
    let mut hits = 0usize;
    let started = std::time::Instant::now();
    for batch in queries.chunks(1000) {
        let probes: Vec<(u32, u64)> =
            batch.iter().flat_map(|&q| tables.iter().map(move |&t| (t as u32, q))).collect();
        hits +=
            node.probe_tablets(&probes, 3, 100).unwrap().iter().map(|h| h.0.len()).sum::<usize>();
    }
    let node_ns = started.elapsed().as_nanos() as f64 / Q as f64;
    node.shutdown().unwrap();
    drop(node);
    let dir = tempfile::tempdir().unwrap();
    let shard = one_shard(dir.path(), &c, design);
    let loading = std::time::Instant::now();
    for (n, chunk) in fps.chunks(50_000).enumerate() {
        let new: Vec<crate::NewDocument> = chunk
            .iter()
            .enumerate()
            .map(|(i, &fp)| crate::NewDocument {
                id: format!("d{}", n * 50_000 + i),
                fingerprint: fp,
                timestamp_ms: 1,
                sketch: None,
            })
            .collect();
        let out = shard.write(&new, &[], false).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
    }
    let shard_load = loading.elapsed().as_secs_f64();
    shard.compact_all().unwrap();
    let mut found = 0usize;
    let started = std::time::Instant::now();
    for batch in queries.chunks(1000) {
        found += shard.probe(batch, 3, 100).unwrap().iter().map(|h| h.matches.len()).sum::<usize>();
    }
    let shard_ns = started.elapsed().as_nanos() as f64 / Q as f64;
    println!(
        "{Q} queries at k = 3 over {N} documents (5c2), one thread: node tablets {node_ns:.0} ns \
         a query ({hits} table hits), one shard {shard_ns:.0} ns a query ({found} matches): \
         {:.2}x; loading them (batches of 50,000, each durable): node tablets {node_load:.2} s, \
         one shard {shard_load:.2} s: {:.2}x",
        node_ns / shard_ns,
        node_load / shard_load
    );
    shard.shutdown().unwrap();
}
