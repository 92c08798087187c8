//! Exactness of the index against brute force, on uniform, clustered and crowded-prefix
//! data, for every k up to the design's, with inserts, deletes and merges interleaved.

use super::*;
use crate::codec::{BlockSearch, Codec, Layout};
use crate::util::SplitMix64;

/// Ground truth: a plain list of live documents.
#[derive(Default)]
struct Model {
    docs: Vec<Doc>,
}

impl Model {
    fn query(&self, q: u64, k: u32) -> Vec<Match> {
        let mut v: Vec<Match> = self
            .docs
            .iter()
            .filter(|d| (d.fp ^ q).count_ones() <= k)
            .map(|d| Match { id: d.id, fp: d.fp, distance: (d.fp ^ q).count_ones(), ts: d.ts })
            .collect();
        v.sort_unstable_by_key(|m| (m.distance, m.ts, m.id));
        v
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    Uniform,
    Clustered,
    CrowdedPrefix,
}

struct Gen {
    rng: SplitMix64,
    shape: Shape,
    centers: Vec<u64>,
    next_id: u64,
}

impl Gen {
    fn new(seed: u64, shape: Shape) -> Gen {
        let mut rng = SplitMix64::new(seed);
        let centers = (0..20).map(|_| rng.next_u64()).collect();
        Gen { rng, shape, centers, next_id: 1 }
    }

    fn fp(&mut self) -> u64 {
        match self.shape {
            Shape::Uniform => self.rng.next_u64(),
            Shape::Clustered => {
                let c = self.centers[self.rng.below(self.centers.len() as u64) as usize];
                let flips = self.rng.below(7) as u32;
                self.rng.flip_bits(c, flips)
            }
            Shape::CrowdedPrefix => {
                if self.rng.below(3) == 0 {
                    self.rng.next_u64()
                } else {
                    // Share the top 30 bits with the first center; random below, sometimes
                    // a close neighbour of an earlier value.
                    (self.centers[0] & !((1 << 34) - 1)) | (self.rng.next_u64() >> 30)
                }
            }
        }
    }

    fn doc(&mut self) -> Doc {
        let id = self.next_id;
        self.next_id += 1;
        let fp = self.fp();
        Doc { id, fp, ts: (self.rng.below(1000) as i64) - 500 }
    }

