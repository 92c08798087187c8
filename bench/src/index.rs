//! `neardup-bench index`: builds the index over a workload, measures queries on one thread
//! and on all threads, checks exactness against brute force in the same run, measures live
//! inserts, and prints one JSON object as its last line.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use neardup_core::codec::{BlockSearch, Codec, Layout, TableOptions};
use neardup_core::index::QueryScratch;
use neardup_core::util::SplitMix64;
use neardup_core::{Design, Doc, Index, IndexConfig, Match};
use serde_json::json;

use crate::alloc_peak;
use crate::bruteforce;
use crate::latency::Latencies;
use crate::workload::{self, Shape, Workload};

/// Options of `neardup-bench index`.
#[derive(clap::Args, Debug)]
pub struct IndexArgs {
    /// Stored fingerprints: raw little-endian u64, id = position (the shared peer format).
    #[arg(long, requires = "queries_file")]
    stored: Option<PathBuf>,
    /// Query fingerprints: raw little-endian u64.
    #[arg(long = "queries-file", id = "queries_file")]
    queries_file: Option<PathBuf>,
    /// Generated workload: number of stored fingerprints.
    #[arg(long, default_value_t = 1_000_000)]
    n: usize,
    /// Generated workload: number of queries.
    #[arg(long, default_value_t = 100_000)]
    queries: usize,
    /// Generated workload: seed.
    #[arg(long, default_value_t = 20070508)]
    seed: u64,
    /// Generated workload: shape.
    #[arg(long, value_enum, default_value_t = Shape::Peers)]
    workload: Shape,
    /// Hamming distance.
    #[arg(long, default_value_t = 3)]
    k: u32,
    /// Table design: a name (paper-20, paper-16, paper-10, paper-4), a text such as 5c2 or
    /// 4c1/4c1, or `auto` (chosen for n, k and --budget-mb).
    #[arg(long, default_value = "paper-10")]
    design: String,
    /// Memory budget for `--design auto`, in MB.
    #[arg(long, default_value_t = 1000)]
    budget_mb: u64,
    /// Block coding: xor (the paper's) or gap.
    #[arg(long, default_value = "xor")]
    codec: String,
    /// Block size in bytes.
    #[arg(long, default_value_t = 1024)]
    block_bytes: usize,
    /// Block lookup: directory or interpolation.
    #[arg(long, default_value = "directory")]
    search: String,
    /// In-memory layout of the tables: blocks (Huffman-coded, with --codec) or packed
    /// (fixed-width low bits under a top-bits directory; no block options apply). Default:
    /// blocks, or what `--design auto` chooses.
    #[arg(long)]
    layout: Option<String>,
    /// Write sorted (u32 query, u32 id) little-endian pairs here (all queries).
    #[arg(long)]
    pairs: Option<PathBuf>,
    /// Queries checked against brute force (at least 1000 for `verified_exact`).
    #[arg(long, default_value_t = 1000)]
    verify: usize,
    /// Documents inserted into the live index after the query measurements (0 = n / 10,
    /// at most 1M).
    #[arg(long, default_value_t = 0)]
    inserts: usize,
    /// Batch size of the live inserts.
    #[arg(long, default_value_t = 1000)]
    insert_batch: usize,
    /// Also time the same queries with the other block lookup method.
    #[arg(long)]
    compare_search: bool,
    /// Buckets with at most this many entries never get a crowded-prefix sub-index
    /// (a huge value turns sub-indexes off, to compare).
    #[arg(long)]
    crowd_min: Option<usize>,
    /// Repeat the one-thread throughput pass this many times (for profiling); the figure
    /// reported is the median pass.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Steady state: after the compacted figure, one thread inserts fresh documents at this
    /// rate (documents/s, in batches of `--insert-batch`, merges off its lock as a server
    /// runs them) while another queries; 0 skips it.
    #[arg(long, default_value_t = 0)]
    steady_insert_rate: u64,
    /// Steady state: how long it lasts, in seconds.
    #[arg(long, default_value_t = 10.0)]
    steady_seconds: f64,
    /// Runs below this many documents (but the largest) are queried through the recent
    /// tables; 0 probes every run and scans the buffer. Default: the index's.
    #[arg(long)]
    recent_docs: Option<usize>,
}

