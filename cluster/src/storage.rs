//! The Raft log, hard state, conf state, snapshot and node identity, durable in sled.
//!
//! Layout (one sled tree, keys in ASCII): `log/` + the entry's index as 8 big-endian bytes,
//! `hard`, `snap`, `identity`. The conf state is the snapshot's: a restarted node starts from
//! the snapshot (its map and conf state, both as of the snapshot's index) and replays the
//! committed entries after it, conf changes included, so the map, the conf state and the
//! applied index always agree. Every value is a 4-byte big-endian CRC-32 of the
//! payload followed by the payload (protobuf for Raft's types, JSON for the identity). A value
//! whose checksum does not match, or that does not decode, makes [`RaftStore::open`] fail with
//! [`ClusterError::Corrupt`]: it never panics.
//!
//! Everything is checked and loaded into memory at open: the log holds at most about
//! `snapshot_every` entries of small map commands, because [`RaftStore::compact`] replaces the
//! applied prefix with a snapshot of the map. Reads are then served from memory (so the
//! [`Storage`] methods raft-rs calls cannot meet a corrupt byte) and every change is written
//! through to the store in one batch and flushed before the call returns, except a hard
//! state that only moves the commit index: that one is written lazily (see
//! [`RaftStore::set_hard_state`]). Under a data path that keeps the disk busy a flush can take
//! seconds, and the Raft thread stalled in one sends no heartbeats; the commit index moves
//! with every committed entry, so flushing it too would double the stalls.
//!
//! The store behind it is a [`Kv`]: [`SledKv`] in production, [`MemKv`] for simulations that
//! restart replicas thousands of times (the same code path above the key-value layer).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::error::ClusterError;

const LOG_PREFIX: &[u8] = b"log/";
const HARD: &[u8] = b"hard";
const SNAP: &[u8] = b"snap";
const IDENTITY: &[u8] = b"identity";

/// One write: `Some(value)` puts, `None` deletes.
pub type KvWrite = (Vec<u8>, Option<Vec<u8>>);

/// A (key, value) pair.
pub type KvPair = (Vec<u8>, Vec<u8>);

/// The key-value layer under [`RaftStore`]. A write is atomic and durable when it returns.
pub trait Kv: Send + Sync {
    /// Every (key, value) pair, in key order.
    fn load(&self) -> Result<Vec<KvPair>, ClusterError>;
    /// Applies the writes atomically and durably.
    fn write(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError>;
    /// Applies the writes atomically without waiting for them to be durable: a crash may lose
    /// them, but never a later [`Kv::write`]'s, nor them once a later `write` returned (the
    /// store keeps its writes' order).
    fn write_lazy(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError>;
}

fn batch(writes: Vec<KvWrite>) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (k, v) in writes {
        match v {
            Some(v) => batch.insert(k, v),
            None => batch.remove(k),
        }
    }
    batch
}

/// [`Kv`] on a sled database (the node's Raft directory).
pub struct SledKv {
    db: sled::Db,
}

impl SledKv {
    /// Opens (or creates) the database in `dir`.
    ///
    /// A database closed a moment ago in this process may still hold its lock while sled's
    /// background threads finish, so a held lock is retried for up to 3 s.
    pub fn open(dir: &Path) -> Result<SledKv, ClusterError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ClusterError::Storage(format!("cannot create {}: {e}", dir.display())))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            match sled::Config::new().path(dir).open() {
                Ok(db) => return Ok(SledKv { db }),
                Err(sled::Error::Io(io))
                    if (io.kind() == std::io::ErrorKind::WouldBlock
                        || io.to_string().starts_with("could not acquire lock"))
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(sled::Error::Io(io)) => {
                    return Err(ClusterError::Storage(format!(
                        "cannot open {}: {io} (is another process using it?)",
                        dir.display()
                    )));
                }
                Err(e) => return Err(ClusterError::from(e)),
            }
        }
    }
}

