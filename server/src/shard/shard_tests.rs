//! The shard against a plain model: writes, replacements, deletes, admissions, and restarts
//! with and without checkpoints, snapshots and damaged data.

use std::collections::BTreeMap;

use neardup_core::util::SplitMix64;

use super::*;
use crate::ErrorClass;
use crate::persist::key64;

pub(super) fn config() -> ShardConfig {
    let mut c = ShardConfig::default();
    c.index.buffer_docs = 64;
    c.checkpoint_ops = 200;
    c.checkpoint_interval = Duration::from_secs(3600);
    c.idle_flush = Duration::from_secs(3600);
    c.snapshot_log_bytes = u64::MAX;
    c.max_record_bytes = 2048;
    // Rebuild the index as one run often, so tests cover it among everything else.
    c.max_runs = 3;
    c.min_free_bytes = 0;
    c.cache_bytes = 8 << 20;
    c
}

fn open(dir: &Path, c: ShardConfig) -> Arc<Shard> {
    let s = Shard::open(dir, c, ShardMetrics::default()).unwrap();
    s.recover().unwrap();
    s
}

/// Writes and waits until the log holds it.
fn durable_write(shard: &Shard, docs: &[NewDocument], dels: &[String]) -> WriteOutcome {
    let out = shard.write(docs, dels, false).unwrap();
    shard.wait_durable_blocking(out.seq).unwrap();
    out
}

/// Opens the shard in `dir` again, checks every answer, and shuts it down cleanly.
fn restart_and_check(dir: &Path, model: &Model, queries: &[u64]) {
    let shard = open(dir, config());
    check(&shard, model, queries);
    shard.shutdown().unwrap();
}

pub(super) fn doc(name: &str, fp: u64, ts: i64) -> NewDocument {
    NewDocument { id: name.into(), fingerprint: fp, timestamp_ms: ts, sketch: None }
}

/// The truth: name -> (fp, ts).
#[derive(Default, Clone)]
struct Model(BTreeMap<String, (u64, i64)>);