/// Bytes of this process backed by transparent huge pages (Linux), for the report.
fn huge_page_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("AnonHugePages:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

fn one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool").install(f)
}

/// Runs the single-thread query loop; returns (seconds, results, pairs).
fn timed_queries(index: &Index, queries: &[u64], k: u32) -> (f64, u64) {
    let mut scratch = QueryScratch::default();
    let mut out: Vec<Match> = Vec::new();
    let mut results = 0u64;
    let t = Instant::now();
    for &q in queries {
        index.query_into(q, k, &mut scratch, &mut out).expect("k checked");
        results += out.len() as u64;
    }
    (t.elapsed().as_secs_f64(), results)
}

/// What the steady-state phase measured.
struct Steady {
    queries: u64,
    query_seconds: f64,
    inserted: u64,
    insert_seconds: f64,
    merges: u64,
    /// Seconds the inserting thread was not waiting for its schedule.
    insert_busy: f64,
    /// Seconds it held the write lock.
    write_locked: f64,
    runs_max: usize,
    runs_end: usize,
}

/// Queries on this thread while another inserts `rate` documents a second in batches of
/// `batch` for `seconds`, taking merges off the write lock as a server does (`next_merge`,
/// `finish_merge`) and running them on its own thread; both rates over the same interval. Bounded in time: the inserter stops
/// at the deadline even if it is behind its schedule.
fn steady_state(
    index: Index,
    queries: &[u64],
    k: u32,
    rate: u64,
    batch: usize,
    seconds: f64,
    seed: u64,
) -> Result<(Index, Steady), String> {
    use std::sync::RwLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let mut index = index;
    let auto_merge = index.config().auto_merge;
    index.set_auto_merge(false);
    let first_id = index.len() as u64 + (1 << 40);
    let lock = RwLock::new(index);
    let done = AtomicBool::new(false);
    let batch = batch.max(1);
    let deadline = Duration::from_secs_f64(seconds);
    let (steady, inserter) = std::thread::scope(|s| {
        // One thread inserts, its merges included: a one-thread pool, so that building a
        // run does not take the querying thread's core as well.
        let inserter = s.spawn(|| {
            one_thread(|| -> Result<(u64, f64, u64, usize, [f64; 2]), String> {
                let mut r = SplitMix64::new(seed ^ 0x57EAD);
                let start = Instant::now();
                let (mut inserted, mut merges, mut runs_max, mut idle) = (0u64, 0u64, 0usize, 0.0);
                let mut locked = 0.0;
                let mut docs = Vec::with_capacity(batch);
                while start.elapsed() < deadline {
                    // Due by now: everything scheduled up to this instant.
                    let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                    if inserted >= due {
                        let t = Instant::now();
                        std::thread::sleep(Duration::from_micros(200));
                        idle += t.elapsed().as_secs_f64();
                        continue;
                    }
                    let take = (due - inserted).min(batch as u64);
                    docs.clear();
                    docs.extend((0..take).map(|i| Doc {
                        id: first_id + inserted + i,
                        fp: r.next_u64(),
                        ts: 2,
                    }));
                    let mut w = lock.write().map_err(|_| "poisoned")?;
                    let t = Instant::now();
                    w.insert_batch(&docs).map_err(|e| e.to_string())?;
                    runs_max = runs_max.max(w.stats().runs);
                    let job = w.next_merge();
                    drop(w);
                    locked += t.elapsed().as_secs_f64();
                    inserted += take;
                    if let Some(job) = job {
                        let merged = job.run().map_err(|e| e.to_string())?;
                        let mut w = lock.write().map_err(|_| "poisoned")?;
                        let t = Instant::now();
                        let replaced = w.finish_merge(job, merged).map_err(|e| e.to_string())?;
                        drop(w);
                        locked += t.elapsed().as_secs_f64();
                        // As the server does: the replaced runs are freed off the lock.
                        drop(replaced);
                        merges += 1;
                    }
                }
                let secs = start.elapsed().as_secs_f64();
                done.store(true, Ordering::Release);
                Ok((inserted, secs, merges, runs_max, [secs - idle, locked]))
            })
        });
        let mut scratch = QueryScratch::default();
        let mut out: Vec<Match> = Vec::new();
        let start = Instant::now();
        let mut n = 0u64;
        let mut results = 0u64;
        'outer: loop {
            for &q in queries {
                if done.load(Ordering::Acquire) || start.elapsed() > deadline * 2 {
                    break 'outer;
                }
                let g = lock.read().expect("not poisoned");
                g.query_into(q, k, &mut scratch, &mut out).expect("k checked");
                drop(g);
                results += out.len() as u64;
                n += 1;
            }
        }
        std::hint::black_box(results);
        ((n, start.elapsed().as_secs_f64()), inserter.join())
    });
    let (inserted, insert_seconds, merges, runs_max, [insert_busy, write_locked]) =
        inserter.map_err(|_| "the inserting thread panicked".to_string())??;
    let mut index = lock.into_inner().map_err(|_| "poisoned")?;
    let runs_end = index.stats().runs;
    index.set_auto_merge(auto_merge);
    Ok((
        index,
        Steady {
            queries: steady.0,
            query_seconds: steady.1,
            inserted,
            insert_seconds,
            merges,
            insert_busy,
            write_locked,
            runs_max,
            runs_end,
        },
    ))
}

