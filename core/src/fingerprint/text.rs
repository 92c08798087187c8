//! Normalisation and tokenisation (sections 2 to 4 of `docs/fingerprint.md`).
//!
//! This module turns text into the two sequences that features are made from: word tokens
//! (kept space-separated in one byte arena, so a word n-gram is a contiguous slice) and the
//! characters of scripts written without spaces (kept back to back in a second arena, so a
//! character n-gram is a contiguous slice too). It also records the "units" (every word
//! token and every spaceless character, in document order) for the exact-duplicate content
//! digest and for ground-truth shingles. Nothing here allocates per token once the arenas
//! have grown to the size of the largest document seen.

use std::sync::OnceLock;

use unicode_general_category::{GeneralCategory as G, get_general_category};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};

/// The Unicode version whose General_Category table defines "assigned" and the token
/// classes in fingerprint v1.
pub const UNICODE_VERSION: (u64, u64, u64) = (16, 0, 0);

// Class of a code point, low 3 bits of the class byte.
const SEP: u8 = 0; // separates tokens
const WORD: u8 = 1; // general category L* or N*
const MARK: u8 = 2; // general category M*
const FORMAT: u8 = 3; // general category Cf, or a variation selector: ignored
const UNASSIGNED: u8 = 4; // general category Cn: replaced by U+0020 before NFKC
const BASE_MASK: u8 = 7;
// Flags.
const IN_SPACELESS: u8 = 8; // code point lies in a spaceless-script range
const IN_HANGUL: u8 = 16; // code point lies in a Hangul range
const LOWER_IS_SELF: u8 = 32; // the full lowercase mapping is the code point itself
const NFKC_STABLE: u8 = 64; // NFKC quick check Yes and combining class 0: no NFKC needed

/// Code-point ranges (inclusive) of scripts written without spaces between words (Han,
/// Hiragana, Katakana, Thai, Lao, Myanmar, Khmer). Only code points of general category
/// L, M or N inside them are spaceless characters. Kept in step with `docs/fingerprint.md`
/// and `docs/fingerprint_reference.py`.
pub const SPACELESS_RANGES: &[(u32, u32)] = &[
    (0x0E00, 0x0E7F),   // Thai
    (0x0E80, 0x0EFF),   // Lao
    (0x1000, 0x109F),   // Myanmar
    (0x1780, 0x17FF),   // Khmer
    (0x19E0, 0x19FF),   // Khmer Symbols
    (0x3000, 0x303F),   // CJK Symbols and Punctuation (its letters, numbers and marks)
    (0x3040, 0x309F),   // Hiragana
    (0x30A0, 0x30FF),   // Katakana
    (0x31F0, 0x31FF),   // Katakana Phonetic Extensions
    (0x3400, 0x4DBF),   // CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),   // CJK Unified Ideographs
    (0xA9E0, 0xA9FF),   // Myanmar Extended-B
    (0xAA60, 0xAA7F),   // Myanmar Extended-A
    (0xF900, 0xFAFF),   // CJK Compatibility Ideographs
    (0xFF66, 0xFF9F),   // Halfwidth Katakana
    (0x1AFF0, 0x1AFFF), // Kana Extended-B
    (0x1B000, 0x1B16F), // Kana Supplement, Kana Extended-A, Small Kana Extension
    (0x20000, 0x2FFFF), // Supplementary Ideographic Plane
    (0x30000, 0x3FFFF), // Tertiary Ideographic Plane
];

/// Code-point ranges (inclusive) of Hangul, spaceless only when
/// [`FingerprintConfig::hangul_as_chars`](super::FingerprintConfig::hangul_as_chars) is set.
pub const HANGUL_RANGES: &[(u32, u32)] = &[
    (0x1100, 0x11FF), // Hangul Jamo
    (0x3130, 0x318F), // Hangul Compatibility Jamo
    (0xA960, 0xA97F), // Hangul Jamo Extended-A
    (0xAC00, 0xD7AF), // Hangul Syllables
    (0xD7B0, 0xD7FF), // Hangul Jamo Extended-B
    (0xFFA0, 0xFFDC), // Halfwidth Hangul
];

/// Code points with the Variation_Selector property; ignored like format characters (an
/// ideographic or emoji variation does not change the text).
pub const VARIATION_SELECTORS: &[(u32, u32)] =
    &[(0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF)];

fn in_ranges(cp: u32, ranges: &[(u32, u32)]) -> bool {
    ranges.iter().any(|&(lo, hi)| lo <= cp && cp <= hi)
}

