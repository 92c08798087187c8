//! `neardup-bench fingerprint`: text throughput of the fingerprinter, one core.
//!
//! Generates web-like text (English-like words with a Zipf distribution, sentences,
//! numbers, and some documents in German, Russian, Chinese, Japanese and Thai), or reads a
//! file, then measures MB of text per second on one core for MD5 and xxh3 features, the
//! share of time in each phase, and, in the same run, two baselines: the naive
//! implementation of the same spec (a `String` per feature occurrence, every occurrence
//! hashed) and raw MD5 over the same bytes. The last line of stdout is one JSON object.

use std::time::Instant;

use clap::Args as ClapArgs;
use md5::Digest;
use neardup_core::fingerprint::{FeatureHash, FingerprintConfig, Fingerprinter, PhaseTimes, naive};
use neardup_core::util::SplitMix64;

/// Options of the `fingerprint` subcommand.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Read documents from this file (UTF-8; documents separated by an empty line) instead
    /// of generating text.
    #[arg(long)]
    file: Option<std::path::PathBuf>,
    /// MB of text to generate.
    #[arg(long, default_value_t = 32)]
    mb: usize,
    /// Seed of the text generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timed passes per measurement; the median is reported.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// MB of text given to the (slow) naive baseline.
    #[arg(long, default_value_t = 4)]
    naive_mb: usize,
}