    fn query(&mut self, model: &Model, k: u32) -> u64 {
        if !model.docs.is_empty() && self.rng.below(4) != 0 {
            let d = model.docs[self.rng.below(model.docs.len() as u64) as usize];
            let flips = self.rng.below(k as u64 + 2) as u32;
            self.rng.flip_bits(d.fp, flips)
        } else {
            self.fp()
        }
    }
}

fn check_all_k(index: &Index, model: &Model, g: &mut Gen, queries: usize) {
    for k in 0..=index.max_k() {
        for _ in 0..queries {
            let q = g.query(model, k);
            let got = index.query(q, k).unwrap();
            let want = model.query(q, k);
            assert_eq!(got, want, "k={k} q={q:#018x} design={}", index.design());
        }
    }
}

/// Random interleaving of every write operation, checked after each step.
fn exercise(config: IndexConfig, shape: Shape, seed: u64, steps: usize) -> Index {
    let mut index = Index::new(config).unwrap();
    let mut model = Model::default();
    let mut g = Gen::new(seed, shape);
    let mut pending: Option<MergeJob> = None;
    let mut seals: Vec<SealJob> = Vec::new();
    for step in 0..steps {
        match g.rng.below(10) {
            0..=3 => {
                let d = g.doc();
                // Exact duplicates of existing fingerprints now and then.
                let d = if !model.docs.is_empty() && g.rng.below(8) == 0 {
                    Doc { fp: model.docs[g.rng.below(model.docs.len() as u64) as usize].fp, ..d }
                } else {
                    d
                };
                index.insert(d).unwrap();
                model.docs.push(d);
            }
            4 | 5 => {
                let n = if g.rng.below(3) == 0 { 300 } else { 1 + g.rng.below(40) as usize };
                let batch: Vec<Doc> = (0..n).map(|_| g.doc()).collect();
                if g.rng.below(3) == 0 {
                    // A bulk load: a run built apart, then added as it is (a second add of
                    // its id is refused).
                    let builder = index.run_builder();
                    let run = builder.build(&batch).unwrap();
                    let again = builder.build(&batch).unwrap();
                    if g.rng.below(2) == 0 {
                        index.add_run(run).unwrap();
                    } else {
                        // Joining the recent tables a few values at a time, over later
                        // steps (below).
                        index.add_run_deferred(run, 1 + g.rng.below(64) as usize).unwrap();
                    }
                    assert!(index.add_run(again).is_err());
                } else {
                    index.insert_batch(&batch).unwrap();
                }
                model.docs.extend_from_slice(&batch);
            }
            6 if !model.docs.is_empty() => {
                let n = 1 + g.rng.below(5) as usize;
                let mut ids: Vec<u64> = (0..n)
                    .map(|_| model.docs[g.rng.below(model.docs.len() as u64) as usize].id)
                    .collect();
                ids.push(u64::MAX); // an id that does not exist
                ids.sort_unstable();
                ids.dedup();
                let before = model.docs.len();
                model.docs.retain(|d| !ids.contains(&d.id));
                assert_eq!(index.delete(&ids).unwrap(), before - model.docs.len());
            }
            7 if !model.docs.is_empty() => {
                let i = g.rng.below(model.docs.len() as u64) as usize;
                let d = model.docs.remove(i);
                assert!(index.delete_doc(d.id, d.fp).unwrap());
                assert!(!index.delete_doc(d.id, d.fp).unwrap());
            }
            8 => {
                index.flush().unwrap();
                // The flush built the frozen buffers: their jobs are refused.
                for job in seals.drain(..) {
                    let run = job.run().unwrap();
                    assert!(index.finish_seal(job, run).is_err());
                }
            }
            9 if g.rng.below(2) == 0 => {
                // Seals off the write path: freeze the buffer, or install the run of any
                // frozen buffer (in any order).
                if !seals.is_empty() && g.rng.below(2) == 0 {
                    let job = seals.remove(g.rng.below(seals.len() as u64) as usize);
                    let run = job.run().unwrap();
                    index.finish_seal(job, run).unwrap();
                } else if let Some(job) = index.freeze_buffer() {
                    seals.push(job);
                }
            }
            _ => {
                if let Some(job) = pending.take() {
                    let merged = job.run().unwrap();
                    // With inline merges on, one may have replaced the job's sources since:
                    // the job is refused, and the index is unchanged.
                    match index.finish_merge(job, merged) {
                        Err(Error::InvalidConfig(_)) if index.config().auto_merge => {}
                        r => drop(r.unwrap()),
                    }
                } else {
                    pending = index.next_merge();
                }
            }
        }
        if g.rng.below(3) == 0 {
            index.cover_recent();
        }
        assert_eq!(index.len(), model.docs.len(), "step {step}");
        if step % 7 == 0 {
            check_all_k(&index, &model, &mut g, 6);
        }
    }
    if let Some(job) = pending.take() {
        let merged = job.run().unwrap();
        match index.finish_merge(job, merged) {
            Err(Error::InvalidConfig(_)) if index.config().auto_merge => {}
            r => drop(r.unwrap()),
        }
    }
    check_all_k(&index, &model, &mut g, 40);
    // Every deferred run joins the recent tables in a bounded number of steps.
    let mut steps = 0;
    while index.cover_recent() {
        steps += 1;
        assert!(steps < 1 << 20, "cover_recent goes on and on");
    }
    assert!(index.waiting().is_none());
    for job in seals.drain(..) {
        let run = job.run().unwrap();
        index.finish_seal(job, run).unwrap();
    }
    assert_eq!(index.frozen_buffers(), 0);
    assert_eq!(index.len(), model.docs.len());
    check_all_k(&index, &model, &mut g, 40);
    index
}

fn small_config(design: &str) -> IndexConfig {
    IndexConfig {
        design: Design::parse(design).unwrap(),
        tables: TableOptions { codec: Codec::Xor, block_bytes: 64, ..TableOptions::default() },
        buffer_docs: 32,
        merge_fanout: 3,
        max_runs: 5,
        auto_merge: true,
        crowd_min: 8,
        crowd_factor: 2.0,
        parallel_build: false,
        recent_docs: 200,
    }
}

/// The recent tables at every threshold: off (every run probed, the buffer scanned), so low
/// that only the buffer is in them, in between (small runs in them, larger ones probed, runs
/// moving between the two as they merge, off-thread and inline), and so high that every run
/// but the largest is; with deletes making stale entries and rebuilds.
#[test]
fn exact_with_recent_tables_at_every_threshold() {
    for (i, recent_docs) in [0, 1, 40, 200, 1000, usize::MAX].into_iter().enumerate() {
        for (j, shape) in
            [Shape::Uniform, Shape::Clustered, Shape::CrowdedPrefix].into_iter().enumerate()
        {
            for (l, design) in ["paper-10", "paper-4"].iter().enumerate() {
                let mut c = IndexConfig { recent_docs, ..small_config(design) };
                c.auto_merge = (i + j + l) % 2 == 0;
                c.tables.layout = if l == 0 { Layout::Packed } else { Layout::Blocks };
                exercise(c, shape, (i * 100 + j * 10 + l) as u64 + 900, 400);
            }
        }
    }
}

/// An index of `n` uniform documents built as one run, with its model and generator.
fn one_large_run(
    seed: u64,
    n: usize,
    buffer_docs: usize,
    recent_docs: usize,
) -> (Gen, Model, Index) {
    let mut g = Gen::new(seed, Shape::Uniform);
    let config = IndexConfig { buffer_docs, recent_docs, ..small_config("paper-10") };
    let base: Vec<Doc> = (0..n).map(|_| g.doc()).collect();
    let index = Index::build(config, &base).unwrap();
    (g, Model { docs: base }, index)
}

/// A run added deferred is probed one by one until its last slice is in the recent tables,
/// then queried through them; answers are exact at every step.
#[test]
fn a_deferred_run_joins_the_recent_tables_a_slice_at_a_time() {
    let (mut g, mut model, mut index) = one_large_run(5, 5_000, 64, 10_000);
    let page: Vec<Doc> = (0..1_000).map(|_| g.doc()).collect();
    let run = index.run_builder().build(&page).unwrap();
    let id = run.id();
    // 1,000 values at about 100 a step: 16 slices (a power of two).
    index.add_run_deferred(run, 100).unwrap();
    model.docs.extend(&page);
    let in_small = |index: &Index| index.small.iter().any(|&i| index.runs[i].id() == id);
    let mut steps = 0;
    loop {
        assert!(!in_small(&index), "step {steps}: queried through the recent tables early");
        assert!(index.recent.len() < 1_000, "step {steps}");
        check_all_k(&index, &model, &mut g, 5);
        steps += 1;
        if !index.cover_recent() {
            break;
        }
    }
    assert_eq!(steps, 16);
    assert!(in_small(&index));
    assert_eq!(index.recent.len(), 1_000);
    check_all_k(&index, &model, &mut g, 20);
}

/// Stale entries (fingerprints deleted or merged into a probed run) are dropped by a rebuild
/// once they outnumber the live ones, and never show in an answer.
#[test]
fn recent_tables_are_rebuilt_and_stay_exact() {
    let (mut g, mut model, mut index) = one_large_run(77, 20_000, 64, 3000);
    let mut most = 0;
    for round in 0..40 {
        let batch: Vec<Doc> = (0..500).map(|_| g.doc()).collect();
        index.insert_batch(&batch).unwrap();
        model.docs.extend(&batch);
        // Delete most of what was just inserted: stale entries pile up.
        let ids: Vec<u64> = batch.iter().take(400).map(|d| d.id).collect();
        model.docs.retain(|d| !ids.contains(&d.id));
        index.delete(&ids).unwrap();
        most = most.max(index.recent.len());
        let held = index.buffered().len()
            + index.small.iter().map(|&i| index.runs()[i].distinct()).sum::<usize>();
        assert!(index.recent.len() <= 2 * held + 4096, "round {round}");
        check_all_k(&index, &model, &mut g, 10);
    }
    assert!(most > 0);
    assert!(index.small.len() + index.direct.len() == index.runs().len());
}

/// Documents crowding one prefix overflow the recent tables: every run is probed and the
/// buffer scanned, answers stay exact, and once the small runs and the buffer are merged
/// away the recent tables serve again.
#[test]
fn a_crowded_prefix_falls_back_to_probing_every_run() {
    let (mut g, mut model, mut index) = one_large_run(31, 5_000, 256, 100_000);
    let mut crowd = Gen::new(32, Shape::CrowdedPrefix);
    for _ in 0..8 {
        let batch: Vec<Doc> = (0..150).map(|_| Doc { id: g.doc().id, ..crowd.doc() }).collect();
        index.insert_batch(&batch).unwrap();
        model.docs.extend(&batch);
    }
    assert!(index.recent.overflowed(), "the crowded prefix overflows the recent tables");
    assert!(index.runs().len() > 1 && index.direct.len() == index.runs().len());
    check_all_k(&index, &model, &mut crowd, 100);
    check_all_k(&index, &model, &mut g, 100);
    index.compact().unwrap();
    let batch: Vec<Doc> = (0..300).map(|_| g.doc()).collect();
    index.insert_batch(&batch).unwrap();
    model.docs.extend(&batch);
    assert!(!index.recent.overflowed() && index.recent.len() > 0);
    assert!(index.runs().len() == 2 && index.small.len() == 1);
    check_all_k(&index, &model, &mut g, 100);
}

#[test]
fn exact_under_interleaved_writes_every_design_and_shape() {
    let designs = ["paper-4", "paper-10", "paper-16", "paper-20", "7c1", "8c2", "9c1"];
    for (i, design) in designs.iter().enumerate() {
        for (j, shape) in
            [Shape::Uniform, Shape::Clustered, Shape::CrowdedPrefix].into_iter().enumerate()
        {
            exercise(small_config(design), shape, (i * 10 + j) as u64, 250);
        }
    }
}

/// The packed layout, on the designs and shapes above, with the merges of both kinds.
#[test]
fn exact_with_the_packed_layout() {
    for (i, design) in ["paper-4", "paper-10", "paper-16", "8c2"].iter().enumerate() {
        for (j, shape) in
            [Shape::Uniform, Shape::Clustered, Shape::CrowdedPrefix].into_iter().enumerate()
        {
            let mut c = small_config(design);
            c.tables.layout = Layout::Packed;
            c.auto_merge = j != 1;
            exercise(c, shape, (i * 10 + j) as u64 + 500, 250);
        }
    }
}

#[test]
fn exact_with_background_merges_and_other_codecs() {
    for (codec, search, bb) in [
        (Codec::Gap, BlockSearch::Interpolation, 48),
        (Codec::Xor, BlockSearch::Interpolation, 1024),
        (Codec::Gap, BlockSearch::Directory, 200),
    ] {
        for shape in [Shape::Uniform, Shape::Clustered, Shape::CrowdedPrefix] {
            let mut c = small_config("paper-10");
            c.tables = TableOptions { codec, block_bytes: bb, search, ..TableOptions::default() };
            c.auto_merge = false;
            exercise(c, shape, 99, 300);
        }
    }
}

#[test]
fn crowded_prefixes_get_sub_indexes_and_stay_exact() {
    // 20% of the values share their top 30 bits.
    let mut g = Gen::new(5, Shape::Uniform);
    let base = g.rng.next_u64() & !((1u64 << 34) - 1);
    let docs: Vec<Doc> = (0..20_000u64)
        .map(|id| {
            let fp = if id % 5 == 0 { base | (g.rng.next_u64() >> 30) } else { g.rng.next_u64() };
            Doc { id, fp, ts: 0 }
        })
        .collect();
    let model = Model { docs };
    for layout in [Layout::Blocks, Layout::Packed] {
        let mut config = IndexConfig { parallel_build: false, ..IndexConfig::default() };
        config.design = Design::parse("paper-4").unwrap();
        config.tables.layout = layout;
        let index = Index::build(config, &model.docs).unwrap();
        let mem = index.memory();
        // Table 0 leads with bits 0..16, inside the shared 30: one huge bucket.
        assert!(mem.tables[0].crowded_buckets >= 1, "{mem:?}");
        assert!(mem.tables[0].crowded_entries >= 4000);
        let mut g2 = Gen::new(6, Shape::Uniform);
        for k in 0..=3 {
            for i in 0..300 {
                let q = if i % 2 == 0 {
                    base | (g2.rng.next_u64() >> 30)
                } else {
                    let d = model.docs[(i * 37) % model.docs.len()];
                    g2.rng.flip_bits(d.fp, k)
                };
                assert_eq!(index.query(q, k).unwrap(), model.query(q, k), "k={k} {layout:?}");
            }
        }
    }
}

#[test]
fn bulk_build_matches_incremental_and_batch_queries() {
    let mut g = Gen::new(8, Shape::Clustered);
    let docs: Vec<Doc> = (0..5000).map(|_| g.doc()).collect();
    let bulk = Index::build(IndexConfig::default(), &docs).unwrap();
    let mut inc = Index::new(IndexConfig { buffer_docs: 100, ..IndexConfig::default() }).unwrap();
    for d in &docs {
        inc.insert(*d).unwrap();
    }
    assert!(inc.stats().merges > 0);
    let qs: Vec<u64> = (0..500).map(|i| g.rng.flip_bits(docs[i * 7].fp, (i % 4) as u32)).collect();
    let batch = bulk.query_batch(&qs, 3).unwrap();
    for (q, b) in qs.iter().zip(&batch) {
        assert_eq!(&bulk.query(*q, 3).unwrap(), b);
        assert_eq!(&inc.query(*q, 3).unwrap(), b);
    }
}

#[test]
fn out_of_range_k_is_an_error() {
    let index = Index::new(IndexConfig::default()).unwrap();
    assert_eq!(index.query(0, 4).unwrap_err(), Error::KOutOfRange { k: 4, max: 3 });
    assert!(index.query_batch(&[1, 2], 9).is_err());
}

#[test]
fn bad_config_is_rejected() {
    let bad = [
        IndexConfig { buffer_docs: 0, ..IndexConfig::default() },
        IndexConfig { merge_fanout: 1, ..IndexConfig::default() },
        IndexConfig { crowd_factor: 0.5, ..IndexConfig::default() },
        IndexConfig {
            tables: TableOptions { block_bytes: 4, ..TableOptions::default() },
            ..IndexConfig::default()
        },
    ];
    for c in bad {
        assert!(matches!(Index::new(c), Err(Error::InvalidConfig(_))));
    }
}

#[test]
fn memory_report_counts_every_table() {
    let mut g = Gen::new(3, Shape::Uniform);
    let docs: Vec<Doc> = (0..50_000).map(|_| g.doc()).collect();
    let floor = 64.0 - (50_000f64).log2() + 1.44;
    // Blocks land within 4 bits of the floor (49.8 at 50,000); the packed layout within 20:
    // 47 bits stored a value, and a directory of 2^17 entries, 22.3 bits a value.
    for (layout, over) in [(Layout::Blocks, 4.0), (Layout::Packed, 20.0)] {
        let mut config = IndexConfig::default();
        config.tables.layout = layout;
        let index = Index::build(config, &docs).unwrap();
        let m = index.memory();
        assert_eq!(m.tables.len(), 10);
        for t in &m.tables {
            assert_eq!(t.entries, 50_000);
            assert!(t.bits_per_fp > floor && t.bits_per_fp < floor + over, "{layout:?} {t:?}");
        }
        assert!(m.total_bytes > m.tables.iter().map(|t| t.bytes).sum::<usize>() + m.doc_bytes - 1);
    }
}

/// Stores every run of an index as bytes, damages some, and loads them into a new index.
fn save_and_load(
    index: &Index,
    damage: impl Fn(usize, usize, &mut Vec<Vec<u8>>),
) -> (Index, Vec<Vec<usize>>) {
    let mut fresh = Index::new(index.config().clone()).unwrap();
    let mut runs = Vec::new();
    let mut rebuilt_all = Vec::new();
    for (r, run) in index.runs().iter().enumerate() {
        let meta = run.meta_bytes(index.design());
        let mut tables = stored_copy(run);
        for (t, (_, blocks)) in tables.iter_mut().enumerate() {
            damage(r, t, blocks);
        }
        let refs = block_refs(&tables);
        let (loaded, rebuilt) = fresh.load_run(&meta, &stored_of(&tables, &refs)).unwrap();
        loaded.restore_deleted(&run.deleted_positions()).unwrap();
        runs.push(loaded);
        rebuilt_all.push(rebuilt);
    }
    fresh.restore(runs).unwrap();
    for d in index.buffered() {
        fresh.insert(*d).unwrap();
    }
    (fresh, rebuilt_all)
}

#[test]
fn runs_survive_storage_and_damaged_tables_are_rebuilt() {
    for (shape, layout) in [
        (Shape::Uniform, Layout::Blocks),
        (Shape::CrowdedPrefix, Layout::Blocks),
        (Shape::CrowdedPrefix, Layout::Packed),
    ] {
        let mut c = small_config("paper-10");
        c.auto_merge = true;
        c.tables.layout = layout;
        let index = exercise(c, shape, 17, 150);
        assert!(!index.runs().is_empty());
        let mut g = Gen::new(4, shape);
        // Intact: nothing rebuilt, same answers.
        let (same, rebuilt) = save_and_load(&index, |_, _, _| {});
        assert!(rebuilt.iter().all(Vec::is_empty), "{rebuilt:?}");
        // Damage: table 0 of run 0 loses a bit, table 3 of every run loses its last block.
        let (repaired, rebuilt) = save_and_load(&index, |r, t, blocks| {
            if r == 0 && t == 0 {
                blocks[0][20] ^= 4;
            }
            if t == 3 {
                blocks.pop();
            }
        });
        assert!(rebuilt[0].contains(&0) && rebuilt[0].contains(&3), "{rebuilt:?}");
        let model = Model { docs: all_live(&index) };
        assert_eq!(model.docs.len(), index.len());
        for idx in [&same, &repaired] {
            assert_eq!(idx.len(), index.len());
            check_all_k(idx, &model, &mut g, 30);
        }
    }
}

/// Found by the `run_load` fuzz target (`fuzz/`): metadata of the magic and one more byte,
/// with a valid checksum, read the version past its end (a panic). Now a clear error.
#[test]
fn fuzz_metadata_cut_after_its_magic_is_an_error() {
    let index = Index::new(small_config("paper-4")).unwrap();
    let meta: [u8; 9] = [78, 68, 82, 78, 3, 176, 23, 92, 173];
    let err = index.load_run(&meta, &[]).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

/// Found by the `run_load` fuzz target (`fuzz/`): metadata with a valid checksum whose count
/// of distinct fingerprints is near `u64::MAX` overflowed adding up the document columns.
#[test]
fn fuzz_metadata_with_huge_distinct_count_is_an_error() {
    let index = Index::new(small_config("paper-4")).unwrap();
    let meta: [u8; 151] = [
        78, 68, 82, 78, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 5, 254, 255,
        255, 255, 255, 255, 255, 15, 0, 0, 0, 3, 0, 0, 0, 52, 99, 49, 0, 0, 0, 0, 0, 0, 0, 0, 10,
        0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 172, 15, 132, 0, 4, 4, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128, 3, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0,
        0, 0, 0, 0, 3, 196, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 1, 0, 0, 2, 221, 240, 41, 116,
    ];
    let err = index.load_run(&meta, &[]).unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
}

/// A run's stored tables as the server keeps them: each table's header and blocks, copied.
fn stored_copy(run: &Run) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
    (0..run.tables())
        .map(|t| {
            let hx = run.stored_table(t).unwrap();
            (hx.header_bytes().to_vec(), hx.block_slices().map(<[u8]>::to_vec).collect())
        })
        .collect()
}

/// The blocks of `tables`, as slices.
fn block_refs(tables: &[(Vec<u8>, Vec<Vec<u8>>)]) -> Vec<Vec<&[u8]>> {
    tables.iter().map(|(_, b)| b.iter().map(Vec::as_slice).collect()).collect()
}

/// `tables` as the loader takes them (`refs` from [`block_refs`]).
fn stored_of<'a>(
    tables: &'a [(Vec<u8>, Vec<Vec<u8>>)],
    refs: &'a [Vec<&'a [u8]>],
) -> Vec<StoredTable<'a>> {
    tables.iter().zip(refs).map(|((h, _), b)| StoredTable { header: h, blocks: b }).collect()
}

