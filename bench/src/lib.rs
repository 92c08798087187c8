//! `neardup-bench`: benchmark programs that print figures, each with a baseline measured in
//! the same run, and the quality evaluation. See the README for the commands.
//!
//! Every measurement program of neardup lives here, so that the production `neardup` binary
//! compiles none of them (no load generator, no plotting library, no font at run time). It
//! is a library with a thin `main` so that the integration tests can build it as a binary of
//! their own package, like the `neardup` command line.

// The index report is one large `json!` object.
#![recursion_limit = "256"]

mod alloc_peak;
mod backup;
mod bruteforce;
mod cluster;
mod cluster_map;
mod cpu;
mod decode;
mod designs;
mod disk;
mod eval;
mod eval_online;
mod eval_set_stats;
mod fingerprint;
mod h2call;
mod in_process;
mod index;
mod join;
mod latency;
mod load;
mod plot;
mod replica;
mod service;
mod service_tls;
mod workload;

use clap::{Parser, Subcommand};

/// A free port on 127.0.0.1 for a server a benchmark or a test starts (bound and released; the
/// server binds it right after). It comes from 20000-31999, below the kernel's ephemeral range,
/// so no outgoing connection's source port takes it before the server binds it, or while a
/// killed server waits to be restarted on it; and one process never gets the same port twice.
pub fn free_port() -> Result<u16, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    // Processes start at offsets of their own, so two of them rarely walk the same ports.
    let start = *START.get_or_init(|| std::process::id().wrapping_mul(7919) % SPAN);
    for _ in 0..SPAN {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free port in {LOW}-{} on 127.0.0.1", LOW + SPAN - 1))
}

#[derive(Parser)]
#[command(name = "neardup-bench", about = "neardup benchmarks: figures with same-run baselines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The in-memory index: build, queries on one and all threads, brute-force check,
    /// live inserts. Last line of stdout: one JSON object.
    Index(index::IndexArgs),
    /// Table designs: tables, prefix bits, expected candidates and estimated memory at a
    /// given n, for the paper's designs and the automatic choices.
    Designs(designs::DesignsArgs),
    /// Fingerprinting throughput (MB of text per second per core), MD5 and xxh3 features,
    /// against a naive implementation and raw MD5 measured in the same run.
    Fingerprint(fingerprint::Args),
    /// The gRPC service on loopback: latency at fixed rates, batch throughput, durable
    /// inserts, mixed load, restart time, and the in-process index as the baseline.
    Service(service::ServiceArgs),
    /// A single node's backup and restore on real processes, against loading the same
    /// documents by durable streaming inserts in the same run.
    Backup(backup::BackupArgs),
    /// Where a shard's bytes on disk go: durable loading, then single-document admissions,
    /// then a restart, in process; after each, disk against memory and every keyspace's live
    /// keys and values.
    Disk(disk::DiskArgs),
    /// The cluster's data path on real processes: 3 nodes on loopback measured through a
    /// router (latency at fixed rates, QueryBatch throughput, durable inserts, queries while
    /// a node is killed, bytes per document), and one node in the same run.
    Cluster(cluster::ClusterArgs),
    /// What one replica's writes cost a cluster node against the single node's shard, in
    /// process: the bound replication puts on the cluster's durable insert rate.
    Replica(replica::ReplicaArgs),
    /// The cluster map on real processes (3 and 5 nodes on loopback): time to a new leader
    /// after kill -9, to commit a membership change, and until every node sees it.
    ClusterMap(cluster_map::ClusterMapArgs),
    /// Write a seeded web-page-like corpus (JSONL or one HTML file a page) with planted
    /// exact and near-duplicates, for measuring `neardup dedup`.
    Corpus(neardup_dedup::GenerateArgs),
    /// Precision and recall of detection against exact word-shingle Jaccard ground truth,
    /// with the report's PNG plots.
    Eval(eval::EvalWithPlotsArgs),
    /// Raw decoding speed of Huffman-XOR runs (ns per value): one scan at a time against
    /// several scans advanced together as lanes.
    Decode(decode::DecodeArgs),
    /// The exact Jaccard join on a generated web-page-like corpus, checked against brute
    /// force on its first 2,000 documents.
    Join(join::JoinArgs),
    /// The duplicate structure of an evaluation set from `scripts/build-eval-set`: exact
    /// duplicates and near-duplicate pairs by how the two documents are related.
    EvalSetStats(eval_set_stats::EvalSetStatsArgs),
}

/// Runs `neardup-bench` on the process's arguments; returns the process exit code.
pub fn main() -> i32 {
    let result = match Cli::parse().command {
        Command::Index(args) => index::run(args),
        Command::Designs(args) => {
            designs::run(args);
            Ok(())
        }
        Command::Fingerprint(args) => {
            fingerprint::run(args);
            Ok(())
        }
        Command::Service(args) => service::main(args),
        Command::Backup(args) => backup::main(args),
        Command::Disk(args) => disk::run(args),
        Command::Cluster(args) => cluster::main(args),
        Command::Replica(args) => replica::run(args),
        Command::ClusterMap(args) => cluster_map::main(args),
        Command::Corpus(args) => corpus(args),
        Command::Eval(args) => eval::run(args).map_err(|e| e.to_string()),
        Command::Decode(args) => {
            decode::run(args);
            Ok(())
        }
        Command::Join(args) => {
            join::run(args);
            Ok(())
        }
        Command::EvalSetStats(args) => {
            eval_set_stats::run(args);
            Ok(())
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("neardup-bench: {e}");
            1
        }
    }
}

/// Runs `neardup-bench corpus`.
fn corpus(args: neardup_dedup::GenerateArgs) -> Result<(), String> {
    let g = neardup_dedup::run_generate(args).map_err(|e| e.to_string())?;
    eprintln!(
        "{} pages, {:.1} MB ({} exact copies, {} near copies planted)",
        g.docs,
        g.bytes as f64 / 1e6,
        g.exact,
        g.near
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_parses() {
        super::Cli::command().debug_assert();
    }
}
