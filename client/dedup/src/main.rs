//! `neardup-dedup`: a thin command line over the `neardup-dedup` library (`dedup`, `eval`,
//! `generate`), for end-to-end tests until the `neardup` binary wires the same entry points.

use clap::Parser;

#[derive(Parser)]
#[command(name = "neardup-dedup", about = "neardup corpus dedup and quality evaluation")]
enum Cli {
    /// Every document's duplicate cluster and original.
    Dedup(neardup_dedup::DedupArgs),
    /// Precision and recall against exact word 3-gram Jaccard ground truth.
    Eval(neardup_dedup::EvalArgs),
    /// Write a seeded web-page-like corpus with planted exact and near-duplicates.
    Generate(neardup_dedup::GenerateArgs),
}

fn main() {
    let result = match Cli::parse() {
        Cli::Dedup(args) => neardup_dedup::run_dedup(args).map(|_| ()),
        Cli::Eval(args) => neardup_dedup::run_eval(args).map(|_| ()),
        Cli::Generate(args) => neardup_dedup::run_generate(args).map(|g| {
            eprintln!(
                "{} pages, {:.1} MB ({} exact copies, {} near copies planted)",
                g.docs,
                g.bytes as f64 / 1e6,
                g.exact,
                g.near
            );
        }),
    };
    if let Err(e) = result {
        eprintln!("neardup: {e}");
        std::process::exit(1);
    }
}