/// Runs the benchmark and prints its figures.
pub fn run(args: Args) {
    let docs = match &args.file {
        Some(path) => {
            let bytes = std::fs::read(path).unwrap_or_else(|e| {
                eprintln!("cannot read {}: {e}", path.display());
                std::process::exit(2)
            });
            split_documents(&String::from_utf8_lossy(&bytes))
        }
        None => generate(args.mb << 20, args.seed),
    };
    let total: usize = docs.iter().map(|d| d.len()).sum();
    let ascii_docs = docs.iter().filter(|d| d.is_ascii()).count();
    let ascii_bytes: usize = docs.iter().filter(|d| d.is_ascii()).map(|d| d.len()).sum();
    println!(
        "corpus: {} documents, {:.1} MB ({:.1}% of bytes in ASCII-only documents, {} of them), source: {}",
        docs.len(),
        mb(total),
        100.0 * ascii_bytes as f64 / total.max(1) as f64,
        ascii_docs,
        args.file
            .as_ref()
            .map_or(format!("generated, seed {}", args.seed), |p| p.display().to_string())
    );
    let passes = args.passes.max(1);

    let mut results = Vec::new();
    for hash in [FeatureHash::Md5, FeatureHash::Xxh3] {
        let config = FingerprintConfig { hash, ..FingerprintConfig::default() };
        let r = measure(&docs, config, passes);
        println!(
            "{:<5} {:>7.1} MB/s per core (wall {:.1}; ASCII docs {:.1}, other docs {:.1}); {:.0} ns per distinct feature; phases: tokenise {:.0}%, count {:.0}%, hash {:.0}%, accumulate {:.0}%",
            name(hash),
            r.mbps,
            r.wall_mbps,
            r.mbps_ascii,
            r.mbps_other,
            r.ns_per_distinct,
            r.share[0],
            r.share[1],
            r.share[2],
            r.share[3]
        );
        results.push((hash, r));
    }

    // Baseline 1: the naive implementation on a prefix of the corpus.
    let naive_docs = prefix(&docs, args.naive_mb << 20);
    let naive_bytes: usize = naive_docs.iter().map(|d| d.len()).sum();
    let config = FingerprintConfig::default();
    let mut sink = 0u64;
    let t = Clock::now();
    for d in naive_docs {
        if let Ok(f) = naive::fingerprint_doc(&config, None, d) {
            sink ^= f.simhash;
        }
    }
    let naive_secs = t.elapsed();
    // JSON has no NaN: a skipped baseline (`--naive-mb 0`) reads as 0.
    let naive_mbps = if naive_bytes == 0 { 0.0 } else { mb(naive_bytes) / naive_secs };
    // Check that the fast path computes the same thing on the same documents.
    let mut fast = Fingerprinter::new(config).expect("valid config");
    let mut check = 0u64;
    for d in naive_docs {
        if let Ok(f) = fast.fingerprint_doc(d) {
            check ^= f.simhash;
        }
    }
    assert_eq!(sink, check, "fast and naive fingerprints differ");
    println!(
        "naive {naive_mbps:>7.1} MB/s per core (baseline: String per feature, MD5 of every occurrence; {:.1} MB)",
        mb(naive_bytes)
    );

    // Baseline 2: raw MD5 over the same bytes, document by document.
    let mut raw = Vec::new();
    for _ in 0..passes {
        let t = Clock::now();
        let mut x = 0u8;
        for d in &docs {
            x ^= md5::Md5::digest(d.as_bytes())[0];
        }
        std::hint::black_box(x);
        raw.push(mb(total) / t.elapsed());
    }
    let raw_mbps = median(&mut raw);
    println!(
        "raw MD5 {raw_mbps:>5.1} MB/s per core (baseline: md-5 crate over each document's bytes)"
    );

    // Per-call cost of MD5 on a short feature with the md-5 crate (the scalar path).
    let feats: Vec<String> = (0..4096).map(|i| format!("word{i} other{} third", i * 7)).collect();
    let reps = 100;
    let t = Clock::now();
    let mut x = 0u8;
    for _ in 0..reps {
        for f in &feats {
            x ^= md5::Md5::digest(f.as_bytes())[0];
        }
    }
    std::hint::black_box(x);
    let md5_short_ns = t.elapsed() * 1e9 / (reps * feats.len()) as f64;
    println!("md-5 crate, one short feature (~20 bytes): {md5_short_ns:.0} ns");

    let (md5r, xxr) = (&results[0].1, &results[1].1);
    let clock = if thread_cpu_ns().is_some() { "thread_cpu" } else { "wall" };
    println!(
        "clock: {clock}; {:.2} bytes of text per unit (word token or spaceless character), {:.2} per word in ASCII documents",
        md5r.bytes_per_unit, md5r.ascii_bytes_per_word
    );
    let share = |r: &Measured| {
        format!(
            "{{\"tokenise\":{:.1},\"count\":{:.1},\"hash\":{:.1},\"accumulate\":{:.1}}}",
            r.share[0], r.share[1], r.share[2], r.share[3]
        )
    };
    println!(
        "{{\"bench\":\"fingerprint\",\"clock\":\"{clock}\",\"corpus_mb\":{:.2},\"docs\":{},\"bytes_per_unit\":{:.2},\"ascii_bytes_per_word\":{:.2},\"seed\":{},\"file\":{},\"md5_mbps\":{:.1},\"xxh3_mbps\":{:.1},\"md5_wall_mbps\":{:.1},\"xxh3_wall_mbps\":{:.1},\"md5_ascii_mbps\":{:.1},\"md5_other_mbps\":{:.1},\"xxh3_ascii_mbps\":{:.1},\"xxh3_other_mbps\":{:.1},\"naive_md5_mbps\":{:.1},\"raw_md5_mbps\":{:.1},\"md5_ns_per_distinct_feature\":{:.1},\"md5_crate_short_feature_ns\":{:.1},\"md5_phase_share_pct\":{},\"xxh3_phase_share_pct\":{}}}",
        mb(total),
        docs.len(),
        md5r.bytes_per_unit,
        md5r.ascii_bytes_per_word,
        args.seed,
        args.file.as_ref().map_or("null".into(), |p| format!("{:?}", p.display().to_string())),
        md5r.mbps,
        xxr.mbps,
        md5r.wall_mbps,
        xxr.wall_mbps,
        md5r.mbps_ascii,
        md5r.mbps_other,
        xxr.mbps_ascii,
        xxr.mbps_other,
        naive_mbps,
        raw_mbps,
        md5r.ns_per_distinct,
        md5_short_ns,
        share(md5r),
        share(xxr),
    );
}