/// Runs `neardup-bench index`.
pub fn run(args: IndexArgs) -> Result<(), String> {
    let w: Workload = match (&args.stored, &args.queries_file) {
        (Some(s), Some(q)) => Workload {
            stored: workload::read_u64s(s)?,
            queries: workload::read_u64s(q)?,
            source: format!("files:{}", s.display()),
        },
        _ => workload::generate(args.workload, args.n, args.queries, args.seed),
    };
    let n = w.stored.len();
    if n == 0 || w.queries.is_empty() {
        return Err("the workload needs at least one stored fingerprint and one query".into());
    }
    if n > u32::MAX as usize {
        return Err("at most 2^32 - 1 stored fingerprints (ids are u32 in the pairs file)".into());
    }
    let codec: Codec = args.codec.parse().map_err(|e: neardup_core::Error| e.to_string())?;
    let search: BlockSearch =
        args.search.parse().map_err(|e: neardup_core::Error| e.to_string())?;
    let layout: Option<Layout> = args
        .layout
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: neardup_core::Error| e.to_string())?;
    let config = if args.design == "auto" {
        let mut c = IndexConfig::auto(n as u64, args.k, args.budget_mb * 1_000_000)
            .map_err(|e| e.to_string())?;
        c.tables.search = search;
        if let Some(layout) = layout {
            c.tables.layout = layout;
        }
        c
    } else {
        let design = Design::parse(&args.design).map_err(|e| e.to_string())?;
        IndexConfig {
            design,
            tables: TableOptions {
                codec,
                block_bytes: args.block_bytes,
                search,
                layout: layout.unwrap_or_default(),
            },
            ..IndexConfig::default()
        }
    };
    let mut config = config;
    if let Some(m) = args.crowd_min {
        config.crowd_min = m;
    }
    if let Some(r) = args.recent_docs {
        config.recent_docs = r;
    }
    config.design.check_k(args.k).map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    let design = config.design.clone();
    let (codec, block_bytes) = (config.tables.codec, config.tables.block_bytes);
    let docs: Vec<Doc> =
        w.stored.iter().enumerate().map(|(i, &fp)| Doc { id: i as u64, fp, ts: 0 }).collect();
    eprintln!(
        "workload {}: n={n} queries={} k={} design={} ({} tables, prefixes {}..{} bits, {:.1} expected candidates/query)",
        w.source,
        w.queries.len(),
        args.k,
        design,
        design.tables().len(),
        design.min_prefix_bits(),
        design.tables().iter().map(|t| t.prefix_bits).max().unwrap_or(0),
        design.expected_candidates(n as u64),
    );

    // The machine's speed drifts from minute to minute, so the build is also given against
    // a baseline timed just before it: the standard library's sort of the same fingerprints.
    let t = Instant::now();
    let mut plain = w.stored.clone();
    plain.sort_unstable();
    let baseline_sort_seconds = t.elapsed().as_secs_f64();
    drop(plain);
    // Build on one core, then on all cores (the second index is the one measured).
    // Each build's peak memory above its input (the documents, already in memory).
    let t = Instant::now();
    let phase = alloc_peak::start();
    let single = one_thread(|| Index::build(config.clone(), &docs)).map_err(|e| e.to_string())?;
    let build_seconds = t.elapsed().as_secs_f64();
    let peak_one = phase.end();
    drop(single);
    let t = Instant::now();
    let phase = alloc_peak::start();
    let mut index = Index::build(config.clone(), &docs).map_err(|e| e.to_string())?;
    let build_seconds_all = t.elapsed().as_secs_f64();
    let peak_all = phase.end();
    let mem = index.memory();
    let floor = 64.0 - (n as f64).log2() + 1.44;
    let bits = mem.bits_per_fp_per_table();
    eprintln!(
        "baseline: sort_unstable of the {n} fingerprints in {baseline_sort_seconds:.2}s ({:.2}M/s); the one-core build took {:.2} times that",
        n as f64 / baseline_sort_seconds / 1e6,
        build_seconds / baseline_sort_seconds,
    );
    eprintln!(
        "build: {build_seconds:.2}s on one core ({:.2}M fp/s), {build_seconds_all:.2}s on all cores; index {:.1} MB, {bits:.2} bits/fp/table (floor {floor:.2}, ratio {:.3}); ids {} bits, timestamps {} bits",
        n as f64 / build_seconds / 1e6,
        mem.total_bytes as f64 / 1e6,
        bits / floor,
        mem.column_bits.0,
        mem.column_bits.1,
    );
    let index_bytes = mem.total_bytes as f64;
    let peak_text = |p: &alloc_peak::Peak| {
        let rss = p.rss_bytes.map_or("not reported".to_string(), |b| {
            format!("{:.1} MB ({:.2}x)", b as f64 / 1e6, b as f64 / index_bytes)
        });
        format!(
            "heap {:.1} MB ({:.2}x the index), resident set {rss}",
            p.heap_bytes as f64 / 1e6,
            p.heap_bytes as f64 / index_bytes
        )
    };
    eprintln!(
        "build peak memory above the input documents: one core {}; all cores {}",
        peak_text(&peak_one),
        peak_text(&peak_all)
    );
    let huge = huge_page_bytes();
    eprintln!("memory backed by huge pages: {:.1} MB", huge as f64 / 1e6);
    for (i, t) in mem.tables.iter().enumerate() {
        if t.crowded_buckets > 0 {
            eprintln!(
                "  table {i}: {} crowded buckets holding {} entries, sub-indexes included in {:.1} MB",
                t.crowded_buckets,
                t.crowded_entries,
                t.bytes as f64 / 1e6
            );
        }
    }

    // One thread: a warm-up pass, a throughput pass, a latency pass.
    let k = args.k;
    let _ = timed_queries(&index, &w.queries[..w.queries.len().min(10_000)], k);
    let mut passes = Vec::new();
    let mut results = 0;
    for _ in 0..args.repeat.max(1) {
        let (secs, r) = timed_queries(&index, &w.queries, k);
        passes.push(secs);
        results = r;
    }
    passes.sort_by(f64::total_cmp);
    let qps_one = w.queries.len() as f64 / passes[passes.len() / 2];
    let mut lat = Latencies::default();
    {
        let mut scratch = QueryScratch::default();
        let mut out = Vec::new();
        for &q in &w.queries {
            let t = Instant::now();
            index.query_into(q, k, &mut scratch, &mut out).expect("k checked");
            lat.record(t.elapsed().as_nanos() as u64);
        }
    }
    let (p50, p99, p999) =
        (lat.percentile_us(0.5), lat.percentile_us(0.99), lat.percentile_us(0.999));
    eprintln!(
        "one thread: {qps_one:.0} queries/s, p50 {p50:.2} us, p99 {p99:.2} us, p99.9 {p999:.2} us, {results} results"
    );
    let mut other_search = serde_json::Value::Null;
    if args.compare_search {
        let other = match search {
            BlockSearch::Directory => BlockSearch::Interpolation,
            BlockSearch::Interpolation => BlockSearch::Directory,
        };
        let cfg = IndexConfig {
            tables: TableOptions { search: other, ..config.tables },
            ..config.clone()
        };
        let idx2 = Index::build(cfg, &docs).map_err(|e| e.to_string())?;
        let _ = timed_queries(&idx2, &w.queries[..w.queries.len().min(10_000)], k);
        let (s2, r2) = timed_queries(&idx2, &w.queries, k);
        let (s1, _) = timed_queries(&index, &w.queries, k);
        eprintln!(
            "block lookup: {search:?} {:.0} q/s vs {other:?} {:.0} q/s (same run, back to back)",
            w.queries.len() as f64 / s1,
            w.queries.len() as f64 / s2
        );
        assert_eq!(r2, results);
        other_search = json!({
            "search": format!("{other:?}").to_lowercase(),
            "qps_one_thread": w.queries.len() as f64 / s2,
            "this_qps_one_thread_again": w.queries.len() as f64 / s1,
        });
    }

    // All threads.
    let t = Instant::now();
    let batch = index.query_batch(&w.queries, k).map_err(|e| e.to_string())?;
    let qps_all = w.queries.len() as f64 / t.elapsed().as_secs_f64();
    eprintln!("all {} threads: {qps_all:.0} queries/s", rayon::current_num_threads());

    // Exactness against brute force on a sample, and the brute-force baseline.
    let sample = args.verify.min(w.queries.len());
    let t = Instant::now();
    let truth = bruteforce::scan_many(&w.stored, &w.queries[..sample], k);
    let bf_secs_all = t.elapsed().as_secs_f64();
    let mut mismatches = 0;
    for (i, want) in truth.iter().enumerate() {
        let mut got: Vec<u32> = batch[i].iter().map(|m| m.id as u32).collect();
        got.sort_unstable();
        if &got != want {
            mismatches += 1;
            if mismatches <= 3 {
                eprintln!("MISMATCH query {i}: index {got:?} brute force {want:?}");
            }
        }
    }
    let verified_exact = mismatches == 0 && sample >= 1000;
    let bf_n = sample.clamp(1, 100);
    let t = Instant::now();
    let mut bf_results = 0;
    for &q in &w.queries[..bf_n] {
        bf_results += bruteforce::scan(&w.stored, q, k).len();
    }
    let bf_qps = bf_n as f64 / t.elapsed().as_secs_f64();
    std::hint::black_box(bf_results);
    eprintln!(
        "brute force: {bf_qps:.1} queries/s on one thread ({:.2e} comparisons/s); checked {sample} queries in {bf_secs_all:.1}s: {}",
        bf_qps * n as f64,
        if mismatches == 0 { "exact".to_string() } else { format!("{mismatches} MISMATCHES") }
    );

    if let Some(path) = &args.pairs {
        let mut pairs: Vec<(u32, u32)> = batch
            .iter()
            .enumerate()
            .flat_map(|(qi, ms)| ms.iter().map(move |m| (qi as u32, m.id as u32)))
            .collect();
        pairs.sort_unstable();
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        );
        for (q, id) in pairs {
            f.write_all(&q.to_le_bytes())
                .and_then(|_| f.write_all(&id.to_le_bytes()))
                .map_err(|e| e.to_string())?;
        }
        f.flush().map_err(|e| e.to_string())?;
    }
    drop(batch);

    // Live inserts: fresh random documents in batches, merges included.
    let inserts = if args.inserts == 0 { (n / 10).clamp(1, 1_000_000) } else { args.inserts };
    let mut r = SplitMix64::new(args.seed ^ 0x5EED);
    let fresh: Vec<Doc> =
        (0..inserts).map(|i| Doc { id: (n + i) as u64, fp: r.next_u64(), ts: 1 }).collect();
    let t = Instant::now();
    for chunk in fresh.chunks(args.insert_batch.max(1)) {
        index.insert_batch(chunk).map_err(|e| e.to_string())?;
    }
    let insert_secs = t.elapsed().as_secs_f64();
    let stats = index.stats();
    // The live index stays exact: spot-check inserted and old documents.
    let mut live_ok = true;
    for i in 0..200 {
        let d = if i % 2 == 0 { fresh[(i * 7919) % inserts] } else { docs[(i * 104_729) % n] };
        let hits = index.query(d.fp, k).map_err(|e| e.to_string())?;
        live_ok &= hits.iter().any(|m| m.id == d.id && m.distance == 0);
    }
    let insert_rate = inserts as f64 / insert_secs;
    let recent_bytes = index.memory().recent_bytes;
    let sample_q = &w.queries[..w.queries.len().min(20_000)];
    // The compacted baseline: the same documents built at once into one run, queried in
    // passes alternating with the live index's, so that the machine's drift from one
    // minute to the next falls on both; medians of `--repeat` (at least 3) passes each.
    let bulk = {
        let mut all = docs.clone();
        all.extend_from_slice(&fresh);
        Index::build(config.clone(), &all).map_err(|e| e.to_string())?
    };
    let warm = &sample_q[..sample_q.len().min(2_000)];
    let _ = (timed_queries(&index, warm, k), timed_queries(&bulk, warm, k));
    let (mut live_passes, mut bulk_passes) = (Vec::new(), Vec::new());
    for _ in 0..args.repeat.max(3) {
        live_passes.push(sample_q.len() as f64 / timed_queries(&index, sample_q, k).0);
        bulk_passes.push(sample_q.len() as f64 / timed_queries(&bulk, sample_q, k).0);
    }
    drop(bulk);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let qps_after = median(live_passes);
    let qps_bulk = median(bulk_passes);
    let t = Instant::now();
    index.compact().map_err(|e| e.to_string())?;
    let compact_secs = t.elapsed().as_secs_f64();
    let _ = timed_queries(&index, warm, k);
    let qps_compacted = median(
        (0..args.repeat.max(3))
            .map(|_| sample_q.len() as f64 / timed_queries(&index, sample_q, k).0)
            .collect(),
    );
    eprintln!(
        "live inserts: {inserts} in batches of {}: {insert_rate:.0} docs/s ({} runs, {} merges, {} docs rewritten); spot check {}; recent tables {:.1} MB; queries then: {qps_after:.0}/s against {qps_bulk:.0}/s for the same documents built as one run, alternating passes: ratio {:.2}; compacted to one run in {compact_secs:.1}s: {qps_compacted:.0} queries/s",
        args.insert_batch,
        stats.runs,
        stats.merges,
        stats.merged_docs,
        if live_ok { "ok" } else { "FAILED" },
        recent_bytes as f64 / 1e6,
        qps_after / qps_bulk,
    );
    let mut steady = serde_json::Value::Null;
    if args.steady_insert_rate > 0 {
        let (_index, st) = steady_state(
            index,
            &w.queries,
            k,
            args.steady_insert_rate,
            args.insert_batch,
            args.steady_seconds,
            args.seed,
        )?;
        let qps = st.queries as f64 / st.query_seconds;
        let ins = st.inserted as f64 / st.insert_seconds;
        eprintln!(
            "steady state: {ins:.0} inserts/s (asked {}) for {:.1}s alongside {qps:.0} queries/s on one thread: {:.2} of the compacted {qps_compacted:.0}; the inserting thread busy {:.0}% of the time, holding the write lock {:.1}%, {} merges, at most {} runs, {} at the end",
            args.steady_insert_rate,
            st.insert_seconds,
            qps / qps_compacted,
            100.0 * st.insert_busy / st.insert_seconds,
            100.0 * st.write_locked / st.insert_seconds,
            st.merges,
            st.runs_max,
            st.runs_end,
        );
        steady = json!({
            "insert_rate_asked": args.steady_insert_rate,
            "inserts_per_second": ins,
            "inserted": st.inserted,
            "seconds": st.insert_seconds,
            "qps_one_thread": qps,
            "qps_to_compacted": qps / qps_compacted,
            "merges": st.merges,
            "runs_max": st.runs_max,
            "inserter_busy": st.insert_busy / st.insert_seconds,
            "write_locked": st.write_locked / st.insert_seconds,
            "runs_end": st.runs_end,
        });
    }

    let report = json!({
        "bench": "index",
        "workload": w.source,
        "n": n,
        "queries": w.queries.len(),
        "k": k,
        "design": design.to_string(),
        "tables": design.tables().len(),
        "codec": format!("{codec:?}").to_lowercase(),
        "layout": format!("{:?}", config.tables.layout).to_lowercase(),
        "block_bytes": block_bytes,
        "search": format!("{search:?}").to_lowercase(),
        "build_seconds": build_seconds,
        "build_fps_per_second_one_core": n as f64 / build_seconds,
        "build_seconds_all_cores": build_seconds_all,
        "build_peak_heap_bytes_one_core": peak_one.heap_bytes,
        "build_peak_heap_bytes_all_cores": peak_all.heap_bytes,
        "build_peak_rss_bytes_one_core": peak_one.rss_bytes,
        "build_peak_rss_bytes_all_cores": peak_all.rss_bytes,
        "build_peak_to_index_all_cores": peak_all.heap_bytes as f64 / index_bytes,
        "baseline_sort_seconds": baseline_sort_seconds,
        "build_to_baseline_sort": build_seconds / baseline_sort_seconds,
        "bits_per_fp_per_table": bits,
        "entropy_floor_bits": floor,
        "bits_ratio_to_floor": bits / floor,
        "index_bytes": mem.total_bytes,
        "doc_bytes": mem.doc_bytes,
        "huge_page_bytes": huge,
        "crowded_buckets": mem.tables.iter().map(|t| t.crowded_buckets).sum::<usize>(),
        "qps_one_thread": qps_one,
        "p50_us": p50,
        "p99_us": p99,
        "p999_us": p999,
        "qps_all_threads": qps_all,
        "threads": rayon::current_num_threads(),
        "results": results,
        "verified_exact": verified_exact,
        "verified_queries": sample,
        "bruteforce_qps_one_thread": bf_qps,
        "insert_docs_per_second": insert_rate,
        "inserts": inserts,
        "insert_batch": args.insert_batch,
        "runs_after_inserts": stats.runs,
        "recent_docs": config.recent_docs,
        "recent_bytes_after_inserts": recent_bytes,
        "qps_one_thread_after_inserts": qps_after,
        "compact_seconds": compact_secs,
        "qps_one_thread_after_compaction": qps_compacted,
        "qps_one_thread_same_docs_one_run": qps_bulk,
        "after_inserts_to_compacted": qps_after / qps_bulk,
        "steady": steady,
        "live_index_exact_spot_check": live_ok,
        "other_search": other_search,
    });
    println!("{report}");
    if mismatches > 0 || !live_ok {
        return Err("the index disagreed with brute force".into());
    }
    Ok(())
}