/// Found by the `run_load` fuzz target (`fuzz/`, `crash-9aee9735…`): a stored table whose
/// checksums hold but whose values are not the run's fingerprints (written wrong, or forged)
/// was kept, and a fingerprint missing from it would have dropped matches. It is rebuilt.
#[test]
fn fuzz_a_table_of_other_fingerprints_is_rebuilt() {
    let mut g = Gen::new(4, Shape::Uniform);
    let docs: Vec<Doc> = (0..2000).map(|_| g.doc()).collect();
    let others: Vec<Doc> = (0..2000).map(|_| g.doc()).collect();
    let index = Index::build(small_config("paper-4"), &docs).unwrap();
    let other = Index::build(small_config("paper-4"), &others).unwrap();
    let (run, run_b) = (&index.runs()[0], &other.runs()[0]);
    assert_eq!(run.distinct(), run_b.distinct(), "same count, so only the values differ");
    // Table 1 of the other run in place of this run's.
    let mut tables = stored_copy(run);
    tables[1] = stored_copy(run_b).swap_remove(1);
    let refs = block_refs(&tables);
    let stored = stored_of(&tables, &refs);
    let meta = run.meta_bytes(index.design());
    let fresh = Index::new(small_config("paper-4")).unwrap();
    let (loaded, rebuilt) = fresh.load_run(&meta, &stored).unwrap();
    assert_eq!(rebuilt, vec![1]);
    let mut fresh = fresh;
    fresh.restore(vec![loaded]).unwrap();
    check_all_k(&fresh, &Model { docs }, &mut g, 30);
}

