//! Prints raw decoding speed of Huffman-XOR runs (ns per value): one scan at a time versus
//! several scans advanced together as lanes. For profiling the codec.
//!
//! ```text
//! neardup-bench decode [VALUES] [LANES]
//! ```
use neardup_core::codec::{HxTable, TableOptions, scan_lanes};
use neardup_core::util::SplitMix64;
use std::time::Instant;

/// Options of `neardup-bench decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// Values per run.
    #[arg(default_value_t = 5_000)]
    values: usize,
    /// Runs, scanned one at a time and then together as lanes.
    #[arg(default_value_t = 10)]
    lanes: usize,
}

/// Runs `neardup-bench decode`.
pub fn run(args: DecodeArgs) {
    let (n, lanes_n) = (args.values, args.lanes);
    let mut r = SplitMix64::new(1);
    let runs: Vec<HxTable> = (0..lanes_n)
        .map(|_| {
            let mut v: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
            v.sort_unstable();
            v.dedup();
            HxTable::encode(&v, TableOptions::default()).unwrap()
        })
        .collect();
    let total: usize = runs.iter().map(|r| r.len()).sum();
    for _ in 0..3 {
        let t = Instant::now();
        let mut acc = 0u64;
        for run in &runs {
            run.scan_range(0, u64::MAX, |x, _| acc ^= x);
        }
        let seq = t.elapsed().as_secs_f64() * 1e9 / total as f64;
        let t = Instant::now();
        let mut out = Vec::new();
        let mut lanes: Vec<_> =
            runs.iter().enumerate().map(|(i, r)| r.lane(0, u64::MAX, 0, i as u32)).collect();
        scan_lanes(runs[0].codec(), &mut lanes, 0, &mut out);
        let lan = t.elapsed().as_secs_f64() * 1e9 / total as f64;
        println!(
            "{} runs of {n}: sequential {seq:.2} ns/value, lanes {lan:.2} ns/value (acc {acc:x} {})",
            runs.len(),
            out.len()
        );
    }
}
