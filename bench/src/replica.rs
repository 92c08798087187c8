//! `neardup-bench replica`: what one copy of the data costs a cluster node to write, against
//! what the single node's shard costs for the same documents, in process.
//!
//! A cluster with `R` replicas writes every document's entries and the document itself `R`
//! times; the nodes share the machine's cores with each other as the single node has them
//! to itself. So the cluster's durable insert rate can be at most
//! `single CPU per document / (R x one replica's CPU per document)` of the single node's,
//! before the network and the router cost anything. This program measures both sides of
//! that bound, with the service's configuration (`neardup serve`'s defaults and `--set`
//! values over them, as `neardup-bench cluster` starts its nodes) and without the network:
//! 1. **single**: a shard with names, `--streams` writers of `--batch` documents a write,
//!    each acknowledged after group commit (as `neardup-bench disk` loads one);
//! 2. **replica**: a node's store holding every tablet and every partition, written as a
//!    node's data API writes one replica of the router's insert: the entries of every table
//!    (new gids), then the documents, each durable before the next.
//!
//! For each: process CPU per document until the last write was acknowledged, and until the
//! merges, compaction and checkpoint the writes left have settled. The last line of stdout is
//! one JSON object.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use neardup_cli::config::{Config, ConfigFlags};
use neardup_server::data_types::{DocInfo, DocOp, TabletOp, make_gid};
use neardup_server::metrics::ShardMetrics;
use neardup_server::node_store::{NodeStore, NodeStoreConfig};
use neardup_server::shard::{NewDocument, Shard};
use serde_json::{Value, json};

use crate::cpu::{cpu_of, cpu_per};
use crate::in_process::{LoadArgs, load, settle, settle_shard};
use crate::service::{name, tempfile_dir, workload};

/// Options of `neardup-bench replica`.
#[derive(Debug, clap::Args)]
pub struct ReplicaArgs {
    /// Documents written to each side, the design, and the writers.
    #[command(flatten)]
    load: LoadArgs,
    /// Replicas of the cluster the bound is given for.
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// Extra `--set key=value` settings over the service's defaults (repeatable).
    #[arg(long = "set")]
    set: Vec<String>,
    /// Seed of the generated fingerprints.
    #[arg(long, default_value_t = 20070508)]
    seed: u64,
}

/// CPU seconds of this process so far.
fn cpu_now() -> Result<f64, String> {
    cpu_of(&[std::process::id()]).ok_or_else(|| "no /proc/self/stat".to_string())
}

/// CPU per document until acknowledged and until settled, and the wall time of the load.
fn measured(
    n: usize,
    cpu_start: f64,
    t: Instant,
    settle_secs: impl FnOnce() -> Result<f64, String>,
) -> Result<Value, String> {
    let acked = cpu_now()?;
    let load_secs = t.elapsed().as_secs_f64();
    let settled_secs = settle_secs()?;
    let settled = cpu_now()?;
    let per = |c: f64| cpu_per(Some(cpu_start), Some(c), n as u64);
    Ok(json!({
        "documents": n,
        "load_seconds": load_secs,
        "docs_per_second": n as f64 / load_secs,
        "settle_seconds": settled_secs,
        "cpu_us_per_doc_acked": per(acked),
        "cpu_us_per_doc_settled": per(settled),
    }))
}

/// Bytes once settled, as they go into a side's figures.
struct Bytes {
    memory: u64,
    disk: u64,
    /// Live keys and values by keyspace.
    spaces: Vec<(String, u64)>,
    /// The store's files by kind.
    files: Vec<(String, u64)>,
}

/// `out` with `bytes` per document of `n`.
fn with_bytes(mut out: Value, n: usize, bytes: Bytes) -> Value {
    let per = |b: u64| json!(b as f64 / n.max(1) as f64);
    let map =
        |v: Vec<(String, u64)>| Value::Object(v.into_iter().map(|(k, b)| (k, per(b))).collect());
    out["memory_bytes_per_doc"] = per(bytes.memory);
    out["disk_bytes_per_doc"] = per(bytes.disk);
    out["live_bytes_per_doc"] = map(bytes.spaces);
    out["files_bytes_per_doc"] = map(bytes.files);
    out
}