/// The class byte of one code point, computed from the tables.
fn compute_class(c: char) -> u8 {
    let base = match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter
        | G::DecimalNumber
        | G::LetterNumber
        | G::OtherNumber => WORD,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => MARK,
        G::Format => FORMAT,
        G::Unassigned => UNASSIGNED,
        _ => SEP,
    };
    let cp = c as u32;
    let base = if in_ranges(cp, VARIATION_SELECTORS) { FORMAT } else { base };
    let mut class = base;
    if base == WORD || base == MARK {
        if in_ranges(cp, SPACELESS_RANGES) {
            class |= IN_SPACELESS;
        }
        if in_ranges(cp, HANGUL_RANGES) {
            class |= IN_HANGUL;
        }
    }
    let mut lower = c.to_lowercase();
    if lower.next() == Some(c) && lower.next().is_none() {
        class |= LOWER_IS_SELF;
    }
    // A text made only of such code points is NFKC already (this is the NFKC quick check:
    // every code point "Yes", combining classes trivially in order).
    if base != UNASSIGNED
        && is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes
        && unicode_normalization::char::canonical_combining_class(c) == 0
    {
        class |= NFKC_STABLE;
    }
    class
}

/// Class bytes of the Basic Multilingual Plane, built once (about 64 KiB, a few ms); code
/// points above U+FFFF are looked up directly.
fn bmp_table() -> &'static [u8] {
    static TABLE: OnceLock<Box<[u8]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0u32..0x10000).map(|cp| char::from_u32(cp).map_or(SEP, compute_class)).collect()
    })
}

#[inline]
fn class_of(c: char) -> u8 {
    let cp = c as usize;
    if cp < 0x10000 { bmp_table()[cp] } else { compute_class(c) }
}

/// Bytes that belong to word tokens in ASCII: `0-9`, `A-Z`, `a-z`.
#[inline(always)]
fn ascii_is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// The tokenised form of one document, reused across documents.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    /// Word tokens joined by single spaces.
    pub words: Vec<u8>,
    /// Byte offset in `words` where each word token starts.
    pub word_starts: Vec<usize>,
    /// Spaceless characters, back to back (UTF-8).
    pub chars: Vec<u8>,
    /// Byte offset in `chars` where each spaceless character starts.
    pub char_starts: Vec<usize>,
    /// Units (word tokens and spaceless characters in document order) joined by single
    /// spaces; only filled once the document has a spaceless character (`mixed`), since
    /// before that the units are the word tokens.
    units: Vec<u8>,
    unit_starts: Vec<usize>,
    mixed: bool,
    // Tokeniser state.
    in_word: bool,
    after_spaceless: bool,
    // Scratch strings for normalising segments.
    segment: String,
    nfkc: String,
}

impl Tokens {
    /// The units joined by single spaces, and where each unit starts.
    pub fn units(&self) -> (&[u8], &[usize]) {
        if self.mixed { (&self.units, &self.unit_starts) } else { (&self.words, &self.word_starts) }
    }

    /// Number of units (word tokens plus spaceless characters).
    pub fn unit_count(&self) -> usize {
        self.word_starts.len() + self.char_starts.len()
    }

    fn clear(&mut self) {
        self.words.clear();
        self.word_starts.clear();
        self.chars.clear();
        self.char_starts.clear();
        self.units.clear();
        self.unit_starts.clear();
        self.mixed = false;
        self.in_word = false;
        self.after_spaceless = false;
    }

    /// Normalises `text` and splits it into word tokens and spaceless characters.
    pub fn tokenise(&mut self, text: &str, hangul_as_chars: bool) {
        self.clear();
        if text.is_ascii() {
            self.ascii_run(text.as_bytes());
        } else {
            self.tokenise_unicode(text, hangul_as_chars);
        }
    }

