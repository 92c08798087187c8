//! Group commit: writers append log records, then wait until a sync covers them.
//!
//! One thread does every sync. A writer that needs its record durable asks for it and
//! waits; the thread reads the highest sequence appended so far, syncs the store once, and
//! releases every writer at or below that sequence. Writers that arrive during a sync are
//! covered by the next one, so concurrent writers share each fsync, and a lone writer waits
//! one fsync.
//!
//! # A failed sync stops the shard
//! When a sync fails, the records appended since the last good one are in an unknown
//! state: the kernel may have dropped their dirty pages and marked them clean, so a later
//! fsync that succeeds says nothing about them (the "fsyncgate" of PostgreSQL, which since
//! then panics on a failed fsync and recovers from its log). A retry that moved the durable
//! point past them would acknowledge data that may be gone. So the first failure is final
//! for this process: the durable point never moves again, every waiter above it (present
//! and future) gets [`Error::SyncFailed`], no further sync is attempted (syncs for
//! checkpoints and snapshots go through [`Committer::sync`] and are refused too), and the
//! shard is told, through the callback given to [`Committer::start`], so it stops serving.
//! Carrying on by retrying was the other choice; it cannot be made safe without knowing
//! which pages the kernel dropped. A restart recovers from what the disk holds, which is
//! all that can be trusted: everything acknowledged, since acknowledged means covered by a
//! sync that succeeded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::metrics::ShardMetrics;
use crate::storage::Store;

/// Told the storage error when the first sync fails.
type OnFailure = Box<dyn Fn(&str) + Send + Sync>;

/// State shared by writers and the sync thread.
struct Inner {
    store: Arc<dyn Store>,
    /// Highest sequence appended (set by writers after their append returned).
    appended: AtomicU64,
    /// Highest sequence a writer waits for.
    requested: AtomicU64,
    /// Highest sequence known durable.
    durable: watch::Sender<u64>,
    /// The error of the first failed sync; never cleared (see the module docs).
    failed: OnceLock<String>,
    on_failure: OnFailure,
    /// Held over each sync and what it decides, so a sync never overlaps a failed one.
    syncing: Mutex<()>,
    wake: Condvar,
    lock: Mutex<()>,
    stop: AtomicBool,
    metrics: ShardMetrics,
}

