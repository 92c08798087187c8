//! Benchmark workloads: the shared peer files, or generated ones with a seed.

use std::path::Path;

use neardup_core::util::SplitMix64;

/// Stored fingerprints and queries.
pub struct Workload {
    /// Stored fingerprints; a fingerprint's id is its position.
    pub stored: Vec<u64>,
    /// Query fingerprints.
    pub queries: Vec<u64>,
    /// Where it came from, for the report.
    pub source: String,
}

/// Reads a file of raw little-endian u64.
pub fn read_u64s(path: &Path) -> Result<Vec<u64>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() % 8 != 0 {
        return Err(format!(
            "{} is not a whole number of u64 ({} bytes)",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// The shapes of generated workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Uniform random fingerprints; 1% of them near-copies (1-3 bits) of others, as in the
    /// shared peer workload. Queries: half a stored value with 0-3 bits flipped, half random.
    Peers,
    /// As `peers`, and 1% of all fingerprints share their first 30 bits (a crowded prefix);
    /// a quarter of the queries land in that prefix.
    Crowded,
    /// Simhash-like clusters: 2% of fingerprints are cluster centres, the rest lie within
    /// 0-6 bits of one.
    Clustered,
}

/// Generates `n` stored fingerprints and `q` queries.
pub fn generate(shape: Shape, n: usize, q: usize, seed: u64) -> Workload {
    let mut r = SplitMix64::new(seed);
    let mut stored: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
    match shape {
        Shape::Peers | Shape::Crowded => {
            for _ in 0..n / 100 {
                let (dst, src) = (r.below(n as u64) as usize, r.below(n as u64) as usize);
                let flips = 1 + r.below(3) as u32;
                stored[dst] = r.flip_bits(stored[src], flips);
            }
        }
        Shape::Clustered => {
            let centres = (n / 50).max(1);
            for i in centres..n {
                let c = stored[r.below(centres as u64) as usize];
                let flips = r.below(7) as u32;
                stored[i] = r.flip_bits(c, flips);
            }
        }
    }
    let crowd_prefix = r.next_u64() & !((1u64 << 34) - 1);
    if shape == Shape::Crowded {
        for _ in 0..n / 100 {
            let i = r.below(n as u64) as usize;
            stored[i] = crowd_prefix | (r.next_u64() >> 30);
        }
    }
    let queries = (0..q)
        .map(|i| {
            if shape == Shape::Crowded && i % 4 == 3 {
                return crowd_prefix | (r.next_u64() >> 30);
            }
            if i % 2 == 0 {
                let s = stored[r.below(n.max(1) as u64) as usize];
                let flips = r.below(4) as u32;
                r.flip_bits(s, flips)
            } else {
                r.next_u64()
            }
        })
        .collect();
    Workload { stored, queries, source: format!("generated:{shape:?}:seed={seed}").to_lowercase() }
}
