//! The storage seam: what the shard needs from an embedded database, and its sled
//! implementation.
//!
//! The shard keeps its write-ahead log, its runs and its document snapshots as keys and
//! values. Everything it assumes of the database is written in the [`Store`] and [`Space`]
//! contracts below, so another engine can replace sled by implementing two traits, and the
//! shard's logic can be read without knowing sled.
//!
//! sled 0.34 panics on some damaged files instead of returning an error (`tried to
//! serialize Uninitialized`, `cannot find pid .. in view_for_key`). Every call into sled
//! here runs under [`guarded`], which turns such a panic into [`Error::CorruptTablet`], so a
//! damaged disk gives a clear error instead of a crash or a recovery thread that dies
//! silently.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Once};

use crate::error::{Error, Result};
use crate::slots::SlotFile;
use crate::wal::SegmentLog;

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
    /// Opens (creating if needed) the keyspace `name` for a log: keys (8 bytes, big-endian)
    /// only ever put in increasing order and removed from the oldest end. An engine may keep
    /// it apart (sled's store keeps it in segment files, [`crate::wal`]); by default it is
    /// an ordinary keyspace. The contract above holds for it with the rest of the store.
    fn log(&self, name: &str) -> Result<Arc<dyn Space>> {
        self.space(name)
    }
    /// Opens (creating if needed) the keyspace `name` for values by dense 8-byte ids that
    /// are read one at a time on the request path (sketches). An engine may keep it apart
    /// (sled's store keeps it in a file of fixed slots, [`crate::slots`]); there its
    /// [`apply`](Space::apply) is not atomic. Durable at [`sync`](Store::sync) or
    /// [`sync_rest`](Store::sync_rest). By default an ordinary keyspace.
    fn slots(&self, name: &str) -> Result<Arc<dyn Space>> {
        self.space(name)
    }
    /// Makes every write that returned before this call durable (see the contract).
    fn sync(&self) -> Result<()>;
    /// Makes every write to the logs ([`log`](Store::log)) that returned before this call
    /// durable; other keyspaces may wait for [`sync`](Store::sync). Group commit needs no
    /// more: what else a write changes is written again from the log on recovery. By
    /// default the same as `sync`.
    fn sync_log(&self) -> Result<()> {
        self.sync()
    }
    /// [`sync_log`](Store::sync_log) for the logs whose names start with `prefix` only (a
    /// [`PrefixedStore`]'s). By default every log.
    fn sync_logs_under(&self, prefix: &str) -> Result<()> {
        let _ = prefix;
        self.sync_log()
    }
    /// Makes durable every write that returned before this call other than those
    /// [`sync_log`](Store::sync_log) covers; `sync_log` then `sync_rest` is a
    /// [`sync`](Store::sync). By default the same as `sync`.
    fn sync_rest(&self) -> Result<()> {
        self.sync()
    }
    /// Bytes the database takes on disk.
    fn disk_bytes(&self) -> Result<u64>;
    /// [`disk_bytes`](Store::disk_bytes) by kind of file, for reports (names are the
    /// engine's; sled: its log file, its blob files and their count, its snapshot files).
    fn disk_parts(&self) -> Result<Vec<(String, u64)>> {
        Ok(vec![("all".to_string(), self.disk_bytes()?)])
    }
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
        remove_scanned(self, from, to).map(drop)
    }
    /// The last entry with `from <= key < to`.
    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>>;
}

/// Removes every key with `from <= key < to` from `space`, found by a scan, in batches;
/// returns the sizes of the values removed.
fn remove_scanned<S: Space + ?Sized>(space: &S, from: &[u8], to: &[u8]) -> Result<Vec<usize>> {
    let mut keys = Vec::new();
    let mut sizes = Vec::new();
    for e in space.scan(from, to) {
        let (k, v) = e?;
        keys.push(k);
        sizes.push(v.len());
    }
    for chunk in keys.chunks(1024) {
        space.apply(chunk.iter().map(|k| (k.clone(), None)).collect())?;
    }
    Ok(sizes)
}

thread_local! {
    /// How many [`guarded`] calls the current thread is inside.
    static GUARDED: Cell<u32> = const { Cell::new(0) };
}

