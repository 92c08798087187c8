//! `neardup bench`: benchmark programs that print figures.

pub mod load;
pub mod service;

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The gRPC service on loopback: latency at fixed rates, batch throughput, durable
    /// inserts, mixed load, restart time, and the in-process index as the baseline.
    Service(service::ServiceArgs),
    /// Write a seeded web-page-like corpus (JSONL or one HTML file a page) with planted
    /// exact and near-duplicates, for measuring `neardup dedup`.
    Corpus(neardup_dedup::GenerateArgs),
}

/// Runs `neardup bench corpus`.
pub fn corpus(args: neardup_dedup::GenerateArgs) -> Result<(), String> {
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

/// Runs a benchmark.
pub async fn run(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Service(a) => service::run(a).await,
        BenchCommand::Corpus(a) => corpus(a),
    }
}
