//! Canonical, length-limited Huffman codes over the 64 symbols `h = 0..=63`.
//!
//! A table keeps one code: the code lengths are computed from the histogram of `h` over the
//! whole table by package-merge (optimal under the length limit), codes are assigned
//! canonically (by length, then symbol), and only the 64 lengths are stored. Decoding looks
//! the next [`MAX_CODE_LEN`] bits up in a table of `2^MAX_CODE_LEN` entries.

use crate::error::{Error, Result};

/// Number of symbols: the leading 1-bit position of a non-zero 64-bit word.
pub const SYMBOLS: usize = 64;
/// Longest code allowed; also the width of the decoding table index.
pub const MAX_CODE_LEN: u32 = 8;

/// A decoding-table entry: `len << 8 | symbol`, `len == 0` for bit patterns no code starts.
pub type LutEntry = u16;

/// A canonical Huffman code for the symbols `0..64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Huffman {
    lengths: [u8; SYMBOLS],
    codes: [u16; SYMBOLS],
    lut: Box<[LutEntry; 1 << MAX_CODE_LEN]>,
}

impl Huffman {
    /// The optimal length-limited code for these symbol counts. Symbols with count 0 get no
    /// code. A histogram with a single used symbol gets a 1-bit code.
    pub fn from_counts(counts: &[u64; SYMBOLS]) -> Huffman {
        let lengths = package_merge(counts, MAX_CODE_LEN);
        Self::from_lengths(&lengths).expect("package-merge yields a valid prefix code")
    }

    /// Rebuilds a code from stored lengths, checking that they describe a prefix code.
    pub fn from_lengths(lengths: &[u8; SYMBOLS]) -> Result<Huffman> {
        let mut kraft: u64 = 0;
        for &l in lengths {
            if l as u32 > MAX_CODE_LEN {
                return Err(Error::corrupt(format!(
                    "Huffman code length {l} exceeds {MAX_CODE_LEN}"
                )));
            }
            if l > 0 {
                kraft += 1 << (MAX_CODE_LEN - l as u32);
            }
        }
        if kraft > 1 << MAX_CODE_LEN {
            return Err(Error::corrupt("Huffman code lengths over-subscribe the code space"));
        }
        // Canonical assignment: shorter codes first, ties by symbol.
        let mut order: Vec<usize> = (0..SYMBOLS).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = [0u16; SYMBOLS];
        let mut code: u32 = 0;
        let mut prev_len = 0u32;
        for &s in &order {
            let l = lengths[s] as u32;
            code <<= l - prev_len;
            codes[s] = code as u16;
            code += 1;
            prev_len = l;
        }
        let mut lut = Box::new([0 as LutEntry; 1 << MAX_CODE_LEN]);
        for &s in &order {
            let l = lengths[s] as u32;
            let first = (codes[s] as usize) << (MAX_CODE_LEN - l);
            let span = 1usize << (MAX_CODE_LEN - l);
            for e in &mut lut[first..first + span] {
                *e = ((l as u16) << 8) | s as u16;
            }
        }
        Ok(Huffman { lengths: *lengths, codes, lut })
    }

    /// The code lengths (0 = symbol unused), as stored in a table header.
    pub fn lengths(&self) -> &[u8; SYMBOLS] {
        &self.lengths
    }

    /// The code of `symbol` and its length in bits (length 0 if the symbol has no code).
    #[inline(always)]
    pub fn code(&self, symbol: u32) -> (u32, u32) {
        (self.codes[symbol as usize] as u32, self.lengths[symbol as usize] as u32)
    }

    /// The decoding table, indexed by the next [`MAX_CODE_LEN`] bits of the stream.
    #[inline(always)]
    pub fn lut(&self) -> &[LutEntry; 1 << MAX_CODE_LEN] {
        &self.lut
    }

    /// Expected bits per symbol for these counts under this code.
    pub fn mean_length(&self, counts: &[u64; SYMBOLS]) -> f64 {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let bits: u64 = counts.iter().zip(&self.lengths).map(|(&c, &l)| c * l as u64).sum();
        bits as f64 / total as f64
    }
}

