//! `neardup-bench designs`: what each table design costs and buys at a given n.

use neardup_core::design::{LayoutCost, NAMED};
use neardup_core::{Design, IndexConfig};

/// Options of `neardup-bench designs`.
#[derive(clap::Args, Debug)]
pub struct DesignsArgs {
    /// Expected number of stored fingerprints.
    #[arg(long, default_value_t = 10_000_000)]
    n: u64,
    /// Hamming distances for the automatic choices.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3,4,6,8,12")]
    k: Vec<u32>,
    /// Memory budgets for the automatic choices, in MB.
    #[arg(long, value_delimiter = ',', default_value = "250,1000,4000")]
    budget_mb: Vec<u64>,
    /// Also print each table's prefix bits.
    #[arg(long)]
    tables: bool,
}

fn describe(label: &str, d: &Design, n: u64, show_tables: bool) {
    let prefixes: Vec<u32> = d.tables().iter().map(|t| t.prefix_bits).collect();
    println!(
        "{label:<28} {:<12} max_k {:>2}  tables {:>3}  prefix {:>2}..{:<2} bits  candidates/query {:>12.1}  est. {:>8.0} MB  est. {:>7.2} us",
        d.to_string(),
        d.max_k(),
        d.tables().len(),
        prefixes.iter().min().unwrap_or(&0),
        prefixes.iter().max().unwrap_or(&0),
        d.expected_candidates(n),
        d.estimate_bytes(n, LayoutCost::default()) as f64 / 1e6,
        d.estimate_query_ns(n, LayoutCost::default()) / 1e3,
    );
    if show_tables {
        for (i, t) in d.tables().iter().enumerate() {
            let moves = t.perm.moves();
            println!(
                "    table {i:>3}: prefix {:>2} bits, {moves} moves, choices {:?}",
                t.prefix_bits, t.choice
            );
        }
    }
}

/// Runs `neardup-bench designs`.
pub fn run(args: DesignsArgs) {
    let n = args.n;
    println!(
        "n = {n}; estimates from the model in neardup_core::design (bytes: tables at the measured coding rates with block overhead, ids in log2 n bits, timestamps in 32; time: one overlapped miss and decoding per table). Default layout: XOR coding, 1 KiB blocks."
    );
    println!("\nThe paper's designs for k = 3:");
    for (name, _) in NAMED {
        let d = Design::parse(name).expect("named design");
        describe(name, &d, n, args.tables);
    }
    println!(
        "\nThe paper's recursion X(f, k, d): fewest tables leaving under 2^tau candidates per table:"
    );
    for &k in &args.k {
        for tau in [4u32, 8, 12] {
            if let Some(d) = Design::fewest_tables(n, k, tau) {
                describe(&format!("k={k} tau={tau}"), &d, n, args.tables);
            }
        }
    }
    println!(
        "\nIndexConfig::auto: design and layout together (fastest estimate within the budget):"
    );
    for &k in &args.k {
        for &mb in &args.budget_mb {
            match IndexConfig::auto(n, k, mb * 1_000_000) {
                Ok(c) => {
                    let layout = LayoutCost::of(&c.tables);
                    let how = match layout {
                        LayoutCost::Packed => "packed".to_string(),
                        LayoutCost::Blocks { .. } => {
                            format!("{:?} {} B blocks", c.tables.codec, c.tables.block_bytes)
                        }
                    };
                    println!(
                        "k={k:<2} budget={mb:>5}MB  {:<10} {how:<18}  tables {:>3}  est. {:>8.0} MB  est. {:>8.2} us",
                        c.design.to_string(),
                        c.design.tables().len(),
                        c.design.estimate_bytes(n, layout) as f64 / 1e6,
                        c.design.estimate_query_ns(n, layout) / 1e3,
                    );
                }
                Err(e) => println!("k={k} budget={mb}MB: {e}"),
            }
        }
    }
    println!("\nDesign::auto (design only, XOR coding in 1 KiB blocks):");
    for &k in &args.k {
        for &mb in &args.budget_mb {
            match Design::auto(n, k, mb * 1_000_000) {
                Ok(d) => describe(&format!("k={k} budget={mb}MB"), &d, n, args.tables),
                Err(e) => println!("k={k} budget={mb}MB: {e}"),
            }
        }
    }
}
