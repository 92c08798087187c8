//! The write buffer: the newest documents, not yet in a run, scanned by every query.
//!
//! Fingerprints are kept in an array of their own so the scan reads 8 bytes a document and
//! vectorises: it counts matches first and collects them only when there are some.

use super::{Doc, Match};

/// Documents in insertion order, with their fingerprints alongside.
#[derive(Debug, Default)]
pub(crate) struct Buffer {
    docs: Vec<Doc>,
    fps: Vec<u64>,
}

impl Buffer {
    pub(crate) fn push(&mut self, d: Doc) {
        self.docs.push(d);
        self.fps.push(d.fp);
    }

    pub(crate) fn len(&self) -> usize {
        self.docs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    pub(crate) fn docs(&self) -> &[Doc] {
        &self.docs
    }

    pub(crate) fn clear(&mut self) {
        self.docs.clear();
        self.fps.clear();
    }

    /// Keeps the documents for which `keep` holds; returns how many were removed.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Doc) -> bool) -> usize {
        let before = self.docs.len();
        self.docs.retain(|d| keep(d));
        self.fps.clear();
        self.fps.extend(self.docs.iter().map(|d| d.fp));
        before - self.docs.len()
    }

    /// Removes the first document with this id and fingerprint; true if there was one.
    pub(crate) fn remove(&mut self, id: u64, fp: u64) -> bool {
        match self.docs.iter().position(|d| d.id == id && d.fp == fp) {
            Some(i) => {
                self.docs.remove(i);
                self.fps.remove(i);
                true
            }
            None => false,
        }
    }

    /// Appends every document within `k` of `q`.
    #[inline]
    pub(crate) fn scan(&self, q: u64, k: u32, out: &mut Vec<Match>) {
        const CHUNK: usize = 256;
        for (c, fps) in self.fps.chunks(CHUNK).enumerate() {
            if fps.iter().filter(|&&fp| (fp ^ q).count_ones() <= k).count() == 0 {
                continue;
            }
            for (i, &fp) in fps.iter().enumerate() {
                let distance = (fp ^ q).count_ones();
                if distance <= k {
                    let d = &self.docs[c * CHUNK + i];
                    out.push(Match { id: d.id, fp, distance, ts: d.ts });
                }
            }
        }
    }

    /// Appends every document with fingerprint `fp`, at its distance from `q`.
    pub(crate) fn matches_of(&self, fp: u64, q: u64, out: &mut Vec<Match>) {
        let distance = (fp ^ q).count_ones();
        for (i, _) in self.fps.iter().enumerate().filter(|&(_, &f)| f == fp) {
            let d = &self.docs[i];
            out.push(Match { id: d.id, fp, distance, ts: d.ts });
        }
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.docs.capacity() * std::mem::size_of::<Doc>() + self.fps.capacity() * 8
    }
}
