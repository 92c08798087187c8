//! # neardup-cli
//!
//! The `neardup` command line. Each subcommand is a module of [`cmd`]:
//!
//! - `serve`: router, shard and storage in one process (the main command);
//! - `shard`, `router`: the two roles as separate processes;
//! - `insert`, `query`, `check`, `delete`, `stats`, `fingerprint`: client calls, printing
//!   JSON lines;
//! - `dedup`, `eval`: corpus dedup and quality evaluation, offline (the `neardup-dedup`
//!   library);
//! - `bench service`: the service benchmark on loopback; `bench corpus`: a seeded
//!   web-page-like corpus with planted duplicates.
//!
//! Adding a subcommand: a module under `cmd/` with an `Args` struct and a `run` function,
//! a variant of [`Command`], and its arm in [`main`].
#![deny(missing_docs)]

pub mod bench;
pub mod cmd;
pub mod config;
pub mod ops;

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "neardup",
    version,
    about = "Exact near-duplicate detection over simhash fingerprints"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API: router, shard and storage in one process.
    Serve(cmd::serve::ServeArgs),
    /// Serve a shard node alone (internal API).
    Shard(cmd::shard::ShardArgs),
    /// Serve the public API alone, in front of a shard node.
    Router(cmd::router::RouterArgs),
    /// Store documents.
    Insert(cmd::insert::InsertArgs),
    /// Find the stored documents near a fingerprint or text.
    Query(cmd::query::QueryArgs),
    /// Admit a document: near-duplicate or not, its cluster; stores it.
    Check(cmd::check::CheckArgs),
    /// Remove documents by id.
    Delete(cmd::delete::DeleteArgs),
    /// Show what the server holds.
    Stats(cmd::stats::StatsArgs),
    /// Fingerprint texts.
    Fingerprint(cmd::fingerprint::FingerprintArgs),
    /// Every document's duplicate cluster and original, for a whole corpus (offline).
    Dedup(neardup_dedup::DedupArgs),
    /// Precision and recall of detection against exact word-shingle Jaccard ground truth.
    Eval(neardup_dedup::EvalArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // The offline commands need no async runtime: they use every core through rayon.
    let offline = match cli.command {
        Command::Dedup(a) => {
            Some(neardup_dedup::run_dedup(a).map(|_| ()).map_err(|e| e.to_string()))
        }
        Command::Eval(a) => Some(neardup_dedup::run_eval(a).map(|_| ()).map_err(|e| e.to_string())),
        Command::Bench(bench::BenchCommand::Corpus(a)) => Some(bench::corpus(a)),
        command => {
            return run_online(command);
        }
    };
    match offline {
        Some(Ok(())) | None => 0,
        Some(Err(e)) => {
            eprintln!("neardup: {e}");
            1
        }
    }
}

/// Runs a command that talks to or is a server, on a tokio runtime.
fn run_online(command: Command) -> i32 {
    let cli = Cli { command };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("neardup: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(a) => cmd::serve::run(a).await,
            Command::Shard(a) => cmd::shard::run(a).await,
            Command::Router(a) => cmd::router::run(a).await,
            Command::Insert(a) => cmd::insert::run(a).await,
            Command::Query(a) => cmd::query::run(a).await,
            Command::Check(a) => cmd::check::run(a).await,
            Command::Delete(a) => cmd::delete::run(a).await,
            Command::Stats(a) => cmd::stats::run(a).await,
            Command::Fingerprint(a) => cmd::fingerprint::run(a).await,
            Command::Bench(b) => bench::run(b).await,
            Command::Dedup(_) | Command::Eval(_) => unreachable!("handled without a runtime"),
        }
    });
    // Background threads (merges, syncs) must not keep a finished process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("neardup: {e}");
            1
        }
    }
}