impl Model {
    fn query(&self, q: u64, k: u32) -> Vec<(String, u32)> {
        let mut v: Vec<(u32, i64, String)> = self
            .0
            .iter()
            .filter(|(_, (fp, _))| (fp ^ q).count_ones() <= k)
            .map(|(n, (fp, ts))| ((fp ^ q).count_ones(), *ts, n.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(d, _, n)| (n, d)).collect()
    }
}

/// Compares every answer's (name, distance) set with the model (ties in the order may
/// differ only among equal distance and timestamp, so compare sorted). Twice: with a limit
/// no answer reaches (a query at a time), and with a small one (the batch in slices spread
/// over the cores), where an answer the limit cuts holds the limit's worth of the nearest.
fn check(shard: &Shard, model: &Model, queries: &[u64]) {
    for limit in [100_000, 2] {
        let got = shard.probe(queries, 3, limit).unwrap();
        assert_eq!(got.len(), queries.len());
        for (q, r) in queries.iter().zip(got) {
            let mut g: Vec<(String, u32)> =
                r.matches.iter().map(|m| (m.id.clone(), m.distance)).collect();
            let mut w = model.query(*q, 3);
            assert_eq!(r.fingerprint, *q);
            assert_eq!(r.truncated, w.len() > limit, "query {q:#x}");
            if w.len() > limit {
                // Cut: the nearest `limit`, in order of distance.
                let distances = |v: &[(String, u32)]| v.iter().map(|m| m.1).collect::<Vec<_>>();
                assert_eq!(distances(&g), distances(&w[..limit]), "query {q:#x}");
                continue;
            }
            g.sort();
            w.sort();
            assert_eq!(g, w, "query {q:#x}, limit {limit}");
        }
    }
    assert_eq!(shard.stats().unwrap().documents as usize, model.0.len());
}

/// A workload: random fingerprints, some near-copies, replacements and deletes.
fn workload(shard: &Shard, model: &mut Model, rng: &mut SplitMix64, rounds: usize) -> Vec<u64> {
    let mut queries = Vec::new();
    for round in 0..rounds {
        let mut docs = Vec::new();
        for _ in 0..1 + rng.below(40) {
            let name = format!("https://example.org/{}", rng.below(600));
            let fp = match model.0.values().nth(rng.below(model.0.len().max(1) as u64) as usize) {
                Some((f, _)) if rng.below(3) == 0 => {
                    let n = rng.below(4) as u32;
                    rng.flip_bits(*f, n)
                }
                _ => rng.next_u64(),
            };
            docs.push(doc(&name, fp, rng.below(1000) as i64));
        }
        durable_write(shard, &docs, &[]);
        for d in &docs {
            model.0.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
            let n = rng.below(5) as u32;
            queries.push(rng.flip_bits(d.fingerprint, n));
        }
        if round % 3 == 0 {
            let dels: Vec<String> =
                (0..3).map(|_| format!("https://example.org/{}", rng.below(600))).collect();
            let mut dels = dels;
            dels.sort();
            dels.dedup();
            let out = durable_write(shard, &[], &dels);
            let mut n = 0;
            for d in &dels {
                n += u64::from(model.0.remove(d).is_some());
            }
            assert_eq!(out.deleted, n);
            assert_eq!(out.missing.len() as u64, dels.len() as u64 - n);
        }
        if round % 7 == 0 {
            shard.maintain_once().unwrap();
        }
    }
    queries.extend((0..50).map(|_| rng.next_u64()));
    queries
}

#[test]
fn writes_replacements_and_deletes_match_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let shard = open(dir.path(), config());
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(1));
    let queries = workload(&shard, &mut model, &mut rng, 120);
    check(&shard, &model, &queries);
    // Rebuilt as one run: the same answers.
    shard.compact_all().unwrap();
    assert_eq!(shard.stats().unwrap().runs, 1);
    // Named as the configuration names it.
    assert_eq!(shard.stats().unwrap().design, "paper-10 (5c2)");
    check(&shard, &model, &queries);
    // Re-inserting an id replaces it: one document, the new fingerprint.
    let out = shard.write(&[doc("x", 1, 0), doc("x", 2, 0)], &[], false).unwrap();
    assert_eq!((out.inserted, out.replaced), (1, 0), "the last of a batch wins");
    let out = shard.write(&[doc("x", 3, 5)], &[], false).unwrap();
    assert_eq!((out.inserted, out.replaced), (1, 1));
    model.0.insert("x".into(), (3, 5));
    check(&shard, &model, &[1, 2, 3]);
    shard.shutdown().unwrap();
}

#[test]
fn bad_writes_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shard = open(dir.path(), config());
    durable_write(&shard, &[doc("a", 10, 0)], &[]);
    let before = shard.stats().unwrap();
    let long = "u".repeat(1025);
    let errors = [
        shard.write(&[doc("", 1, 0)], &[], false).unwrap_err(),
        shard.write(&[doc("b", 1, 0), doc(&long, 1, 0)], &[], false).unwrap_err(),
        shard.write(&[], &["a".into(), "nope".into()], true).unwrap_err(),
        shard.write(&[doc("a", 1, 0)], &["a".into()], false).unwrap_err(),
        shard.probe(&[1], 4, 10).unwrap_err(),
        shard.admit(&doc("", 1, 0), 3, Verify::OFF, 10, false).unwrap_err(),
    ];
    let classes: Vec<ErrorClass> = errors.iter().map(|e| e.class()).collect();
    use ErrorClass::*;
    assert_eq!(
        classes,
        [InvalidInput, InvalidInput, NotFound, InvalidInput, InvalidInput, InvalidInput]
    );
    let after = shard.stats().unwrap();
    assert_eq!((before.documents, before.wal_bytes), (after.documents, after.wal_bytes));
    assert_eq!(shard.probe(&[10], 0, 10).unwrap()[0].matches[0].id, "a");
    assert!(shard.probe(&[1], 0, 10).unwrap()[0].matches.is_empty(), "b was not stored");
    shard.shutdown().unwrap();
}