/// A clock of this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that "per core"
/// figures are not diluted when other processes share the machine; wall time where that
/// clock is unavailable.
#[derive(Clone, Copy)]
struct Clock {
    wall: Instant,
    cpu_ns: Option<u64>,
}

fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

impl Clock {
    fn now() -> Self {
        Clock { wall: Instant::now(), cpu_ns: thread_cpu_ns() }
    }

    /// Seconds of CPU time (or wall time) since `self`.
    fn elapsed(&self) -> f64 {
        match (self.cpu_ns, thread_cpu_ns()) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 * 1e-9,
            _ => self.wall.elapsed().as_secs_f64(),
        }
    }

    /// Seconds of wall time since `self`.
    fn wall(&self) -> f64 {
        self.wall.elapsed().as_secs_f64()
    }
}

struct Measured {
    mbps: f64,
    wall_mbps: f64,
    mbps_ascii: f64,
    mbps_other: f64,
    ns_per_distinct: f64,
    bytes_per_unit: f64,
    ascii_bytes_per_word: f64,
    share: [f64; 4],
}

fn measure(docs: &[String], config: FingerprintConfig, passes: usize) -> Measured {
    let mut f = Fingerprinter::new(config).expect("valid config");
    let total: usize = docs.iter().map(|d| d.len()).sum();
    // Warm-up: grows the buffers, builds the character table.
    let mut sink = 0u64;
    for d in docs {
        sink ^= f.fingerprint(d).unwrap_or(0);
    }
    let ascii: Vec<&String> = docs.iter().filter(|d| d.is_ascii()).collect();
    let other: Vec<&String> = docs.iter().filter(|d| !d.is_ascii()).collect();
    let bytes = |v: &[&String]| v.iter().map(|d| d.len()).sum::<usize>();
    let (b_ascii, b_other) = (bytes(&ascii), bytes(&other));
    let mut rates = Vec::new();
    let mut wall_rates = Vec::new();
    let (mut ascii_rates, mut other_rates) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        let start = Clock::now();
        for d in docs {
            sink ^= f.fingerprint(d).unwrap_or(0);
        }
        rates.push(mb(total) / start.elapsed());
        wall_rates.push(mb(total) / start.wall());
        let start = Clock::now();
        for d in &ascii {
            sink ^= f.fingerprint(d).unwrap_or(0);
        }
        ascii_rates.push(mb(b_ascii) / start.elapsed().max(1e-9));
        let start = Clock::now();
        for d in &other {
            sink ^= f.fingerprint(d).unwrap_or(0);
        }
        other_rates.push(mb(b_other) / start.elapsed().max(1e-9));
    }
    // One more pass with per-phase timers.
    let mut phases = PhaseTimes::default();
    let mut distinct = 0usize;
    let mut units = 0usize;
    let (mut ascii_units, mut ascii_bytes) = (0usize, 0usize);
    for d in docs {
        if let Ok((doc, p)) = f.fingerprint_doc_timed(d) {
            distinct += doc.distinct_features;
            units += doc.tokens;
            if d.is_ascii() {
                ascii_units += doc.tokens;
                ascii_bytes += d.len();
            }
            phases.tokenise_ns += p.tokenise_ns;
            phases.count_ns += p.count_ns;
            phases.hash_ns += p.hash_ns;
            phases.accumulate_ns += p.accumulate_ns;
        }
    }
    std::hint::black_box(sink);
    let sum = (phases.tokenise_ns + phases.count_ns + phases.hash_ns + phases.accumulate_ns).max(1)
        as f64;
    let pct = |x: u64| 100.0 * x as f64 / sum;
    Measured {
        mbps: median(&mut rates),
        wall_mbps: median(&mut wall_rates),
        mbps_ascii: median(&mut ascii_rates),
        mbps_other: median(&mut other_rates),
        ns_per_distinct: phases.hash_ns as f64 / distinct.max(1) as f64,
        bytes_per_unit: total as f64 / units.max(1) as f64,
        ascii_bytes_per_word: ascii_bytes as f64 / ascii_units.max(1) as f64,
        share: [
            pct(phases.tokenise_ns),
            pct(phases.count_ns),
            pct(phases.hash_ns),
            pct(phases.accumulate_ns),
        ],
    }
}

