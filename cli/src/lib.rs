//! # neardup-cli
//!
//! The `neardup` command line. Each subcommand is a module of [`cmd`]:
//!
//! - `serve`: router, shard and storage in one process (the main command);
//! - `shard`, `router`: the two roles as separate processes;
//! - `insert`, `query`, `check`, `delete`, `stats`, `fingerprint`: client calls, printing
//!   JSON lines;
//! - `cluster`: the admin API of a cluster node (status, add, remove, transfer-leader,
//!   rebalance);
//! - `dedup`: corpus dedup, offline (the `neardup-dedup` library);
//! - `token`: API tokens for a server's tokens file;
//! - `cert`: a certificate authority and certificates for TLS.
//!
//! Benchmarks and the quality evaluation are measurement programs: they are subcommands of
//! `neardup-bench`, so this binary links no load generator and no plotting.
//!
//! Every command returns [`CliError`]: one line on stderr, and its exit code.
//!
//! Adding a subcommand: a module under `cmd/` with an `Args` struct and a `run` function,
//! a variant of [`Command`], and its arm in [`main`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cmd;
pub mod config;
pub mod error;
pub mod ops;

pub use error::CliError;

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
    /// Ask whether the server is serving (grpc.health.v1); exits 0 only if it is.
    Health(cmd::health::HealthArgs),
    /// Copy every document of a running server (a node, or a whole cluster) into a
    /// directory.
    Backup(cmd::backup::BackupArgs),
    /// Store a backup's documents into a fresh server (a node, or a cluster).
    Restore(cmd::backup::RestoreArgs),
    /// Fingerprint texts.
    Fingerprint(cmd::fingerprint::FingerprintArgs),
    /// Administer a cluster: status, add, remove, transfer-leader, rebalance (JSON output).
    Cluster(cmd::cluster::ClusterArgs),
    /// Every document's duplicate cluster and original, for a whole corpus (offline).
    Dedup(neardup_dedup::DedupArgs),
    /// Make API tokens for a server's tokens file.
    Token(cmd::token::TokenArgs),
    /// Make a certificate authority and certificates it signs (tests, small deployments).
    Cert(cmd::cert::CertArgs),
    /// Make, once, what a small cluster needs for TLS and tokens: a CA, node certificates,
    /// tokens (what exists is kept).
    Secrets(cmd::secrets::SecretsArgs),
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // The offline command needs no async runtime: it uses every core through rayon.
    let result = match cli.command {
        Command::Dedup(a) => neardup_dedup::run_dedup(a).map(|_| ()).map_err(CliError::from),
        Command::Token(a) => cmd::token::run(a),
        Command::Cert(a) => cmd::cert::run(a),
        Command::Secrets(a) => cmd::secrets::run(a),
        command => run_online(command),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("neardup: {e}");
            e.exit_code()
        }
    }
}

/// Runs a command that talks to or is a server, on a tokio runtime.
fn run_online(command: Command) -> Result<(), CliError> {
    let cli = Cli { command };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
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
            Command::Health(a) => cmd::health::run(a).await,
            Command::Backup(a) => cmd::backup::run_backup(a).await,
            Command::Restore(a) => cmd::backup::run_restore(a).await,
            Command::Fingerprint(a) => cmd::fingerprint::run(a).await,
            Command::Cluster(a) => cmd::cluster::run(a).await,
            Command::Dedup(_) | Command::Token(_) | Command::Cert(_) | Command::Secrets(_) => {
                unreachable!("handled without a runtime")
            }
        }
    });
    // Background threads (merges, syncs) must not keep a finished process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