impl Kv for SledKv {
    fn load(&self) -> Result<Vec<KvPair>, ClusterError> {
        self.db
            .iter()
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(ClusterError::from))
            .collect()
    }

    fn write(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError> {
        let applied = self.apply(writes)?;
        let started = std::time::Instant::now();
        self.db.flush()?;
        let took = applied + started.elapsed();
        if took >= crate::STALL_WARN {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                write_ms = applied.as_millis() as u64,
                "syncing the Raft store took long"
            );
        }
        Ok(())
    }

    /// sled's log is sequential and a flush makes every earlier write durable; its own
    /// background flush (every 500 ms by default) does the same for lazy writes.
    fn write_lazy(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError> {
        let took = self.apply(writes)?;
        if took >= crate::STALL_WARN {
            tracing::warn!(took_ms = took.as_millis() as u64, "a lazy Raft store write took long");
        }
        Ok(())
    }
}

impl SledKv {
    /// Applies `writes` in one batch, not flushed; returns how long sled took (the kernel may
    /// hold the write back while the disk has much dirty data).
    fn apply(&self, writes: Vec<KvWrite>) -> Result<std::time::Duration, ClusterError> {
        let started = std::time::Instant::now();
        self.db.apply_batch(batch(writes))?;
        Ok(started.elapsed())
    }
}

/// [`Kv`] in memory, shared by clones: a simulated disk that survives a replica's restart.
///
/// Lazy writes wait in a queue that the next durable write applies first, and that
/// [`Kv::load`] (a restart) drops: a crash loses every lazy write not followed by a durable
/// one, the worst a real store may do.
#[derive(Clone, Default)]
pub struct MemKv {
    map: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
    lazy: Arc<Mutex<Vec<KvWrite>>>,
}

impl MemKv {
    /// Flips one bit of the value under `key` (tests of the checksums); false if absent.
    pub fn flip_bit(&self, key: &[u8], byte: usize) -> bool {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(key) {
            Some(v) if !v.is_empty() => {
                let i = byte % v.len();
                v[i] ^= 1;
                true
            }
            _ => false,
        }
    }

    /// The keys held (tests).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }
}

impl Kv for MemKv {
    fn load(&self) -> Result<Vec<KvPair>, ClusterError> {
        self.lazy.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    fn write(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError> {
        let mut lazy = self.lazy.lock().unwrap_or_else(|p| p.into_inner());
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in lazy.drain(..).chain(writes) {
            match v {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        Ok(())
    }

    fn write_lazy(&self, writes: Vec<KvWrite>) -> Result<(), ClusterError> {
        self.lazy.lock().unwrap_or_else(|p| p.into_inner()).extend(writes);
        Ok(())
    }
}

/// Who this Raft directory belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The node's id.
    pub node_id: NodeId,
    /// The cluster's id; empty until the node learns it (a joining node, before its first
    /// snapshot).
    pub cluster_id: String,
}

/// The key of the log entry at `index`.
pub fn log_key(index: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn seal(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 4);
    v.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn unseal<'a>(key: &[u8], value: &'a [u8]) -> Result<&'a [u8], ClusterError> {
    let name = String::from_utf8_lossy(&key[..key.len().min(4)]).into_owned();
    if value.len() < 4 {
        return Err(ClusterError::Corrupt(format!("value of {name} is {} bytes", value.len())));
    }
    let (crc, payload) = value.split_at(4);
    let want = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(payload) != want {
        return Err(ClusterError::Corrupt(format!(
            "checksum mismatch in {name}{}",
            if key.starts_with(LOG_PREFIX) && key.len() == 12 {
                let mut b = [0u8; 8];
                b.copy_from_slice(&key[4..]);
                format!(" entry {}", u64::from_be_bytes(b))
            } else {
                String::new()
            }
        )));
    }
    Ok(payload)
}

fn pb<M: protobuf::Message>(key: &[u8], value: &[u8]) -> Result<M, ClusterError> {
    M::parse_from_bytes(unseal(key, value)?).map_err(|e| {
        ClusterError::Corrupt(format!("{} does not decode: {e}", String::from_utf8_lossy(key)))
    })
}

fn pb_bytes<M: protobuf::Message>(m: &M) -> Result<Vec<u8>, ClusterError> {
    m.write_to_bytes()
        .map(|b| seal(&b))
        .map_err(|e| ClusterError::Storage(format!("cannot encode: {e}")))
}

struct Core {
    kv: Box<dyn Kv>,
    hard: HardState,
    snap: Snapshot,
    /// The entries after the snapshot, contiguous.
    entries: Vec<Entry>,
    identity: Option<Identity>,
    /// The map as applied now (in memory only), sent to followers that need a snapshot: a
    /// follower must find itself in the snapshot's conf state, so the persisted one (possibly
    /// older than its joining) will not do.
    live: Option<Snapshot>,
}

impl Core {
    fn first_index(&self) -> u64 {
        self.snap.get_metadata().index + 1
    }

    fn last_index(&self) -> u64 {
        self.snap.get_metadata().index + self.entries.len() as u64
    }
}

/// raft-rs [`Storage`] over a [`Kv`]; clones share the state (the Raft node reads through one,
/// the driver writes through another).
#[derive(Clone)]
pub struct RaftStore {
    core: Arc<RwLock<Core>>,
}

fn store_err(e: ClusterError) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(e)))
}