fn single(config: &Config, dir: &Path, fps: &[u64], args: &ReplicaArgs) -> Result<Value, String> {
    let shard_config = config.shard_config().map_err(|e| e.to_string())?;
    let shard =
        Shard::open(dir, shard_config, ShardMetrics::default()).map_err(|e| e.to_string())?;
    shard.recover().map_err(|e| e.to_string())?;
    let (cpu_start, t) = (cpu_now()?, Instant::now());
    load(fps.len(), args.load.batch, args.load.streams, |first, end| {
        let docs: Vec<NewDocument> = (first..end)
            .map(|i| NewDocument {
                id: name(i),
                fingerprint: fps[i],
                timestamp_ms: i as i64,
                sketch: None,
            })
            .collect();
        let o = shard.write(&docs, &[], false).map_err(|e| e.to_string())?;
        shard.wait_durable_blocking(o.seq).map_err(|e| e.to_string())
    })?;
    let out = measured(fps.len(), cpu_start, t, || settle_shard(&shard, Duration::from_secs(900)))?;
    // What was measured must be what was written: every document, once.
    let st = shard.stats().map_err(|e| e.to_string())?;
    if st.documents != fps.len() as u64 {
        return Err(format!(
            "the shard holds {} documents, {} were written",
            st.documents,
            fps.len()
        ));
    }
    let usage = shard.disk_usage().map_err(|e| e.to_string())?;
    shard.shutdown().map_err(|e| e.to_string())?;
    let spaces =
        usage.spaces.iter().map(|u| (u.name.to_string(), u.key_bytes + u.value_bytes)).collect();
    let memory = st.index_bytes + st.document_bytes;
    let bytes = Bytes { memory, disk: st.disk_bytes, spaces, files: usage.files };
    Ok(with_bytes(out, fps.len(), bytes))
}

fn replica(config: &Config, dir: &Path, fps: &[u64], args: &ReplicaArgs) -> Result<Value, String> {
    let design = config.index_config().map_err(|e| e.to_string())?.design;
    let shard = config.shard_config().map_err(|e| e.to_string())?;
    let store_config = NodeStoreConfig::of_shard(shard);
    let store = NodeStore::open(dir, &design, store_config, ShardMetrics::default())
        .map_err(|e| e.to_string())?;
    let tables = design.tables().len() as u32;
    // The gid of document `i`: in partition `i % 16`, as the router's ids are spread.
    let gid = |i: usize| make_gid(i as u64 + 1, (i % 16) as u32);
    // One runtime for every writer to wait on its writes' syncs (made before the CPU count
    // starts, not once a write).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .map_err(|e| e.to_string())?;
    let (cpu_start, t) = (cpu_now()?, Instant::now());
    load(fps.len(), args.load.batch, args.load.streams, |first, end| {
        let ops: Vec<(u32, TabletOp)> = (first..end)
            .flat_map(|i| (0..tables).map(move |t| (t, TabletOp::Put { gid: gid(i), fp: fps[i] })))
            .collect();
        let new = vec![true; ops.len()];
        let durable = store.append_tablets(ops, &new).map_err(|e| e.to_string())?;
        rt.block_on(durable.wait()).map_err(|e| e.to_string())?;
        let docs: Vec<DocOp> = (first..end)
            .map(|i| {
                DocOp::Put(DocInfo {
                    gid: gid(i),
                    name: name(i),
                    fp: fps[i],
                    ts_ms: i as i64,
                    cluster: gid(i),
                    sketch: None,
                })
            })
            .collect();
        let durable = store.append_docs(&docs).map_err(|e| e.to_string())?;
        rt.block_on(durable.wait()).map_err(|e| e.to_string())
    })?;
    let out = measured(fps.len(), cpu_start, t, || {
        settle(
            || {
                let s = store.stats();
                Ok((s.runs, s.merges, s.buffered, s.merging, s.checkpoint_pending))
            },
            Duration::from_secs(900),
        )
    })?;
    let held = store.stats();
    let n = fps.len() as u64;
    if held.documents != n
        || held.entries.len() != tables as usize
        || held.entries.iter().any(|&e| e != n)
    {
        return Err(format!(
            "the store holds {} documents and {:?} entries a table, {n} of each were written",
            held.documents, held.entries
        ));
    }
    // Live keys and values by keyspace, summed over the table shards and for the documents.
    let mut spaces: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut files = Vec::new();
    for (part, usage) in store.disk_usage().map_err(|e| e.to_string())? {
        let whose = if part == "documents" { "documents" } else { "tables" };
        for u in usage.spaces {
            *spaces.entry(format!("{whose}/{}", u.name)).or_default() +=
                u.key_bytes + u.value_bytes;
        }
        files = usage.files;
    }
    store.shutdown().map_err(|e| e.to_string())?;
    let bytes = Bytes {
        memory: held.memory_bytes,
        disk: held.disk_bytes,
        spaces: spaces.into_iter().collect(),
        files,
    };
    Ok(with_bytes(out, fps.len(), bytes))
}

