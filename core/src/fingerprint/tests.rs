//! Unit and property tests of the fast fingerprinter, mostly against [`super::naive`].

use proptest::prelude::*;

use super::*;
use crate::util::{SplitMix64, hamming};

fn cfg(word: usize, chr: usize, hash: FeatureHash) -> FingerprintConfig {
    FingerprintConfig { word_ngram: word, char_ngram: chr, hash, hangul_as_chars: false }
}

/// English-like text: `words` words from a Zipf-ish vocabulary.
fn english(rng: &mut SplitMix64, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        // Square of a uniform: small ranks are much more frequent.
        let u = rng.below(1 << 16) as f64 / 65536.0;
        let rank = (u * u * 5000.0) as u64;
        if i > 0 {
            s.push(if rng.below(12) == 0 { '\n' } else { ' ' });
        }
        let mut x = rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..(2 + rank % 7) {
            s.push((b'a' + (x % 26) as u8) as char);
            x /= 26;
        }
    }
    s
}

#[test]
fn fingerprinter_is_send() {
    fn send<T: Send>() {}
    send::<Fingerprinter>();
}

#[test]
fn config_validation() {
    assert!(FingerprintConfig::default().validate().is_ok());
    for (w, c) in [(0, 2), (3, 0), (MAX_NGRAM + 1, 2), (3, MAX_NGRAM + 1)] {
        let err = Fingerprinter::new(cfg(w, c, FeatureHash::Md5)).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{w} {c}");
    }
}

#[test]
fn empty_and_punctuation_only_are_errors() {
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    for t in ["", "   ", "!?., -- ()", "\u{200B}\u{AD}", "\u{3000}、。", "\u{E000}", "🙂🙂"] {
        assert_eq!(f.fingerprint(t), Err(Error::EmptyDocument), "{t:?}");
        assert_eq!(f.content_hash(t), Err(Error::EmptyDocument), "{t:?}");
        assert_eq!(f.word_shingles(t, 3), Ok(vec![]));
    }
}

#[test]
fn each_distinct_feature_is_hashed_once() {
    let mut f = Fingerprinter::new(cfg(2, 2, FeatureHash::Md5)).unwrap();
    let text = "a b a b a b c 中文中文中文";
    let d = f.fingerprint_doc(text).unwrap();
    // Word bigrams: "a b" x3, "b a" x2, "b c"; char bigrams: 中文 x3, 文中 x2.
    assert_eq!(d.features, 11);
    assert_eq!(d.distinct_features, 5);
    assert_eq!(f.hash_calls, 5);
}

#[test]
fn batched_md5_matches_scalar_for_every_feature() {
    let mut rng = SplitMix64::new(3);
    let mut text = english(&mut rng, 400);
    // Some features longer than one MD5 block.
    text.push_str(" supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism");
    let mut f = Fingerprinter::new(cfg(3, 2, FeatureHash::Md5)).unwrap();
    let feats = f.features(&text).unwrap();
    assert!(feats.iter().any(|x| x.text.len() > md5_lanes::MAX_LEN));
    for x in &feats {
        assert_eq!(x.hash, md5_lanes::md5_low64(x.text.as_bytes()), "{}", x.text);
    }
}

#[test]
fn zero_sum_bits_are_zero() {
    // Two features of weight 1: where their hashes differ the sum is exactly 0, so the
    // fingerprint is the AND of the two hashes.
    let mut f = Fingerprinter::new(cfg(1, 2, FeatureHash::Xxh3)).unwrap();
    use xxhash_rust::xxh3::xxh3_64;
    assert_eq!(f.fingerprint("a b").unwrap(), xxh3_64(b"a") & xxh3_64(b"b"));
}

#[test]
fn short_texts_give_one_feature() {
    let mut f = Fingerprinter::new(cfg(5, 3, FeatureHash::Xxh3)).unwrap();
    let feats = f.features("Hello, World! 你好").unwrap();
    let texts: Vec<&str> = feats.iter().map(|x| x.text.as_str()).collect();
    assert_eq!(texts, ["hello world", "你好"]);
}

