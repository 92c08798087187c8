//! The shard's per-document data: caller id, internal id, fingerprint, timestamp, cluster.
//!
//! The index knows documents by opaque `u64` ids; callers name them by strings (URLs). This
//! table maps one to the other, once per replica, and keeps what the index does not: the
//! fingerprint of a document by id (to replace or delete it with one block lookup) and its
//! cluster. Internal ids are handed out in increasing order and never reused, so a log record
//! always means the same document.
//!
//! Entries live in a slab; two hash tables of slab positions find them by internal id and by
//! name, so each name is stored once. Each position keeps 32 bits of its key's hash, from
//! which the table's hash is derived: a table that grows moves its positions without
//! reading the slab or hashing a name again (at a million documents, hashing every name
//! again held the shard's write lock for half a second), and a lookup reads the slab only
//! for positions whose 32 bits match. Replaying log records onto a snapshot taken while they
//! were written may briefly hold two entries with one name (see [`crate::record`]); lookups
//! by name are only made once replay is over, when names are unique again.

use hashbrown::HashTable;

use crate::record::Op;

/// One stored document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocEntry {
    /// Internal id (never 0).
    pub id: u64,
    /// Fingerprint.
    pub fp: u64,
    /// Timestamp, ms.
    pub ts: i64,
    /// Internal id of the document that founded its cluster.
    pub cluster: u64,
    /// The caller's id.
    pub name: Box<str>,
}

/// Documents by internal id and by name. See the module docs.
#[derive(Debug)]
pub struct DocTable {
    slots: Vec<DocEntry>,
    free: Vec<u32>,
    by_id: HashTable<Pos>,
    by_name: HashTable<Pos>,
    next_id: u64,
    live: usize,
    name_bytes: usize,
    /// Live documents by the low byte of their internal id (a cluster node's partition).
    by_low_byte: Box<[u64; 256]>,
    /// Bumped by each [`compact`](Self::compact), which moves entries to other slots: a
    /// reader that walks the slots across calls checks it has not changed.
    generation: u32,
}

/// A slab position in one of the hash tables, with 32 bits of its key's hash.
#[derive(Debug, Clone, Copy)]
struct Pos {
    slot: u32,
    hash: u32,
}

impl Pos {
    /// The table's hash of the key: every bit (the bucket's low bits, the control byte's
    /// top ones) from the 32 kept.
    #[inline]
    fn table_hash(&self) -> u64 {
        spread(self.hash)
    }
}