#[test]
fn admission_attaches_to_the_earliest_near_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let shard = open(dir.path(), config());
    let base = 0xABCD_0000_1234_0000u64;
    let (a, _) = shard.admit(&doc("a", base, 100), 3, Verify::OFF, 10, false).unwrap();
    assert!(!a.duplicate && a.inserted);
    assert_eq!(a.original_id, "a");
    // Far away: a cluster of its own.
    let (z, _) = shard.admit(&doc("z", !base, 50), 3, Verify::OFF, 10, false).unwrap();
    assert_ne!(z.cluster_id, a.cluster_id);
    // b is 2 bits from a and earlier: still joins a's cluster (a is the only near one).
    let (b, _) = shard.admit(&doc("b", base ^ 0b11, 10), 3, Verify::OFF, 10, false).unwrap();
    assert!(b.duplicate && b.inserted);
    assert_eq!((b.cluster_id, b.original_id.as_str()), (a.cluster_id, "a"));
    // c is near both; b is the earliest, so c joins b's cluster, whose original is a (b was
    // reported a duplicate: it is never named an original).
    let (c, _) = shard.admit(&doc("c", base ^ 0b101, 500), 3, Verify::OFF, 10, true).unwrap();
    assert!(c.duplicate && !c.inserted, "skip_insert_if_duplicate");
    assert_eq!((c.cluster_id, c.original_id.as_str()), (a.cluster_id, "a"));
    assert_eq!(c.matches.len(), 2);
    assert_eq!(shard.stats().unwrap().documents, 3);
    // Re-admitting a with the same content does not find itself.
    let (a2, _) = shard.admit(&doc("a", base, 100), 3, Verify::OFF, 1, false).unwrap();
    assert!(a2.duplicate && a2.replaced && !a2.truncated);
    // Its cluster's founder is the document this write replaces: no longer stored.
    assert_eq!(a2.original_id, "");
    let m = &shard.probe(&[base], 0, 10).unwrap()[0].matches;
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].cluster_id, a.cluster_id);
    shard.shutdown().unwrap();
}

#[test]
fn restarts_recover_everything_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(7));
    let mut queries = Vec::new();
    // Clean shutdowns, crash-like stops, document snapshots and log truncation in turn.
    for life in 0..6 {
        let mut c = config();
        if life % 2 == 1 {
            c.snapshot_log_bytes = 4096;
        }
        let shard = open(dir.path(), c);
        check(&shard, &model, &queries);
        queries.extend(workload(&shard, &mut model, &mut rng, 60));
        check(&shard, &model, &queries);
        if life % 3 == 2 {
            shard.close_without_checkpoint();
        } else {
            shard.shutdown().unwrap();
        }
    }
    restart_and_check(dir.path(), &model, &queries);
}

/// Deletions replayed from the log into stored runs after a crash are not yet stored
/// themselves: the next checkpoint must write them before its manifest passes their records.
#[test]
fn deletions_replayed_after_a_crash_survive_the_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model::default();
    let mut rng = SplitMix64::new(11);
    let shard = open(dir.path(), config());
    for batch in 0..4 {
        let docs: Vec<NewDocument> = (0..50)
            .map(|i| doc(&format!("d{}", batch * 50 + i), rng.next_u64(), i as i64))
            .collect();
        durable_write(&shard, &docs, &[]);
        for d in &docs {
            model.0.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
        }
    }
    shard.checkpoint().unwrap();
    // Replacements and deletes of stored documents, in the log only, then a crash.
    let docs: Vec<NewDocument> =
        (0..30).map(|i| doc(&format!("d{}", i * 3), rng.next_u64(), 7)).collect();
    durable_write(&shard, &docs, &[]);
    let dels: Vec<String> = (0..20).map(|i| format!("d{}", 101 + i * 2)).collect();
    durable_write(&shard, &[], &dels);
    for d in &docs {
        model.0.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
    }
    for d in &dels {
        model.0.remove(d);
    }
    let mut queries: Vec<u64> = model.0.values().map(|(fp, _)| rng.flip_bits(*fp, 1)).collect();
    queries.extend(docs.iter().map(|d| d.fingerprint));
    shard.close_without_checkpoint();
    drop(shard);
    // Recovery replays them; a clean shutdown checkpoints; the next start must agree.
    restart_and_check(dir.path(), &model, &queries);
    restart_and_check(dir.path(), &model, &queries);
}

