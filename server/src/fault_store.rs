//! A [`Store`] that fails on command, for tests of what the shard does when the disk does.
//!
//! The shard's durability rests on the [`Store`] contract: a write is durable once a later
//! `sync` returns `Ok`, a failed `sync` promises nothing, and a crash keeps a prefix of the
//! writes. Those promises are hard to break on purpose with a real disk, so [`FaultyStore`]
//! wraps a real store and breaks them on command:
//!
//! - [`fail_syncs`](FaultyStore::fail_syncs): the next `n` syncs return an I/O error
//!   (`EIO`), as `fsync` does when the kernel could not write dirty pages back. Whether the
//!   writes before it reached the disk is then unknown: a caller must treat them as lost.
//! - [`set_disk_full`](FaultyStore::set_disk_full): every write (put, remove, batch) fails
//!   with `ENOSPC` and changes nothing, as a database refuses a write it cannot log.
//! - [`crash_after_writes`](FaultyStore::crash_after_writes): the next `n` writes land, then
//!   the store behaves as a process killed at that point: every later write and sync fails
//!   and changes nothing. What is left in the wrapped store is a prefix of the writes, the
//!   worst a crash may leave under the contract; reopening the wrapped store's files is the
//!   restart.
//! - [`tear_next_put`](FaultyStore::tear_next_put): the next put stores only the first half
//!   of its value and reports success. The contract rules this out (a put is atomic); it
//!   models a storage engine that breaks that promise (a torn page), so tests can show that
//!   what the shard stores carries its own checksums and such damage is found, not served.
//!
//! Reads always pass through: the faults are about what reaches the disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::storage::{Entry, Space, Store};

/// The faults to inject, shared by the store and its keyspaces.
#[derive(Debug, Default)]
struct Faults {
    /// Syncs still to fail.
    fail_syncs: AtomicU32,
    /// Writes fail with `ENOSPC`.
    disk_full: AtomicBool,
    /// Writes still allowed before the crash point; `u64::MAX` for no crash point.
    writes_left: AtomicU64,
    /// The next put is torn.
    tear_put: AtomicBool,
    /// Syncs that returned `Ok`.
    syncs_ok: AtomicU64,
    /// Syncs that returned an error.
    syncs_failed: AtomicU64,
}

impl Faults {
    /// Whether a write may go ahead; the error it gets otherwise.
    fn admit_write(&self) -> Result<()> {
        if self.disk_full.load(Ordering::Acquire) {
            return Err(io_error(libc::ENOSPC, "write refused"));
        }
        let passed = self
            .writes_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| match left {
                u64::MAX => Some(u64::MAX),
                0 => None,
                n => Some(n - 1),
            })
            .is_ok();
        if passed {
            Ok(())
        } else {
            Err(Error::Storage("injected crash: the store is gone".into()))
        }
    }
}

/// An error as the storage engine reports an operating-system error `code`.
fn io_error(code: i32, what: &str) -> Error {
    Error::Storage(format!("{what}: {}", std::io::Error::from_raw_os_error(code)))
}

/// A [`Store`] wrapping another and failing on command: see the module docs.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Arc<Faults>,
}

impl FaultyStore {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn Store>) -> Arc<FaultyStore> {
        let faults = Faults { writes_left: AtomicU64::new(u64::MAX), ..Default::default() };
        Arc::new(FaultyStore { inner, faults: Arc::new(faults) })
    }

    /// The next `n` syncs fail with `EIO` (after the ones already armed).
    pub fn fail_syncs(&self, n: u32) {
        self.faults.fail_syncs.fetch_add(n, Ordering::AcqRel);
    }

    /// While `full`, every write fails with `ENOSPC` and changes nothing.
    pub fn set_disk_full(&self, full: bool) {
        self.faults.disk_full.store(full, Ordering::Release);
    }

    /// `n` more writes land; every write and sync after them fails and changes nothing.
    pub fn crash_after_writes(&self, n: u64) {
        self.faults.writes_left.store(n, Ordering::Release);
    }

    /// The next put stores the first half of its value only, and reports success.
    pub fn tear_next_put(&self) {
        self.faults.tear_put.store(true, Ordering::Release);
    }

    /// Syncs that returned `Ok` so far.
    pub fn syncs_ok(&self) -> u64 {
        self.faults.syncs_ok.load(Ordering::Acquire)
    }

    /// Syncs that returned an error so far.
    pub fn syncs_failed(&self) -> u64 {
        self.faults.syncs_failed.load(Ordering::Acquire)
    }
}

impl Store for FaultyStore {
    fn space(&self, name: &str) -> Result<Arc<dyn Space>> {
        Ok(Arc::new(FaultySpace { inner: self.inner.space(name)?, faults: self.faults.clone() }))
    }