/// Optimal code lengths with no code longer than `limit` (Larmore & Hirschberg's
/// package-merge).
fn package_merge(counts: &[u64; SYMBOLS], limit: u32) -> [u8; SYMBOLS] {
    let mut lengths = [0u8; SYMBOLS];
    let mut leaves: Vec<(u64, usize)> =
        (0..SYMBOLS).filter(|&s| counts[s] > 0).map(|s| (counts[s], s)).collect();
    match leaves.len() {
        0 => return lengths,
        1 => {
            lengths[leaves[0].1] = 1;
            return lengths;
        }
        _ => {}
    }
    leaves.sort_unstable();
    let n = leaves.len();
    // Each item: weight and how many times each leaf occurs inside it.
    type Item = (u64, Vec<u8>);
    let leaf_items: Vec<Item> = leaves
        .iter()
        .enumerate()
        .map(|(i, &(w, _))| {
            let mut v = vec![0u8; n];
            v[i] = 1;
            (w, v)
        })
        .collect();
    let mut list: Vec<Item> = leaf_items.clone();
    for _ in 1..limit {
        let packages: Vec<Item> = list
            .chunks_exact(2)
            .map(|p| {
                let v = p[0].1.iter().zip(&p[1].1).map(|(a, b)| a + b).collect();
                (p[0].0 + p[1].0, v)
            })
            .collect();
        let mut merged = Vec::with_capacity(leaf_items.len() + packages.len());
        let (mut a, mut b) = (leaf_items.iter().peekable(), packages.into_iter().peekable());
        loop {
            let take_leaf = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => x.0 <= y.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if take_leaf {
                merged.push(a.next().expect("peeked").clone());
            } else {
                merged.push(b.next().expect("peeked"));
            }
        }
        list = merged;
    }
    for item in &list[..2 * n - 2] {
        for (i, &c) in item.1.iter().enumerate() {
            lengths[leaves[i].1] += c;
        }
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kraft(l: &[u8; SYMBOLS]) -> f64 {
        l.iter().filter(|&&x| x > 0).map(|&x| 0.5f64.powi(x as i32)).sum()
    }

    #[test]
    fn skewed_counts_respect_limit_and_kraft() {
        let mut c = [0u64; SYMBOLS];
        for (i, x) in c.iter_mut().enumerate() {
            *x = 1u64 << (i % 40); // extremely skewed: unlimited Huffman would need ~40 bits
        }
        let h = Huffman::from_counts(&c);
        assert!(h.lengths().iter().all(|&l| l as u32 <= MAX_CODE_LEN && l > 0));
        assert!((kraft(h.lengths()) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn optimal_on_small_example() {
        // Frequencies 1,1,2,4: optimal lengths 3,3,2,1.
        let mut c = [0u64; SYMBOLS];
        c[10] = 1;
        c[11] = 1;
        c[12] = 2;
        c[13] = 4;
        let h = Huffman::from_counts(&c);
        assert_eq!(
            (h.lengths()[10], h.lengths()[11], h.lengths()[12], h.lengths()[13]),
            (3, 3, 2, 1)
        );
        assert!((h.mean_length(&c) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn lut_decodes_every_code() {
        let mut c = [0u64; SYMBOLS];
        for (i, x) in c.iter_mut().enumerate() {
            *x = (i as u64 * 7919) % 1000 + 1;
        }
        let h = Huffman::from_counts(&c);
        for s in 0..SYMBOLS as u32 {
            let (code, len) = h.code(s);
            let idx = (code as usize) << (MAX_CODE_LEN - len);
            let e = h.lut()[idx];
            assert_eq!((e >> 8) as u32, len);
            assert_eq!((e & 0xFF) as u32, s);
        }
    }

    #[test]
    fn single_symbol_and_empty() {
        let mut c = [0u64; SYMBOLS];
        assert!(Huffman::from_counts(&c).lengths().iter().all(|&l| l == 0));
        c[40] = 5;
        let h = Huffman::from_counts(&c);
        assert_eq!(h.code(40), (0, 1));
    }

    #[test]
    fn rejects_oversubscribed_lengths() {
        let mut l = [0u8; SYMBOLS];
        l[0] = 1;
        l[1] = 1;
        l[2] = 1;
        assert!(Huffman::from_lengths(&l).is_err());
        l[2] = 12;
        assert!(Huffman::from_lengths(&l).is_err());
    }
}