#[test]
fn damaged_metadata_or_every_table_is_an_error() {
    let mut g = Gen::new(2, Shape::Uniform);
    let docs: Vec<Doc> = (0..3000).map(|_| g.doc()).collect();
    let index = Index::build(small_config("paper-4"), &docs).unwrap();
    let run = &index.runs()[0];
    let tables = stored_copy(run);
    let refs = block_refs(&tables);
    let stored = stored_of(&tables, &refs);
    let meta = run.meta_bytes(index.design());
    assert!(index.load_run(&meta, &stored).is_ok());
    // Found by the `run_load` fuzz target (`fuzz/`, `crash-d9e4b954…`): a valid checksum over
    // run id `u64::MAX` overflowed the next run id when the run was restored.
    for id in [u64::MAX, u64::MAX - 1, 1 << 63] {
        // The id follows magic, version and a reserved field; the CRC-32 ends the record.
        let mut bad = meta[..meta.len() - 4].to_vec();
        bad[8..16].copy_from_slice(&id.to_le_bytes());
        let crc = crc32fast::hash(&bad);
        bad.extend_from_slice(&crc.to_le_bytes());
        let err = index.load_run(&bad, &stored).unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err}");
        assert!(err.to_string().contains("beyond"), "{err}");
    }
    for i in [0, 5, 9, meta.len() / 2, meta.len() - 1] {
        let mut bad = meta.clone();
        bad[i] ^= 1;
        assert!(matches!(
            index.load_run(&bad, &stored),
            Err(Error::Corrupt(_) | Error::UnsupportedVersion { .. })
        ));
    }
    assert!(index.load_run(&meta[..meta.len() - 3], &stored).is_err());
    let none: Vec<StoredTable<'_>> =
        stored.iter().map(|s| StoredTable { header: &s.header[..10], blocks: s.blocks }).collect();
    assert!(matches!(index.load_run(&meta, &none), Err(Error::Corrupt(_))));
    // Loading into an index with another design rebuilds the tables it needs.
    let other = Index::new(small_config("paper-10")).unwrap();
    let (run2, rebuilt) = other.load_run(&meta, &stored).unwrap();
    assert_eq!(rebuilt.len(), 9);
    let mut other = other;
    other.restore(vec![run2]).unwrap();
    let model = Model { docs };
    check_all_k(&other, &model, &mut g, 30);
}

