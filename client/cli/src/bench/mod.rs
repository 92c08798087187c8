//! `neardup bench`: benchmark programs that print figures.

pub mod service;

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The gRPC service on loopback: latency at fixed rates, batch throughput, durable
    /// inserts, mixed load, restart time, and the in-process index as the baseline.
    Service(service::ServiceArgs),
}

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Service(a) => service::run(a).await,
    }
}