/// Damages stored runs through the storage layer, as a disk might.
fn damage(dir: &Path, what: &str) {
    let store = SledStore::open(&dir.join("db"), 8 << 20).unwrap();
    let manifest =
        Manifest::decode(&store.space("meta").unwrap().get(b"manifest").unwrap().unwrap()).unwrap();
    let sid = *manifest.runs.last().unwrap();
    let space = match what {
        "table" => store.space("run_blocks").unwrap(),
        _ => store.space("run_meta").unwrap(),
    };
    let (k, mut v) = space.scan(&key64(sid), &key64(sid + 1)).next().unwrap().unwrap();
    let mid = v.len() / 2;
    v[mid] ^= 0x5A;
    space.put(&k, &v).unwrap();
    store.sync().unwrap();
}

#[test]
fn damaged_tables_are_rebuilt_and_damaged_runs_are_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(3));
    let shard = open(dir.path(), config());
    let queries = workload(&shard, &mut model, &mut rng, 40);
    shard.shutdown().unwrap();
    drop(shard);
    damage(dir.path(), "table");
    let metrics = ShardMetrics::default();
    let shard = Shard::open(dir.path(), config(), metrics).unwrap();
    shard.recover().unwrap();
    check(&shard, &model, &queries);
    shard.shutdown().unwrap();
    drop(shard);
    // Rewritten on recovery: a clean start now, same answers.
    restart_and_check(dir.path(), &model, &queries);
    damage(dir.path(), "meta");
    let shard = Shard::open(dir.path(), config(), ShardMetrics::default()).unwrap();
    let err = shard.recover().unwrap_err();
    assert_eq!(err.class(), ErrorClass::DataLoss, "{err}");
    assert!(matches!(shard.status(), Status::Corrupt(_)));
    assert_eq!(shard.probe(&queries[..1], 3, 10).unwrap_err().class(), ErrorClass::DataLoss);
    assert_eq!(
        shard.write(&[doc("n", 1, 1)], &[], false).unwrap_err().class(),
        ErrorClass::DataLoss
    );
}

/// Only the configured number of tables is written; the others are rebuilt when the run is
/// loaded, quietly (they are not damage), and a larger setting later uses what is there.
#[test]
fn runs_store_only_the_configured_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(5));
    let mut c = config();
    c.stored_tables = 2;
    let shard = open(dir.path(), c.clone());
    let queries = workload(&shard, &mut model, &mut rng, 40);
    shard.shutdown().unwrap();
    drop(shard);
    let tables_stored = || {
        let store = SledStore::open(&dir.path().join("db"), 8 << 20).unwrap();
        let space = store.space("run_tables").unwrap();
        let mut per_run: BTreeMap<u64, Vec<u16>> = BTreeMap::new();
        for e in space.scan(&[], &[0xFF; 16]) {
            let (k, _) = e.unwrap();
            let sid = u64::from_be_bytes(k[..8].try_into().unwrap());
            per_run.entry(sid).or_default().push(u16::from_be_bytes([k[8], k[9]]));
        }
        per_run
    };
    let stored = tables_stored();
    assert!(!stored.is_empty());
    assert!(stored.values().all(|t| t == &[0, 1]), "{stored:?}");
    let metrics = ShardMetrics::default();
    let shard = Shard::open(dir.path(), c.clone(), metrics).unwrap();
    shard.recover().unwrap();
    check(&shard, &model, &queries);
    shard.close_without_checkpoint();
    drop(shard);
    assert_eq!(tables_stored(), stored, "tables not stored are not damage: none rewritten");
    // One table stored, then all of them: the same answers each time.
    for n in [1, 100] {
        c.stored_tables = n;
        let shard = open(dir.path(), c.clone());
        check(&shard, &model, &queries);
        durable_write(&shard, &[doc("https://more", 42, 9)], &[]);
        model.0.insert("https://more".into(), (42, 9));
        shard.shutdown().unwrap();
    }
    restart_and_check(dir.path(), &model, &queries);
}