/// Every live document of an index (from its answers to exact queries for its own runs).
fn all_live(index: &Index) -> Vec<Doc> {
    let mut out = Vec::new();
    for r in index.runs() {
        r.for_each_live(|fp, id, ts| out.push(Doc { id, fp, ts }));
    }
    out.extend_from_slice(index.buffered());
    out
}

/// One step of a random history for the property test.
#[derive(Debug, Clone)]
enum Op {
    Insert(u64),
    Batch(Vec<u64>),
    /// Documents through [`Index::insert_many`].
    Many(Vec<u64>),
    DeleteIndex(usize),
    DeleteDoc(usize),
    Flush,
    Merge,
    /// Freezes the buffer, or installs the oldest frozen buffer's run.
    Seal,
    Query(u64, u32),
    /// Deletes the fingerprints within a range around a fingerprint: this wide (bits).
    DeleteRange(u64, u32),
}

fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    // Fingerprints from a few clusters so that near and exact duplicates are common.
    let fp = (0u64..6, proptest::num::u64::ANY, 0u32..5).prop_map(|(c, noise, bits)| {
        let centre = c.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut r = SplitMix64::new(noise);
        r.flip_bits(centre, bits)
    });
    prop_oneof![
        4 => fp.clone().prop_map(Op::Insert),
        2 => proptest::collection::vec(fp.clone(), 0..80).prop_map(Op::Batch),
        2 => proptest::collection::vec(fp.clone(), 0..30).prop_map(Op::Many),
        1 => (0usize..1000).prop_map(Op::DeleteIndex),
        1 => (0usize..1000).prop_map(Op::DeleteDoc),
        1 => Just(Op::Flush),
        1 => Just(Op::Merge),
        1 => Just(Op::Seal),
        1 => (fp.clone(), 0u32..64).prop_map(|(q, w)| Op::DeleteRange(q, w)),
        3 => (fp, 0u32..4).prop_map(|(q, k)| Op::Query(q, k)),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Any history of writes, merges and queries agrees with brute force at every query.
    #[test]
    fn any_history_agrees_with_brute_force(ops in proptest::collection::vec(op_strategy(), 1..120)) {
        let mut config = small_config("paper-10");
        config.buffer_docs = 8;
        config.merge_fanout = 2;
        config.auto_merge = false;
        let mut index = Index::new(config).unwrap();
        let mut model = Model::default();
        let mut next_id = 1u64;
        let mut pending: Option<MergeJob> = None;
        let mut seals: std::collections::VecDeque<SealJob> = Default::default();
        for op in ops {
            match op {
                Op::Insert(fp) => {
                    let d = Doc { id: next_id, fp, ts: (next_id % 7) as i64 };
                    next_id += 1;
                    index.insert(d).unwrap();
                    model.docs.push(d);
                }
                Op::Batch(fps) => {
                    let batch: Vec<Doc> = fps.iter().map(|&fp| {
                        next_id += 1;
                        Doc { id: next_id - 1, fp, ts: 0 }
                    }).collect();
                    index.insert_batch(&batch).unwrap();
                    model.docs.extend_from_slice(&batch);
                }
                Op::Many(fps) => {
                    let docs: Vec<Doc> = fps.iter().map(|&fp| {
                        next_id += 1;
                        Doc { id: next_id - 1, fp, ts: (next_id % 5) as i64 }
                    }).collect();
                    index.insert_many(&docs).unwrap();
                    model.docs.extend_from_slice(&docs);
                }
                Op::DeleteIndex(i) if !model.docs.is_empty() => {
                    let id = model.docs[i % model.docs.len()].id;
                    let before = model.docs.len();
                    model.docs.retain(|d| d.id != id);
                    proptest::prop_assert_eq!(index.delete(&[id]).unwrap(), before - model.docs.len());
                }
                Op::DeleteDoc(i) if !model.docs.is_empty() => {
                    let d = model.docs.remove(i % model.docs.len());
                    proptest::prop_assert!(index.delete_doc(d.id, d.fp).unwrap());
                }
                Op::DeleteRange(q, w) => {
                    let mask = 1u64.checked_shl(w).map_or(u64::MAX, |x| x - 1);
                    let (lo, hi) = (q & !mask, q | mask);
                    let inside = |d: &Doc| (lo..=hi).contains(&d.fp);
                    let want = model.docs.iter().filter(|d| inside(d)).count();
                    proptest::prop_assert_eq!(index.live_count_in(lo, hi), want);
                    model.docs.retain(|d| !inside(d));
                    proptest::prop_assert_eq!(index.delete_range(lo, hi).unwrap(), want);
                    proptest::prop_assert_eq!(index.live_count_in(lo, hi), 0);
                }
                Op::Flush => {
                    index.flush().unwrap();
                    seals.clear();
                }
                Op::Seal => match seals.len() {
                    2.. => {
                        let job = seals.pop_front().unwrap();
                        let run = job.run().unwrap();
                        index.finish_seal(job, run).unwrap();
                    }
                    _ => seals.extend(index.freeze_buffer()),
                },
                Op::Merge => match pending.take() {
                    Some(job) => {
                        let merged = job.run().unwrap();
                        index.finish_merge(job, merged).unwrap();
                    }
                    None => pending = index.next_merge(),
                },
                Op::Query(q, k) => {
                    proptest::prop_assert_eq!(index.query(q, k).unwrap(), model.query(q, k));
                    // Many at once, more than one group of staged queries: each the same.
                    let qs: Vec<u64> = (0..11).map(|b| q ^ (b as u64 * 0x0101_0101)).collect();
                    let mut outs = vec![vec![Match { id: 0, fp: 0, distance: 0, ts: 0 }]];
                    index.query_many_into(&qs, k, &mut QueryScratch::default(), &mut outs).unwrap();
                    proptest::prop_assert_eq!(outs.len(), qs.len());
                    for (&q, out) in qs.iter().zip(&outs) {
                        proptest::prop_assert_eq!(out, &model.query(q, k));
                    }
                    // Paged range scans: the pages, in order, are the live documents of the
                    // range, each page cut between two fingerprints.
                    let r = q.rotate_left(7);
                    for (lo, hi) in [(q.min(r), q.max(r)), (0, u64::MAX)] {
                        let mut want: Vec<Doc> =
                            model.docs.iter().filter(|d| (lo..=hi).contains(&d.fp)).copied().collect();
                        want.sort_unstable_by_key(|d| (d.fp, d.id));
                        // Counted by seeks: the live ones, and at most the deleted ones a
                        // run still holds besides.
                        let dead: usize = index.runs().iter().map(|r| r.deleted()).sum();
                        let counted = index.count_in(lo, hi) as usize;
                        proptest::prop_assert!(
                            counted >= want.len() && counted <= want.len() + dead,
                            "{} counted in {:#x}..={:#x}: {} live, {} deleted in runs",
                            counted, lo, hi, want.len(), dead
                        );
                        let (mut got, mut from) = (Vec::new(), Some(lo));
                        while let Some(f) = from {
                            let (page, next) = index.live_in(f, hi, k as usize + 1);
                            if let Some(n) = next {
                                proptest::prop_assert!(n > f && n <= hi && !page.is_empty());
                                proptest::prop_assert!(page.iter().all(|d| d.fp < n));
                            }
                            got.extend(page);
                            from = next;
                        }
                        proptest::prop_assert_eq!(got, want);
                    }
                }
                _ => {}
            }
            proptest::prop_assert_eq!(index.len(), model.docs.len());
        }
    }
}