impl RaftStore {
    /// Opens the store in `dir` (sled).
    pub fn open_dir(dir: &Path) -> Result<RaftStore, ClusterError> {
        RaftStore::open(Box::new(SledKv::open(dir)?))
    }

    /// Loads and checks everything in `kv`.
    pub fn open(kv: Box<dyn Kv>) -> Result<RaftStore, ClusterError> {
        let mut hard = HardState::default();
        let mut snap = Snapshot::default();
        let mut identity = None;
        let mut log: Vec<Entry> = Vec::new();
        for (k, v) in kv.load()? {
            if k.starts_with(LOG_PREFIX) {
                let e: Entry = pb(&k, &v)?;
                if k != log_key(e.index) {
                    return Err(ClusterError::Corrupt(format!(
                        "entry {} stored under another index",
                        e.index
                    )));
                }
                log.push(e);
            } else if k == HARD {
                hard = pb(&k, &v)?;
            } else if k == SNAP {
                snap = pb(&k, &v)?;
            } else if k == IDENTITY {
                identity = Some(serde_json::from_slice(unseal(&k, &v)?).map_err(|e| {
                    ClusterError::Corrupt(format!("identity does not decode: {e}"))
                })?);
            }
        }
        let snap_index = snap.get_metadata().index;
        // Entries at or below the snapshot are stale leftovers; the rest must be contiguous.
        log.retain(|e| e.index > snap_index);
        for (i, e) in log.iter().enumerate() {
            if e.index != snap_index + 1 + i as u64 {
                return Err(ClusterError::Corrupt(format!(
                    "the log has a gap: entry {} follows snapshot {snap_index} and {i} entries",
                    e.index
                )));
            }
        }
        Ok(RaftStore {
            core: Arc::new(RwLock::new(Core {
                kv,
                hard,
                snap,
                entries: log,
                identity,
                live: None,
            })),
        })
    }