#[test]
fn case_whitespace_punctuation_and_form_do_not_matter() {
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let base = f.fingerprint_doc("the office file is final").unwrap();
    for t in [
        "The Office File is FINAL.",
        "  the\toffice\n\nfile -- is final!!! ",
        "the o\u{FB03}ce \u{FB01}le is \u{FB01}nal", // ligatures ffi, fi
        "ｔｈｅ ｏｆｆｉｃｅ ｆｉｌｅ ｉｓ ｆｉｎａｌ", // full width
        "the of\u{AD}fice file is final",            // soft hyphen
    ] {
        assert_eq!(f.fingerprint_doc(t).unwrap(), base, "{t:?}");
    }
}

#[test]
fn similar_texts_get_close_fingerprints() {
    let mut rng = SplitMix64::new(11);
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let mut near = Vec::new();
    let mut far = Vec::new();
    for _ in 0..20 {
        let words: Vec<String> =
            english(&mut rng, 600).split_whitespace().map(str::to_owned).collect();
        let mut edited = words.clone();
        for _ in 0..3 {
            let i = rng.below(edited.len() as u64) as usize;
            edited[i] = "zzzedit".into();
        }
        let a = f.fingerprint(&words.join(" ")).unwrap();
        let b = f.fingerprint(&edited.join(" ")).unwrap();
        let c = f.fingerprint(&english(&mut rng, 600)).unwrap();
        near.push(hamming(a, b));
        far.push(hamming(a, c));
    }
    let mean = |v: &[u32]| v.iter().sum::<u32>() as f64 / v.len() as f64;
    // 3 edits touch 9 of ~600 word 3-grams: a few bits; unrelated texts: about 32.
    assert!(mean(&near) < 6.0, "near {near:?}");
    assert!(mean(&far) > 24.0, "far {far:?}");
}

#[test]
fn idf_scaling_and_reweighting() {
    let text = "alpha beta gamma delta alpha beta gamma epsilon";
    let c = cfg(1, 2, FeatureHash::Md5);
    let plain = Fingerprinter::new(c).unwrap().fingerprint(text).unwrap();
    // A constant IDF scales every sum by the same positive factor: same fingerprint.
    let scaled =
        Fingerprinter::with_idf(c, Arc::new(Idf::new(7))).unwrap().fingerprint(text).unwrap();
    assert_eq!(plain, scaled);
    // A huge weight on one feature makes the fingerprint that feature's hash.
    let mut idf = Idf::new(1);
    idf.insert("epsilon", 1_000_000);
    let mut f = Fingerprinter::with_idf(c, Arc::new(idf.clone())).unwrap();
    assert_eq!(f.fingerprint(text).unwrap(), naive::feature_hash(FeatureHash::Md5, "epsilon"));
    assert_eq!(
        f.fingerprint_doc(text).unwrap(),
        naive::fingerprint_doc(&c, Some(&idf), text).unwrap()
    );
    // All weights zero: every sum is 0, every bit 0.
    let zero =
        Fingerprinter::with_idf(c, Arc::new(Idf::new(0))).unwrap().fingerprint(text).unwrap();
    assert_eq!(zero, 0);
}

#[test]
fn matches_naive_on_generated_text() {
    let mut rng = SplitMix64::new(1);
    for (i, hash) in [FeatureHash::Md5, FeatureHash::Xxh3].into_iter().enumerate() {
        for n in 1..=4 {
            let c = cfg(n, 5 - n, hash);
            let mut f = Fingerprinter::new(c).unwrap();
            let text = english(&mut rng, 50 + 100 * i) + " 日本語のテキスト、ภาษาไทย";
            assert_eq!(f.fingerprint_doc(&text), naive::fingerprint_doc(&c, None, &text));
        }
    }
}

