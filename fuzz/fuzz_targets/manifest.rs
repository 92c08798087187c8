//! The shard's checkpoint records: `Manifest::decode` (which runs hold the log up to where),
//! `DocSnapshot::decode` (the document snapshot header) and `Expectation::decode` (the
//! `expect` file), each checked to encode back to the bytes it accepted.
//!
//! Input: a mode byte, then the record. Mode bits 0-1 pick the decoder (0 manifest, 1
//! snapshot header, 2 expectation, 3 all three); bit 2: recompute the trailing CRC-32 first.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neardup_fuzz::{fix_crc_tail, write_seeds};
use neardup_server::expect::Expectation;
use neardup_server::persist::{DocSnapshot, Manifest};

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let records = [
        (0u8, Manifest { covered: 9, next_sid: 4, runs: vec![1, 3], last_seq: 12 }.encode()),
        (0, Manifest::default().encode()),
        (1, DocSnapshot { id: 2, covered: 7, chunks: 3, next_id: 100 }.encode()),
        (2, Expectation { seq: 5, live: 77 }.encode()),
    ];
    for (i, (kind, bytes)) in records.into_iter().enumerate() {
        for fix in [0u8, 4] {
            let mut v = vec![kind | fix];
            v.extend_from_slice(&bytes);
            out.push((format!("{i}-{}", kind | fix), v));
        }
    }
    out
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 4 != 0 {
        fix_crc_tail(&mut bytes);
    }
    let kind = mode & 3;
    if kind == 0 || kind == 3 {
        if let Ok(m) = Manifest::decode(&bytes) {
            assert_eq!(m.encode(), bytes);
        }
    }
    if kind == 1 || kind == 3 {
        if let Ok(d) = DocSnapshot::decode(&bytes) {
            assert_eq!(d.encode(), bytes);
            let _ = DocSnapshot::chunk_key(d.id, d.chunks);
        }
    }
    if kind == 2 || kind == 3 {
        if let Ok(e) = Expectation::decode(&bytes) {
            assert_eq!(e.encode(), bytes);
            let _ = e.check(e.seq, e.live, Default::default());
        }
    }
});
