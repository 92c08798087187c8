//! Bit-packed integer columns with a frame of reference: each value is stored as its offset
//! from the column's minimum in just as many bits as the largest offset needs. Document ids
//! numbered 0..10M take 24 bits; timestamps that are all equal take none.

/// A read-only column of `u64` values, bit-packed.
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedColumn {
    base: u64,
    bits: u32,
    len: usize,
    words: Vec<u64>,
}

impl PackedColumn {
    /// Packs the values yielded by `values` (which must yield exactly `len` of them).
    #[cfg(test)]
    pub(crate) fn new(len: usize, values: impl Iterator<Item = u64> + Clone) -> PackedColumn {
        let (mut min, mut max) = (u64::MAX, 0u64);
        for v in values.clone() {
            min = min.min(v);
            max = max.max(v);
        }
        let mut w = PackedColumnWriter::new(len, min, max);
        values.for_each(|v| w.push(v));
        w.finish()
    }

    /// Value `i` (`i < len`).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u64 {
        debug_assert!(i < self.len);
        if self.bits == 0 {
            return self.base;
        }
        let at = i * self.bits as usize;
        let (w, o) = (at / 64, (at % 64) as u32);
        let lo = self.words[w] >> o;
        let hi = if o + self.bits > 64 { self.words[w + 1] << (64 - o) } else { 0 };
        let mask = if self.bits == 64 { u64::MAX } else { (1u64 << self.bits) - 1 };
        self.base + ((lo | hi) & mask)
    }

    /// Starts loading the word that holds value `i`.
    #[inline(always)]
    pub(crate) fn prefetch(&self, i: usize) {
        crate::util::prefetch(&self.words, i * self.bits as usize / 64);
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bits per value.
    pub(crate) fn bits(&self) -> u32 {
        self.bits
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    /// All values, in order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).map(|i| self.get(i))
    }
}

/// Packs a column value by value, in order, when its range is known beforehand: several
/// columns can then be filled in one pass over their source.
pub(crate) struct PackedColumnWriter {
    base: u64,
    bits: u32,
    len: usize,
    words: Vec<u64>,
    /// Bit position of the next value.
    at: usize,
}

impl PackedColumnWriter {
    /// A writer for `len` values within `min..=max` (any range when `len` is 0).
    pub(crate) fn new(len: usize, min: u64, max: u64) -> PackedColumnWriter {
        if len == 0 {
            return PackedColumnWriter { base: 0, bits: 0, len: 0, words: Vec::new(), at: 0 };
        }
        let bits = 64 - (max - min).leading_zeros();
        // Read at random by every hit of a query: in huge pages, as the tables are.
        let n = (len * bits as usize).div_ceil(64) + 1;
        let mut words = crate::util::huge_page_vec(n);
        words.resize(n, 0);
        PackedColumnWriter { base: min, bits, len, words, at: 0 }
    }

    /// Appends `v` (within the range given to [`new`](Self::new)).
    #[inline(always)]
    pub(crate) fn push(&mut self, v: u64) {
        if self.bits == 0 {
            return;
        }
        let d = v - self.base;
        let (w, o) = (self.at / 64, (self.at % 64) as u32);
        self.words[w] |= d << o;
        if o + self.bits > 64 {
            self.words[w + 1] |= d >> (64 - o);
        }
        self.at += self.bits as usize;
    }

    /// The packed column (of `len` values: all must have been pushed).
    pub(crate) fn finish(mut self) -> PackedColumn {
        debug_assert_eq!(self.at, self.len * self.bits as usize);
        if self.len == 0 {
            return PackedColumn::default();
        }
        self.words.shrink_to_fit();
        PackedColumn { base: self.base, bits: self.bits, len: self.len, words: self.words }
    }
}

impl PackedColumn {
    /// Appends the column's bytes: base, bit width, length, words.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.bits.to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        out.extend_from_slice(&(self.words.len() as u64).to_le_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads a column written by [`write`](Self::write) from the front of `bytes`,
    /// returning it and the rest.
    pub(crate) fn read(bytes: &[u8]) -> Option<(PackedColumn, &[u8])> {
        let (base, rest) = take_u64(bytes)?;
        let (bits, rest) = rest.split_first_chunk::<4>()?;
        let bits = u32::from_le_bytes(*bits);
        let (len, rest) = take_u64(rest)?;
        let (nwords, rest) = take_u64(rest)?;
        let len = usize::try_from(len).ok()?;
        let nwords = usize::try_from(nwords).ok()?;
        let need = if len == 0 { 0 } else { (len.checked_mul(bits as usize)?).div_ceil(64) + 1 };
        if bits > 64 || nwords != need || rest.len() < nwords.checked_mul(8)? {
            return None;
        }
        let (body, rest) = rest.split_at(nwords * 8);
        let mut words = crate::util::huge_page_vec(nwords);
        words.extend(body.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))));
        Some((PackedColumn { base, bits, len, words }, rest))
    }
}

/// Splits a little-endian u64 off the front of `bytes`.
pub(crate) fn take_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (v, rest) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*v), rest))
}

/// Maps an `i64` to a `u64` preserving order (flips the sign bit).
#[inline]
pub(crate) fn order_i64(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

/// Inverse of [`order_i64`].
#[inline]
pub(crate) fn unorder_i64(v: u64) -> i64 {
    (v ^ (1 << 63)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    #[test]
    fn round_trips_at_every_width() {
        let mut r = SplitMix64::new(1);
        for bits in 0..=64u32 {
            let base = r.next_u64() >> 1;
            let vals: Vec<u64> = (0..300)
                .map(|_| {
                    let off = if bits == 0 { 0 } else { r.next_u64() >> (64 - bits) };
                    base.wrapping_add(off)
                })
                .collect();
            let p = PackedColumn::new(vals.len(), vals.iter().copied());
            assert!(p.bits() <= bits.max(1) || bits == 0);
            assert_eq!(p.iter().collect::<Vec<_>>(), vals, "bits {bits}");
        }
        assert_eq!(PackedColumn::new(0, std::iter::empty()).len(), 0);
    }

    #[test]
    fn bytes_round_trip_and_reject_garbage() {
        let vals: Vec<u64> = (0..1000u64).map(|i| i * 7919 % 1_000_003).collect();
        let p = PackedColumn::new(vals.len(), vals.iter().copied());
        let mut b = Vec::new();
        p.write(&mut b);
        b.extend_from_slice(b"tail");
        let (q, rest) = PackedColumn::read(&b).unwrap();
        assert_eq!(rest, b"tail");
        assert_eq!(q.iter().collect::<Vec<_>>(), vals);
        for cut in 0..40 {
            assert!(PackedColumn::read(&b[..cut]).is_none());
        }
    }

    #[test]
    fn i64_order() {
        let xs = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for w in xs.windows(2) {
            assert!(order_i64(w[0]) < order_i64(w[1]));
        }
        for x in xs {
            assert_eq!(unorder_i64(order_i64(x)), x);
        }
    }
}
