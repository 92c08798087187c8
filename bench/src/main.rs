//! `neardup-bench`: benchmark programs that print figures, each with a baseline measured in
//! the same run. See the README for the commands.

mod bruteforce;
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
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Index(args) => index::run(args),
    };
    if let Err(e) = result {
        eprintln!("neardup-bench: {e}");
        std::process::exit(1);
    }
}