/// A 64-bit table hash from 32 bits of a key's hash.
#[inline]
fn spread(h: u32) -> u64 {
    (u64::from(h) | (u64::from(h) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Adds slab position `slot`, whose key hashes to `hash`, to `t`.
fn insert_pos(t: &mut HashTable<Pos>, slot: u32, hash: u32) {
    t.insert_unique(spread(hash), Pos { slot, hash }, Pos::table_hash);
}

/// Whether a position of `slots` holds internal id `id`, whose hash is `hash`: the slab is
/// read only when the kept bits match.
fn holds_id(slots: &[DocEntry], id: u64, hash: u32) -> impl Fn(&Pos) -> bool + '_ {
    move |p| p.hash == hash && slots[p.slot as usize].id == id
}

/// The low byte of an internal id, as an index of [`DocTable::by_low_byte`].
#[inline]
fn low_byte(id: u64) -> usize {
    (id & 0xff) as usize
}

#[inline]
fn hash_id(id: u64) -> u32 {
    // SplitMix64's finaliser: ids are sequential, the table needs every bit mixed.
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

#[inline]
fn hash_name(name: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as u32
}

impl Default for DocTable {
    fn default() -> Self {
        DocTable::new()
    }
}

impl DocTable {
    /// An empty table whose first internal id is 1.
    pub fn new() -> DocTable {
        DocTable {
            slots: Vec::new(),
            free: Vec::new(),
            by_id: HashTable::new(),
            by_name: HashTable::new(),
            next_id: 1,
            live: 0,
            name_bytes: 0,
            by_low_byte: Box::new([0; 256]),
            generation: 0,
        }
    }

    /// Live documents.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no document is stored.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The next internal id [`allocate_id`](Self::allocate_id) hands out.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Hands out a fresh internal id.
    pub fn allocate_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A table holding `entries` (a document snapshot), built faster than by one
    /// [`put`](Self::put) each: no rehashing, and the two hash tables built side by side.
    /// Internal ids must be unique; if they are not, the entries are put one by one, so a
    /// later entry replaces an earlier one with its id as [`put`](Self::put) does.
    pub fn from_entries(entries: Vec<DocEntry>) -> DocTable {
        let n = entries.len();
        let slots = &entries;
        let ((by_id, unique), by_name) = rayon::join(
            || {
                let mut t: HashTable<Pos> = HashTable::with_capacity(n);
                for (i, e) in slots.iter().enumerate() {
                    let hash = hash_id(e.id);
                    if t.find(spread(hash), holds_id(slots, e.id, hash)).is_some() {
                        return (t, false);
                    }
                    insert_pos(&mut t, i as u32, hash);
                }
                (t, true)
            },
            || {
                let mut t: HashTable<Pos> = HashTable::with_capacity(n);
                for (i, e) in slots.iter().enumerate() {
                    insert_pos(&mut t, i as u32, hash_name(&e.name));
                }
                t
            },
        );
        if !unique {
            let mut t = DocTable::new();
            for e in entries {
                t.put(e);
            }
            return t;
        }
        let mut by_low_byte = Box::new([0u64; 256]);
        for e in &entries {
            by_low_byte[low_byte(e.id)] += 1;
        }
        DocTable {
            next_id: entries.iter().map(|e| e.id + 1).max().unwrap_or(1),
            live: n,
            by_low_byte,
            name_bytes: entries.iter().map(|e| e.name.len()).sum(),
            slots: entries,
            free: Vec::new(),
            by_id,
            by_name,
            generation: 0,
        }
    }

    /// The document named `name`.
    pub fn by_name(&self, name: &str) -> Option<&DocEntry> {
        let slots = &self.slots;
        let hash = hash_name(name);
        self.by_name
            .find(spread(hash), |p| p.hash == hash && &*slots[p.slot as usize].name == name)
            .map(|p| &slots[p.slot as usize])
    }

    /// The document with internal id `id`.
    #[inline]
    pub fn by_id(&self, id: u64) -> Option<&DocEntry> {
        let hash = hash_id(id);
        self.by_id
            .find(spread(hash), holds_id(&self.slots, id, hash))
            .map(|p| &self.slots[p.slot as usize])
    }

    /// Stores `entry`, replacing an entry with the same internal id. Names are not checked
    /// for uniqueness here (see the module docs); writers resolve names first.
    pub fn put(&mut self, entry: DocEntry) {
        self.next_id = self.next_id.max(entry.id + 1);
        if self.by_id(entry.id).is_some() {
            self.remove(entry.id);
        }
        self.name_bytes += entry.name.len();
        self.by_low_byte[low_byte(entry.id)] += 1;
        let (h_id, h_name) = (hash_id(entry.id), hash_name(&entry.name));
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = entry;
                s
            }
            None => {
                self.slots.push(entry);
                (self.slots.len() - 1) as u32
            }
        };
        insert_pos(&mut self.by_id, slot, h_id);
        insert_pos(&mut self.by_name, slot, h_name);
        self.live += 1;
    }

    /// Removes the document with internal id `id`; returns it.
    pub fn remove(&mut self, id: u64) -> Option<DocEntry> {
        let hash = hash_id(id);
        let found = self.by_id.find_entry(spread(hash), holds_id(&self.slots, id, hash)).ok()?;
        let (Pos { slot: s, .. }, _) = found.remove();
        let name_hash = hash_name(&self.slots[s as usize].name);
        if let Ok(e) = self.by_name.find_entry(spread(name_hash), |p| p.slot == s) {
            e.remove();
        }
        let entry = std::mem::replace(
            &mut self.slots[s as usize],
            DocEntry { id: 0, fp: 0, ts: 0, cluster: 0, name: Box::from("") },
        );
        self.free.push(s);
        self.live -= 1;
        self.by_low_byte[low_byte(id)] -= 1;
        self.name_bytes -= entry.name.len();
        Some(entry)
    }

    /// Applies one replayed log operation (idempotent: see [`crate::record`]).
    pub fn apply(&mut self, op: &Op<'_>) {
        match *op {
            Op::Put { id, fp, ts, cluster, name, sketch: _ } => {
                self.put(DocEntry { id, fp, ts, cluster, name: name.into() })
            }
            Op::Remove { id, .. } => {
                self.remove(id);
                self.next_id = self.next_id.max(id + 1);
            }
            // Only in shards without names, which keep no document table.
            Op::RemoveRange { .. } | Op::AddRun { .. } => {}
        }
    }

    /// Live entries in slot order, from slot `from`; with the slot after the last one
    /// visited. Visits at most `max` entries.
    pub fn entries_from(&self, from: usize, max: usize) -> (Vec<&DocEntry>, usize) {
        let mut out = Vec::with_capacity(max.min(self.live));
        let mut s = from;
        while s < self.slots.len() && out.len() < max {
            if self.slots[s].id != 0 {
                out.push(&self.slots[s]);
            }
            s += 1;
        }
        (out, s)
    }

    /// Live entries whose id satisfies `keep`, in slot order from slot `from`: at most `max`
    /// of them, visiting at most `visits` slots; with the slot to go on from (`None` once
    /// every slot is visited).
    pub fn entries_where_from(
        &self,
        from: usize,
        max: usize,
        visits: usize,
        keep: impl Fn(u64) -> bool,
    ) -> (Vec<&DocEntry>, Option<usize>) {
        let end = self.slots.len().min(from.saturating_add(visits));
        let mut out = Vec::new();
        let mut s = from;
        while s < end && out.len() < max {
            let e = &self.slots[s];
            if e.id != 0 && keep(e.id) {
                out.push(e);
            }
            s += 1;
        }
        (out, (s < self.slots.len()).then_some(s))
    }

    /// Live documents whose internal id's low byte is `b` (on a cluster node: the documents
    /// of partition `b`).
    pub fn count_with_low_byte(&self, b: u8) -> u64 {
        self.by_low_byte[usize::from(b)]
    }

    /// Number of slots (live or free), the bound for [`entries_from`](Self::entries_from).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The table without its freed slots, once at most three quarters of the slots are live
    /// (and there are 1024 slots or more), else `None`: the live entries copied to the
    /// front, in slot order, and the hash tables built to fit, each position renumbered by
    /// the hash bits it keeps (no key is hashed or compared). It reads the table only, so a
    /// caller may build it while readers go on, then swap it in; its
    /// [`generation`](Self::generation) is one more.
    pub fn compacted(&self) -> Option<DocTable> {
        if self.slots.len() < 1024 || self.live * 4 > self.slots.len() * 3 {
            return None;
        }
        let mut to = vec![u32::MAX; self.slots.len()];
        let mut slots = Vec::with_capacity(self.live);
        for (i, e) in self.slots.iter().enumerate() {
            if e.id != 0 {
                to[i] = slots.len() as u32;
                slots.push(e.clone());
            }
        }
        let renumbered = |t: &HashTable<Pos>| {
            let mut fit = HashTable::with_capacity(t.len());
            for p in t {
                insert_pos(&mut fit, to[p.slot as usize], p.hash);
            }
            fit
        };
        let (by_id, by_name) =
            rayon::join(|| renumbered(&self.by_id), || renumbered(&self.by_name));
        Some(DocTable {
            slots,
            free: Vec::new(),
            by_id,
            by_name,
            next_id: self.next_id,
            live: self.live,
            name_bytes: self.name_bytes,
            by_low_byte: self.by_low_byte.clone(),
            generation: self.generation.wrapping_add(1),
        })
    }

    /// How many times the entries were moved by [`compacted`](Self::compacted) (wrapping).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Approximate heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<DocEntry>()
            + self.free.capacity() * 4
            + (self.by_id.capacity() + self.by_name.capacity()) * (std::mem::size_of::<Pos>() + 1)
            + self.name_bytes
            + self.live * 8 // allocator rounding of names, roughly
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: u64, name: &str) -> DocEntry {
        DocEntry { id, fp: id * 3, ts: id as i64, cluster: id, name: name.into() }
    }

    #[test]
    fn put_get_remove_reuse() {
        let mut t = DocTable::new();
        for i in 1..=1000u64 {
            t.put(e(i, &format!("u{i}")));
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.next_id(), 1001);
        assert_eq!(t.by_name("u17").unwrap().id, 17);
        assert_eq!(t.by_id(17).unwrap().name.as_ref(), "u17");
        assert_eq!(t.remove(17).unwrap().name.as_ref(), "u17");
        assert!(t.remove(17).is_none());
        assert!(t.by_name("u17").is_none() && t.by_id(17).is_none());
        t.put(e(2000, "u17"));
        assert_eq!(t.by_name("u17").unwrap().id, 2000);
        assert_eq!(t.slot_count(), 1000, "the freed slot is reused");
        let (all, end) = t.entries_from(0, usize::MAX);
        assert_eq!((all.len(), end), (1000, 1000));
        for b in 0..=255u8 {
            let want = all.iter().filter(|d| d.id & 0xff == u64::from(b)).count() as u64;
            assert_eq!(t.count_with_low_byte(b), want, "low byte {b}");
        }
    }

    #[test]
    fn built_from_entries_like_put_one_by_one() {
        let entries: Vec<DocEntry> =
            (1..=500u64).map(|i| e(i * 7, &format!("u{}", i % 400))).collect();
        let mut one = DocTable::new();
        for x in entries.clone() {
            one.put(x);
        }
        let mut dup = entries.clone();
        dup.push(e(14, "again"));
        for (t, again) in
            [(DocTable::from_entries(entries), false), (DocTable::from_entries(dup.clone()), true)]
        {
            assert_eq!(t.next_id(), one.next_id());
            if !again {
                assert!(
                    (0..=255u8).all(|b| t.count_with_low_byte(b) == one.count_with_low_byte(b))
                );
            }
            for x in &dup[..500] {
                let want = if x.id == 14 && again { "again" } else { &*x.name };
                assert_eq!(t.by_id(x.id).map(|d| &*d.name), Some(want));
                if !(x.id == 14 && again) {
                    assert!(t.by_name(&x.name).is_some());
                }
            }
        }
        let t = DocTable::from_entries(dup);
        assert_eq!(t.len(), 500, "a repeated id replaces the earlier entry");
        assert_eq!(t.by_name("again").unwrap().id, 14);
        let t = DocTable::from_entries(Vec::new());
        assert!(t.is_empty() && t.next_id() == 1);
    }

    #[test]
    fn replay_over_a_later_snapshot_converges() {
        // The true history: put 5 "n"; remove 5; put 9 "n". A fuzzy snapshot already holds 9.
        let mut t = DocTable::new();
        t.put(e(9, "n"));
        let ops = [
            Op::Put { id: 5, fp: 15, ts: 5, cluster: 5, name: "n", sketch: None },
            Op::Remove { id: 5, fp: 15 },
            Op::Put { id: 9, fp: 27, ts: 9, cluster: 9, name: "n", sketch: None },
        ];
        for op in &ops {
            t.apply(op);
        }
        assert_eq!(t.len(), 1);
        assert_eq!(t.by_name("n").unwrap().id, 9);
        assert!(t.by_id(5).is_none());
        assert_eq!(t.next_id(), 10);
    }

    #[test]
    fn compaction_gives_back_freed_slots_and_keeps_every_document() {
        let mut t = DocTable::new();
        for id in 1..=4000u64 {
            t.put(e(id, &format!("doc{id}")));
        }
        // Three in four removed.
        for id in (1..=4000u64).filter(|id| id % 4 != 0) {
            t.remove(id);
        }
        let (before, next_id) = (t.heap_bytes(), t.next_id());
        assert_eq!((t.slot_count(), t.len(), t.generation()), (4000, 1000, 0));
        t = t.compacted().unwrap();
        assert_eq!((t.slot_count(), t.len(), t.generation()), (1000, 1000, 1));
        assert!(t.heap_bytes() * 2 < before, "{} then {}", before, t.heap_bytes());
        assert_eq!(t.next_id(), next_id, "ids are never reused");
        for id in 1..=4000u64 {
            let name = format!("doc{id}");
            let kept = id % 4 == 0;
            assert_eq!(t.by_id(id).is_some(), kept, "{id}");
            assert_eq!(t.by_name(&name).map(|d| d.id), kept.then_some(id), "{name}");
        }
        // Ids 4, 260, ..., 3844: every multiple of 4 whose low byte is 4.
        assert_eq!(t.count_with_low_byte(4), 16);
        // Slots stay in order, and a table mostly live, or small, is left alone.
        let (all, _) = t.entries_from(0, usize::MAX);
        assert!(all.windows(2).all(|w| w[0].id < w[1].id));
        assert!(t.compacted().is_none());
        let id = t.allocate_id();
        t.put(e(id, "new"));
        assert_eq!(t.by_name("new").map(|d| d.id), Some(next_id));
        // The renumbered positions serve removals and reused slots too.
        assert_eq!(t.remove(8).map(|d| d.name), Some("doc8".into()));
        assert!(t.by_name("doc8").is_none() && t.by_id(8).is_none());
        t.put(e(id + 1, "newer"));
        assert_eq!(t.by_name("newer").map(|d| d.id), Some(id + 1));
        assert_eq!(t.by_id(12).map(|d| &*d.name), Some("doc12"));
        let mut small = DocTable::new();
        small.put(e(1, "a"));
        small.remove(1);
        assert!(small.compacted().is_none());
    }
}