    /// Steps 1 to 4 on text that is not all ASCII.
    ///
    /// Steps 1 and 2 (mask, NFKC) act locally: a code point that is assigned, has NFKC quick
    /// check Yes and combining class 0 ("stable") is a normalisation boundary (nothing
    /// before it composes or reorders with it) and is left unchanged. So the text is
    /// walked once; stable code points and ASCII stretches are tokenised as they are, and
    /// only each segment made of one code point and the unstable ones after it is masked
    /// and normalised, in a small scratch string.
    fn tokenise_unicode(&mut self, src: &str, hangul_as_chars: bool) {
        let spaceless_mask = if hangul_as_chars { IN_SPACELESS | IN_HANGUL } else { IN_SPACELESS };
        let bytes = src.as_bytes();
        let n = bytes.len();
        let char_at = |i: usize| src.get(i..).and_then(|rest| rest.chars().next());
        let stable_at = |i: usize| {
            i >= n
                || bytes[i].is_ascii()
                || char_at(i).is_some_and(|c| class_of(c) & NFKC_STABLE != 0)
        };
        let mut i = 0;
        while i < n {
            // A stretch of ASCII (English text with the odd curly quote is mostly ASCII),
            // less its last byte if an unstable code point follows (it may combine with it).
            let run = bytes[i..].iter().take_while(|b| b.is_ascii()).count();
            let run = if run > 0 && !stable_at(i + run) { run - 1 } else { run };
            if run > 0 {
                if self.mixed {
                    for &b in &bytes[i..i + run] {
                        if ascii_is_word(b) {
                            self.word_byte(b.to_ascii_lowercase());
                        } else {
                            self.separator();
                        }
                    }
                } else {
                    self.ascii_run(&bytes[i..i + run]);
                }
                i += run;
                continue;
            }
            let Some(c) = char_at(i) else { break };
            let next = i + c.len_utf8();
            let class = if c.is_ascii() { ascii_class(c) } else { class_of(c) };
            if class & NFKC_STABLE != 0 && stable_at(next) {
                self.lower_and_push(c, class, spaceless_mask);
                i = next;
                continue;
            }
            // A segment: this code point and the unstable ones after it.
            let mut end = next;
            while !stable_at(end) {
                end += char_at(end).map_or(1, char::len_utf8);
            }
            let mut seg = std::mem::take(&mut self.segment);
            let mut nfkc = std::mem::take(&mut self.nfkc);
            seg.clear();
            seg.extend(src[i..end].chars().map(|c| {
                if !c.is_ascii() && class_of(c) & BASE_MASK == UNASSIGNED { ' ' } else { c }
            }));
            nfkc.clear();
            nfkc.extend(seg.nfkc());
            for c in nfkc.chars() {
                let class = if c.is_ascii() { ascii_class(c) } else { class_of(c) };
                self.lower_and_push(c, class, spaceless_mask);
            }
            self.segment = seg;
            self.nfkc = nfkc;
            i = end;
        }
    }

    /// Step 3 and 4 for one normalised code point.
    #[inline]
    fn lower_and_push(&mut self, c: char, class: u8, spaceless_mask: u8) {
        if c.is_ascii() {
            let b = c as u8;
            if ascii_is_word(b) {
                self.word_byte(b.to_ascii_lowercase());
            } else {
                self.separator();
            }
        } else if class & LOWER_IS_SELF != 0 {
            self.push_char(c, class, spaceless_mask);
        } else {
            for l in c.to_lowercase() {
                let lc = if l.is_ascii() { ascii_class(l) } else { class_of(l) };
                self.push_char(l, lc, spaceless_mask);
            }
        }
    }

    /// Tokenises a stretch of ASCII (which needs no NFKC and has no spaceless characters),
    /// continuing the current state (inside a word or not),
    /// while the document has no spaceless character yet (so units are the words). One
    /// branch-free pass maps each byte through a table (lowercase letter or digit, or 0 for
    /// a separator), writes it unconditionally and advances the output only past word bytes
    /// and the first separator after a word, so token boundaries cost no mispredicted
    /// branches.
    fn ascii_run(&mut self, bytes: &[u8]) {
        static LUT: [u8; 256] = {
            let mut t = [0u8; 256];
            let mut b = 0;
            while b < 256 {
                let c = b as u8;
                if c.is_ascii_alphanumeric() {
                    t[b] = c.to_ascii_lowercase();
                }
                b += 1;
            }
            t
        };
        if bytes.is_empty() {
            return;
        }
        let n = bytes.len();
        let base = self.words.len();
        let was_in_word = self.in_word;
        // After an earlier token, a new one needs a space before it: write it now and take
        // it back if no token starts in this stretch.
        let tentative = !was_in_word && base > 0;
        let first = base + tentative as usize;
        self.words.resize(first + n + 1, b' ');
        let first_token = self.word_starts.len();
        self.word_starts.resize(first_token + n / 2 + 2, 0);
        let out = &mut self.words[..first + n + 1];
        let starts = &mut self.word_starts[..first_token + n / 2 + 2];
        let (mut pos, mut tokens, mut prev) = (first, first_token, was_in_word as usize);
        for &b in bytes {
            let c = LUT[b as usize];
            let word = (c != 0) as usize;
            out[pos] = if word == 1 { c } else { b' ' };
            starts[tokens] = pos;
            tokens += word & !prev & 1;
            pos += word | prev;
            prev = word;
        }
        let new_tokens = tokens - first_token;
        let len = if tentative && new_tokens == 0 {
            base
        } else if prev == 0 && (new_tokens > 0 || was_in_word) {
            // A separator after the last word advanced `pos` past a trailing space.
            pos - 1
        } else {
            pos
        };
        self.words.truncate(len);
        self.word_starts.truncate(tokens);
        self.in_word = prev == 1;
        self.after_spaceless = false;
    }

