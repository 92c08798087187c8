//! Helpers shared by the fuzz targets under `fuzz_targets/`.
//!
//! Most stored formats end in a CRC-32, which random mutations almost never get right, so a
//! target would only ever test the checksum check. Each target therefore takes a mode byte
//! first; one of its bits asks the target to recompute the checksums of the bytes that follow
//! before decoding ([`fix_crc_tail`] and the target's own fix-ups), so the fuzzer reaches the
//! parsing behind the checksum too. With the bit clear, the bytes are decoded exactly as
//! given.
//!
//! Seed inputs are written by the targets themselves ([`write_seeds`]) when they start, from
//! real encoded data, so no corpus needs to be committed.

use std::path::PathBuf;

/// Little-endian CRC-32 of `body`, as every neardup format stores it.
pub fn crc(body: &[u8]) -> [u8; 4] {
    crc32fast::hash(body).to_le_bytes()
}

/// Rewrites the last four bytes of `bytes` as the CRC-32 of everything before them (when
/// there are at least four bytes).
pub fn fix_crc_tail(bytes: &mut [u8]) {
    if let Some(body_len) = bytes.len().checked_sub(4) {
        let c = crc(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&c);
    }
}

/// Splits `data` into items, each a little-endian `u16` length and that many bytes (the last
/// item takes what is left when its length runs past the end). At most `max` items.
pub fn split_items(mut data: &[u8], max: usize) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < max && data.len() >= 2 {
        let n = u16::from_le_bytes([data[0], data[1]]) as usize;
        data = &data[2..];
        let n = n.min(data.len());
        out.push(&data[..n]);
        data = &data[n..];
    }
    out
}

/// Joins items as [`split_items`] reads them.
pub fn join_items(items: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for it in items {
        out.extend_from_slice(&(it.len() as u16).to_le_bytes());
        out.extend_from_slice(it);
    }
    out
}

/// The corpus directory libFuzzer was given: the first argument that is not a flag.
fn corpus_dir() -> Option<PathBuf> {
    std::env::args().skip(1).find(|a| !a.starts_with('-')).map(PathBuf::from)
}

/// Writes `seeds` as files `seed-<name>` into the corpus directory the fuzzer was started
/// with (`cargo fuzz run TARGET` passes `fuzz/corpus/TARGET`), unless it is missing or is a
/// single file (a reproduction run). Called from a target's `init`, which libFuzzer runs
/// before it reads the corpus.
pub fn write_seeds(seeds: impl IntoIterator<Item = (String, Vec<u8>)>) {
    let Some(dir) = corpus_dir() else { return };
    if !dir.is_dir() {
        return;
    }
    for (name, bytes) in seeds {
        let _ = std::fs::write(dir.join(format!("seed-{name}")), bytes);
    }
}