    fn rl(&self) -> RwLockReadGuard<'_, Core> {
        self.core.read().unwrap_or_else(|p| p.into_inner())
    }

    fn wl(&self) -> RwLockWriteGuard<'_, Core> {
        self.core.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The stored identity, if any.
    pub fn identity(&self) -> Option<Identity> {
        self.rl().identity.clone()
    }

    /// Stores the identity.
    pub fn set_identity(&self, identity: Identity) -> Result<(), ClusterError> {
        let mut core = self.wl();
        let bytes = serde_json::to_vec(&identity)
            .map_err(|e| ClusterError::Storage(format!("cannot encode identity: {e}")))?;
        core.kv.write(vec![(IDENTITY.to_vec(), Some(seal(&bytes)))])?;
        core.identity = Some(identity);
        Ok(())
    }

    /// The hard state.
    pub fn hard_state(&self) -> HardState {
        self.rl().hard.clone()
    }

    /// The conf state as of the snapshot (the one Raft restarts from).
    pub fn conf_state(&self) -> ConfState {
        self.rl().snap.get_metadata().get_conf_state().clone()
    }

    /// The latest snapshot (its data is the encoded map at its index).
    pub fn snapshot_now(&self) -> Snapshot {
        self.rl().snap.clone()
    }

    /// Index of the first entry held.
    pub fn first(&self) -> u64 {
        self.rl().first_index()
    }

    /// Index of the last entry held (the snapshot's when there is none).
    pub fn last(&self) -> u64 {
        self.rl().last_index()
    }

    /// Persists the hard state. A change of the term or the vote is durable when this returns
    /// (a vote must never be forgotten); a change of the commit index alone is written
    /// lazily. A commit index lost in a crash is learned again from the leader, and
    /// the store's order keeps it at or above any snapshot written after it.
    pub fn set_hard_state(&self, hs: &HardState) -> Result<(), ClusterError> {
        let mut core = self.wl();
        let write = vec![(HARD.to_vec(), Some(pb_bytes(hs)?))];
        if hs.term == core.hard.term && hs.vote == core.hard.vote {
            core.kv.write_lazy(write)?;
        } else {
            core.kv.write(write)?;
        }
        core.hard = hs.clone();
        Ok(())
    }

    /// Persists the commit index (from a light ready), lazily as [`RaftStore::set_hard_state`].
    pub fn set_commit(&self, commit: u64) -> Result<(), ClusterError> {
        let mut hs = self.hard_state();
        hs.commit = commit;
        self.set_hard_state(&hs)
    }

    /// Appends entries, replacing any held from the first one's index on.
    pub fn append(&self, ents: &[Entry]) -> Result<(), ClusterError> {
        let Some(first_new) = ents.first().map(|e| e.index) else {
            return Ok(());
        };
        let mut core = self.wl();
        let (first, last) = (core.first_index(), core.last_index());
        if first_new < first {
            return Err(ClusterError::Storage(format!(
                "append at {first_new} below the first held entry {first}"
            )));
        }
        if first_new > last + 1 {
            return Err(ClusterError::Storage(format!(
                "append at {first_new} leaves a gap after {last}"
            )));
        }
        let keep = (first_new - first) as usize;
        let mut writes: Vec<KvWrite> = Vec::new();
        let new_last = ents[ents.len() - 1].index;
        for e in &core.entries[keep..] {
            if e.index > new_last {
                writes.push((log_key(e.index), None));
            }
        }
        for e in ents {
            writes.push((log_key(e.index), Some(pb_bytes(e)?)));
        }
        core.kv.write(writes)?;
        core.entries.truncate(keep);
        core.entries.extend_from_slice(ents);
        Ok(())
    }

    /// Replaces everything with a snapshot received from the leader.
    pub fn apply_snapshot(&self, snap: &Snapshot) -> Result<(), ClusterError> {
        let mut core = self.wl();
        let meta = snap.get_metadata();
        let mut hard = core.hard.clone();
        hard.term = hard.term.max(meta.term);
        hard.commit = meta.index;
        let mut writes: Vec<KvWrite> =
            core.entries.iter().map(|e| (log_key(e.index), None)).collect();
        writes.push((SNAP.to_vec(), Some(pb_bytes(snap)?)));
        writes.push((HARD.to_vec(), Some(pb_bytes(&hard)?)));
        core.kv.write(writes)?;
        core.hard = hard;
        core.snap = snap.clone();
        core.entries.clear();
        Ok(())
    }

    /// Log compaction: stores `data` (the map applied up to `index`) with `conf` (the conf
    /// state at `index`) as the snapshot and drops the entries up to `index`.
    pub fn compact(&self, index: u64, conf: &ConfState, data: Vec<u8>) -> Result<(), ClusterError> {
        let mut core = self.wl();
        let (first, last) = (core.first_index(), core.last_index());
        if index < first || index > last {
            return Err(ClusterError::Storage(format!(
                "compaction at {index} outside the held entries [{first}, {last}]"
            )));
        }
        let drop = (index - first + 1) as usize;
        let term = core.entries[drop - 1].term;
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf.clone());
        let mut writes: Vec<KvWrite> =
            core.entries[..drop].iter().map(|e| (log_key(e.index), None)).collect();
        writes.push((SNAP.to_vec(), Some(pb_bytes(&snap)?)));
        core.kv.write(writes)?;
        core.entries.drain(..drop);
        core.snap = snap;
        Ok(())
    }

    /// Records the map applied up to `index` (with the conf state there) as the snapshot to send
    /// to followers. Kept in memory only; [`RaftStore::compact`] persists one.
    pub fn set_applied(
        &self,
        index: u64,
        conf: &ConfState,
        data: Vec<u8>,
    ) -> Result<(), ClusterError> {
        let term = self.term(index).map_err(|e| {
            ClusterError::Storage(format!("no term for the applied index {index}: {e}"))
        })?;
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf.clone());
        self.wl().live = Some(snap);
        Ok(())
    }

    /// Stores the first state of a new cluster: a snapshot at index 1, term 1 holding `data`
    /// (the bootstrapped map) with `voters`, and the matching hard and conf states.
    pub fn bootstrap(&self, voters: Vec<NodeId>, data: Vec<u8>) -> Result<(), ClusterError> {
        let mut snap = Snapshot { data: data.into(), ..Default::default() };
        let meta = snap.mut_metadata();
        meta.index = 1;
        meta.term = 1;
        meta.mut_conf_state().voters = voters;
        self.apply_snapshot(&snap)
    }
}

