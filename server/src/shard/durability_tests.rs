//! The shard's durability when the disk fails, with faults injected by a
//! [`FaultyStore`]: a failed sync, a full disk, a crash in the middle of a write, a torn put.

use std::sync::Arc;

use super::shard_tests::{config, doc};
use super::*;
use crate::ErrorClass;
use crate::fault_store::FaultyStore;

/// A recovered shard in `dir` over a [`FaultyStore`] wrapping sled, as `Shard::open` lays it
/// out, so a plain `Shard::open` of `dir` is the restart.
fn open_faulty(dir: &Path) -> (Arc<Shard>, Arc<FaultyStore>) {
    let c = config();
    let sled = Arc::new(SledStore::open(&dir.join("db"), c.cache_bytes).unwrap());
    let store = FaultyStore::new(sled);
    let shard = Shard::open_with_store(dir, store.clone(), c, ShardMetrics::default()).unwrap();
    shard.recover().unwrap();
    (shard, store)
}

/// The restart: the shard opened on what the disk holds.
fn reopen(dir: &Path) -> Arc<Shard> {
    let shard = Shard::open(dir, config(), ShardMetrics::default()).unwrap();
    shard.recover().unwrap();
    shard
}

/// Whether a document named `name` with fingerprint `fp` is stored.
fn holds(shard: &Shard, name: &str, fp: u64) -> bool {
    shard.probe(&[fp], 0, 100).unwrap()[0].matches.iter().any(|m| m.id == name)
}

/// The fsyncgate pattern: a failed fsync may have dropped the dirty pages of every record
/// appended before it, and a later fsync that succeeds does not bring them back. So once a
/// sync fails, nothing appended before it may ever be acknowledged, and since the log is
/// one sequence, nothing after it either: the shard stops until it is restarted.
#[test]
fn after_a_failed_sync_nothing_is_acknowledged_until_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, store) = open_faulty(dir.path());
    let a = shard.write(&[doc("a", 1, 1)], &[], false).unwrap();
    shard.wait_durable_blocking(a.seq).unwrap();
    store.fail_syncs(1);
    let b = shard.write(&[doc("b", 2, 2)], &[], false).unwrap();
    let e = shard.wait_durable_blocking(b.seq).unwrap_err();
    assert_eq!(store.syncs_failed(), 1);
    // Asked again, until the shard has given up (a committer that retried the sync would
    // acknowledge `b` here instead).
    while !matches!(shard.status(), Status::Failed(_)) {
        if shard.wait_durable_blocking(b.seq).is_ok() {
            panic!(
                "record {} was acknowledged after the sync that should have made it durable \
                 failed (durable moved past it on a later sync)",
                b.seq
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("restart"), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::FailedPrecondition);
    assert!(shard.wait_durable_blocking(b.seq).is_err());
    // What was durable before the failure stays acknowledged.
    shard.wait_durable_blocking(a.seq).unwrap();
    // Writes and reads are refused, with the same permanent error.
    let e = shard.write(&[doc("c", 3, 3)], &[], false).unwrap_err();
    assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
    assert_eq!(shard.probe(&[1], 0, 10).unwrap_err().class(), ErrorClass::FailedPrecondition);
    assert_eq!(
        shard.admit(&doc("d", 4, 4), 3, Verify::OFF, 10, false).unwrap_err().class(),
        ErrorClass::FailedPrecondition
    );
    // No checkpoint or sync at shutdown claims the data durable.
    let synced = store.syncs_ok();
    assert_eq!(shard.shutdown().unwrap_err().class(), ErrorClass::FailedPrecondition);
    assert_eq!(store.syncs_ok(), synced, "no sync after the failed one");
    drop((shard, store));
    // A restart recovers from what is on disk: everything acknowledged is there.
    let shard = reopen(dir.path());
    assert!(holds(&shard, "a", 1));
    assert!(!holds(&shard, "c", 3), "c was refused");
    let c = shard.write(&[doc("c", 3, 3)], &[], false).unwrap();
    shard.wait_durable_blocking(c.seq).unwrap();
    shard.shutdown().unwrap();
}

/// Every writer waiting when the sync fails gets the error; none is acknowledged.
#[test]
fn every_waiter_of_a_failed_sync_gets_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, store) = open_faulty(dir.path());
    store.fail_syncs(1);
    let seqs: Vec<u64> = (0..8)
        .map(|i| shard.write(&[doc(&format!("w{i}"), 100 + i, 0)], &[], false).unwrap().seq)
        .collect();
    let shard = &shard;
    std::thread::scope(|s| {
        let waits: Vec<_> =
            seqs.iter().map(|&seq| s.spawn(move || shard.wait_durable_blocking(seq))).collect();
        for w in waits {
            let e = w.join().unwrap().unwrap_err();
            assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
        }
    });
    assert!(matches!(shard.status(), Status::Failed(_)));
    shard.close_without_checkpoint();
}

