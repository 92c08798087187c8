//! The Huffman-XOR table decoder: `HxTable::from_bytes` (header, Huffman code lengths, every
//! block of either codec), then every lookup over what it accepted (ranks, range scans, the
//! multi-lane scan, both block searches) and a round trip through `to_bytes` and `encode`.
//!
//! Input: a mode byte, then the table's bytes. Mode bit 0: recompute the header's and every
//! block's CRC-32 first; bit 1: interpolation search instead of the directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neardup_core::codec::{BlockSearch, Codec, HEADER_BYTES, HxTable, TableOptions, scan_lanes};
use neardup_core::util::SplitMix64;
use neardup_fuzz::{crc, write_seeds};

fn fix_crcs(b: &mut [u8]) {
    if b.len() < HEADER_BYTES {
        return;
    }
    let c = crc(&b[..HEADER_BYTES - 4]);
    b[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&c);
    let bb = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
    if bb < 16 {
        return;
    }
    for block in b[HEADER_BYTES..].chunks_exact_mut(bb) {
        let c = crc(&block[..bb - 4]);
        block[bb - 4..].copy_from_slice(&c);
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut r = SplitMix64::new(7);
    for (i, n) in [1usize, 3, 40, 300].into_iter().enumerate() {
        let mut v: Vec<u64> =
            (0..n).map(|j| if j % 3 == 0 { r.next_u64() >> 20 } else { r.next_u64() }).collect();
        v.sort_unstable();
        v.dedup();
        for codec in [Codec::Xor, Codec::Gap] {
            for bb in [32usize, 64, 256] {
                let opts = TableOptions { codec, block_bytes: bb, ..Default::default() };
                let Ok(t) = HxTable::encode(&v, opts) else { continue };
                let mut bytes = vec![(i % 2) as u8 * 2 + 1];
                bytes.extend_from_slice(&t.to_bytes());
                out.push((format!("{n}-{codec:?}-{bb}"), bytes));
            }
        }
    }
    out
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 != 0 {
        fix_crcs(&mut bytes);
    }
    let search =
        if mode & 2 != 0 { BlockSearch::Interpolation } else { BlockSearch::Directory };
    let Ok(table) = HxTable::from_bytes(&bytes, search) else { return };

    // Everything accepted decodes to what its header says, strictly increasing.
    let values = table.to_vec();
    assert_eq!(values.len(), table.len());
    assert!(values.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(table.first(), values.first().copied());
    for (rank, &v) in values.iter().enumerate().take(64) {
        assert_eq!(table.get(rank), Some(v));
        assert_eq!(table.rank_of(v), Some(rank));
    }
    assert_eq!(table.get(values.len()), None);
    // Lookups of values that may or may not be there, from the input's own bytes.
    let probes: Vec<u64> = bytes
        .chunks_exact(8)
        .take(16)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .chain([0, 1, u64::MAX, u64::MAX - 1])
        .collect();
    for &q in &probes {
        let found = table.rank_of(q);
        assert_eq!(found, values.binary_search(&q).ok());
        let cands = table.candidates(q);
        let _ = table.block_for(q);
        assert_eq!(table.rank_in(cands, q), found);
        let (lo, hi) = (q & !0xFFFF, q | 0xFFFF);
        let mut seen = Vec::new();
        table.scan_range(lo, hi, |v, _| seen.push(v));
        let want: Vec<u64> = values.iter().copied().filter(|v| (lo..=hi).contains(v)).collect();
        assert_eq!(seen, want);
        let mut hits = Vec::new();
        let mut lanes = [table.lane(lo, hi, q, 0), table.lane_in(cands, lo, hi, q, 1)];
        scan_lanes(table.codec(), &mut lanes, 3, &mut hits);
        for h in &hits {
            assert!((h.value ^ q).count_ones() <= 3 && (lo..=hi).contains(&h.value));
        }
    }
    // Written back, it reads back the same; encoded afresh, it holds the same values.
    let back = HxTable::from_bytes(&table.to_bytes(), search).expect("own bytes read back");
    assert_eq!(back.to_vec(), values);
    let fresh = HxTable::encode(&values, table.options()).expect("valid values encode");
    assert_eq!(fresh.to_vec(), values);
});