/// A trickle of writes after a large run is not a reason to rewrite it: the idle compaction
/// waits until the other runs hold a share of the largest.
#[test]
fn idle_compaction_waits_for_a_share_of_the_largest_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config();
    // Each write stays in the buffer until the idle flush makes it one run.
    c.index.buffer_docs = 4096;
    c.max_runs = 1000;
    c.index.max_runs = 1000;
    c.index.merge_fanout = 1000;
    c.idle_flush = Duration::ZERO;
    c.compact_idle = Duration::ZERO;
    let shard = open(dir.path(), c);
    let runs = || {
        // Twice: a round compacts before it flushes the buffer.
        shard.maintain_once().unwrap();
        shard.maintain_once().unwrap();
        shard.state.read().index.runs().len()
    };
    let spread = |i: u64, k: u64| i.wrapping_mul(k);
    let big: Vec<_> =
        (0..800u64).map(|i| doc(&format!("b{i}"), spread(i, 0x9E37_79B9_7F4A_7C15), 1)).collect();
    durable_write(&shard, &big, &[]);
    assert_eq!(runs(), 1);
    durable_write(&shard, &[doc("small", 7, 1)], &[]);
    assert_eq!(runs(), 2, "one document does not rewrite 800");
    let more: Vec<_> =
        (0..100u64).map(|i| doc(&format!("m{i}"), spread(i, 0xD1B5_4A32_D192_ED03), 1)).collect();
    durable_write(&shard, &more, &[]);
    assert_eq!(runs(), 1, "an eighth of the largest: compacted");
}

#[test]
fn unusable_data_directories_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = Shard::open(&file, config(), ShardMetrics::default()).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    let e = Shard::open(&file.join("below"), config(), ShardMetrics::default()).unwrap_err();
    assert!(e.to_string().contains("cannot be created"), "{e}");
    let mut c = config();
    c.min_free_bytes = u64::MAX;
    let e = Shard::open(&dir.path().join("d"), c, ShardMetrics::default()).unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
}

#[test]
fn idle_compaction_merges_every_run_and_keeps_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config();
    // No full rebuilds and no tiered merges: only the idle compaction may merge runs.
    c.max_runs = 1000;
    c.index.max_runs = 1000;
    c.index.merge_fanout = 1000;
    c.compact_idle = Duration::from_secs(3600);
    let shard = open(dir.path(), c.clone());
    let mut model = Model::default();
    let mut rng = SplitMix64::new(77);
    let queries = workload(&shard, &mut model, &mut rng, 40);
    shard.maintain_once().unwrap();
    assert!(shard.state.read().index.runs().len() > 1, "the workload leaves several runs");
    check(&shard, &model, &queries);
    shard.shutdown().unwrap();
    drop(shard);
    // Reopened with no idle time required: one maintenance round compacts everything.
    c.compact_idle = Duration::ZERO;
    let shard = open(dir.path(), c);
    let before = shard.state.read().index.runs().len();
    assert!(before > 1, "recovery keeps the runs ({before})");
    shard.maintain_once().unwrap();
    assert_eq!(shard.state.read().index.runs().len(), 1);
    check(&shard, &model, &queries);
    // And it survives a restart.
    shard.shutdown().unwrap();
    drop(shard);
    let shard = open(dir.path(), config());
    check(&shard, &model, &queries);
}

/// A shard in `dir` whose writes are quiet at once, and for which neither the operation
/// count nor the interval asks for a checkpoint; and 20 documents for it, fewer than its
/// buffer holds (one run after the idle flush, so no compaction, which checkpoints too).
fn quiet_shard(dir: &Path) -> (Arc<Shard>, Vec<NewDocument>) {
    let mut c = config();
    c.checkpoint_ops = u64::MAX;
    c.idle_flush = Duration::ZERO;
    c.compact_idle = Duration::ZERO;
    let docs = (0..20u64)
        .map(|i| doc(&format!("https://q/{i}"), i.wrapping_mul(0x9E37_79B9_7F4A_7C15), 1))
        .collect();
    (open(dir, c), docs)
}

