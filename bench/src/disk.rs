//! `neardup-bench disk`: where a shard's bytes on disk go, measured in process.
//!
//! It opens a shard (the service's configuration, `neardup serve`'s defaults and the
//! `--set` values over them) in a fresh data directory and drives it as the service
//! benchmark's clients do, without the network in between:
//! 1. durable inserts of `--n` generated documents (`--streams` writers, `--batch` documents a
//!    write, each acknowledged after group commit), then waits for merges, the idle
//!    compaction and the checkpoint;
//! 2. `--admissions` verified single-document admissions (CheckAndInsert one at a time from
//!    `--admit-threads` writers, each acknowledged after group commit), then settles again;
//! 3. a clean shutdown, and the time to open and recover the shard again.
//!
//! After each phase it reports the index's memory, the document table's memory, the log,
//! the store's size on disk by file, and the live keys and values of every keyspace (a full
//! scan), so what the engine spends beyond the data shows. The last line of stdout is one
//! JSON object.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use neardup_cli::config::{Config, ConfigFlags};
use neardup_core::sketch::Sketch;
use neardup_server::metrics::ShardMetrics;
use neardup_server::shard::{NewDocument, Shard, Verify};
use serde_json::{Value, json};

use crate::in_process::{LoadArgs, settle_shard};
use crate::service::workload;

/// Options of `neardup-bench disk`.
#[derive(Debug, clap::Args)]
pub struct DiskArgs {
    /// Documents loaded, the design, and the writers of the load.
    #[command(flatten)]
    load: LoadArgs,
    /// Store every document with a (synthetic) sketch.
    #[arg(long)]
    sketches: bool,
    /// Verified single-document admissions after the load.
    #[arg(long, default_value_t = 30_000)]
    admissions: usize,
    /// Concurrent admitting writers.
    #[arg(long, default_value_t = 4)]
    admit_threads: usize,
    /// Admissions per second in all (0: as fast as they are acknowledged).
    #[arg(long, default_value_t = 0)]
    admit_rate: u64,
    /// Data directory (removed first) [default: a fresh temporary one, removed at the end].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Extra `key=value` settings over the service's defaults (repeatable), as `neardup
    /// serve --set`.
    #[arg(long = "set")]
    set: Vec<String>,
    /// Skip the per-keyspace scan (slow at 10M documents and more).
    #[arg(long)]
    no_scan: bool,
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 20070508)]
    seed: u64,
}

fn name(i: usize) -> String {
    format!("https://bench.example/page/{i}")
}

/// What the shard holds in memory and on disk now, per document.
fn report(shard: &Shard, scan: bool) -> Result<Value, String> {
    let s = shard.stats().map_err(|e| e.to_string())?;
    let doc_bytes = shard.doc_bytes() as u64;
    let n = s.documents.max(1) as f64;
    let (spaces, files) = if scan {
        let u = shard.disk_usage().map_err(|e| e.to_string())?;
        (u.spaces, u.files)
    } else {
        (Vec::new(), Vec::new())
    };
    let live: u64 = spaces.iter().map(|u| u.key_bytes + u.value_bytes).sum();
    let per_space: serde_json::Map<String, Value> = spaces
        .iter()
        .map(|u| {
            (
                u.name.to_string(),
                json!({ "keys": u.keys, "key_bytes": u.key_bytes, "value_bytes": u.value_bytes,
                        "max_value": u.max_value,
                        "bytes_per_doc": (u.key_bytes + u.value_bytes) as f64 / n }),
            )
        })
        .collect();
    let files: serde_json::Map<String, Value> =
        files.into_iter().map(|(k, v)| (k, json!(v))).collect();
    Ok(json!({
        "documents": s.documents,
        "runs": s.runs,
        "index_bytes": s.index_bytes,
        "doc_bytes": doc_bytes,
        "wal_bytes": s.wal_bytes,
        "disk_bytes": s.disk_bytes,
        "index_bytes_per_doc": s.index_bytes as f64 / n,
        "doc_bytes_per_doc": doc_bytes as f64 / n,
        "disk_bytes_per_doc": s.disk_bytes as f64 / n,
        "disk_over_index": s.disk_bytes as f64 / s.index_bytes.max(1) as f64,
        "disk_over_index_and_docs": s.disk_bytes as f64 / (s.index_bytes + doc_bytes).max(1) as f64,
        "live_bytes": live,
        "live_bytes_per_doc": live as f64 / n,
        "disk_over_live": s.disk_bytes as f64 / live.max(1) as f64,
        "files": files,
        "spaces": per_space,
    }))
}