/// Installs, once, a panic hook that stays quiet for panics [`guarded`] catches (their
/// message becomes the error) and hands every other panic to the hook that was there.
fn quiet_guarded_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, a call into the storage engine, turning a panic inside it into
/// [`Error::CorruptTablet`] naming `what` and the panic's message.
///
/// `AssertUnwindSafe` is sound here because nothing observes the engine's state after such
/// a panic as healthy: the error makes the shard refuse to open or mark it corrupt, and it
/// serves nothing more from that database.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    quiet_guarded_panics();
    GUARDED.with(|g| g.set(g.get() + 1));
    let out = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    out.unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::CorruptTablet(format!("the database is damaged ({what} failed: {msg})")))
    })
}

/// A sled error as the shard's: damage sled detects is a corrupt tablet.
fn sled_error(e: sled::Error) -> Error {
    match e {
        sled::Error::Corruption { .. } => {
            Error::CorruptTablet(format!("the database is damaged: {e}"))
        }
        e => Error::from(e),
    }
}

/// [`Store`] on sled 0.34.
///
/// sled makes writes durable with `flush` (an fsync of its log), and flushes by itself every
/// `flush_every_ms`; the shard calls [`Store::sync`] itself (group commit), so the automatic
/// flush only bounds how much unacknowledged data a crash can lose.
#[derive(Clone)]
pub struct SledStore {
    /// Logs opened (see [`Store::log`]), by name; each synced before the database. Declared
    /// before `db` so that they are closed before the database's lock is released.
    logs: Arc<parking_lot::Mutex<std::collections::HashMap<String, Arc<SegmentLog>>>>,
    /// Slot files opened (see [`Store::slots`]), by name; closed before the database too.
    slot_files: Arc<parking_lot::Mutex<std::collections::HashMap<String, Arc<SlotFile>>>>,
    db: sled::Db,
    path: std::path::PathBuf,
    /// The newest of sled's blob files synced so far (see [`SledStore::sync_blobs`]).
    blobs_synced: Arc<std::sync::atomic::AtomicI64>,
    /// Bytes of large values written or removed since sled's segments were last closed
    /// (see [`SledStore::close_segments`]).
    blob_churn: Arc<std::sync::atomic::AtomicU64>,
    /// Held by each flush ([`SledStore::flush_db`]): one at a time.
    flushing: Arc<parking_lot::Mutex<()>>,
}

/// Values this large (a quarter of sled's 512 KiB log segment) are files of their own.
const BLOB_BYTES: usize = 128 << 10;

/// Large-value churn after which a flush closes sled's segments, so that the files of
/// replaced values go: twice what closing them writes.
const CLOSE_SEGMENTS_AFTER: u64 = 2 * PAD_VALUES as u64 * PAD_BYTES as u64;

