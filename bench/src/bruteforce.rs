//! Brute-force Hamming range search: the baseline and the exactness check.

use rayon::prelude::*;

const TILE: usize = 1 << 14;

/// Appends to `out` the ids (`base` + position) of `tile` within `k` of `q`.
#[inline]
fn scan_tile(tile: &[u64], base: usize, q: u64, k: u32, out: &mut Vec<u32>) {
    // Count first so the hot loop vectorises; collect only when something matched.
    if tile.iter().filter(|&&s| (s ^ q).count_ones() <= k).count() > 0 {
        out.extend(
            tile.iter()
                .enumerate()
                .filter(|(_, s)| (**s ^ q).count_ones() <= k)
                .map(|(i, _)| (base + i) as u32),
        );
    }
}

/// Ids (positions in `stored`) within `k` of `q`, ascending.
pub fn scan(stored: &[u64], q: u64, k: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for (t, tile) in stored.chunks(TILE).enumerate() {
        scan_tile(tile, t * TILE, q, k, &mut out);
    }
    out
}

/// Answers for many queries on all cores, tiled so each stored tile stays in cache while a
/// group of queries scans it. `result[i]` answers `queries[i]`, ids ascending.
pub fn scan_many(stored: &[u64], queries: &[u64], k: u32) -> Vec<Vec<u32>> {
    queries
        .par_chunks(64)
        .flat_map_iter(|qs| {
            let mut res = vec![Vec::new(); qs.len()];
            for (t, tile) in stored.chunks(TILE).enumerate() {
                for (r, &q) in res.iter_mut().zip(qs) {
                    scan_tile(tile, t * TILE, q, k, r);
                }
            }
            res
        })
        .collect()
}
