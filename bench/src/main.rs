//! `neardup-bench`: benchmark programs that print figures, each with a baseline measured in
//! the same run. See the README for the commands.

use clap::{Parser, Subcommand};

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
enum Command {}

fn main() {
    let cli = Cli::parse();
    match cli.command {}
}