fn name(h: FeatureHash) -> &'static str {
    match h {
        FeatureHash::Md5 => "md5",
        FeatureHash::Xxh3 => "xxh3",
    }
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The median of `v` (the upper one of an even count; `v` not empty), sorting it.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The shortest leading run of `docs` holding at least `bytes` bytes (none for 0).
fn prefix(docs: &[String], bytes: usize) -> &[String] {
    if bytes == 0 {
        return &[];
    }
    let mut acc = 0;
    for (i, d) in docs.iter().enumerate() {
        acc += d.len();
        if acc >= bytes {
            return &docs[..=i];
        }
    }
    docs
}

fn split_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                docs.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    if !cur.is_empty() {
        docs.push(cur);
    }
    docs
}

/// Zipf sampler over ranks `0..n` (exponent 1) by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize) -> Self {
        let mut acc = 0.0;
        let cdf = (0..n)
            .map(|r| {
                acc += 1.0 / (r as f64 + 1.0);
                acc
            })
            .collect::<Vec<_>>();
        let total = acc;
        Zipf { cdf: cdf.into_iter().map(|c| c / total).collect() }
    }

    fn sample(&self, rng: &mut SplitMix64) -> usize {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

fn pick<'a>(rng: &mut SplitMix64, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len() as u64) as usize]
}

/// Pseudo-words from syllables, in rank order: the 50 most frequent have one syllable, the
/// next ones up to rank 1000 one or two, the rest two to four. With Zipf ranks this gives
/// about 4.9 letters per running word (about 6 bytes with separators), as in English text.
fn vocabulary(rng: &mut SplitMix64, n: usize, onsets: &[&str], nuclei: &[&str]) -> Vec<String> {
    (0..n)
        .map(|rank| {
            let syllables = match rank {
                0..50 => 1,
                50..1000 => 1 + rng.below(2) as usize,
                _ => 2 + rng.below(2) as usize + (rng.below(3) == 0) as usize,
            };
            (0..syllables).map(|_| format!("{}{}", pick(rng, onsets), pick(rng, nuclei))).collect()
        })
        .collect()
}

const EN_ONSETS: &[&str] = &[
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "th",
    "st", "tr", "ch", "sh", "pr", "br", "",
];
const EN_NUCLEI: &[&str] =
    &["a", "e", "i", "o", "u", "ea", "ou", "er", "in", "on", "an", "ing", "ed", "y", "al"];
const DE_NUCLEI: &[&str] = &["a", "e", "i", "o", "u", "ä", "ö", "ü", "ei", "au", "en", "er", "ß"];
const RU_ONSETS: &[&str] = &[
    "б", "в", "г", "д", "ж", "з", "к", "л", "м", "н", "п", "р", "с", "т", "ф", "х", "ц", "ч", "ш",
    "",
];
const RU_NUCLEI: &[&str] = &["а", "е", "и", "о", "у", "ы", "я", "ю", "ой", "ен", "ов"];
const HANZI: &str = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域读";
const KANA: &str = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだでどばびぶべぼアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモラリルレロン";
const THAI_CONSONANTS: &str = "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮ";
const THAI_VOWELS: &str = "ะาิีึืุู่้เแโไำ";

