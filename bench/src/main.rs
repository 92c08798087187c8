//! `neardup-bench`: benchmark programs that print figures, each with a baseline measured in
//! the same run. See the README for the commands.

// The index report is one large `json!` object.
#![recursion_limit = "256"]

mod bruteforce;
mod designs;
mod fingerprint;
mod index;
mod workload;

use clap::{Parser, Subcommand};

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
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Index(args) => {
            if let Err(e) = index::run(args) {
                eprintln!("neardup-bench: {e}");
                std::process::exit(1);
            }
        }
        Command::Designs(args) => designs::run(args),
        Command::Fingerprint(args) => fingerprint::run(args),
    }
}