/// A write refused for lack of space says so, changes nothing stored or served, and the
/// shard goes on once there is room.
#[test]
fn a_write_to_a_full_disk_fails_clearly_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, store) = open_faulty(dir.path());
    let a = shard.write(&[doc("a", 1, 1)], &[], false).unwrap();
    shard.wait_durable_blocking(a.seq).unwrap();
    let before = shard.stats().unwrap();
    store.set_disk_full(true);
    let e = shard.write(&[doc("b", 2, 2)], &["a".into()], false).unwrap_err();
    assert!(e.to_string().contains("No space left on device"), "{e}");
    assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
    let after = shard.stats().unwrap();
    assert_eq!((after.documents, after.wal_bytes), (before.documents, before.wal_bytes));
    assert!(holds(&shard, "a", 1));
    assert!(!holds(&shard, "b", 2));
    assert_eq!(shard.status(), Status::Serving);
    store.set_disk_full(false);
    let c = shard.write(&[doc("c", 3, 3)], &[], false).unwrap();
    shard.wait_durable_blocking(c.seq).unwrap();
    shard.close_without_checkpoint();
    drop((shard, store));
    let shard = reopen(dir.path());
    assert!(holds(&shard, "a", 1) && holds(&shard, "c", 3));
    assert!(!holds(&shard, "b", 2));
    shard.shutdown().unwrap();
}

/// A crash in the middle of a write that takes several log records: what the disk keeps is
/// a prefix of the writes (the store's contract), so recovery finds whole records, a prefix
/// of the unacknowledged write's, and every acknowledged write.
#[test]
fn a_write_cut_by_a_crash_recovers_as_whole_records() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, store) = open_faulty(dir.path());
    let a = shard.write(&[doc("a", 1, 1)], &[], false).unwrap();
    shard.wait_durable_blocking(a.seq).unwrap();
    // Names long enough that a record (2 KiB at most in these tests) holds a few.
    let name = |i: u64| format!("torn-{i:03}-{}", "x".repeat(400));
    let docs: Vec<_> = (0..20).map(|i| doc(&name(i), 1000 + i * 7919, 0)).collect();
    store.crash_after_writes(1);
    let e = shard.write(&docs, &[], false).unwrap_err();
    assert!(e.to_string().contains("injected crash"), "{e}");
    shard.close_without_checkpoint();
    drop((shard, store));
    let shard = reopen(dir.path());
    assert!(holds(&shard, "a", 1), "acknowledged before the crash");
    let kept: Vec<bool> = (0..20).map(|i| holds(&shard, &name(i), 1000 + i * 7919)).collect();
    let n = kept.iter().take_while(|&&k| k).count();
    assert!(kept[n..].iter().all(|&k| !k), "a prefix of the write survives: {kept:?}");
    assert!(n < 20, "the records after the crash point are gone");
    assert_eq!(shard.stats().unwrap().documents as usize, 1 + n);
    shard.shutdown().unwrap();
}

/// A put that a storage engine tore (against the contract) is found at recovery by the
/// record's checksum: the shard refuses to serve rather than answer from damaged data.
#[test]
fn a_torn_log_record_is_detected_at_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, store) = open_faulty(dir.path());
    let a = shard.write(&[doc("a", 1, 1)], &[], false).unwrap();
    shard.wait_durable_blocking(a.seq).unwrap();
    store.tear_next_put();
    let b = shard.write(&[doc("b", 2, 2)], &[], false).unwrap();
    shard.wait_durable_blocking(b.seq).unwrap();
    shard.close_without_checkpoint();
    drop((shard, store));
    let shard = Shard::open(dir.path(), config(), ShardMetrics::default()).unwrap();
    let e = shard.recover().unwrap_err();
    assert_eq!(e.class(), ErrorClass::DataLoss, "{e}");
    assert!(e.to_string().contains("write-ahead log record"), "{e}");
    assert!(matches!(shard.status(), Status::Corrupt(_)));
}
