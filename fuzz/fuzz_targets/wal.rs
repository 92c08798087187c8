//! The write-ahead log: `record::decode` (a record's operations, in formats 1 to 3, with
//! sketches checked by `Sketch::from_bytes` as replay does), and the segment files' frames as
//! `SegmentLog::open` reads them at start-up (cutting a torn newest segment, refusing a
//! damaged older one), then every record read back through `Space::scan`.
//!
//! Input: a mode byte, then the bytes. Mode bit 1 clear: the rest is one record, bit 0 asks to
//! recompute its CRC-32 first. Bit 1 set: the rest is up to three segment files as items
//! (`u16` LE length, bytes), bit 2 asks to recompute each frame's CRC-32 first.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use neardup_core::sketch::Sketch;
use neardup_fuzz::{crc, fix_crc_tail, join_items, split_items, write_seeds};
use neardup_server::record::{self, Op, RecordWriter};
use neardup_server::storage::Space;
use neardup_server::wal::SegmentLog;

fn sample_records() -> Vec<Vec<u8>> {
    let sketch = vec![2u8; 70];
    let long = vec![7u8; 600];
    let sets: Vec<Vec<Op<'_>>> = vec![
        vec![Op::Put { id: 1, fp: 2, ts: 3, cluster: 1, name: "a", sketch: None }],
        vec![
            Op::Put { id: 7, fp: u64::MAX, ts: -3, cluster: 7, name: "https://a/é", sketch: None },
            Op::Remove { id: 5, fp: 9 },
            Op::Put { id: 8, fp: 0, ts: 1, cluster: 7, name: "b", sketch: Some(&sketch) },
        ],
        vec![Op::Put { id: 2, fp: 3, ts: 4, cluster: 1, name: "c", sketch: Some(&long) }],
        vec![Op::Remove { id: 5, fp: 9 }, Op::RemoveRange { lo: 1 << 62, hi: u64::MAX, count: 3 }],
        vec![Op::Remove { id: 5, fp: 9 }, Op::AddRun { sid: 4, count: 65_536 }],
    ];
    sets.iter()
        .map(|ops| {
            let mut w = RecordWriter::new();
            for op in ops {
                w.push(op);
            }
            w.finish()
        })
        .collect()
}

fn frame(key: u64, value: &[u8]) -> Vec<u8> {
    let mut body = key.to_be_bytes().to_vec();
    body.extend_from_slice(value);
    let mut f = ((body.len()) as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&crc(&body));
    f.extend_from_slice(&body);
    f
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let recs = sample_records();
    let mut out = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let mut v = vec![1u8];
        v.extend_from_slice(r);
        out.push((format!("record-{i}"), v));
    }
    let seg1: Vec<u8> = recs.iter().enumerate().flat_map(|(i, r)| frame(i as u64 + 1, r)).collect();
    let seg2: Vec<u8> = frame(10, &recs[0]);
    let mut v = vec![6u8];
    v.extend_from_slice(&join_items(&[&seg1, &seg2]));
    out.push(("segments".into(), v));
    out
}

fn check_record(bytes: &[u8]) {
    let Ok(ops) = record::decode(bytes) else { return };
    let mut w = RecordWriter::new();
    for op in &ops {
        w.push(op);
        if let Op::Put { sketch: Some(s), .. } = op {
            let _ = Sketch::from_bytes(s);
        }
    }
    let again = w.finish();
    assert_eq!(record::decode(&again).expect("own record decodes"), ops);
}

fn fix_frames(seg: &mut [u8]) {
    let mut pos = 0usize;
    while pos + 16 <= seg.len() {
        let len = u32::from_le_bytes(seg[pos..pos + 4].try_into().unwrap()) as usize;
        if len < 8 || pos + 8 + len > seg.len() {
            break;
        }
        let c = crc(&seg[pos + 8..pos + 8 + len]);
        seg[pos + 4..pos + 8].copy_from_slice(&c);
        pos += 8 + len;
    }
}

fn dir() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("neardup-fuzz-wal-{}", std::process::id()))
}

fn read_all(log: &SegmentLog) -> Vec<(Vec<u8>, Vec<u8>)> {
    log.scan(&[], &[0xFF; 9]).map(|e| e.expect("a record found at open reads back")).collect()
}

fn segments(data: &[u8], fix: bool) {
    let dir = dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fuzz directory");
    for (i, seg) in split_items(data, 3).into_iter().enumerate() {
        let mut seg = seg.to_vec();
        if fix {
            fix_frames(&mut seg);
        }
        std::fs::write(dir.join(format!("{:016x}.wal", i * 100)), seg).expect("segment");
    }
    let first = match SegmentLog::open(&dir) {
        Ok(log) => {
            let entries = read_all(&log);
            assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "keys increase");
            for (k, v) in &entries {
                assert_eq!(log.get(k).expect("get").as_ref(), Some(v));
                check_record(v);
            }
            let last = log.last_in(&[], &[0xFF; 9]).expect("last");
            assert_eq!(last.as_ref(), entries.last());
            Some(entries)
        }
        Err(_) => None,
    };
    // Opening again (after any cut) finds the same records.
    if let Some(entries) = first {
        let log = SegmentLog::open(&dir).expect("a log opened once opens again");
        assert_eq!(read_all(&log), entries);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fuzz_target!(init: { write_seeds(seeds()) }, |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 2 != 0 {
        return segments(rest, mode & 4 != 0);
    }
    let mut bytes = rest.to_vec();
    if mode & 1 != 0 {
        fix_crc_tail(&mut bytes);
    }
    check_record(&bytes);
});
