//! A damaged disk never crashes a shard and is never served as healthy with documents
//! missing or deletes undone.
//!
//! One small data directory is prepared once (documents stored, some deleted, a clean
//! shutdown); every trial damages a copy of it (the database file truncated, one byte
//! flipped, a file made unreadable) and opens and recovers the shard in this process. Each
//! trial must end one of three ways: refused at open (the CLI exits 1), refused at recovery
//! (the shard is NOT_SERVING: corrupt or failed), or served with every acknowledged
//! document and no deleted one. The counts are printed (`--nocapture`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use neardup_core::util::SplitMix64;
use neardup_server::{NewDocument, Shard, ShardConfig, ShardMetrics, Status};

/// Documents stored, and deleted from them.
const DOCS: usize = 3000;
const DELETED: usize = 300;
/// Truncation offsets tried, spread evenly over the database file.
const TRUNCATIONS: u64 = 60;
/// Seeded single-byte flips.
const FLIPS: usize = 200;
/// No loop runs longer than this, whatever the machine.
const BUDGET: Duration = Duration::from_secs(300);

fn config() -> ShardConfig {
    let mut c = ShardConfig::default();
    c.index.buffer_docs = 256;
    c.checkpoint_interval = Duration::from_secs(3600);
    c.idle_flush = Duration::from_secs(3600);
    c.compact_idle = Duration::from_secs(3600);
    c.max_record_bytes = 4096;
    c.min_free_bytes = 0;
    c.cache_bytes = 4 << 20;
    c
}

/// What the prepared directory holds.
struct Truth {
    live: Vec<(String, u64)>,
    deleted: Vec<(String, u64)>,
}

fn prepare(dir: &Path) -> Truth {
    let shard = Shard::open(dir, config(), ShardMetrics::default()).unwrap();
    shard.recover().unwrap();
    let mut rng = SplitMix64::new(11);
    let all: Vec<(String, u64)> = (0..DOCS).map(|i| (format!("d{i}"), rng.next_u64())).collect();
    for chunk in all.chunks(250) {
        let docs: Vec<NewDocument> = chunk
            .iter()
            .map(|(id, fp)| NewDocument {
                id: id.clone(),
                fingerprint: *fp,
                timestamp_ms: 0,
                sketch: None,
            })
            .collect();
        let out = shard.write(&docs, &[], false).unwrap();
        shard.wait_durable_blocking(out.seq).unwrap();
    }
    let (deleted, live): (Vec<_>, Vec<_>) =
        all.into_iter().enumerate().partition(|(i, _)| i % (DOCS / DELETED) == 0);
    let deleted: Vec<(String, u64)> = deleted.into_iter().map(|(_, d)| d).collect();
    let names: Vec<String> = deleted.iter().map(|(n, _)| n.clone()).collect();
    let out = shard.write(&[], &names, true).unwrap();
    shard.wait_durable_blocking(out.seq).unwrap();
    shard.shutdown().unwrap();
    Truth { live: live.into_iter().map(|(_, d)| d).collect(), deleted }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    trials: usize,
    served_whole: usize,
    refused_at_open: usize,
    refused_corrupt: usize,
    refused_failed: usize,
    served_with_loss: usize,
    panics: usize,
}

/// How one trial ended.
enum Outcome {
    ServedWhole,
    RefusedAtOpen,
    RefusedCorrupt,
    RefusedFailed,
    ServedWithLoss(String),
}

/// Opens and recovers the shard in `dir` and judges what it serves.
fn trial(dir: &Path, truth: &Truth) -> Outcome {
    let shard = match Shard::open(dir, config(), ShardMetrics::default()) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return Outcome::RefusedAtOpen;
        }
    };
    let outcome = match shard.recover() {
        Err(_) => match shard.status() {
            Status::Corrupt(_) => Outcome::RefusedCorrupt,
            Status::Failed(_) => Outcome::RefusedFailed,
            s => Outcome::ServedWithLoss(format!("recovery failed but the status is {s:?}")),
        },
        Ok(()) => judge(&shard, truth),
    };
    shard.close_without_checkpoint();
    outcome
}

fn judge(shard: &Shard, truth: &Truth) -> Outcome {
    let fps: Vec<u64> = truth.live.iter().map(|d| d.1).collect();
    let hits = match shard.probe(&fps, 0, 10) {
        Ok(h) => h,
        Err(e) => return Outcome::ServedWithLoss(format!("serving, but a probe failed: {e}")),
    };
    let missing = truth
        .live
        .iter()
        .zip(&hits)
        .filter(|((name, _), h)| !h.matches.iter().any(|m| &m.id == name))
        .count();
    let fps: Vec<u64> = truth.deleted.iter().map(|d| d.1).collect();
    let hits = match shard.probe(&fps, 0, 10) {
        Ok(h) => h,
        Err(e) => return Outcome::ServedWithLoss(format!("serving, but a probe failed: {e}")),
    };
    let undeleted = truth
        .deleted
        .iter()
        .zip(&hits)
        .filter(|((name, _), h)| h.matches.iter().any(|m| &m.id == name))
        .count();
    if missing == 0 && undeleted == 0 {
        Outcome::ServedWhole
    } else {
        Outcome::ServedWithLoss(format!("{missing} documents missing, {undeleted} deletes undone"))
    }
}