/// What closing sled's segments writes (and removes again): this many values of this many
/// bytes, small enough for a leaf of them to stay in sled's log.
const PAD_VALUES: u32 = 1024;
const PAD_BYTES: usize = 4000;

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
            let opened = guarded("opening the database", || {
                Ok(sled::Config::new()
                    .path(path)
                    .cache_capacity(cache_bytes)
                    .flush_every_ms(Some(1000))
                    .open())
            });
            let e = match opened {
                Ok(Ok(db)) => {
                    return Ok(SledStore {
                        db,
                        path: path.to_path_buf(),
                        logs: Default::default(),
                        slot_files: Default::default(),
                        blobs_synced: Default::default(),
                        blob_churn: Default::default(),
                        flushing: Default::default(),
                    });
                }
                Ok(Err(e)) => e,
                Err(Error::CorruptTablet(msg)) => {
                    return Err(Error::DataDir { path: path.display().to_string(), reason: msg });
                }
                Err(e) => return Err(e),
            };
            // sled 0.34 reports a held lock as an `Other` I/O error whose text names it (the
            // lock error's kind survives only in that text).
            let held = matches!(&e, sled::Error::Io(io)
                if io.kind() == std::io::ErrorKind::WouldBlock
                    || io.to_string().starts_with("could not acquire lock"));
            if held && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            return Err(Error::DataDir {
                path: path.display().to_string(),
                reason: if held {
                    "the database is in use by another process (its lock is held)".to_string()
                } else if matches!(e, sled::Error::Corruption { .. }) {
                    format!("the database is damaged: {e}")
                } else {
                    format!("cannot open the database: {e}")
                },
            });
        }
    }

    /// sled's flush: everything written to the database so far is durable. The blob files
    /// are synced first, so that the log records pointing at them are never durable
    /// before they are.
    ///
    /// After enough large values were written or removed, the flush also closes sled's
    /// segments ([`close_segments`](Self::close_segments)), once what it flushed is durable.
    fn flush_db(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let flush = || guarded("sync", || self.db.flush().map(drop).map_err(sled_error));
        // sled 0.34 hung here with flushes running at once while one closed the segments
        // (flushes waiting for the log to be stable, the closing insert for room in it, no
        // I/O thread at work). A flush waits for everything written before it anyway: a
        // second one at the same moment gains nothing.
        let _one = self.flushing.lock();
        self.sync_blobs()?;
        flush()?;
        // One flush at a time takes the count and closes the segments.
        let due = self.blob_churn.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c >= CLOSE_SEGMENTS_AFTER).then_some(0)
        });
        if due.is_ok() {
            self.close_segments()?;
            flush()?;
        }
        Ok(())
    }

    /// Writes and removes about 4 MB of small values in a keyspace of their own, so that
    /// sled's log moves on by several segments.
    ///
    /// sled 0.34 deletes the file of a replaced large value (a run's chunk, a document
    /// snapshot's value, a leaf holding them) only once the page that pointed at it has
    /// been rewritten and the log segment holding the rewrite has filled. With the
    /// write-ahead log and the sketches outside sled, almost nothing else fills its
    /// segments, and the replaced files stayed: at 1M documents, 2.6 times the live data.
    /// 4 MB of small writes after them lets sled delete them (2 MB did not, here).
    fn close_segments(&self) -> Result<()> {
        let pad = guarded("opening a keyspace", || {
            self.db.open_tree("close_segments").map_err(sled_error)
        })?;
        let value = vec![0u8; PAD_BYTES];
        guarded("closing segments", || {
            for i in 0..PAD_VALUES {
                pad.insert(i.to_be_bytes(), value.as_slice()).map_err(sled_error)?;
            }
            for i in 0..PAD_VALUES {
                pad.remove(i.to_be_bytes()).map_err(sled_error)?;
            }
            Ok(())
        })
    }

    /// Syncs the blob files sled wrote since the last call, and their directory.
    ///
    /// sled 0.34 writes a value over a quarter of a log segment (run chunks, document
    /// snapshots) to a file of its own under `blobs/`, named by its log sequence number,
    /// and never syncs it: its flush syncs only the log that points at it, so a power loss
    /// could keep the pointer and lose the value. A write that returned before a sync began
    /// has its blob file there already (sled writes it within the write), so the sync
    /// covers it. The first sync after opening syncs every blob file there.
    fn sync_blobs(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        let dir = self.path.join("blobs");
        let bad = |what: &str, p: &Path, e: std::io::Error| {
            Error::Storage(format!("{what} {}: {e}", p.display()))
        };
        let listing = match std::fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(bad("listing", &dir, e)),
        };
        let done = self.blobs_synced.load(Ordering::Acquire);
        let mut fresh: Vec<(i64, std::path::PathBuf)> = listing
            .flatten()
            .filter_map(|f| {
                let lsn = f.file_name().to_str()?.parse::<i64>().ok()?;
                (lsn > done).then(|| (lsn, f.path()))
            })
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        fresh.sort_unstable();
        let mut newest = done;
        for (lsn, path) in fresh {
            match std::fs::File::open(&path).and_then(|f| f.sync_data()) {
                Ok(()) => newest = lsn,
                // Replaced and collected meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(bad("syncing", &path, e)),
            }
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| bad("syncing", &dir, e))?;
        self.blobs_synced.fetch_max(newest, Ordering::AcqRel);
        Ok(())
    }

    /// Moves the tree `name` an older version kept to where this one keeps it: when the
    /// tree exists, `copy` writes its entries there and makes them durable, then the tree
    /// is dropped. Whether there was one.
    fn move_tree(&self, name: &str, copy: impl FnOnce(&SledSpace) -> Result<()>) -> Result<bool> {
        let had_tree = guarded("listing keyspaces", || {
            Ok(self.db.tree_names().iter().any(|t| t.as_ref() == name.as_bytes()))
        })?;
        if !had_tree {
            return Ok(false);
        }
        let tree = guarded("opening a keyspace", || self.db.open_tree(name).map_err(sled_error))?;
        copy(&SledSpace { tree, churn: None })?;
        guarded("dropping a keyspace", || self.db.drop_tree(name).map(drop).map_err(sled_error))?;
        Ok(true)
    }

    /// Bytes of the files kept beside the database: the logs and the slot files.
    fn side_file_bytes(&self) -> (u64, u64) {
        let logs = self.logs.lock().values().map(|l| l.disk_bytes()).sum();
        let slots = self.slot_files.lock().values().map(|f| f.disk_bytes()).sum();
        (logs, slots)
    }
}