#[test]
fn quiet_writes_are_checkpointed_without_waiting_for_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, docs) = quiet_shard(dir.path());
    let mut model = Model::default();
    durable_write(&shard, &docs, &[]);
    for d in &docs {
        model.0.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
    }
    assert!(shard.stats().unwrap().checkpoint_pending);
    shard.maintain_once().unwrap();
    assert_eq!(shard.state.read().index.runs().len(), 1);
    assert!(!shard.stats().unwrap().checkpoint_pending, "a quiet shard stores its index");
    let queries: Vec<u64> = docs.iter().map(|d| d.fingerprint ^ 0b11).collect();
    check(&shard, &model, &queries);
}

/// Writes that end in removes leave nothing buffered, yet the log holds records past what the
/// last checkpoint covers: a quiet shard stores those too, so its stats settle and a restart
/// replays nothing.
#[test]
fn a_quiet_tail_of_removes_is_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, docs) = quiet_shard(dir.path());
    let mut model = Model::default();
    durable_write(&shard, &docs, &[]);
    shard.maintain_once().unwrap();
    assert!(!shard.stats().unwrap().checkpoint_pending);
    let gone: Vec<String> = docs[..5].iter().map(|d| d.id.clone()).collect();
    durable_write(&shard, &[], &gone);
    for d in &docs[5..] {
        model.0.insert(d.id.clone(), (d.fingerprint, d.timestamp_ms));
    }
    assert!(shard.stats().unwrap().checkpoint_pending);
    shard.maintain_once().unwrap();
    assert!(!shard.stats().unwrap().checkpoint_pending, "the removes are stored");
    let queries: Vec<u64> = docs.iter().map(|d| d.fingerprint ^ 0b101).collect();
    check(&shard, &model, &queries);
    shard.close_without_checkpoint();
    drop(shard);
    restart_and_check(dir.path(), &model, &queries);
}

/// A rebuilt index numbers its runs afresh, so a run id alone could name a run stored from
/// the old index: the checkpoint after a rebuild stores the new run and drops the old one.
#[test]
fn the_checkpoint_after_a_rebuild_stores_the_rebuilt_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config();
    c.max_runs = 1000;
    let shard = open(dir.path(), c);
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(5));
    let queries = workload(&shard, &mut model, &mut rng, 30);
    let run_id = || shard.state.read().index.runs()[0].id();
    shard.compact_all().unwrap();
    shard.checkpoint().unwrap();
    let (first_id, first_sids) = (run_id(), persist::stored_run_ids(&shard.spaces).unwrap());
    assert_eq!(first_sids.len(), 1);
    shard.compact_all().unwrap();
    assert_eq!(run_id(), first_id, "each rebuilt index numbers its runs from the start");
    assert!(shard.stats().unwrap().checkpoint_pending);
    shard.checkpoint().unwrap();
    assert!(!shard.stats().unwrap().checkpoint_pending);
    let sids = persist::stored_run_ids(&shard.spaces).unwrap();
    assert_eq!(sids.len(), 1, "{sids:?}");
    assert_ne!(sids, first_sids, "stored anew, the old run removed");
    check(&shard, &model, &queries);
    shard.close_without_checkpoint();
    drop(shard);
    restart_and_check(dir.path(), &model, &queries);
}