#[test]
fn huge_input_does_not_panic() {
    let mut rng = SplitMix64::new(9);
    let mut s = String::with_capacity(5 << 20);
    while s.len() < 5 << 20 {
        // Mostly valid scalar values from all planes, some ASCII.
        let cp =
            if rng.below(2) == 0 { rng.below(0x80) as u32 } else { rng.below(0x11_0000) as u32 };
        if let Some(c) = char::from_u32(cp) {
            s.push(c);
        }
    }
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let d = f.fingerprint_doc(&s).unwrap();
    assert!(d.features >= d.distinct_features && d.tokens > 0);
    let one_word = "x".repeat(3 << 20);
    assert!(f.fingerprint(&one_word).is_ok());
}

#[test]
fn signs_match_signed_sums() {
    let mut rng = SplitMix64::new(4);
    for _ in 0..200 {
        let n = 1 + rng.below(20) as usize;
        let entries: Vec<Entry> = (0..n)
            .map(|_| Entry {
                start: 0,
                end: 0,
                chars: false,
                // Few distinct hash bits so that zero sums happen.
                hash: rng.next_u64() & rng.next_u64(),
                count: 1 + rng.below(3),
            })
            .collect();
        let mut want = 0u64;
        for i in 0..64 {
            let s: i64 = entries
                .iter()
                .map(|e| if e.hash >> i & 1 == 1 { e.count as i64 } else { -(e.count as i64) })
                .sum();
            want |= ((s > 0) as u64) << i;
        }
        assert_eq!(signs_tf(&entries), want);
        assert_eq!(signs_weighted(entries.iter().map(|e| (e.hash, e.count as u128))), want);
    }
}

/// Strings biased towards the interesting parts of Unicode: ASCII, Latin with combining
/// marks, non-ASCII punctuation between ASCII words, Greek, Turkish dotted I, ligatures, full width, CJK, kana, Hangul, Thai,
/// Devanagari, format characters, unassigned code points, and anything else.
fn interesting_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-zA-Z0-9 ,.!?'\\-\n\t]{0,12}",
        1 => "[ßẞİıΣσςÅå\u{301}\u{307}\u{308}é]{0,6}",
        2 => "[—“”’©\u{A0}…«»¿¡€]{1,2}",
        1 => "[\u{FB00}-\u{FB06}\u{FF01}-\u{FF5E}²³¹½ⅫK]{0,6}",
        2 => "[\u{4E00}-\u{4E40}\u{3041}-\u{3096}\u{30A1}-\u{30FA}ー々、。「」]{0,8}",
        1 => "[\u{AC00}-\u{AC40}\u{1100}-\u{1112}\u{1161}-\u{1175}\u{3131}-\u{318E}]{0,6}",
        1 => "[\u{0E01}-\u{0E5B}\u{0900}-\u{097F}\u{1780}-\u{17DD}\u{1000}-\u{104F}]{0,8}",
        1 => "[\u{200B}-\u{200F}\u{AD}\u{FEFF}\u{E0100}\u{FE0F}\u{378}\u{2FFFF}\u{31350}]{0,3}",
        1 => any::<String>(),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn fast_equals_naive(text in interesting_text(), w in 1usize..5, c in 1usize..4,
                         xxh in any::<bool>(), hangul in any::<bool>()) {
        let config = FingerprintConfig {
            word_ngram: w,
            char_ngram: c,
            hash: if xxh { FeatureHash::Xxh3 } else { FeatureHash::Md5 },
            hangul_as_chars: hangul,
        };
        let mut f = Fingerprinter::new(config).unwrap();
        prop_assert_eq!(f.fingerprint_doc(&text), naive::fingerprint_doc(&config, None, &text));
        if let Ok(h) = f.content_hash(&text) {
            prop_assert_eq!(
                h,
                xxhash_rust::xxh3::xxh3_128(naive::content_string(&config, &text).as_bytes())
            );
        }
    }

    #[test]
    fn arbitrary_input_never_panics(text in any::<String>()) {
        let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
        match f.fingerprint_doc(&text) {
            Ok(d) => {
                prop_assert!(d.tokens > 0 && d.features >= d.distinct_features);
                prop_assert_eq!(f.content_hash(&text), Ok(d.content_hash));
                let sh = f.word_shingles(&text, 3).unwrap();
                prop_assert!(!sh.is_empty() && sh.windows(2).all(|w| w[0] < w[1]));
            }
            Err(e) => prop_assert_eq!(e, Error::EmptyDocument),
        }
    }

    #[test]
    fn whitespace_and_ascii_case_do_not_matter(
        words in prop::collection::vec("[a-zA-Z0-9éß中文ไทย]{1,8}", 1..30),
        seps in prop::collection::vec("[ \t\n,.;!?()\u{3000}]{1,3}", 30),
    ) {
        let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
        let plain = words.join(" ");
        let mut noisy = String::new();
        for (i, w) in words.iter().enumerate() {
            noisy.push_str(&seps[i]);
            noisy.push_str(&w.to_ascii_uppercase());
        }
        prop_assert_eq!(f.fingerprint_doc(&plain), f.fingerprint_doc(&noisy));
    }
}

