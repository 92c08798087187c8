//! `neardup-bench`: benchmark programs that print figures, each with a baseline measured in
//! the same run. See the README for the commands.

use clap::{Parser, Subcommand};

mod fingerprint;

#[derive(Parser)]
#[command(
    name = "neardup-bench",
    about = "neardup benchmarks: figures with same-run baselines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fingerprinting throughput (MB of text per second per core), MD5 and xxh3 features,
    /// against a naive implementation and raw MD5 measured in the same run.
    Fingerprint(fingerprint::Args),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Fingerprint(args) => fingerprint::run(args),
    }
}