    #[inline]
    fn push_char(&mut self, c: char, class: u8, spaceless_mask: u8) {
        match class & BASE_MASK {
            WORD | MARK if class & spaceless_mask != 0 => self.spaceless(c),
            MARK if self.after_spaceless => self.spaceless(c),
            MARK if self.in_word => self.word_char(c),
            WORD => self.word_char(c),
            FORMAT => {}
            _ => self.separator(),
        }
    }

    #[inline]
    fn separator(&mut self) {
        self.in_word = false;
        self.after_spaceless = false;
    }

    #[inline]
    fn start_word(&mut self) {
        if !self.words.is_empty() {
            self.words.push(b' ');
        }
        self.word_starts.push(self.words.len());
        if self.mixed {
            if !self.units.is_empty() {
                self.units.push(b' ');
            }
            self.unit_starts.push(self.units.len());
        }
        self.in_word = true;
        self.after_spaceless = false;
    }

    #[inline]
    fn word_byte(&mut self, b: u8) {
        if !self.in_word {
            self.start_word();
        }
        self.words.push(b);
        if self.mixed {
            self.units.push(b);
        }
    }

    #[inline]
    fn word_char(&mut self, c: char) {
        if !self.in_word {
            self.start_word();
        }
        let mut buf = [0u8; 4];
        let s = c.encode_utf8(&mut buf).as_bytes();
        self.words.extend_from_slice(s);
        if self.mixed {
            self.units.extend_from_slice(s);
        }
    }

    #[inline]
    fn spaceless(&mut self, c: char) {
        if !self.mixed {
            self.mixed = true;
            self.units.extend_from_slice(&self.words);
            self.unit_starts.extend_from_slice(&self.word_starts);
        }
        self.in_word = false;
        self.after_spaceless = true;
        let mut buf = [0u8; 4];
        let s = c.encode_utf8(&mut buf).as_bytes();
        self.char_starts.push(self.chars.len());
        self.chars.extend_from_slice(s);
        if !self.units.is_empty() {
            self.units.push(b' ');
        }
        self.unit_starts.push(self.units.len());
        self.units.extend_from_slice(s);
    }
}

fn ascii_class(c: char) -> u8 {
    if ascii_is_word(c as u8) {
        WORD | LOWER_IS_SELF | NFKC_STABLE
    } else {
        SEP | LOWER_IS_SELF | NFKC_STABLE
    }
}