struct Bench {
    base: PathBuf,
    truth: Truth,
    work: tempfile::TempDir,
    counts: Counts,
    failures: Vec<String>,
    started: Instant,
    n: usize,
}

impl Bench {
    fn new() -> (Bench, tempfile::TempDir) {
        let keep = tempfile::tempdir().unwrap();
        let base = keep.path().join("base");
        let truth = prepare(&base);
        let bench = Bench {
            base,
            truth,
            work: tempfile::tempdir().unwrap(),
            counts: Counts::default(),
            failures: Vec::new(),
            started: Instant::now(),
            n: 0,
        };
        (bench, keep)
    }

    fn db_len(&self) -> u64 {
        std::fs::metadata(self.base.join("db").join("db")).unwrap().len()
    }

    /// Runs one trial on a fresh copy damaged by `damage`; false once the budget is spent.
    fn run(&mut self, what: &str, damage: impl FnOnce(&Path)) -> bool {
        if self.started.elapsed() > BUDGET {
            return false;
        }
        self.n += 1;
        let dir = self.work.path().join(format!("t{}", self.n));
        copy_dir(&self.base, &dir);
        damage(&dir);
        let truth = &self.truth;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trial(&dir, truth)));
        self.counts.trials += 1;
        match outcome {
            Ok(Outcome::ServedWhole) => self.counts.served_whole += 1,
            Ok(Outcome::RefusedAtOpen) => self.counts.refused_at_open += 1,
            Ok(Outcome::RefusedCorrupt) => self.counts.refused_corrupt += 1,
            Ok(Outcome::RefusedFailed) => self.counts.refused_failed += 1,
            Ok(Outcome::ServedWithLoss(why)) => {
                self.counts.served_with_loss += 1;
                self.failures.push(format!("{what}: {why}"));
            }
            Err(_) => {
                self.counts.panics += 1;
                self.failures.push(format!("{what}: panicked"));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        true
    }
}

#[test]
fn damaged_databases_are_refused_or_served_whole() {
    let (mut b, _keep) = Bench::new();
    let len = b.db_len();
    // Truncations at evenly spread offsets, the whole file's first half included.
    for i in 0..TRUNCATIONS {
        let at = len * i / TRUNCATIONS;
        let ok = b.run(&format!("truncate -s {at}"), |dir| {
            let f = std::fs::OpenOptions::new().write(true).open(dir.join("db/db")).unwrap();
            f.set_len(at).unwrap();
        });
        if !ok {
            break;
        }
    }
    // Seeded single-byte flips anywhere in the file.
    let mut rng = SplitMix64::new(2026);
    for _ in 0..FLIPS {
        let at = (rng.next_u64() % len) as usize;
        let mask = (rng.next_u64() % 255 + 1) as u8;
        let ok = b.run(&format!("flip byte {at} by {mask:#04x}"), |dir| {
            let path = dir.join("db/db");
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at] ^= mask;
            std::fs::write(&path, bytes).unwrap();
        });
        if !ok {
            break;
        }
    }
    // Unreadable files: replaced by a directory (chmod 000 does not stop root).
    for file in ["db/db", "expect"] {
        b.run(&format!("{file} replaced by a directory"), |dir| {
            std::fs::remove_file(dir.join(file)).unwrap();
            std::fs::create_dir(dir.join(file)).unwrap();
        });
    }
    // A damaged expectation record.
    b.run("expect damaged", |dir| {
        let path = dir.join("expect");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, bytes).unwrap();
    });
    // The undamaged copy is served whole.
    b.run("no damage", |_| {});
    let Counts { trials, served_whole, refused_at_open, refused_corrupt, refused_failed, .. } =
        b.counts;
    println!(
        "damage trials: {trials} (database file {len} bytes; {} truncations, {} byte flips, \
         3 unreadable or damaged files, 1 undamaged): served whole {served_whole}, refused at \
         open {refused_at_open}, refused corrupt {refused_corrupt}, refused failed \
         {refused_failed}, served with loss {}, panics {}",
        TRUNCATIONS, FLIPS, b.counts.served_with_loss, b.counts.panics
    );
    assert!(b.failures.is_empty(), "{:#?}", b.failures);
    assert!(b.counts.served_whole >= 1, "the undamaged copy is served");
    if b.started.elapsed() <= BUDGET {
        assert_eq!(trials as u64, TRUNCATIONS + FLIPS as u64 + 4);
    }
}
