//! A table's top-bits directory, stored compactly so that the directories of all tables stay
//! in cache.
//!
//! Entry `t` is the block where a scan for the keys with top bits `t` starts. Entries grow
//! slowly (about one block per bucket), so a group of [`GROUP`] consecutive entries is kept
//! as one 32-bit base and an 8-bit offset per entry: a little over a byte an entry instead
//! of four. A group whose entries span more than 255 blocks (a crowded prefix) is kept
//! whole, as 32-bit entries, instead.

use crate::util::{huge_page_vec, prefetch};

/// Entries per group.
pub(crate) const GROUP: usize = 64;
/// Set in a group's base when the group is kept whole: the rest is its position in `wide`.
const WIDE: u32 = 1 << 31;

/// The compact directory: see the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    /// A key's bucket is its top `64 - shift` bits (`1 <= shift <= 64`).
    shift: u32,
    /// Per group: the group's first entry, or [`WIDE`] and where the group sits in `wide`.
    base: Vec<u32>,
    /// Per entry: the entry minus its group's base (0 in groups kept whole).
    off: Vec<u8>,
    /// The groups kept whole, [`GROUP`] entries each.
    wide: Vec<u32>,
}

impl Default for Directory {
    /// An empty directory over no bits.
    fn default() -> Directory {
        Directory { shift: 64, base: Vec::new(), off: Vec::new(), wide: Vec::new() }
    }
}

impl Directory {
    /// A directory with the given entries (non-decreasing) over the top `64 - shift` bits
    /// (`1 <= shift <= 64`: at most 63 bits).
    pub(crate) fn new(shift: u32, entries: &[u32]) -> Directory {
        assert!((1..=64).contains(&shift), "a directory spans 0 to 63 top bits");
        let mut d = Directory {
            shift,
            base: Vec::with_capacity(entries.len().div_ceil(GROUP)),
            off: huge_page_vec(entries.len()),
            wide: Vec::new(),
        };
        d.off.resize(entries.len(), 0);
        for (g, group) in entries.chunks(GROUP).enumerate() {
            let first = group[0];
            let last = group[group.len() - 1];
            if first < WIDE && last - first <= u8::MAX as u32 {
                d.base.push(first);
                for (o, &e) in d.off[g * GROUP..].iter_mut().zip(group) {
                    *o = (e - first) as u8;
                }
            } else {
                d.base.push(WIDE | d.wide.len() as u32);
                d.wide.extend_from_slice(group);
                d.wide.resize(d.wide.len() + GROUP - group.len(), last);
            }
        }
        d
    }

    /// The bucket of `key`.
    #[inline(always)]
    pub(crate) fn bucket(&self, key: u64) -> usize {
        // Two shifts, so that a shift of 64 (no directory bits) needs no branch.
        ((key >> 1) >> (self.shift - 1)) as usize
    }

    /// Entry `t`, if there is one.
    #[inline(always)]
    pub(crate) fn get(&self, t: usize) -> Option<usize> {
        let off = *self.off.get(t)?;
        let base = *self.base.get(t / GROUP)?;
        if base & WIDE == 0 {
            Some(base as usize + off as usize)
        } else {
            self.wide.get((base & !WIDE) as usize + t % GROUP).map(|&e| e as usize)
        }
    }

    /// Entries `t` and `t + 1`, if there are both: the blocks a scan of bucket `t` may
    /// start in.
    #[inline(always)]
    fn pair(&self, t: usize) -> Option<(usize, usize)> {
        let &[a, b] = self.off.get(t..t + 2)? else { return None };
        let base = *self.base.get(t / GROUP)?;
        if base & WIDE == 0 && !(t + 1).is_multiple_of(GROUP) {
            Some((base as usize + a as usize, base as usize + b as usize))
        } else {
            Some((self.get(t)?, self.get(t + 1)?))
        }
    }

    /// The blocks a scan for `key` may start in: the entries of its bucket and the next
    /// (`(0, 0)` for an empty directory).
    #[inline(always)]
    pub(crate) fn blocks_for(&self, key: u64) -> (usize, usize) {
        self.pair(self.bucket(key)).unwrap_or((0, 0))
    }

    /// The entries of `lo`'s bucket and of the bucket after `hi`'s (`lo <= hi`); for a
    /// directory of value positions, where the values with top bits from `lo`'s to `hi`'s
    /// lie. One load when both are in one bucket.
    #[inline(always)]
    pub(crate) fn span(&self, lo: u64, hi: u64) -> (usize, usize) {
        let (a, b) = (self.bucket(lo), self.bucket(hi));
        if a == b {
            self.pair(a).unwrap_or((0, 0))
        } else {
            (self.get(a).unwrap_or(0), self.get(b + 1).unwrap_or(0))
        }
    }

    /// Starts loading what [`blocks_for`](Self::blocks_for) `key` reads.
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: u64) {
        let t = self.bucket(key);
        prefetch(&self.base, t / GROUP);
        prefetch(&self.off, t);
    }

    /// Bytes of memory held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.base.capacity() * 4 + self.off.capacity() + self.wide.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    /// Every entry reads back as given, whether its group is compact or kept whole, and
    /// nothing is read past the last entry.
    #[test]
    fn entries_read_back() {
        let mut r = SplitMix64::new(5);
        for len in [1, 2, 63, 64, 65, 129, 1000, 4097] {
            for crowded in [false, true] {
                let mut e = 0u32;
                let entries: Vec<u32> = (0..len)
                    .map(|i| {
                        // Mostly small steps; with `crowded`, a few that no byte holds.
                        e += (r.next_u64() % 3) as u32;
                        if crowded && i % 300 == 7 {
                            e += 1000;
                        }
                        e
                    })
                    .collect();
                let d = Directory::new(40, &entries);
                let got: Vec<u32> = (0..len).map(|t| d.get(t).unwrap() as u32).collect();
                assert_eq!(got, entries, "len {len} crowded {crowded}");
                let pairs: Vec<(usize, usize)> = (0..len - 1).map(|t| d.pair(t).unwrap()).collect();
                let want: Vec<(usize, usize)> =
                    entries.windows(2).map(|w| (w[0] as usize, w[1] as usize)).collect();
                assert_eq!(pairs, want, "len {len} crowded {crowded}");
                assert_eq!(d.pair(len - 1), None);
                assert_eq!(d.get(len), None);
                assert_eq!(d.wide.is_empty(), !crowded || len <= 7, "len {len}");
            }
        }
        let d = Directory::new(64, &[WIDE + 1, WIDE + 2]);
        assert_eq!((d.get(0), d.get(1)), (Some(WIDE as usize + 1), Some(WIDE as usize + 2)));
    }

    #[test]
    fn buckets_are_top_bits() {
        let d = Directory::new(44, &[0; 3]);
        assert_eq!(d.bucket(u64::MAX), (1 << 20) - 1);
        assert_eq!(d.bucket(1 << 44), 1);
        assert_eq!(Directory::new(64, &[0; 2]).bucket(u64::MAX), 0);
    }
}