impl Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let core = self.rl();
        Ok(RaftState::new(core.hard.clone(), core.snap.get_metadata().get_conf_state().clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let core = self.rl();
        if low < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > core.last_index() + 1 || low > high {
            return Err(store_err(ClusterError::Storage(format!(
                "entries [{low}, {high}) asked beyond the last entry {}",
                core.last_index()
            ))));
        }
        let off = core.first_index();
        let mut ents = core.entries[(low - off) as usize..(high - off) as usize].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let core = self.rl();
        let meta = core.snap.get_metadata();
        if idx == meta.index {
            return Ok(meta.term);
        }
        if idx < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > core.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(core.entries[(idx - core.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.rl().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.rl().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let core = self.rl();
        let snap = match &core.live {
            Some(live) if live.get_metadata().index >= core.snap.get_metadata().index => live,
            _ => &core.snap,
        };
        if snap.get_metadata().index < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(snap.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: format!("cmd {index}").into_bytes().into(),
            ..Default::default()
        }
    }

    fn fill(store: &RaftStore) {
        store.bootstrap(vec![1], b"map at 1".to_vec()).unwrap();
        store.append(&(2..=10).map(|i| entry(i, 2)).collect::<Vec<_>>()).unwrap();
        // A conflicting suffix from a new leader replaces 8..=10.
        store.append(&[entry(8, 3), entry(9, 3)]).unwrap();
        let hs = HardState { term: 3, vote: 1, commit: 7, ..Default::default() };
        store.set_hard_state(&hs).unwrap();
        store.set_identity(Identity { node_id: 1, cluster_id: "c".into() }).unwrap();
    }

    fn check(store: &RaftStore) {
        assert_eq!(store.first_index().unwrap(), 2);
        assert_eq!(store.last_index().unwrap(), 9);
        assert_eq!(store.term(1).unwrap(), 1);
        assert_eq!(store.term(7).unwrap(), 2);
        assert_eq!(store.term(8).unwrap(), 3);
        assert!(store.term(10).is_err());
        let ents = store.entries(2, 10, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(ents.iter().map(|e| e.index).collect::<Vec<_>>(), (2..=9).collect::<Vec<_>>());
        let one = store.entries(2, 10, Some(0), GetEntriesContext::empty(false)).unwrap();
        assert_eq!(one.len(), 1);
        let state = store.initial_state().unwrap();
        assert_eq!(state.hard_state.commit, 7);
        assert_eq!(state.hard_state.vote, 1);
        assert_eq!(state.conf_state.voters, vec![1]);
        assert_eq!(store.snapshot(0, 2).unwrap().data.as_ref(), b"map at 1");
        assert_eq!(store.identity().unwrap().node_id, 1);
    }

    #[test]
    fn sled_restart_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RaftStore::open_dir(dir.path()).unwrap();
            fill(&store);
            check(&store);
        }
        let store = RaftStore::open_dir(dir.path()).unwrap();
        check(&store);
        // Compaction survives a restart too.
        let cs = ConfState { voters: vec![1, 2], learners: vec![3], ..Default::default() };
        store.compact(6, &cs, b"map at 6".to_vec()).unwrap();
        drop(store);
        let store = RaftStore::open_dir(dir.path()).unwrap();
        assert_eq!(store.first_index().unwrap(), 7);
        assert_eq!(store.last_index().unwrap(), 9);
        assert_eq!(store.term(6).unwrap(), 2);
        assert!(matches!(store.term(5), Err(raft::Error::Store(StorageError::Compacted))));
        assert!(matches!(
            store.entries(5, 8, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let snap = store.snapshot(0, 2).unwrap();
        assert_eq!(snap.data.as_ref(), b"map at 6");
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2]);
        assert_eq!(store.initial_state().unwrap().conf_state.learners, vec![3]);
        // A gap and an append below the first entry are errors, not panics.
        assert!(store.append(&[entry(12, 3)]).is_err());
        assert!(store.append(&[entry(3, 3)]).is_err());
        assert!(store.entries(7, 20, None, GetEntriesContext::empty(false)).is_err());
    }

    #[test]
    fn sled_flipped_byte_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RaftStore::open_dir(dir.path()).unwrap();
            fill(&store);
        }
        for key in [log_key(5), HARD.to_vec(), SNAP.to_vec(), IDENTITY.to_vec()] {
            for byte in [0usize, 3, 4, 9] {
                {
                    // The store just dropped may still hold sled's lock for a moment:
                    // opened as the store opens it, retrying a held lock.
                    let db = SledKv::open(dir.path()).unwrap().db;
                    let mut v = db.get(&key).unwrap().unwrap().to_vec();
                    let i = byte % v.len();
                    v[i] ^= 0x10;
                    db.insert(&key, v.clone()).unwrap();
                    db.flush().unwrap();
                    drop(db);
                    match RaftStore::open_dir(dir.path()) {
                        Err(ClusterError::Corrupt(m)) => {
                            assert!(
                                m.contains(&String::from_utf8_lossy(&key[..4]).into_owned()),
                                "{m}"
                            )
                        }
                        Err(e) => panic!("{e}"),
                        Ok(_) => panic!("flipped byte {i} of {key:?} not detected"),
                    }
                    let db = SledKv::open(dir.path()).unwrap().db;
                    v[i] ^= 0x10;
                    db.insert(&key, v).unwrap();
                    db.flush().unwrap();
                }
                check(&RaftStore::open_dir(dir.path()).unwrap());
            }
        }
    }

    #[test]
    fn mem_kv_is_the_same_code_path() {
        let kv = MemKv::default();
        let store = RaftStore::open(Box::new(kv.clone())).unwrap();
        fill(&store);
        drop(store);
        check(&RaftStore::open(Box::new(kv.clone())).unwrap());
        assert!(kv.flip_bit(&log_key(9), 20));
        assert!(matches!(RaftStore::open(Box::new(kv.clone())), Err(ClusterError::Corrupt(_))));
        // A missing entry in the middle is a gap.
        kv.write(vec![(log_key(9), None), (log_key(4), None)]).unwrap();
        assert!(matches!(RaftStore::open(Box::new(kv)), Err(ClusterError::Corrupt(_))));
    }

    /// A commit index alone may be lost in a crash; a vote, a term, and a commit index
    /// followed by a durable write (a compaction here) are not.
    #[test]
    fn a_crash_may_lose_a_commit_alone_never_a_vote() {
        let kv = MemKv::default();
        let store = RaftStore::open(Box::new(kv.clone())).unwrap();
        fill(&store);
        store.set_commit(8).unwrap();
        assert_eq!(store.hard_state().commit, 8);
        drop(store);
        let store = RaftStore::open(Box::new(kv.clone())).unwrap();
        let hs = store.initial_state().unwrap().hard_state;
        assert_eq!((hs.term, hs.vote, hs.commit), (3, 1, 7), "the lazy commit 8 was lost");
        // A new vote with a new commit is durable at once.
        let hs = HardState { term: 4, vote: 2, commit: 8, ..Default::default() };
        store.set_hard_state(&hs).unwrap();
        store.set_commit(9).unwrap();
        let cs = ConfState { voters: vec![1], ..Default::default() };
        store.compact(8, &cs, b"map at 8".to_vec()).unwrap();
        drop(store);
        let store = RaftStore::open(Box::new(kv)).unwrap();
        let hs = store.initial_state().unwrap().hard_state;
        assert_eq!((hs.term, hs.vote, hs.commit), (4, 2, 9), "the compaction kept commit 9");
        assert_eq!(store.first_index().unwrap(), 9);
    }
}