fn print_report(label: &str, r: &Value) {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    eprintln!(
        "{label}: {} docs, {} runs; index {:.1} B/doc, documents {:.1} B/doc; disk {:.1} B/doc \
         ({:.2}x index, {:.2}x index+documents), log {:.1} MB; live keys+values {:.1} B/doc \
         (disk {:.2}x live)",
        r["documents"],
        r["runs"],
        f("index_bytes_per_doc"),
        f("doc_bytes_per_doc"),
        f("disk_bytes_per_doc"),
        f("disk_over_index"),
        f("disk_over_index_and_docs"),
        f("wal_bytes") / 1e6,
        f("live_bytes_per_doc"),
        f("disk_over_live"),
    );
    if let Some(files) = r["files"].as_object() {
        let parts: Vec<String> = files.iter().map(|(k, v)| format!("{k} {v}")).collect();
        eprintln!("  files: {}", parts.join(", "));
    }
    if let Some(spaces) = r["spaces"].as_object() {
        for (name, u) in spaces {
            eprintln!(
                "  {name:<12} {:>9} keys {:>12} B keys {:>13} B values (largest {:>7}) {:>7.1} B/doc",
                u["keys"],
                u["key_bytes"],
                u["value_bytes"],
                u["max_value"],
                u["bytes_per_doc"].as_f64().unwrap_or(0.0)
            );
        }
    }
}

fn sketch_of(fp: u64) -> Option<Sketch> {
    Sketch::from_bytes(&crate::load::synthetic_sketch(fp)).ok()
}