#[test]
fn auto_config_answers_k_and_respects_budgets() {
    for k in [0, 1, 3, 4, 6, 8] {
        let roomy = IndexConfig::auto(10_000_000, k, 4_000_000_000).unwrap();
        assert!(roomy.design.max_k() >= k);
        roomy.validate().unwrap();
        let tight = IndexConfig::auto(10_000_000, k, 300_000_000).unwrap();
        assert!(tight.design.max_k() >= k);
        assert!(tight.design.tables().len() <= roomy.design.tables().len());
    }
    assert!(IndexConfig::auto(1000, 17, 1 << 30).is_err());
    // At 10M and k = 3, packed tables (faster, and smaller than 64-byte blocks) once the
    // budget holds them; Huffman-XOR blocks below that.
    let roomy = IndexConfig::auto(10_000_000, 3, 1_000_000_000).unwrap();
    assert_eq!(roomy.tables.layout, Layout::Packed);
    let tight = IndexConfig::auto(10_000_000, 3, 300_000_000).unwrap();
    assert_eq!(tight.tables.layout, Layout::Blocks);
    let (design, n) = (&roomy.design, 10_000_000);
    let packed = design.estimate_bytes(n, crate::design::LayoutCost::Packed);
    assert!(packed <= 1_000_000_000);
    assert!(
        design.estimate_query_ns(n, crate::design::LayoutCost::Packed)
            < design.estimate_query_ns(n, crate::design::LayoutCost::default())
    );
    // A small auto-configured index is exact.
    let mut g = Gen::new(12, Shape::Clustered);
    let docs: Vec<Doc> = (0..3000).map(|_| g.doc()).collect();
    let config =
        IndexConfig { parallel_build: false, ..IndexConfig::auto(3000, 4, 1 << 30).unwrap() };
    assert_eq!(config.tables.layout, Layout::Packed);
    let index = Index::build(config, &docs).unwrap();
    let model = Model { docs };
    check_all_k(&index, &model, &mut g, 20);
    // And one the budget holds to blocks.
    let config =
        IndexConfig { parallel_build: false, ..IndexConfig::auto(3000, 4, 125_000).unwrap() };
    assert_eq!(config.tables.layout, Layout::Blocks);
    let index = Index::build(config, &model.docs).unwrap();
    check_all_k(&index, &model, &mut g, 20);
}