/// Runs `neardup-bench replica`.
pub fn run(args: ReplicaArgs) -> Result<(), String> {
    let base: PathBuf = tempfile_dir()?;
    let mut set = vec!["storage.compact_idle_secs=1".to_string()];
    set.extend(args.set.iter().cloned());
    let flags = ConfigFlags { design: Some(args.load.design.clone()), set, ..Default::default() };
    let config = Config::load(&flags, std::iter::empty()).map_err(|e| e.to_string())?;
    eprintln!("generating {} documents", args.load.n);
    let fps = workload(args.load.n, 1, args.seed).stored;
    let result = (|| -> Result<(Value, Value), String> {
        eprintln!(
            "single: a shard with names, {} writers of {}",
            args.load.streams, args.load.batch
        );
        let s = single(&config, &base.join("single"), &fps, &args)?;
        std::fs::create_dir_all(base.join("replica")).map_err(|e| e.to_string())?;
        eprintln!(
            "replica: every tablet and partition of a node's store, {} writers",
            args.load.streams
        );
        let r = replica(&config, &base.join("replica"), &fps, &args)?;
        Ok((s, r))
    })();
    let _ = std::fs::remove_dir_all(&base);
    let (s, r) = result?;
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let rf = f64::from(args.replicas.max(1));
    let bound = |k: &str| f(&s, k) / (rf * f(&r, k));
    println!(
        "neardup-bench replica: {} documents, design {}, {} writers of {} (process CPU, in process, no network)",
        args.load.n, args.load.design, args.load.streams, args.load.batch
    );
    println!("| figure | single shard | one replica |");
    println!("|---|---:|---:|");
    println!(
        "| durable writes, documents/s | {:.0} | {:.0} |",
        f(&s, "docs_per_second"),
        f(&r, "docs_per_second")
    );
    for (label, k) in [
        ("CPU per document until acknowledged, us", "cpu_us_per_doc_acked"),
        ("... until merges settled, us", "cpu_us_per_doc_settled"),
    ] {
        println!("| {label} | {:.2} | {:.2} |", f(&s, k), f(&r, k));
    }
    for (label, k) in [
        ("memory once settled (index and documents), bytes/document", "memory_bytes_per_doc"),
        ("disk once settled, bytes/document", "disk_bytes_per_doc"),
    ] {
        println!("| {label} | {:.1} | {:.1} |", f(&s, k), f(&r, k));
    }
    for side in [&s, &r] {
        eprintln!(
            "  live keys and values by keyspace, bytes/document: {}; files: {}",
            side["live_bytes_per_doc"], side["files_bytes_per_doc"]
        );
    }
    println!(
        "bound on a {}-replica cluster's durable insert rate on the same cores, before any network: \
         {:.2}x the single node's (until acknowledged), {:.2}x (until settled)",
        args.replicas,
        bound("cpu_us_per_doc_acked"),
        bound("cpu_us_per_doc_settled")
    );
    let out = json!({
        "n": args.load.n,
        "design": args.load.design,
        "replicas": args.replicas,
        "single": s,
        "replica": r,
        "insert_rate_bound_acked": bound("cpu_us_per_doc_acked"),
        "insert_rate_bound_settled": bound("cpu_us_per_doc_settled"),
    });
    println!("{out}");
    Ok(())
}