impl Store for SledStore {
    fn space(&self, name: &str) -> Result<Arc<dyn Space>> {
        let tree = guarded("opening a keyspace", || self.db.open_tree(name).map_err(sled_error))?;
        Ok(Arc::new(SledSpace { tree, churn: Some(self.blob_churn.clone()) }))
    }

    /// A log in segment files under `wal/` in the database's directory ([`crate::wal`]).
    /// A log an older version kept as a tree is moved there the first time it is opened.
    fn log(&self, name: &str) -> Result<Arc<dyn Space>> {
        let mut logs = self.logs.lock();
        if let Some(l) = logs.get(name) {
            return Ok(l.clone());
        }
        let log = Arc::new(SegmentLog::open(&self.path.join("wal").join(name.replace('/', "_")))?);
        let moved = self.move_tree(name, |old| {
            let newest = log.last_in(&[], &[0xFF; 9])?.map(|(k, _)| k);
            for e in old.scan(&[], &[0xFF; 9]) {
                let (k, v) = e?;
                if newest.as_ref().is_none_or(|n| &k > n) {
                    log.put(&k, &v)?;
                }
            }
            log.sync()
        })?;
        if moved {
            tracing::info!(name, "the write-ahead log moved from the database to its own files");
        }
        logs.insert(name.to_string(), log.clone());
        Ok(log)
    }

    /// Values in a file of slots under `slots/` in the database's directory, those longer
    /// than a slot in the keyspace `{name}.overflow` ([`crate::slots`]). A keyspace an
    /// older version kept as a tree is moved there the first time it is opened.
    fn slots(&self, name: &str) -> Result<Arc<dyn Space>> {
        let mut files = self.slot_files.lock();
        if let Some(f) = files.get(name) {
            return Ok(f.clone());
        }
        let overflow = self.space(&format!("{name}.overflow"))?;
        let path = self.path.join("slots").join(format!("{}.slots", name.replace('/', "_")));
        let file = Arc::new(SlotFile::open(&path, overflow)?);
        let moved = self.move_tree(name, |old| {
            for e in old.scan(&[], &[0xFF; 9]) {
                let (k, v) = e?;
                file.put(&k, &v)?;
            }
            // The slots, and the overflow values in the database.
            file.sync()?;
            self.flush_db()
        })?;
        if moved {
            tracing::info!(name, "a keyspace moved from the database to a slot file");
        }
        files.insert(name.to_string(), file.clone());
        Ok(file)
    }

    /// Syncs every log, then the rest: a log record is durable before anything the
    /// database holds that was written after it.
    fn sync(&self) -> Result<()> {
        self.sync_log()?;
        self.sync_rest()
    }

    /// The slot files and the database.
    fn sync_rest(&self) -> Result<()> {
        let files: Vec<Arc<SlotFile>> = self.slot_files.lock().values().cloned().collect();
        for f in files {
            f.sync()?;
        }
        self.flush_db()
    }

    /// Syncs the logs' segment files only: the database's work (its own flushes, large
    /// removals) never holds up group commit.
    fn sync_log(&self) -> Result<()> {
        self.sync_logs_under("")
    }