#[test]
fn compaction_leaves_one_run_and_stays_exact() {
    let mut c = small_config("paper-10");
    c.auto_merge = false;
    let mut index = Index::new(c).unwrap();
    let mut g = Gen::new(31, Shape::Clustered);
    let mut model = Model::default();
    for _ in 0..700 {
        let d = g.doc();
        index.insert(d).unwrap();
        model.docs.push(d);
    }
    let gone: Vec<u64> = model.docs.iter().step_by(5).map(|d| d.id).collect();
    index.delete(&gone).unwrap();
    model.docs.retain(|d| !gone.contains(&d.id));
    assert!(index.runs().len() > 1);
    // As a background job, with a delete while it runs.
    let job = index.compact_job().unwrap();
    let victim = model.docs.remove(3);
    index.delete_doc(victim.id, victim.fp).unwrap();
    let merged = job.run().unwrap();
    index.finish_merge(job, merged).unwrap();
    check_all_k(&index, &model, &mut g, 20);
    // Inline, with the buffer.
    let d = g.doc();
    index.insert(d).unwrap();
    model.docs.push(d);
    index.compact().unwrap();
    assert_eq!(index.runs().len(), 1);
    assert!(index.buffered().is_empty());
    assert_eq!(index.stats().deleted_pending, 0);
    check_all_k(&index, &model, &mut g, 20);
    assert!(index.compact_job().is_none());
}

