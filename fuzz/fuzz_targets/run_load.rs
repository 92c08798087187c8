//! The run loader: `Index::load_run` over a run's metadata record (ids, counts, design, the
//! document columns) and its stored tables (header and blocks, as the server keeps them),
//! including the rebuilding of damaged tables; then the loaded run restored into an index and
//! queried. Also `Sketch::from_bytes`, the stored and wire form of a document's sketch.
//!
//! Input: a mode byte, then items (`u16` LE length, bytes; see `split_items`): the metadata
//! record, then each table as `u16` LE block size, its header, its blocks. Mode bit 0:
//! recompute every CRC-32 first; bit 1: an index laid out packed instead of in blocks; bit 2:
//! the rest is a sketch instead.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neardup_core::codec::{Codec, HEADER_BYTES, Layout, TableOptions};
use neardup_core::index::StoredTable;
use neardup_core::sketch::Sketch;
use neardup_core::util::SplitMix64;
use neardup_core::{Design, Doc, Index, IndexConfig};
use neardup_fuzz::{crc, fix_crc_tail, join_items, split_items, write_seeds};

const DESIGN: &str = "4c1";
const BLOCK_BYTES: usize = 64;

fn config(packed: bool) -> IndexConfig {
    IndexConfig {
        design: Design::parse(DESIGN).expect("design"),
        tables: TableOptions {
            codec: Codec::Xor,
            block_bytes: BLOCK_BYTES,
            layout: if packed { Layout::Packed } else { Layout::default() },
            ..TableOptions::default()
        },
        buffer_docs: 1 << 20,
        parallel_build: false,
        recent_docs: 0,
        auto_merge: false,
        ..IndexConfig::default()
    }
}

/// A stored table's item: block size, header, blocks.
fn table_item(header: &[u8], blocks: &[&[u8]]) -> Vec<u8> {
    let bb = blocks.first().map_or(0, |b| b.len());
    let mut v = (bb as u16).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    for b in blocks {
        v.extend_from_slice(b);
    }
    v
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut r = SplitMix64::new(11);
    for n in [1usize, 5, 60] {
        let mut index = Index::new(config(false)).expect("index");
        for i in 0..n as u64 {
            let fp = r.next_u64();
            index.insert(Doc { id: i, fp, ts: i as i64 }).expect("insert");
            if i % 7 == 3 {
                // A second document with the same fingerprint: the duplicates column.
                index.insert(Doc { id: 1000 + i, fp, ts: 0 }).expect("insert");
            }
        }
        index.flush().expect("flush");
        let run = &index.runs()[0];
        let design = index.design().clone();
        let meta = run.meta_bytes(&design);
        let mut items: Vec<Vec<u8>> = vec![meta];
        for t in 0..run.tables() {
            let hx = run.stored_table(t).expect("table");
            let blocks: Vec<&[u8]> = hx.block_slices().collect();
            items.push(table_item(&hx.header_bytes(), &blocks));
        }
        let refs: Vec<&[u8]> = items.iter().map(|v| v.as_slice()).collect();
        for mode in [0u8, 1, 2, 3] {
            let mut bytes = vec![mode];
            bytes.extend_from_slice(&join_items(&refs));
            out.push((format!("run-{n}-{mode}"), bytes));
        }
        // Only the first table stored: the others are rebuilt.
        let mut bytes = vec![1u8];
        bytes.extend_from_slice(&join_items(&refs[..2]));
        out.push((format!("run-{n}-one-table"), bytes));
    }
    let mut f =
        neardup_core::fingerprint::Fingerprinter::new(Default::default()).expect("fingerprinter");
    for text in ["a b c d e f g", "the quick brown fox jumps over the lazy dog"] {
        if let Ok(s) = Sketch::of_text(&mut f, text) {
            let mut bytes = vec![4u8];
            bytes.extend_from_slice(&s.to_bytes());
            out.push((format!("sketch-{}", text.len()), bytes));
        }
    }
    out
}

fn sketch(bytes: &[u8]) {
    let Ok(s) = Sketch::from_bytes(bytes) else { return };
    assert_eq!(s.to_bytes(), bytes, "a sketch reads back as it was written");
    assert_eq!(s.encoded_len(), bytes.len());
    assert_eq!(s.exact_with(&s), s.set().is_some());
    let j = s.jaccard(&s);
    assert!((0.0..=1.0).contains(&j));
    let _ = s.agreements(&s);
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 4 != 0 {
        return sketch(rest);
    }
    let mut items: Vec<Vec<u8>> = split_items(rest, 16).into_iter().map(|s| s.to_vec()).collect();
    let Some((meta, tables)) = items.split_first_mut() else { return };
    if mode & 1 != 0 {
        fix_crc_tail(meta);
    }
    // Each table: block size, header, blocks (cut as the server cuts its chunks).
    let mut parts: Vec<(Vec<u8>, usize)> = Vec::new();
    for t in tables.iter_mut() {
        if t.len() < 2 {
            parts.push((Vec::new(), 0));
            continue;
        }
        let bb = u16::from_le_bytes([t[0], t[1]]) as usize;
        let mut body = t[2..].to_vec();
        if mode & 1 != 0 && body.len() >= HEADER_BYTES {
            let c = crc(&body[..HEADER_BYTES - 4]);
            body[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&c);
            if bb >= 4 {
                for b in body[HEADER_BYTES..].chunks_exact_mut(bb) {
                    let c = crc(&b[..bb - 4]);
                    b[bb - 4..].copy_from_slice(&c);
                }
            }
        }
        parts.push((body, bb));
    }
    let blocks: Vec<Vec<&[u8]>> = parts
        .iter()
        .map(|(body, bb)| {
            let after = body.get(HEADER_BYTES..).unwrap_or_default();
            if *bb == 0 { Vec::new() } else { after.chunks(*bb).collect() }
        })
        .collect();
    let stored: Vec<StoredTable<'_>> = parts
        .iter()
        .zip(&blocks)
        .map(|((body, _), b)| StoredTable {
            header: &body[..body.len().min(HEADER_BYTES)],
            blocks: b,
        })
        .collect();
    let mut index = Index::new(config(mode & 2 != 0)).expect("index");
    let Ok((run, rebuilt)) = index.load_run(meta, &stored) else { return };
    assert!(rebuilt.iter().all(|&t| t < run.tables()));
    assert!(run.distinct() <= run.len());
    // Deletion marks as the server restores them, then the run queried in an index.
    let positions: Vec<u32> = meta.iter().take(8).map(|&b| u32::from(b)).collect();
    let in_range = positions.iter().all(|&p| (p as usize) < run.len());
    assert_eq!(run.restore_deleted(&positions).is_ok(), in_range);
    let fps: Vec<u64> = meta
        .chunks_exact(8)
        .take(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let live = run.live_len();
    index.restore(vec![run]).expect("one run restores");
    assert_eq!(index.len(), live);
    for fp in fps {
        let found = index.query(fp, 1).expect("k = 1 is in range");
        assert!(found.iter().all(|m| (m.fp ^ fp).count_ones() <= 1));
    }
});