/// The n-grams of a sequence stored in an arena: for `starts` (where each item begins) and
/// the arena length, calls `f(start, end)` for every window of `n` consecutive items, or
/// once for all items when there are fewer than `n`. `sep` is the number of separator bytes
/// between items (1 for word arenas, 0 for the character arena).
#[inline]
pub(crate) fn for_each_ngram(
    starts: &[usize],
    arena_len: usize,
    n: usize,
    sep: usize,
    mut f: impl FnMut(usize, usize),
) {
    let m = starts.len();
    if m == 0 {
        return;
    }
    let end_of = |j: usize| {
        if j + 1 < m { starts[j + 1] - sep } else { arena_len }
    };
    if m <= n {
        f(starts[0], arena_len);
        return;
    }
    for (i, &start) in starts[..=m - n].iter().enumerate() {
        f(start, end_of(i + n - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(text: &str, hangul: bool) -> (Vec<String>, Vec<String>, String) {
        let mut t = Tokens::default();
        t.tokenise(text, hangul);
        let words = String::from_utf8(t.words.clone()).unwrap();
        let words: Vec<String> =
            if words.is_empty() { vec![] } else { words.split(' ').map(str::to_owned).collect() };
        assert_eq!(words.len(), t.word_starts.len());
        let chars: Vec<String> =
            String::from_utf8(t.chars.clone()).unwrap().chars().map(String::from).collect();
        let units = String::from_utf8(t.units().0.to_vec()).unwrap();
        (words, chars, units)
    }

    #[test]
    fn ascii_and_general_paths_agree() {
        // "é" forces the general path for the second text; the ASCII part must tokenise
        // identically.
        let (w1, _, _) = toks("Hello, World!  foo_bar 42x", false);
        let (w2, _, _) = toks("Hello, World!  foo_bar 42x é", false);
        assert_eq!(w1, ["hello", "world", "foo", "bar", "42x"]);
        assert_eq!(&w2[..5], &w1[..]);
        assert_eq!(w2[5], "é");
    }

    #[test]
    fn mixed_run_is_split_by_script() {
        let (w, c, u) = toks("iPhone手机2024年", false);
        assert_eq!(w, ["iphone", "2024"]);
        assert_eq!(c, ["手", "机", "年"]);
        assert_eq!(u, "iphone 手 机 2024 年");
    }

    #[test]
    fn marks_stay_inside_words_and_attach_to_spaceless() {
        // Devanagari virama (Mn) and vowel signs (Mc) stay in the word.
        let (w, _, _) = toks("हिन्दी भाषा", false);
        assert_eq!(w, ["हिन्दी", "भाषा"]);
        // A combining acute (outside the spaceless ranges) after a kanji is a spaceless char.
        let (w, c, _) = toks("漢\u{301}字", false);
        assert!(w.is_empty());
        assert_eq!(c.len(), 3);
        // A mark with nothing to attach to separates; variation selectors are ignored.
        let (w, c, _) = toks("\u{301}a \u{301}b ❤\u{FE0F} 葛\u{E0100}城", false);
        assert_eq!(w, ["a", "b"]);
        assert_eq!(c, ["葛", "城"]);
    }

    #[test]
    fn format_characters_are_ignored() {
        let (w, _, _) = toks("hyphen\u{AD}ation zero\u{200B}width", false);
        assert_eq!(w, ["hyphenation", "zerowidth"]);
    }

    #[test]
    fn hangul_option() {
        let (w, c, _) = toks("한국어 텍스트", false);
        assert_eq!(w, ["한국어", "텍스트"]);
        assert!(c.is_empty());
        let (w, c, _) = toks("한국어 텍스트", true);
        assert!(w.is_empty());
        assert_eq!(c.len(), 6);
    }

    #[test]
    fn spaceless_ranges_have_no_case() {
        // The tokeniser may skip lowercasing spaceless characters only because none has a
        // lowercase mapping; check every code point in the ranges.
        for &(lo, hi) in SPACELESS_RANGES.iter().chain(HANGUL_RANGES) {
            for cp in lo..=hi {
                if let Some(c) = char::from_u32(cp) {
                    let l: Vec<char> = c.to_lowercase().collect();
                    assert_eq!(l, [c], "U+{cp:04X} has a lowercase mapping");
                }
            }
        }
    }

    #[test]
    fn stable_flag_means_nfkc_and_mask_change_nothing() {
        for cp in 0x80..0x11_0000u32 {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            if class_of(c) & NFKC_STABLE != 0 {
                assert_ne!(class_of(c) & BASE_MASK, UNASSIGNED, "U+{cp:04X}");
                let s: String = [c, 'a', c].iter().collect();
                assert_eq!(s.nfkc().collect::<String>(), s, "U+{cp:04X}");
            }
        }
    }

    #[test]
    fn category_table_is_the_pinned_unicode_version() {
        // Fingerprint v1 is defined with Unicode 16.0 categories; a dependency update that
        // changes the table must be a deliberate new fingerprint version.
        assert_eq!(unicode_general_category::UNICODE_VERSION, UNICODE_VERSION);
    }

    #[test]
    fn ranges_are_sorted_and_disjoint() {
        for r in [SPACELESS_RANGES, HANGUL_RANGES] {
            for w in r.windows(2) {
                assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0);
            }
        }
    }

    #[test]
    fn ngram_windows() {
        let starts = [0, 4, 8];
        let mut got = vec![];
        for_each_ngram(&starts, 11, 2, 1, |s, e| got.push((s, e)));
        assert_eq!(got, [(0, 7), (4, 11)]);
        got.clear();
        for_each_ngram(&starts, 11, 5, 1, |s, e| got.push((s, e)));
        assert_eq!(got, [(0, 11)]);
        got.clear();
        for_each_ngram(&[], 0, 2, 1, |s, e| got.push((s, e)));
        assert!(got.is_empty());
    }
}