/// Small runs that live inserts add beside a much larger one are packed, whatever the
/// index's layout, and the index stays exact: the runs of mixed layouts, their merges,
/// and the runs stored and loaded back (as blocks).
#[test]
fn small_runs_beside_a_large_one_are_packed_and_exact() {
    for shape in [Shape::Uniform, Shape::Clustered] {
        let mut g = Gen::new(11, shape);
        let mut model = Model::default();
        let config = IndexConfig { buffer_docs: 500, ..small_config("paper-4") };
        assert_eq!(config.tables.layout, Layout::Blocks);
        let base: Vec<Doc> = (0..40_000).map(|_| g.doc()).collect();
        model.docs.extend(&base);
        let mut index = Index::build(config, &base).unwrap();
        assert!(!index.runs()[0].is_packed(), "{shape:?}: the bulk run keeps its blocks");
        for _ in 0..6 {
            let batch: Vec<Doc> = (0..700).map(|_| g.doc()).collect();
            model.docs.extend(&batch);
            index.insert_batch(&batch).unwrap();
        }
        index.flush().unwrap();
        let runs = index.runs();
        assert!(runs.len() > 1 && runs[1..].iter().all(|r| r.is_packed()), "{shape:?}");
        check_all_k(&index, &model, &mut g, 300);
        let (loaded, _) = save_and_load(&index, |_, _, _| {});
        assert!(loaded.runs().iter().all(|r| !r.is_packed()), "{shape:?}: loaded as stored");
        check_all_k(&loaded, &model, &mut g, 300);
        index.compact().unwrap();
        assert!(!index.runs()[0].is_packed(), "{shape:?}: one run again, in blocks");
        check_all_k(&index, &model, &mut g, 300);
    }
}

/// A cluster node keeps table t of a design as an index of design `p{prefix_t}k{max_k}`
/// over `perm_t(fp)`. Such an index answers table t's probe: every entry sharing the
/// query's prefix in table t and within k (it may also return entries within k that do not
/// share it, from a scanned buffer: true matches, which callers may keep or drop), and the
/// union over the tables is exactly the design's answer. Checked against brute force, with
/// deletes, merges and a write buffer.
#[test]
fn tablet_designs_answer_each_tables_probe() {
    for (i, text) in ["5c2", "paper-16"].iter().enumerate() {
        let design = Design::parse(text).unwrap();
        let max_k = design.max_k();
        for (j, shape) in [Shape::Uniform, Shape::Clustered].into_iter().enumerate() {
            let mut g = Gen::new(7000 + (i * 10 + j) as u64, shape);
            let mut docs: Vec<Doc> = (0..1500).map(|_| g.doc()).collect();
            // Exact duplicates of fingerprints under other ids.
            for n in 0..50 {
                let fp = docs[n * 7].fp;
                let d = g.doc();
                docs.push(Doc { fp, ..d });
            }
            let deleted: Vec<Doc> = docs.iter().copied().filter(|d| d.id % 9 == 0).collect();
            let late: Vec<Doc> = (0..40).map(|_| g.doc()).collect();
            let live: Vec<Doc> = docs
                .iter()
                .copied()
                .filter(|d| d.id % 9 != 0)
                .chain(late.iter().copied())
                .collect();
            let indexes: Vec<Index> = design
                .tables()
                .iter()
                .map(|t| {
                    let mut c = small_config("4c1");
                    c.design = Design::tablet(64, t.prefix_bits, max_k).unwrap();
                    let permuted = |d: &Doc| Doc { fp: t.perm.apply(d.fp), ..*d };
                    let mut index = Index::new(c).unwrap();
                    let first: Vec<Doc> = docs.iter().map(permuted).collect();
                    index.insert_batch(&first).unwrap();
                    for d in &deleted {
                        assert!(index.delete_doc(d.id, t.perm.apply(d.fp)).unwrap());
                    }
                    for d in &late {
                        index.insert(permuted(d)).unwrap();
                    }
                    index
                })
                .collect();
            let model = Model { docs: live.clone() };
            for k in 0..=max_k {
                for _ in 0..60 {
                    let q = g.query(&model, k);
                    let mut union: Vec<(u64, u64)> = Vec::new();
                    for (t, index) in design.tables().iter().zip(&indexes) {
                        let pq = t.perm.apply(q);
                        let shift = 64 - t.prefix_bits;
                        let got = index.query(pq, k).unwrap();
                        for m in &got {
                            assert!(m.distance <= k && (m.fp ^ pq).count_ones() == m.distance);
                        }
                        let mut probe: Vec<(u64, u64)> = got
                            .iter()
                            .filter(|m| m.fp >> shift == pq >> shift)
                            .map(|m| (m.id, t.perm.invert(m.fp)))
                            .collect();
                        probe.sort_unstable();
                        let mut want: Vec<(u64, u64)> = live
                            .iter()
                            .filter(|d| {
                                let p = t.perm.apply(d.fp);
                                p >> shift == pq >> shift && (d.fp ^ q).count_ones() <= k
                            })
                            .map(|d| (d.id, d.fp))
                            .collect();
                        want.sort_unstable();
                        assert_eq!(probe, want, "{text} k={k} q={q:#x}");
                        union.extend(probe);
                    }
                    union.sort_unstable();
                    union.dedup();
                    let mut all: Vec<(u64, u64)> =
                        model.query(q, k).iter().map(|m| (m.id, m.fp)).collect();
                    all.sort_unstable();
                    assert_eq!(union, all, "{text} k={k} q={q:#x}: union over tables");
                }
            }
            // Every live entry is listed once.
            let mut listed = Vec::new();
            indexes[0].for_each_live(|d| listed.push(d.id));
            listed.sort_unstable();
            let mut ids: Vec<u64> = live.iter().map(|d| d.id).collect();
            ids.sort_unstable();
            assert_eq!(listed, ids);
        }
    }
}
