//! Group commit: writers append log records, then wait until a sync covers them.
//!
//! One thread does every sync. A writer that needs its record durable asks for it and
//! waits; the thread reads the highest sequence appended so far, syncs the store once, and
//! releases every writer at or below that sequence. Writers that arrive during a sync are
//! covered by the next one, so concurrent writers share each fsync, and a lone writer waits
//! one fsync.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::metrics::ShardMetrics;
use crate::storage::Store;

/// State shared by writers and the sync thread.
struct Inner {
    store: Arc<dyn Store>,
    /// Highest sequence appended (set by writers after their append returned).
    appended: AtomicU64,
    /// Highest sequence a writer waits for.
    requested: AtomicU64,
    /// Highest sequence known durable; `u64::MAX` never.
    durable: watch::Sender<u64>,
    /// The last sync failed with this message (cleared by the next success).
    failed: Mutex<Option<String>>,
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
    /// everything stored).
    pub fn start(
        store: Arc<dyn Store>,
        durable: u64,
        metrics: ShardMetrics,
        _on_failure: impl Fn(&str) + Send + Sync + 'static,
    ) -> Committer {
        let (tx, _) = watch::channel(durable);
        let inner = Arc::new(Inner {
            store,
            appended: AtomicU64::new(durable),
            requested: AtomicU64::new(durable),
            durable: tx,
            failed: Mutex::new(None),
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

    /// Whether `seq` is durable; the sync failure if the log can no longer be synced.
    fn reached(&self, rx: &mut watch::Receiver<u64>, seq: u64) -> Result<bool> {
        if *rx.borrow_and_update() >= seq {
            return Ok(true);
        }
        match self.inner.failed.lock().clone() {
            Some(msg) => Err(Error::Storage(format!("log sync failed: {msg}"))),
            None => Ok(false),
        }
    }

    fn request(&self, seq: u64) {
        self.inner.requested.fetch_max(seq, Ordering::AcqRel);
        let _g = self.inner.lock.lock();
        self.inner.wake.notify_one();
    }

    /// A sync outside group commit (checkpoints, snapshots, shutdown).
    pub fn sync(&self) -> Result<()> {
        self.inner.store.sync()
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
        let started = Instant::now();
        match inner.store.sync() {
            Ok(()) => {
                *inner.failed.lock() = None;
                inner.metrics.observe_sync(started.elapsed().as_secs_f64());
                inner.durable.send_modify(|d| *d = (*d).max(target));
            }
            Err(e) => {
                tracing::error!(error = %e, "log sync failed");
                *inner.failed.lock() = Some(e.to_string());
                // Wake the waiters so they report the failure; back off before retrying.
                inner.durable.send_modify(|_| {});
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        if inner.stop.load(Ordering::Acquire)
            && inner.requested.load(Ordering::Acquire) <= *inner.durable.borrow()
        {
            return;
        }
    }
}