fn generate(bytes: usize, seed: u64) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    let en = vocabulary(&mut rng, 30_000, EN_ONSETS, EN_NUCLEI);
    let de = vocabulary(&mut rng, 10_000, EN_ONSETS, DE_NUCLEI);
    let ru = vocabulary(&mut rng, 10_000, RU_ONSETS, RU_NUCLEI);
    let hanzi: Vec<char> = HANZI.chars().collect();
    let kana: Vec<char> = KANA.chars().collect();
    let thai_c: Vec<char> = THAI_CONSONANTS.chars().collect();
    let thai_v: Vec<char> = THAI_VOWELS.chars().collect();
    let zipf_words = Zipf::new(30_000);
    let zipf_small = Zipf::new(10_000);
    let zipf_hanzi = Zipf::new(hanzi.len());
    let mut docs = Vec::new();
    let mut total = 0;
    while total < bytes {
        // Log-uniform length between 100 and 3000 units.
        let len =
            (100.0 * 30f64.powf((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64)) as usize;
        let kind = rng.below(100);
        let mut doc = String::new();
        match kind {
            0..=84 => words_doc(&mut doc, &mut rng, len, &en, &zipf_words),
            85..=89 => words_doc(&mut doc, &mut rng, len, &de, &zipf_small),
            90..=93 => words_doc(&mut doc, &mut rng, len, &ru, &zipf_small),
            94..=96 => {
                for i in 0..len {
                    doc.push(hanzi[zipf_hanzi.sample(&mut rng)]);
                    if i % 17 == 16 {
                        doc.push_str(if rng.below(3) == 0 { "，" } else { "。" });
                    }
                    if rng.below(200) == 0 {
                        doc.push_str(" iPhone 2024 ");
                    }
                }
            }
            97..=98 => {
                for i in 0..len {
                    if rng.below(3) == 0 {
                        doc.push(hanzi[zipf_hanzi.sample(&mut rng)]);
                    } else {
                        doc.push(kana[rng.below(kana.len() as u64) as usize]);
                    }
                    if i % 23 == 22 {
                        doc.push('。');
                    }
                }
            }
            _ => {
                for i in 0..len {
                    doc.push(thai_c[rng.below(thai_c.len() as u64) as usize]);
                    if rng.below(2) == 0 {
                        doc.push(thai_v[rng.below(thai_v.len() as u64) as usize]);
                    }
                    if i % 30 == 29 {
                        doc.push(' ');
                    }
                }
            }
        }
        total += doc.len();
        docs.push(doc);
    }
    docs
}

fn words_doc(doc: &mut String, rng: &mut SplitMix64, len: usize, vocab: &[String], z: &Zipf) {
    let mut sentence_left = 0;
    for _ in 0..len {
        if sentence_left == 0 {
            if !doc.is_empty() {
                doc.push_str(if rng.below(8) == 0 { ".\n\n" } else { ". " });
            }
            sentence_left = 5 + rng.below(20);
            let w = &vocab[z.sample(rng)];
            let mut cs = w.chars();
            if let Some(c) = cs.next() {
                doc.extend(c.to_uppercase());
                doc.push_str(cs.as_str());
            }
        } else {
            doc.push(' ');
            match rng.below(40) {
                0 if rng.below(4) == 0 => {
                    // Typography as on real pages: one non-ASCII character every ~150 words
                    // puts most documents off the pure-ASCII path.
                    doc.push_str(pick(rng, &["’s", " — ", "“", "”", "©", "\u{a0}", "…", "é"]));
                    doc.push_str(&vocab[z.sample(rng)]);
                }
                0 => doc.push_str(&format!("{}", rng.below(3000))),
                1 => {
                    doc.pop();
                    doc.push_str(", ");
                    doc.push_str(&vocab[z.sample(rng)]);
                }
                _ => doc.push_str(&vocab[z.sample(rng)]),
            }
        }
        sentence_left -= 1;
    }
    doc.push('.');
}