    fn sync_logs_under(&self, prefix: &str) -> Result<()> {
        let logs: Vec<Arc<SegmentLog>> = self
            .logs
            .lock()
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, l)| l.clone())
            .collect();
        for l in logs {
            l.sync()?;
        }
        Ok(())
    }

    fn disk_bytes(&self) -> Result<u64> {
        let (logs, slots) = self.side_file_bytes();
        Ok(guarded("size", || self.db.size_on_disk().map_err(sled_error))? + logs + slots)
    }

    fn disk_parts(&self) -> Result<Vec<(String, u64)>> {
        let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let (mut blobs, mut blob_files, mut snaps) = (0u64, 0u64, 0u64);
        if let Ok(dir) = std::fs::read_dir(self.path.join("blobs")) {
            for f in dir.flatten() {
                blobs += f.metadata().map(|m| m.len()).unwrap_or(0);
                blob_files += 1;
            }
        }
        if let Ok(dir) = std::fs::read_dir(&self.path) {
            for f in dir.flatten() {
                if f.file_name().to_string_lossy().starts_with("snap.") {
                    snaps += f.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
        let (wal, slots) = self.side_file_bytes();
        Ok(vec![
            ("wal".to_string(), wal),
            ("sketch_slots".to_string(), slots),
            ("db".to_string(), len(&self.path.join("db"))),
            ("blobs".to_string(), blobs),
            ("blob_files".to_string(), blob_files),
            ("snapshots".to_string(), snaps),
        ])
    }
}

/// A store shared under a prefix: keyspace `name` is the inner store's `{prefix}{name}`.
/// Several shards over one database this way share its page cache (one bound for all) and
/// its syncs (a sync makes every shard's writes durable: sled flushes the whole database).
pub struct PrefixedStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl PrefixedStore {
    /// `inner` with every keyspace name prefixed by `prefix`.
    pub fn new(inner: Arc<dyn Store>, prefix: impl Into<String>) -> PrefixedStore {
        PrefixedStore { inner, prefix: prefix.into() }
    }
}

impl Store for PrefixedStore {
    fn space(&self, name: &str) -> Result<Arc<dyn Space>> {
        self.inner.space(&format!("{}{name}", self.prefix))
    }

    fn log(&self, name: &str) -> Result<Arc<dyn Space>> {
        self.inner.log(&format!("{}{name}", self.prefix))
    }

    /// An ordinary keyspace: the shards of a shared store number their documents by
    /// cluster-wide ids, sparse over 64 bits, where a file of slots by id does not fit.
    fn slots(&self, name: &str) -> Result<Arc<dyn Space>> {
        self.space(name)
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }

    /// This store's own logs: group commit of the shard over it waits for no other
    /// shard's log.
    fn sync_log(&self) -> Result<()> {
        self.inner.sync_logs_under(&self.prefix)
    }

    fn sync_logs_under(&self, prefix: &str) -> Result<()> {
        self.inner.sync_logs_under(&format!("{}{prefix}", self.prefix))
    }

    fn sync_rest(&self) -> Result<()> {
        self.inner.sync_rest()
    }

    /// The whole shared database's size.
    fn disk_bytes(&self) -> Result<u64> {
        self.inner.disk_bytes()
    }

    fn disk_parts(&self) -> Result<Vec<(String, u64)>> {
        self.inner.disk_parts()
    }
}

struct SledSpace {
    tree: sled::Tree,
    /// The store's count of large values written or removed, when it keeps one.
    churn: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl SledSpace {
    /// Counts the large values among `sizes` (written, replaced or removed).
    fn churned(&self, sizes: impl IntoIterator<Item = usize>) {
        if let Some(c) = &self.churn {
            let big: usize = sizes.into_iter().filter(|&n| n >= BLOB_BYTES).sum();
            if big > 0 {
                c.fetch_add(big as u64, std::sync::atomic::Ordering::AcqRel);
            }
        }
    }
}

impl Space for SledSpace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        guarded("get", || Ok(self.tree.get(key).map_err(sled_error)?.map(|v| v.to_vec())))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let old = guarded("put", || self.tree.insert(key, value).map_err(sled_error))?;
        self.churned([value.len(), old.map_or(0, |v| v.len())]);
        Ok(())
    }

    fn remove(&self, key: &[u8]) -> Result<()> {
        let old = guarded("remove", || self.tree.remove(key).map_err(sled_error))?;
        self.churned(old.map(|v| v.len()));
        Ok(())
    }

    fn apply(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        // What a batch replaces or removes is not returned: its large writes are counted.
        self.churned(batch.iter().map(|(_, v)| v.as_ref().map_or(0, Vec::len)));
        let mut b = sled::Batch::default();
        for (k, v) in batch {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        guarded("batch", || self.tree.apply_batch(b).map_err(sled_error))
    }

    /// As the default, and the large values removed are counted.
    fn remove_range(&self, from: &[u8], to: &[u8]) -> Result<()> {
        self.churned(remove_scanned(self, from, to)?);
        Ok(())
    }

    fn scan<'a>(&'a self, from: &[u8], to: &[u8]) -> Box<dyn Iterator<Item = Result<Entry>> + 'a> {
        let range = match guarded("scan", || Ok(self.tree.range(from.to_vec()..to.to_vec()))) {
            Ok(r) => r,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        Box::new(GuardedIter { inner: Some(range) })
    }

    fn last_in(&self, from: &[u8], to: &[u8]) -> Result<Option<Entry>> {
        guarded("scan", || match self.tree.range(from.to_vec()..to.to_vec()).next_back() {
            None => Ok(None),
            Some(r) => {
                let (k, v) = r.map_err(sled_error)?;
                Ok(Some((k.to_vec(), v.to_vec())))
            }
        })
    }
}

/// A sled range whose every step is [`guarded`]; it ends after its first error.
struct GuardedIter {
    inner: Option<sled::Iter>,
}

impl Iterator for GuardedIter {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        let it = self.inner.as_mut()?;
        let step = guarded("scan", || {
            it.next()
                .transpose()
                .map(|o| o.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .map_err(sled_error)
        });
        match step {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.inner = None;
                None
            }
            Err(e) => {
                self.inner = None;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_engine_is_a_corrupt_tablet() {
        let e = guarded("get", || -> Result<()> { panic!("tried to serialize Uninitialized") })
            .unwrap_err();
        assert!(matches!(&e, Error::CorruptTablet(m) if m.contains("Uninitialized")), "{e}");
        assert_eq!(guarded("get", || Ok(3)).unwrap(), 3);
    }

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

    /// A value sled writes as a blob file of its own is synced by the next sync, once: the
    /// store keeps the newest blob file it synced, and that is the newest one there.
    #[test]
    fn a_sync_syncs_the_blob_files_written_since_the_last() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let s = store.space("t").unwrap();
        let newest_blob = || {
            std::fs::read_dir(dir.path().join("blobs"))
                .unwrap()
                .filter_map(|f| f.unwrap().file_name().to_str()?.parse::<i64>().ok())
                .max()
        };
        store.sync().unwrap();
        assert_eq!(store.blobs_synced.load(Ordering::Acquire), 0, "no blob yet");
        for round in 1..=2u8 {
            s.put(&[round], &vec![round; 1 << 20]).unwrap();
            let blob = newest_blob().expect("a value of 1 MiB is a blob file");
            assert!(store.blobs_synced.load(Ordering::Acquire) < blob);
            store.sync().unwrap();
            assert_eq!(store.blobs_synced.load(Ordering::Acquire), blob, "round {round}");
        }
        drop((s, store));
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(store.space("t").unwrap().get(&[2]).unwrap().unwrap().len(), 1 << 20);
    }

    /// Large values written, replaced and removed count toward closing sled's segments,
    /// small ones do not, and the flush that closes them takes the count. (That closing
    /// lets sled's files go is tested in `tests/sled_blobs.rs`, in a process of its own.)
    #[test]
    fn large_values_written_and_removed_count_toward_closing_segments() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let s = store.space("runs").unwrap();
        let churn = || store.blob_churn.load(Ordering::Acquire);
        s.put(b"small", &[1; 100]).unwrap();
        assert_eq!(churn(), 0);
        s.put(b"a", &vec![1; BLOB_BYTES]).unwrap();
        assert_eq!(churn(), BLOB_BYTES as u64, "written");
        s.put(b"a", &vec![2; BLOB_BYTES]).unwrap();
        assert_eq!(churn(), 3 * BLOB_BYTES as u64, "written, and the value it replaced");
        s.put(b"b", &vec![3; BLOB_BYTES]).unwrap();
        s.remove(b"a").unwrap();
        s.remove_range(b"b", b"c").unwrap();
        assert_eq!(churn(), 6 * BLOB_BYTES as u64, "removed, one by one and by range");
        store.sync().unwrap();
        assert_eq!(churn(), 6 * BLOB_BYTES as u64, "not yet enough to close the segments");
        s.put(b"c", &vec![4; CLOSE_SEGMENTS_AFTER as usize]).unwrap();
        store.sync().unwrap();
        assert_eq!(churn(), 0, "the flush closed the segments and took the count");
    }

    /// A shard over a shared store syncs its own logs for group commit, not its
    /// neighbours'; a sync of the whole store syncs them all.
    #[test]
    fn a_prefixed_store_syncs_its_own_logs() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let (a, b) =
            (PrefixedStore::new(shared.clone(), "t1/"), PrefixedStore::new(shared, "t10/"));
        let (la, lb) = (a.log("log").unwrap(), b.log("log").unwrap());
        let dirty = |name: &str| store.logs.lock()[name].is_dirty();
        for round in 1..=2u64 {
            la.put(&round.to_be_bytes(), b"a").unwrap();
            lb.put(&round.to_be_bytes(), b"b").unwrap();
            a.sync_log().unwrap();
            assert!(!dirty("t1/log") && dirty("t10/log"), "round {round}");
            b.sync_log().unwrap();
            assert!(!dirty("t10/log"));
        }
        la.put(&3u64.to_be_bytes(), b"a").unwrap();
        lb.put(&3u64.to_be_bytes(), b"b").unwrap();
        a.sync().unwrap();
        assert!(!dirty("t1/log") && !dirty("t10/log"));
    }

    /// A log kept as a tree by an older version moves to segment files the first time it
    /// is opened as a log, and appends go on after it.
    #[test]
    fn a_log_in_the_database_moves_to_its_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let old = store.space("t0/log").unwrap();
        for n in 1..=100u64 {
            old.put(&n.to_be_bytes(), format!("record {n}").as_bytes()).unwrap();
        }
        store.sync().unwrap();
        drop((old, store));
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let log = store.log("t0/log").unwrap();
        log.put(&101u64.to_be_bytes(), b"record 101").unwrap();
        store.sync().unwrap();
        let names: Vec<sled::IVec> = store.db.tree_names();
        assert!(!names.iter().any(|n| n.as_ref() == b"t0/log"), "the tree is dropped");
        drop((log, store));
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            store.log("t0/log").unwrap().scan(&[], &[0xFF; 9]).collect::<Result<_>>().unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = (1..=101u64)
            .map(|n| (n.to_be_bytes().to_vec(), format!("record {n}").into_bytes()))
            .collect();
        assert_eq!(got, want);
        assert!(dir.path().join("wal/t0_log").is_dir());
    }

    /// Sketches an older version kept in a tree move to the slot file on first open, the
    /// long ones to its overflow keyspace, and read back the same after a restart.
    #[test]
    fn sketches_in_the_database_move_to_a_slot_file() {
        let value = |n: u64| -> Vec<u8> {
            let len = if n.is_multiple_of(3) { 200 } else { crate::slots::INLINE_BYTES };
            (0..len).map(|i| (n as usize + i) as u8).collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let old = store.space("sketches").unwrap();
        for n in (0..300u64).step_by(7) {
            old.put(&n.to_be_bytes(), &value(n)).unwrap();
        }
        store.sync().unwrap();
        drop((old, store));
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        store.slots("sketches").unwrap().remove(&14u64.to_be_bytes()).unwrap();
        store.sync().unwrap();
        assert!(!store.db.tree_names().iter().any(|n| n.as_ref() == b"sketches"));
        drop(store);
        let store = SledStore::open(dir.path(), 1 << 20).unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            store.slots("sketches").unwrap().scan(&[], &[0xFF; 9]).collect::<Result<_>>().unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = (0..300u64)
            .step_by(7)
            .filter(|&n| n != 14)
            .map(|n| (n.to_be_bytes().to_vec(), value(n)))
            .collect();
        assert_eq!(got, want);
        assert!(dir.path().join("slots/sketches.slots").is_file());
    }
}
