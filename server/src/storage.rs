//! The storage seam: what the shard needs from an embedded database, and its sled
//! implementation.
//!
//! The shard keeps its write-ahead log, its runs and its document snapshots as keys and
//! values. Everything it assumes of the database is written in the [`Store`] and [`Space`]
//! contracts below, so another engine can replace sled by implementing two traits, and the
//! shard's logic can be read without knowing sled.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// An embedded, ordered key-value database made of named keyspaces.
///
/// # Contract
/// An implementation guarantees:
/// - **Durability point.** A write (put, remove, batch) that returned before [`sync`] was
///   called survives a crash of the process or the machine once `sync` returns `Ok`. Writes
///   not covered by a successful `sync` may be lost, but only as a suffix: if a write
///   survives a crash, every write to the same store that returned before it started
///   survives too.
/// - **Integrity.** Data read back is the data written, or an error: damage to the files is
///   reported (as [`Error::Storage`]), never returned as values.
/// - **Concurrency.** Every method may be called from any thread at once. `sync` may run
///   while other threads write; it covers at least the writes that returned before it was
///   called.
///
/// A caller may assume nothing else: in particular no atomicity across keyspaces.
///
/// [`sync`]: Store::sync
pub trait Store: Send + Sync + 'static {
    /// Opens (creating if needed) the keyspace `name`.
    fn space(&self, name: &str) -> Result<Arc<dyn Space>>;
    /// Makes every write that returned before this call durable (see the contract).
    fn sync(&self) -> Result<()>;
    /// Bytes the database takes on disk.
    fn disk_bytes(&self) -> Result<u64>;
}

/// One keyspace: keys ordered bytewise.
///
/// # Contract
/// - `put` and `remove` of one key are atomic; [`Space::apply`] applies its whole batch
///   atomically (after a crash, all of it or none of it is there) and in order.
/// - [`Space::scan`] yields the entries with `from <= key < to` in key order, as of some
///   moment during the scan for keys written concurrently.
pub trait Space: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Sets `key` to `value`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Removes `key` (no-op when absent).
    fn remove(&self, key: &[u8]) -> Result<()>;
    /// Applies puts (`Some`) and removes (`None`) atomically, in order.
    fn apply(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()>;
    /// Entries with `from <= key < to`, in key order.
    fn scan<'a>(&'a self, from: &[u8], to: &[u8]) -> Box<dyn Iterator<Item = Result<Entry>> + 'a>;
    /// Removes every key with `from <= key < to`.
    fn remove_range(&self, from: &[u8], to: &[u8]) -> Result<()> {
        let keys: Vec<Vec<u8>> =
            self.scan(from, to).map(|e| e.map(|(k, _)| k)).collect::<Result<_>>()?;
        for chunk in keys.chunks(1024) {
            self.apply(chunk.iter().map(|k| (k.clone(), None)).collect())?;
        }
        Ok(())
    }
    /// The last entry with `from <= key < to`.
    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>>;
}

/// [`Store`] on sled 0.34.
///
/// sled makes writes durable with `flush` (an fsync of its log), and flushes by itself every
/// `flush_every_ms`; the shard calls [`Store::sync`] itself (group commit), so the automatic
/// flush only bounds how much unacknowledged data a crash can lose.
#[derive(Clone)]
pub struct SledStore {
    db: sled::Db,
}

impl SledStore {
    /// Opens or creates the database in directory `path`, with a page cache of
    /// `cache_bytes`.
    ///
    /// The database's lock file is held by one process at a time. A database closed a moment
    /// ago in this process may still hold it while sled's background threads finish, so a
    /// held lock is retried for up to 3 s before it is reported.
    pub fn open(path: &Path, cache_bytes: u64) -> Result<SledStore> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            let opened = sled::Config::new()
                .path(path)
                .cache_capacity(cache_bytes)
                .flush_every_ms(Some(1000))
                .open();
            let e = match opened {
                Ok(db) => return Ok(SledStore { db }),
                Err(e) => e,
            };
            let held =
                matches!(&e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock);
            if held && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            return Err(Error::DataDir {
                path: path.display().to_string(),
                reason: if held {
                    format!("the database is in use by another process ({e})")
                } else {
                    format!("cannot open the database: {e}")
                },
            });
        }
    }
}

impl Store for SledStore {
    fn space(&self, name: &str) -> Result<Arc<dyn Space>> {
        Ok(Arc::new(SledSpace { tree: self.db.open_tree(name)? }))
    }

    fn sync(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    fn disk_bytes(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()?)
    }
}

struct SledSpace {
    tree: sled::Tree,
}

impl Space for SledSpace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.tree.insert(key, value)?;
        Ok(())
    }

    fn remove(&self, key: &[u8]) -> Result<()> {
        self.tree.remove(key)?;
        Ok(())
    }

    fn apply(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        let mut b = sled::Batch::default();
        for (k, v) in batch {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        self.tree.apply_batch(b)?;
        Ok(())
    }

    fn scan<'a>(&'a self, from: &[u8], to: &[u8]) -> Box<dyn Iterator<Item = Result<Entry>> + 'a> {
        Box::new(
            self.tree
                .range(from.to_vec()..to.to_vec())
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(Error::from)),
        )
    }

    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>> {
        match self.tree.range(from.to_vec()..to.to_vec()).next_back() {
            None => Ok(None),
            Some(r) => {
                let (k, v) = r?;
                Ok(Some((k.to_vec(), v.to_vec())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sled_space_contract() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let s = store.space("t").unwrap();
        s.put(b"b", b"2").unwrap();
        s.apply(vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"c".to_vec(), Some(b"3".to_vec()))])
            .unwrap();
        assert_eq!(s.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        let keys: Vec<Vec<u8>> = s.scan(b"a", b"c").map(|e| e.unwrap().0).collect();
        assert_eq!(keys, [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(s.last_in(b"a", b"z").unwrap().unwrap().0, b"c");
        s.remove_range(b"a", b"c").unwrap();
        assert_eq!(s.get(b"a").unwrap(), None);
        assert_eq!(s.get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
        store.sync().unwrap();
        drop((s, store));
        // Reopened, the synced data is there.
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.space("t").unwrap().get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
    }
}
