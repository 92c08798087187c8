//! Times the exact Jaccard join on a generated corpus of web-page-like documents and prints
//! the figures (no assertions on time anywhere else).
//!
//! ```text
//! neardup-bench join [DOCS] [THRESHOLD...]
//! ```
//!
//! Defaults: 50,000 documents, thresholds 0.5 and 0.8. The corpus: 500 sites, each with its
//! own header and footer boilerplate (30 to 300 words); page bodies of 150 to 3,000 words
//! drawn from a Zipf vocabulary of 200,000 words; one page in five is an edited copy of an
//! earlier page (1% to 20% of its words replaced, or a block cut), one in fifty an exact copy.
//! Documents are word 3-gram shingle sets. A brute-force join on the first 2,000 documents
//! checks the answer.

use std::time::Instant;

use neardup_core::util::SplitMix64;
use neardup_dedup::jaccard::{brute_force_join, similarity_join, similarity_join_with_stats};

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let cdf = (1..=n)
            .map(|r| {
                acc += 1.0 / (r as f64).powf(s);
                acc
            })
            .collect();
        Zipf { cdf }
    }
    fn sample(&self, r: &mut SplitMix64) -> u32 {
        let total = *self.cdf.last().unwrap();
        let u = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        self.cdf.partition_point(|&c| c < u) as u32
    }
}

fn words(z: &Zipf, r: &mut SplitMix64, n: usize) -> Vec<u32> {
    (0..n).map(|_| z.sample(r)).collect()
}

fn shingles(w: &[u32]) -> Vec<u64> {
    let mut v: Vec<u64> = w
        .windows(3)
        .map(|g| mix((g[0] as u64) ^ mix((g[1] as u64) << 21 ^ mix(g[2] as u64 + 0x51ED))))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Options of `neardup-bench join`: `[DOCS] [THRESHOLD...]`, as the defaults above.
#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// Documents [default: 50000], then Jaccard thresholds [default: 0.5 0.8].
    args: Vec<String>,
}

/// Runs `neardup-bench join`.
pub fn run(JoinArgs { args }: JoinArgs) {
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let mut thresholds: Vec<f64> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    if thresholds.is_empty() {
        thresholds = vec![0.5, 0.8];
    }

    let t0 = Instant::now();
    let mut r = SplitMix64::new(2007);
    let z = Zipf::new(200_000, 1.0);
    let sites: Vec<(Vec<u32>, Vec<u32>)> = (0..500)
        .map(|_| {
            let h = 30 + r.below(270) as usize;
            let f = 30 + r.below(270) as usize;
            (words(&z, &mut r, h), words(&z, &mut r, f))
        })
        .collect();
    let mut bodies: Vec<(usize, Vec<u32>)> = Vec::with_capacity(n);
    for i in 0..n {
        let roll = r.below(100);
        let body = if i > 0 && roll < 2 {
            bodies[r.below(i as u64) as usize].clone()
        } else if i > 0 && roll < 22 {
            let (site, mut b) = bodies[r.below(i as u64) as usize].clone();
            if r.below(3) == 0 && b.len() > 20 {
                let cut = r.below(b.len() as u64 / 5) as usize;
                let at = r.below((b.len() - cut) as u64) as usize;
                b.drain(at..at + cut);
            } else {
                let pct = 1 + r.below(20);
                let edits = b.len() * pct as usize / 100;
                for _ in 0..edits {
                    let k = r.below(b.len() as u64) as usize;
                    b[k] = z.sample(&mut r);
                }
            }
            (site, b)
        } else {
            // Log-uniform body length in 150..3000 words.
            let len =
                (150.0 * 20f64.powf((r.next_u64() >> 11) as f64 / (1u64 << 53) as f64)) as usize;
            (r.below(sites.len() as u64) as usize, words(&z, &mut r, len))
        };
        bodies.push(body);
    }
    let docs: Vec<Vec<u64>> = bodies
        .iter()
        .map(|(site, b)| {
            let (h, f) = &sites[*site];
            let page: Vec<u32> = h.iter().chain(b).chain(f).copied().collect();
            shingles(&page)
        })
        .collect();
    let tokens: usize = docs.iter().map(Vec::len).sum();
    println!(
        "corpus: {n} documents, {tokens} shingles ({:.0} per document), generated in {:.1} s",
        tokens as f64 / n as f64,
        t0.elapsed().as_secs_f64()
    );
    println!("rayon threads: {}", rayon::current_num_threads());

    for &t in &thresholds {
        let t1 = Instant::now();
        let (pairs, st) = similarity_join_with_stats(&docs, t).expect("join");
        let secs = t1.elapsed().as_secs_f64();
        println!(
            "t = {t}: {} pairs in {secs:.2} s; {} distinct shingles ({} shared), {} index entries, \
             {} candidates verified, {} pruned by position",
            pairs.len(),
            st.distinct_tokens,
            st.shared_tokens,
            st.index_entries,
            st.verified,
            st.positional_pruned
        );
        let m = n.min(2000);
        let fast = similarity_join(&docs[..m], t).expect("join");
        let slow = brute_force_join(&docs[..m], t).expect("brute force");
        println!(
            "  check on the first {m} documents: {} pairs, brute force {} pairs: {}",
            fast.len(),
            slow.len(),
            if fast == slow { "same" } else { "DIFFERENT" }
        );
    }
}