    fn log(&self, name: &str) -> Result<Arc<dyn Space>> {
        Ok(Arc::new(FaultySpace { inner: self.inner.log(name)?, faults: self.faults.clone() }))
    }

    fn slots(&self, name: &str) -> Result<Arc<dyn Space>> {
        Ok(Arc::new(FaultySpace { inner: self.inner.slots(name)?, faults: self.faults.clone() }))
    }

    fn sync(&self) -> Result<()> {
        self.faulty_sync(|s| s.sync())
    }

    fn sync_log(&self) -> Result<()> {
        self.faulty_sync(|s| s.sync_log())
    }

    fn sync_rest(&self) -> Result<()> {
        self.faulty_sync(|s| s.sync_rest())
    }

    fn disk_bytes(&self) -> Result<u64> {
        self.inner.disk_bytes()
    }
}

impl FaultyStore {
    /// A sync of the inner store (`sync`), failed as the faults say.
    fn faulty_sync(&self, sync: impl FnOnce(&dyn Store) -> Result<()>) -> Result<()> {
        let f = &self.faults;
        let fail = f
            .fail_syncs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        let r = if fail {
            Err(io_error(libc::EIO, "sync failed"))
        } else if f.writes_left.load(Ordering::Acquire) == 0 {
            Err(Error::Storage("injected crash: the store is gone".into()))
        } else {
            sync(&*self.inner)
        };
        match r {
            Ok(()) => f.syncs_ok.fetch_add(1, Ordering::AcqRel),
            Err(_) => f.syncs_failed.fetch_add(1, Ordering::AcqRel),
        };
        r
    }
}

/// A keyspace of a [`FaultyStore`].
struct FaultySpace {
    inner: Arc<dyn Space>,
    faults: Arc<Faults>,
}

impl Space for FaultySpace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.faults.admit_write()?;
        if self.faults.tear_put.swap(false, Ordering::AcqRel) {
            return self.inner.put(key, &value[..value.len() / 2]);
        }
        self.inner.put(key, value)
    }

    fn remove(&self, key: &[u8]) -> Result<()> {
        self.faults.admit_write()?;
        self.inner.remove(key)
    }

    fn apply(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        self.faults.admit_write()?;
        self.inner.apply(batch)
    }

    fn scan<'a>(&'a self, from: &[u8], to: &[u8]) -> Box<dyn Iterator<Item = Result<Entry>> + 'a> {
        self.inner.scan(from, to)
    }

    fn remove_range(&self, from: &[u8], to: &[u8]) -> Result<()> {
        self.faults.admit_write()?;
        self.inner.remove_range(from, to)
    }

    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>> {
        self.inner.last_in(from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SledStore;

    fn store() -> (tempfile::TempDir, Arc<FaultyStore>) {
        let dir = tempfile::tempdir().unwrap();
        let sled = Arc::new(SledStore::open(dir.path(), 1 << 20).unwrap());
        (dir, FaultyStore::new(sled))
    }

    #[test]
    fn each_fault_does_what_it_says() {
        let (_dir, store) = store();
        let s = store.space("t").unwrap();
        s.put(b"a", b"1").unwrap();
        store.sync().unwrap();
        // Failed syncs: exactly as many as armed.
        store.fail_syncs(2);
        assert!(store.sync().unwrap_err().to_string().contains("Input/output error"));
        assert!(store.sync().is_err());
        store.sync().unwrap();
        assert_eq!((store.syncs_ok(), store.syncs_failed()), (2, 2));
        // Disk full: a clear error, nothing changed.
        store.set_disk_full(true);
        let e = s.put(b"a", b"2").unwrap_err();
        assert!(e.to_string().contains("No space left on device"), "{e}");
        assert!(s.apply(vec![(b"b".to_vec(), Some(b"3".to_vec()))]).is_err());
        assert!(s.remove(b"a").is_err());
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.get(b"b").unwrap(), None);
        store.set_disk_full(false);
        // A torn put keeps half of the value.
        store.tear_next_put();
        s.put(b"c", b"abcd").unwrap();
        assert_eq!(s.get(b"c").unwrap().as_deref(), Some(&b"ab"[..]));
        s.put(b"d", b"abcd").unwrap();
        assert_eq!(s.get(b"d").unwrap().as_deref(), Some(&b"abcd"[..]));
        // A crash point: one more write lands, then nothing does.
        store.crash_after_writes(1);
        s.put(b"e", b"1").unwrap();
        assert!(s.put(b"f", b"1").is_err());
        assert!(store.sync().is_err());
        assert_eq!(s.get(b"e").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.get(b"f").unwrap(), None);
    }
}