/// The group-commit front: see the module docs.
#[derive(Clone)]
pub struct Committer {
    inner: Arc<Inner>,
    thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl Committer {
    /// Starts the sync thread. `durable` is the sequence already durable (after recovery,
    /// everything stored). `on_failure` is called once, with the storage error, when a sync
    /// first fails.
    pub fn start(
        store: Arc<dyn Store>,
        durable: u64,
        metrics: ShardMetrics,
        on_failure: impl Fn(&str) + Send + Sync + 'static,
    ) -> Committer {
        let (tx, _) = watch::channel(durable);
        let inner = Arc::new(Inner {
            store,
            appended: AtomicU64::new(durable),
            requested: AtomicU64::new(durable),
            durable: tx,
            failed: OnceLock::new(),
            on_failure: Box::new(on_failure),
            syncing: Mutex::new(()),
            wake: Condvar::new(),
            lock: Mutex::new(()),
            stop: AtomicBool::new(false),
            metrics,
        });
        let thread_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("neardup-commit".into())
            .spawn(move || sync_loop(&thread_inner))
            .expect("spawn the commit thread");
        Committer { inner, thread: Arc::new(Mutex::new(Some(thread))) }
    }

    /// Records that every sequence up to `seq` has been appended (call in sequence order).
    pub fn appended(&self, seq: u64) {
        self.inner.appended.fetch_max(seq, Ordering::AcqRel);
    }

    /// The highest sequence appended so far.
    pub fn appended_seq(&self) -> u64 {
        self.inner.appended.load(Ordering::Acquire)
    }

    /// The highest sequence known durable.
    pub fn durable(&self) -> u64 {
        *self.inner.durable.borrow()
    }

    /// The error of the sync that failed, if one has: nothing more will be made durable.
    pub fn failure(&self) -> Option<&str> {
        self.inner.failed.get().map(String::as_str)
    }

    /// Waits until the record with sequence `seq` (already appended) is durable.
    pub async fn wait(&self, seq: u64) -> Result<()> {
        let mut rx = self.inner.durable.subscribe();
        if *rx.borrow_and_update() >= seq {
            return Ok(());
        }
        self.request(seq);
        loop {
            if self.reached(&mut rx, seq)? {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err(Error::ShuttingDown);
            }
        }
    }

    /// Blocking form of [`wait`](Self::wait), for threads outside the async runtime.
    pub fn wait_blocking(&self, seq: u64) -> Result<()> {
        let mut rx = self.inner.durable.subscribe();
        self.request(seq);
        loop {
            if self.reached(&mut rx, seq)? {
                return Ok(());
            }
            // A short sleep keeps this simple; it is used at shutdown and in tests only.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Whether `seq` is durable; the sync failure if it never will be.
    fn reached(&self, rx: &mut watch::Receiver<u64>, seq: u64) -> Result<bool> {
        if *rx.borrow_and_update() >= seq {
            return Ok(true);
        }
        match self.inner.failed.get() {
            Some(msg) => Err(Error::SyncFailed(msg.clone())),
            None => Ok(false),
        }
    }

    fn request(&self, seq: u64) {
        self.inner.requested.fetch_max(seq, Ordering::AcqRel);
        let _g = self.inner.lock.lock();
        self.inner.wake.notify_one();
    }

    /// A sync outside group commit (checkpoints, snapshots, shutdown), under the same rule:
    /// refused once a sync has failed, and its own failure stops group commit.
    ///
    /// The logs are synced under the group-commit rule; the rest of the store (sled's
    /// flush, which can take a while when a checkpoint wrote a run) is synced outside it, so
    /// group commit goes on meanwhile. Its failure is final too.
    pub fn sync(&self) -> Result<()> {
        sync_log_once(&self.inner, || {})?;
        let inner = &self.inner;
        if let Some(msg) = inner.failed.get() {
            return Err(Error::SyncFailed(msg.clone()));
        }
        match inner.store.sync_rest() {
            Ok(()) => Ok(()),
            Err(e) => Err(fail(inner, e)),
        }
    }

    /// Stops the sync thread after a last sync, and waits for it.
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        {
            let _g = self.inner.lock.lock();
            self.inner.wake.notify_one();
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Syncs the store's logs ([`Store::sync_log`]) and calls `synced` while no other sync can fail in
/// between; after a failure (this one or an earlier one) returns [`Error::SyncFailed`] and syncs nothing.
fn sync_log_once(inner: &Inner, synced: impl FnOnce()) -> Result<()> {
    let _one = inner.syncing.lock();
    if let Some(msg) = inner.failed.get() {
        return Err(Error::SyncFailed(msg.clone()));
    }
    let started = Instant::now();
    match inner.store.sync_log() {
        Ok(()) => {
            inner.metrics.observe_sync(started.elapsed().as_secs_f64());
            synced();
            Ok(())
        }
        Err(e) => Err(fail(inner, e)),
    }
}

/// Records the first failed sync (see the module docs) and wakes the waiters.
fn fail(inner: &Inner, e: Error) -> Error {
    let msg = e.to_string();
    tracing::error!(error = %msg,
        "store sync failed; nothing more is acknowledged until the shard is restarted");
    let _ = inner.failed.set(msg.clone());
    (inner.on_failure)(&msg);
    // Wake the waiters so they report the failure.
    inner.durable.send_modify(|_| {});
    Error::SyncFailed(msg)
}

fn sync_loop(inner: &Inner) {
    loop {
        {
            let mut g = inner.lock.lock();
            while inner.requested.load(Ordering::Acquire) <= *inner.durable.borrow()
                && !inner.stop.load(Ordering::Acquire)
            {
                inner.wake.wait(&mut g);
            }
        }
        // Everything appended before the sync starts is covered by it.
        let target = inner.appended.load(Ordering::Acquire);
        let advance = || inner.durable.send_modify(|d| *d = (*d).max(target));
        if sync_log_once(inner, advance).is_err() {
            // Final: see the module docs.
            return;
        }
        if inner.stop.load(Ordering::Acquire)
            && inner.requested.load(Ordering::Acquire) <= *inner.durable.borrow()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault_store::FaultyStore;
    use crate::storage::SledStore;

    /// After a failed sync the durable point stays where it was, whatever later syncs would
    /// report, and every waiter above it gets the error.
    #[test]
    fn the_durable_point_never_moves_after_a_failed_sync() {
        let dir = tempfile::tempdir().unwrap();
        let sled = Arc::new(SledStore::open(dir.path(), 1 << 20).unwrap());
        let store = FaultyStore::new(sled);
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        let t = told.clone();
        let c = Committer::start(store.clone(), 0, ShardMetrics::default(), move |m: &str| {
            t.lock().push(m.to_string())
        });
        c.appended(1);
        c.wait_blocking(1).unwrap();
        store.fail_syncs(1);
        c.appended(2);
        let e = c.wait_blocking(2).unwrap_err();
        assert!(matches!(e, Error::SyncFailed(_)), "{e}");
        c.appended(3);
        assert!(matches!(c.wait_blocking(3), Err(Error::SyncFailed(_))));
        assert!(matches!(c.sync(), Err(Error::SyncFailed(_))));
        assert_eq!(c.durable(), 1);
        assert!(c.failure().is_some());
        c.wait_blocking(1).unwrap();
        assert_eq!(told.lock().len(), 1, "told once");
        assert_eq!((store.syncs_ok(), store.syncs_failed()), (1, 1), "no sync after it");
        c.stop();
    }
}