/// Runs `neardup-bench disk`.
pub fn run(args: DiskArgs) -> Result<(), String> {
    let tmp;
    let data = match &args.data {
        Some(d) => {
            let _ = std::fs::remove_dir_all(d);
            d.clone()
        }
        None => {
            tmp = crate::service::tempfile_dir()?;
            tmp.clone()
        }
    };
    let mut set = vec!["storage.compact_idle_secs=1".to_string()];
    set.extend(args.set.iter().cloned());
    let flags = ConfigFlags { design: Some(args.load.design.clone()), set, ..Default::default() };
    let config = Config::load(&flags, std::iter::empty()).map_err(|e| e.to_string())?;
    let shard_config = config.shard_config().map_err(|e| e.to_string())?;
    eprintln!("generating {} documents", args.load.n);
    let w = workload(args.load.n, args.admissions.max(1), args.seed);
    let fps = Arc::new(w.stored);
    let queries = Arc::new(w.queries);
    let mut out = serde_json::Map::new();
    out.insert("n".into(), json!(args.load.n));
    out.insert("design".into(), json!(args.load.design));
    out.insert("block_bytes".into(), json!(config.index.block_bytes));
    out.insert("sketches".into(), json!(args.sketches));

    let shard = Shard::open(&data, shard_config.clone(), ShardMetrics::default())
        .map_err(|e| e.to_string())?;
    shard.recover().map_err(|e| e.to_string())?;

    // 1. The load.
    eprintln!(
        "loading {} documents: {} writers, {} a write",
        args.load.n, args.load.streams, args.load.batch
    );
    let t = Instant::now();
    crate::in_process::load(args.load.n, args.load.batch, args.load.streams, |first, end| {
        let docs: Vec<NewDocument> = (first..end)
            .map(|i| NewDocument {
                id: name(i),
                fingerprint: fps[i],
                timestamp_ms: i as i64,
                sketch: if args.sketches { sketch_of(fps[i]) } else { None },
            })
            .collect();
        let o = shard.write(&docs, &[], false).map_err(|e| e.to_string())?;
        shard.wait_durable_blocking(o.seq).map_err(|e| e.to_string())
    })?;
    let load_secs = t.elapsed().as_secs_f64();
    eprintln!("  {:.0} documents/s durable", args.load.n as f64 / load_secs);
    let settle_secs = settle_shard(&shard, Duration::from_secs(900))?;
    let loaded = report(&shard, !args.no_scan)?;
    print_report("after the load", &loaded);
    out.insert(
        "load".into(),
        json!({ "seconds": load_secs, "settle_seconds": settle_secs, "after": loaded }),
    );

    // 2. Single-document admissions.
    if args.admissions > 0 {
        eprintln!(
            "{} verified admissions, {} writers{}",
            args.admissions,
            args.admit_threads,
            if args.admit_rate > 0 { format!(", {}/s", args.admit_rate) } else { String::new() }
        );
        let t = Instant::now();
        let next = AtomicUsize::new(0);
        let verify = Verify { jaccard: 0.9, candidate_k: shard.max_k() };
        let k = 3.min(shard.max_k());
        std::thread::scope(|s| -> Result<(), String> {
            let workers: Vec<_> = (0..args.admit_threads.max(1))
                .map(|_| {
                    s.spawn(|| -> Result<(), String> {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= args.admissions {
                                return Ok(());
                            }
                            if args.admit_rate > 0 {
                                let due =
                                    t + Duration::from_secs_f64(i as f64 / args.admit_rate as f64);
                                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                                    std::thread::sleep(wait);
                                }
                            }
                            let q = queries[i % queries.len()];
                            let doc = NewDocument {
                                id: format!("https://bench.example/admitted/{i}"),
                                fingerprint: q,
                                timestamp_ms: (args.load.n + i) as i64,
                                sketch: sketch_of(q),
                            };
                            let (_, seq) = shard
                                .admit(&doc, k, verify, 100, false)
                                .map_err(|e| e.to_string())?;
                            shard.wait_durable_blocking(seq).map_err(|e| e.to_string())?;
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().map_err(|_| "an admitting writer panicked".to_string())??;
            }
            Ok(())
        })?;
        let secs = t.elapsed().as_secs_f64();
        eprintln!("  {:.0} admissions/s", args.admissions as f64 / secs);
        let during = report(&shard, false)?;
        eprintln!("  at the end of the calls: disk {} B", during["disk_bytes"]);
        let settle_secs = settle_shard(&shard, Duration::from_secs(900))?;
        let after = report(&shard, !args.no_scan)?;
        print_report("after the admissions", &after);
        let grown = after["disk_bytes"].as_f64().unwrap_or(0.0)
            - loaded["disk_bytes"].as_f64().unwrap_or(0.0);
        eprintln!(
            "  disk grew {:.1} MB, {:.0} B per admission",
            grown / 1e6,
            grown / args.admissions as f64
        );
        out.insert(
            "admissions".into(),
            json!({ "count": args.admissions, "seconds": secs, "settle_seconds": settle_secs,
                    "disk_bytes_at_end_of_calls": during["disk_bytes"],
                    "disk_growth_per_admission": grown / args.admissions as f64,
                    "after": after }),
        );
    }

    // 3. Clean shutdown and recovery.
    let t = Instant::now();
    shard.shutdown().map_err(|e| e.to_string())?;
    let shutdown_secs = t.elapsed().as_secs_f64();
    drop(shard);
    let t = Instant::now();
    let shard =
        Shard::open(&data, shard_config, ShardMetrics::default()).map_err(|e| e.to_string())?;
    shard.recover().map_err(|e| e.to_string())?;
    let recover_secs = t.elapsed().as_secs_f64();
    eprintln!("shutdown {shutdown_secs:.2} s; open and recover {recover_secs:.2} s");
    let reopened = report(&shard, !args.no_scan)?;
    print_report("after a restart", &reopened);
    out.insert(
        "restart".into(),
        json!({ "shutdown_seconds": shutdown_secs, "recover_seconds": recover_secs,
                "after": reopened }),
    );
    shard.shutdown().map_err(|e| e.to_string())?;
    drop(shard);
    if args.data.is_none() {
        let _ = std::fs::remove_dir_all(&data);
    }
    println!("{}", Value::Object(out));
    Ok(())
}