/// A batch whose every query finds every document (10,000 copies of one page, asked 200
/// times with the largest limit) is held to the budget: queries are served in order, the
/// matches stop where the budget does, and every result past it says `truncated`.
#[test]
fn probe_answers_are_held_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let shard = open(dir.path(), config());
    let fp = 0xABCD_EF01_2345_6789;
    let docs: Vec<NewDocument> = (0..10_000).map(|i| doc(&format!("page-{i:05}"), fp, i)).collect();
    for chunk in docs.chunks(1000) {
        durable_write(&shard, chunk, &[]);
    }
    let queries = vec![fp; 200];
    // Each match counts its id (10 bytes) and 40: 50 bytes.
    for budget in [
        ProbeBudget { max_matches: 25_000, max_bytes: usize::MAX },
        ProbeBudget { max_matches: usize::MAX, max_bytes: 25_000 * 50 },
    ] {
        let got = shard.probe_within(&queries, 0, 10_000, budget).unwrap();
        assert_eq!(got.len(), 200);
        let counts: Vec<usize> = got.iter().map(|r| r.matches.len()).collect();
        assert_eq!(&counts[..4], [10_000, 10_000, 5_000, 0], "{budget:?}");
        assert!(counts[3..].iter().all(|&c| c == 0));
        assert!(!got[0].truncated && !got[1].truncated);
        assert!(got[2..].iter().all(|r| r.truncated), "every result past the budget says so");
        // Within the budget, the answer is the exact one: by timestamp among equals.
        assert_eq!(got[2].matches[4_999].id, "page-04999");
    }
    // The default budget: 3 MiB of 50-byte matches come before 100,000 of them.
    let got = shard.probe(&queries, 0, 10_000).unwrap();
    assert_eq!(got.iter().map(|r| r.matches.len()).sum::<usize>(), (3 << 20) / 50);
    shard.shutdown().unwrap();
}

/// The original of a cluster is the document that founded it: a page admitted later with an
/// earlier timestamp joins as a duplicate and is never named an original afterwards.
#[test]
fn a_duplicate_is_never_named_an_original() {
    let dir = tempfile::tempdir().unwrap();
    let shard = open(dir.path(), config());
    let admit = |name: &str, fp: u64, ts: i64| {
        shard.admit(&doc(name, fp, ts), 3, Verify::OFF, 10, false).unwrap().0
    };
    let a = admit("a", 0xF00D, 2000);
    assert!(!a.duplicate);
    let b = admit("b", 0xF00D, 1000);
    assert!(b.duplicate);
    assert_eq!(b.original_id, "a");
    let c = admit("c", 0xF00D ^ 1, 3000);
    assert_eq!((c.original_id.as_str(), c.cluster_id), ("a", a.cluster_id), "not b");

    // Seeded sequences of near-duplicates in random time order: no document reported a
    // duplicate is named as an original later.
    let mut rng = SplitMix64::new(7);
    let mut duplicates = std::collections::HashSet::new();
    for i in 0..400 {
        let fp = 0xBEEF_0000 ^ (1u64 << (rng.next_u64() % 3)) ^ ((rng.next_u64() % 4) << 40);
        let name = format!("p{i}");
        let r = admit(&name, fp, (rng.next_u64() % 10_000) as i64);
        if r.duplicate {
            assert!(
                !duplicates.contains(&r.original_id),
                "{} named original of {name}",
                r.original_id
            );
            duplicates.insert(name);
        } else {
            assert_eq!(r.original_id, name);
        }
    }
    // A deleted founder leaves its cluster without a stored original.
    durable_write(&shard, &[], &["a".to_string()]);
    let d = admit("d", 0xF00D, 4000);
    assert!(d.duplicate);
    assert_eq!((d.original_id.as_str(), d.cluster_id), ("", a.cluster_id));
    shard.shutdown().unwrap();
}

