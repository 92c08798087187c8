//! A growable byte buffer whose start is aligned to 128 bytes.
//!
//! A table's blocks are read by random access, and every cache line a block straddles is one
//! more miss. A `Vec<u8>` from the system allocator starts 16 bytes past a page boundary,
//! so a 128-byte block covered three 64-byte lines instead of two. Aligning the buffer to
//! 128 bytes puts every block of 64 bytes or more on line boundaries, and a 128-byte block
//! on one aligned pair of lines (which the hardware's spatial prefetcher fetches together).

use std::ops::{Deref, DerefMut};

/// The alignment of the first byte.
const ALIGN: usize = 128;

/// Bytes starting on a 128-byte boundary. Dereferences to `[u8]` of its length.
///
/// The bytes live in a `Vec<u8>` at the offset that aligns them; whenever the vector's
/// allocation moves, they are moved to the new aligned offset. A plain vector keeps what a
/// 128-byte-aligned allocation would lose: shrinking a large one remaps its pages instead of
/// copying them, and they stay backed by huge pages.
#[derive(Default)]
pub(crate) struct AlignedBytes {
    /// `off` bytes of padding, then the `len` bytes.
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes").field("len", &self.len).finish()
    }
}

impl AlignedBytes {
    /// An empty buffer with room for `bytes` bytes, backed by huge pages where the kernel
    /// allows (see [`crate::util::huge_page_vec`]).
    pub(crate) fn with_capacity(bytes: usize) -> AlignedBytes {
        let mut b = AlignedBytes { buf: crate::util::huge_page_vec(bytes + ALIGN), off: 0, len: 0 };
        b.realign();
        b
    }

    /// Sets the length to `len`; new bytes are zero.
    pub(crate) fn resize_zeroed(&mut self, len: usize) {
        // Growing zero-fills; bytes cut off are dropped, so they come back as zero.
        self.buf.resize(self.off + len, 0);
        self.len = len;
        self.realign();
    }

    /// Appends `bytes`.
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        let at = self.len;
        self.resize_zeroed(at + bytes.len());
        self[at..].copy_from_slice(bytes);
    }

    /// Frees the capacity beyond the length.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.buf.shrink_to_fit();
        self.realign();
    }

    /// Bytes of memory held.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Moves the bytes to the aligned offset of the vector's current allocation.
    fn realign(&mut self) {
        let want = self.buf.as_ptr().align_offset(ALIGN);
        if want == self.off {
            return;
        }
        let (from, len) = (self.off, self.len);
        if want > from {
            self.buf.resize(want + len, 0);
            if self.buf.as_ptr().align_offset(ALIGN) != want {
                // Growing moved the allocation: its aligned offset is new again.
                return self.realign();
            }
        }
        self.buf.copy_within(from..from + len, want);
        self.buf.truncate(want + len);
        self.off = want;
    }
}

impl Clone for AlignedBytes {
    fn clone(&self) -> AlignedBytes {
        let mut b = AlignedBytes::with_capacity(self.len);
        b.extend_from_slice(self);
        b
    }
}

impl Deref for AlignedBytes {
    type Target = [u8];

    #[inline(always)]
    fn deref(&self) -> &[u8] {
        debug_assert!(self.off + self.len <= self.buf.len());
        // SAFETY: every method leaves `off + len <= buf.len()` (the vector is resized or
        // truncated to exactly `off + len` whenever either changes). Packed lookups read
        // through here for every value; the checks were 2.5% of a query's instructions.
        unsafe { self.buf.get_unchecked(self.off..self.off + self.len) }
    }
}

impl DerefMut for AlignedBytes {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_growable_and_zero_filled() {
        let mut b = AlignedBytes::with_capacity(10);
        assert_eq!(b.len(), 0);
        b.extend_from_slice(&[1, 2, 3]);
        assert_eq!(b.as_ptr() as usize % 128, 0);
        assert_eq!(&b[..], &[1, 2, 3]);
        b.resize_zeroed(300);
        assert_eq!(b.len(), 300);
        assert!(b[3..].iter().all(|&x| x == 0));
        b[299] = 9;
        b.resize_zeroed(200);
        b.resize_zeroed(300);
        assert_eq!(b[299], 0, "bytes cut off come back as zero");
        b.shrink_to_fit();
        assert_eq!(b.as_ptr() as usize % 128, 0);
        assert_eq!(b.len(), 300);
        assert_eq!(b[299], 0);
        let c = b.clone();
        assert_eq!(c.as_ptr() as usize % 128, 0);
        assert_eq!(&c[..], &b[..]);
    }
}