#[test]
fn segment_normalisation_equals_whole_text_nfkc() {
    // Code points that compose, decompose, reorder or are unassigned, between ASCII and
    // stable letters: the fast tokeniser normalises only segments around the unstable ones,
    // the naive one normalises the whole text.
    const ALPHABET: &[char] = &[
        'a',
        'e',
        'o',
        'A',
        'E',
        ' ',
        '.',
        'x',
        'é',
        'ệ',
        'İ',
        'ß',
        'Σ',
        '\u{301}',
        '\u{323}',
        '\u{334}',
        '\u{345}',
        '\u{5B0}',
        '\u{308}',
        '\u{1100}',
        '\u{1161}',
        '\u{11A8}',
        '\u{AC00}',
        '\u{D4DB}',
        '\u{D46}',
        '\u{D3E}',
        '\u{D57}',
        '\u{FF76}',
        '\u{FF9E}',
        '\u{FF9F}',
        'ｶ',
        '\u{3099}',
        'か',
        '\u{A0}',
        '…',
        'ﬁ',
        'Ａ',
        '²',
        '½',
        '\u{F900}',
        '\u{2F800}',
        '\u{378}',
        '\u{FFFF}',
        '\u{200B}',
        '\u{FE0F}',
        '\u{E0100}',
        '漢',
        'ก',
        '\u{E48}',
        '\u{E38}',
        'K',
        'Å',
        '\u{1E9B}',
        '\u{FB2C}',
        '\u{2126}',
    ];
    let mut rng = SplitMix64::new(21);
    let config = cfg(2, 2, FeatureHash::Xxh3);
    let mut f = Fingerprinter::new(config).unwrap();
    for _ in 0..20_000 {
        let len = rng.below(12) as usize;
        let text: String =
            (0..len).map(|_| ALPHABET[rng.below(ALPHABET.len() as u64) as usize]).collect();
        assert_eq!(
            f.fingerprint_doc(&text),
            naive::fingerprint_doc(&config, None, &text),
            "{text:?}"
        );
    }
}

#[test]
fn word_shingles_are_unit_ngrams() {
    use xxhash_rust::xxh3::xxh3_64;
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let sorted = |v: &[&str]| {
        let mut h: Vec<u64> = v.iter().map(|s| xxh3_64(s.as_bytes())).collect();
        h.sort_unstable();
        h.dedup();
        h
    };
    assert_eq!(f.word_shingles("A b, c. A b", 2).unwrap(), sorted(&["a b", "b c", "c a"]));
    // Spaceless characters are units of their own; fewer units than n give one shingle.
    assert_eq!(f.word_shingles("iPhone手机", 2).unwrap(), sorted(&["iphone 手", "手 机"]));
    assert_eq!(f.word_shingles("中文", 3).unwrap(), sorted(&["中 文"]));
    assert!(matches!(f.word_shingles("x", 0), Err(Error::InvalidConfig(_))));
}