/// Admissions racing with writes, replacements and deletes decide on exactly the documents
/// stored when they decide: each admission stores its document under the write lock at its
/// log sequence, and its matches equal a brute-force scan over the documents live just
/// before that sequence. Both ways of catching up under the write lock run: from the
/// documents stored since the admission's query, and by querying again when more were
/// stored than the shard remembers.
#[test]
fn admissions_racing_writes_see_exactly_the_documents_stored_before_them() {
    #[derive(Clone)]
    enum Event {
        Put(String, u64),
        Delete(String),
    }
    let dir = tempfile::tempdir().unwrap();
    let mut c = config();
    c.index.buffer_docs = 16;
    let shard = open(dir.path(), c);
    let centers = [0x0123_4567_89AB_CDEFu64, 0xFEDC_BA98_7654_3210, 0x0F0F_F0F0_0F0F_F0F0];
    let near = |r: &mut SplitMix64| {
        let c = centers[r.below(centers.len() as u64) as usize];
        let flips = r.below(4) as u32;
        r.flip_bits(c, flips)
    };
    let history = parking_lot::Mutex::new(Vec::<(u64, Event)>::new());
    let decided = parking_lot::Mutex::new(Vec::<(u64, u64, Vec<(String, u64)>)>::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut r = SplitMix64::new(11);
            for i in 0..3000u64 {
                if i % 4 == 3 {
                    let name = format!("w{}", r.below(60));
                    let out = shard.write(&[], std::slice::from_ref(&name), false).unwrap();
                    if out.deleted > 0 {
                        history.lock().push((out.seq, Event::Delete(name)));
                    }
                } else {
                    // Names repeat: many writes replace a document.
                    let name = format!("w{}", r.below(60));
                    let fp = near(&mut r);
                    let out = shard.write(&[doc(&name, fp, i as i64)], &[], false).unwrap();
                    history.lock().push((out.seq, Event::Put(name, fp)));
                }
            }
        });
        for t in 0..2u64 {
            let (history, decided, shard) = (&history, &decided, &shard);
            s.spawn(move || {
                let mut r = SplitMix64::new(100 + t);
                for j in 0..400 {
                    let name = format!("a{t}-{j}");
                    let fp = near(&mut r);
                    let (a, seq) = shard
                        .admit(&doc(&name, fp, j as i64), 3, Verify::OFF, 1000, false)
                        .unwrap();
                    assert!(a.inserted && !a.truncated);
                    let got = a.matches.iter().map(|m| (m.id.clone(), m.fingerprint)).collect();
                    history.lock().push((seq, Event::Put(name, fp)));
                    decided.lock().push((seq, fp, got));
                }
            });
        }
    });
    let mut history = history.into_inner();
    history.sort_by_key(|(seq, _)| *seq);
    let mut decided = decided.into_inner();
    decided.sort_by_key(|(seq, ..)| *seq);
    let mut live: BTreeMap<String, u64> = BTreeMap::new();
    let mut h = history.iter().peekable();
    for (seq, fp, got) in &decided {
        while let Some((_, e)) = h.next_if(|(s, _)| s < seq) {
            match e {
                Event::Put(name, fp) => live.insert(name.clone(), *fp),
                Event::Delete(name) => live.remove(name),
            };
        }
        let mut want: Vec<(String, u64)> = live
            .iter()
            .filter(|(_, f)| (**f ^ fp).count_ones() <= 3)
            .map(|(n, f)| (n.clone(), *f))
            .collect();
        want.sort();
        let mut got = got.clone();
        got.sort();
        assert_eq!(got, want, "admission at sequence {seq}");
    }
    let (delta, again) = &shard.admissions_by_delta;
    let (delta, again) = (
        delta.load(std::sync::atomic::Ordering::Relaxed),
        again.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!(
        "{} admissions checked: {delta} caught up from the recent documents, {again} queried again",
        decided.len()
    );
    assert!(delta > 0, "no admission caught up from the recent documents");
    shard.shutdown().unwrap();
}

/// Full write buffers are built into runs by the sealing thread, off the write lock:
/// answers stay exact while frozen buffers wait, and checkpoints taken meanwhile (covering
/// only what the runs hold) recover everything after a crash.
#[test]
fn frozen_buffers_are_sealed_off_the_lock_and_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, mut rng) = (Model::default(), SplitMix64::new(11));
    let shard = open(dir.path(), config());
    let mut queries = Vec::new();
    for _ in 0..8 {
        queries.extend(workload(&shard, &mut model, &mut rng, 30));
        check(&shard, &model, &queries);
        shard.checkpoint().unwrap();
    }
    let sealed = shard.sealed_off_lock.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sealed > 0, "no run was sealed off the write lock");
    shard.close_without_checkpoint();
    drop(shard);
    restart_and_check(dir.path(), &model, &queries);
}
