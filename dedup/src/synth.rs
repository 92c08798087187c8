//! A seeded generator of web-page-like corpora with planted exact and near-duplicates.
//!
//! Dedup speed is to be measured on web pages (markup, scripts, site boilerplate) at a
//! realistic size, and clustering is to be tested on corpora whose duplicate structure is
//! known; real crawls cannot be shipped, so this makes them. Everything follows from the
//! seed, so a corpus can be regenerated instead of stored.
//!
//! * **Text**: sentences of words drawn from a made-up vocabulary (syllable words, Zipf
//!   frequencies), paragraphs of sentences, articles of paragraphs.
//! * **Sites**: each page belongs to a site whose navigation, sidebar and footer text are
//!   shared by all its pages (boilerplate); every page also has a `<style>`, a `<script>`
//!   with page-specific code, a "related articles" box and a view counter.
//! * **Planted duplicates**: a page is, with `--exact-fraction`, an exact copy of an earlier
//!   page's text (other markup, script, whitespace and letter case: the same normalised
//!   text); with `--near-fraction`, a near copy: the same article with 0.2% to
//!   `--max-edit-rate` (4%) of its words replaced, in half of the copies a sentence dropped
//!   or added, and a fresh related box and counter, sometimes on another site
//!   (syndication). One copy in five is dated earlier than its source, so
//!   the source is not always the original.

use std::io::Write;
use std::path::PathBuf;

use neardup_core::util::SplitMix64;

use crate::error::DedupError;

/// How the generated corpus is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Layout {
    /// One JSONL file: `id`, `url`, `site`, `timestamp` (RFC 3339), `text` (the page), and
    /// `planted` (`fresh`, `exact:<id>` or `near:<id>`).
    #[default]
    Jsonl,
    /// A directory of `.html` files, one page each, in subdirectories of 1,000.
    Dir,
}

/// Options of the corpus generator.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// Where to write: a `.jsonl` file or a directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of pages.
    #[arg(long, default_value_t = 50_000)]
    pub docs: usize,
    /// The seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Layout of the output.
    #[arg(long, value_enum, default_value_t)]
    pub layout: Layout,
    /// Fraction of pages that are exact copies of an earlier page's text.
    #[arg(long, default_value_t = 0.04)]
    pub exact_fraction: f64,
    /// Fraction of pages that are near copies of an earlier page.
    #[arg(long, default_value_t = 0.12)]
    pub near_fraction: f64,
    /// Number of sites.
    #[arg(long, default_value_t = 300)]
    pub sites: usize,
    /// Mean article length in words.
    #[arg(long, default_value_t = 520)]
    pub words: usize,
    /// Largest fraction of words a near copy replaces (each copy draws from 0.2% to this).
    #[arg(long, default_value_t = 0.04)]
    pub max_edit_rate: f64,
    /// Headlines in each page's "related articles" box (five words each; they differ
    /// between copies).
    #[arg(long, default_value_t = 5)]
    pub related: usize,
    /// Plain text (the article and boilerplate text, no markup) instead of HTML.
    #[arg(long)]
    pub plain: bool,
}

impl GenerateArgs {
    /// Defaults for `docs` pages written to `out`.
    pub fn new(out: PathBuf, docs: usize) -> GenerateArgs {
        GenerateArgs {
            out,
            docs,
            seed: 1,
            layout: Layout::Jsonl,
            exact_fraction: 0.04,
            near_fraction: 0.12,
            sites: 300,
            words: 520,
            max_edit_rate: 0.04,
            related: 5,
            plain: false,
        }
    }
}

/// How a page came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planted {
    /// A new article.
    Fresh,
    /// The same text as page `.0`.
    Exact(usize),
    /// A near copy of page `.0`.
    Near(usize),
}

/// One generated page.
#[derive(Debug, Clone)]
pub struct Page {
    /// Its number, from 0.
    pub index: usize,
    /// Its URL.
    pub url: String,
    /// Its site's number.
    pub site: usize,
    /// Seconds since the Unix epoch.
    pub timestamp: i64,
    /// The page: HTML, or plain text with `plain`.
    pub body: String,
    /// How it came about.
    pub planted: Planted,
}

/// What was generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generated {
    /// Pages written.
    pub docs: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Exact copies planted.
    pub exact: usize,
    /// Near copies planted.
    pub near: usize,
}

struct Vocab {
    words: Vec<String>,
    /// Cumulative Zipf weights.
    cdf: Vec<f64>,
}

impl Vocab {
    fn new(rng: &mut SplitMix64, size: usize) -> Vocab {
        const ONSETS: [&str; 20] = [
            "", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
            "st", "tr", "pl",
        ];
        const VOWELS: [&str; 8] = ["a", "e", "i", "o", "u", "ai", "ou", "ea"];
        const CODAS: [&str; 8] = ["", "", "", "n", "r", "s", "l", "t"];
        let mut seen = std::collections::HashSet::new();
        let mut words = Vec::with_capacity(size);
        while words.len() < size {
            let syllables = 1 + rng.below(3) as usize + (words.len() > 200) as usize;
            let mut w = String::new();
            for _ in 0..syllables {
                w.push_str(ONSETS[rng.below(20) as usize]);
                w.push_str(VOWELS[rng.below(8) as usize]);
                w.push_str(CODAS[rng.below(8) as usize]);
            }
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let mut acc = 0.0;
        let cdf = (1..=size)
            .map(|r| {
                acc += 1.0 / r as f64;
                acc
            })
            .collect();
        Vocab { words, cdf }
    }

    fn word(&self, rng: &mut SplitMix64) -> &str {
        let total = *self.cdf.last().unwrap_or(&1.0);
        let x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let i = self.cdf.partition_point(|&c| c < x).min(self.words.len() - 1);
        &self.words[i]
    }

    fn sentence(&self, rng: &mut SplitMix64, out: &mut Vec<String>) {
        let n = 6 + rng.below(15) as usize;
        for _ in 0..n {
            out.push(self.word(rng).to_string());
        }
    }
}

struct Site {
    name: String,
    nav: Vec<String>,
    footer: String,
    style: String,
}

/// An article: paragraphs of sentences of words.
type Article = Vec<Vec<Vec<String>>>;

/// Generates pages one at a time (memory does not grow with the corpus).
pub struct Pages {
    rng: SplitMix64,
    vocab: Vocab,
    sites: Vec<Site>,
    args: GenerateArgs,
    /// Per page so far: (article seed, site, timestamp, edit seed if near copy, seed of
    /// the visible page-specific parts).
    history: Vec<(u64, usize, i64, Option<u64>, u64)>,
}

impl Pages {
    /// The page generator for `args` (output options are ignored).
    pub fn new(args: &GenerateArgs) -> Pages {
        let mut rng = SplitMix64::new(args.seed ^ 0x6E65_6172_6475_7031);
        let vocab = Vocab::new(&mut rng, 20_000);
        let sites = (0..args.sites.max(1))
            .map(|s| {
                let mut words = Vec::new();
                vocab.sentence(&mut rng, &mut words);
                let nav = (0..8 + rng.below(8)).map(|_| cap(vocab.word(&mut rng))).collect();
                let mut footer = Vec::new();
                for _ in 0..3 {
                    vocab.sentence(&mut rng, &mut footer);
                }
                Site {
                    name: format!("{} {}", cap(&words[0]), cap(&words[1])),
                    nav,
                    footer: format!("Copyright {} {}. {}.", 2000 + s % 25, cap(&words[0]), footer.join(" ")),
                    style: format!(
                        "body{{font-family:sans-serif;color:#{:06x}}} .nav a{{margin:{}px}} .side{{width:{}px}}",
                        rng.below(1 << 24),
                        rng.below(20),
                        200 + rng.below(200)
                    ),
                }
            })
            .collect();
        Pages { rng, vocab, sites, args: args.clone(), history: Vec::new() }
    }

    fn article(&self, seed: u64) -> Article {
        let mut rng = SplitMix64::new(seed);
        let mut words = 0;
        let target = self.args.words / 2 + rng.below(self.args.words as u64 + 1) as usize;
        let mut paras = Vec::new();
        while words < target.max(8) {
            let mut para = Vec::new();
            for _ in 0..2 + rng.below(5) {
                let mut s = Vec::new();
                self.vocab.sentence(&mut rng, &mut s);
                words += s.len();
                para.push(s);
            }
            paras.push(para);
        }
        paras
    }

    fn edit(&self, article: &mut Article, seed: u64) {
        let mut rng = SplitMix64::new(seed);
        let spread = (self.args.max_edit_rate - 0.002).max(0.0);
        let rate = 0.002 + spread * (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        for para in article.iter_mut() {
            for s in para.iter_mut() {
                for w in s.iter_mut() {
                    if (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= rate {
                        *w = self.vocab.word(&mut rng).to_string();
                    }
                }
            }
        }
        let p = rng.below(article.len() as u64) as usize;
        let change = rng.below(4);
        if change == 0 && article[p].len() > 1 {
            let s = rng.below(article[p].len() as u64) as usize;
            article[p].remove(s);
        } else if change == 1 {
            let mut s = Vec::new();
            self.vocab.sentence(&mut rng, &mut s);
            article[p].push(s);
        }
    }

    fn render(
        &mut self,
        (index, site, ts): (usize, usize, i64),
        visible_seed: u64,
        article: &Article,
        shout: bool,
    ) -> String {
        let rng = &mut self.rng;
        let visible = &mut SplitMix64::new(visible_seed);
        let s = &self.sites[site];
        let title: Vec<&str> = article[0][0].iter().take(6).map(String::as_str).collect();
        let title = cap(&title.join(" "));
        let related: Vec<String> = (0..self.args.related)
            .map(|_| (0..5).map(|_| self.vocab.word(visible)).collect::<Vec<_>>().join(" "))
            .collect();
        let views = visible.below(100_000);
        let sentence_text = |sent: &Vec<String>| {
            let t = format!("{}.", cap(&sent.join(" ")));
            if shout { t.to_uppercase() } else { t }
        };
        if self.args.plain {
            let mut out = format!("{}\n{}\n\n{title}\n\n", s.name, s.nav.join(" | "));
            for para in article {
                out.push_str(&para.iter().map(sentence_text).collect::<Vec<_>>().join(" "));
                out.push_str("\n\n");
            }
            out.push_str(&format!(
                "{views} views. Related: {}\n{}\n",
                related.join("; "),
                s.footer
            ));
            return out;
        }
        let mut h = String::with_capacity(8192);
        h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        h.push_str(&format!("<title>{title} &mdash; {}</title>", s.name));
        h.push_str(&format!("<style>{}</style>", s.style));
        h.push_str(&format!(
            "<script>window.dataLayer=window.dataLayer||[];dataLayer.push({{'page':{index},'ts':{ts},'r':'{:016x}'}});\
             function track(e){{if(e&&e.target){{var x=e.target.getAttribute('data-id');navigator.sendBeacon('/t?'+x)}}}}</script>",
            rng.next_u64()
        ));
        h.push_str("</head>\n<body><div class=\"nav\">");
        for n in &s.nav {
            h.push_str(&format!("<a href=\"/{}\">{n}</a> ", n.to_lowercase()));
        }
        h.push_str(&format!(
            "</div>\n<header><h1>{}</h1></header>\n<main><article><h2>{title}</h2>\n",
            s.name
        ));
        for para in article {
            h.push_str("<p>");
            h.push_str(&para.iter().map(sentence_text).collect::<Vec<_>>().join(" "));
            h.push_str("</p>\n");
        }
        h.push_str(&format!(
            "</article></main>\n<aside class=\"side\"><p>{views} views</p><h3>Related</h3><ul>"
        ));
        for r in &related {
            h.push_str(&format!("<li><a href=\"/r/{:x}\">{}</a></li>", rng.below(1 << 30), cap(r)));
        }
        h.push_str(&format!(
            "</ul></aside>\n<footer><p>{} &copy; {}</p></footer>\n<!-- served by node {} -->\n</body></html>\n",
            s.footer,
            s.name,
            rng.below(64)
        ));
        h
    }
}

impl Iterator for Pages {
    type Item = Page;

    fn next(&mut self) -> Option<Page> {
        let index = self.history.len();
        if index >= self.args.docs {
            return None;
        }
        let base = 1_600_000_000i64;
        let roll = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let copy_of = (index > 0).then(|| self.rng.below(index as u64) as usize);
        let (planted, article_seed, site, ts, edit, visible) = match copy_of {
            Some(src) if roll < self.args.exact_fraction => {
                let (seed, site, ts, edit, visible) = self.history[src];
                let ts = self.copy_time(ts);
                (Planted::Exact(src), seed, site, ts, edit, visible)
            }
            Some(src) if roll < self.args.exact_fraction + self.args.near_fraction => {
                let (seed, site, ts, _, _) = self.history[src];
                let site = if self.rng.below(4) == 0 {
                    self.rng.below(self.sites.len() as u64) as usize
                } else {
                    site
                };
                let ts = self.copy_time(ts);
                (Planted::Near(src), seed, site, ts, Some(self.rng.next_u64()), self.rng.next_u64())
            }
            _ => {
                let seed = self.rng.next_u64();
                let site = self.rng.below(self.sites.len() as u64) as usize;
                let ts = base + index as i64 * 600 + self.rng.below(600) as i64;
                (Planted::Fresh, seed, site, ts, None, self.rng.next_u64())
            }
        };
        // An exact copy of a near copy repeats the same edit, so the text is identical.
        let mut article = self.article(article_seed);
        if let Some(e) = edit {
            self.edit(&mut article, e);
        }
        self.history.push((article_seed, site, ts, edit, visible));
        let shout = matches!(planted, Planted::Exact(_)) && self.rng.below(3) == 0;
        let body = self.render((index, site, ts), visible, &article, shout);
        Some(Page {
            index,
            url: format!("https://site{site}.example/{index:07}.html"),
            site,
            timestamp: ts,
            body,
            planted,
        })
    }
}

impl Pages {
    fn copy_time(&mut self, source_ts: i64) -> i64 {
        let delta = 60 + self.rng.below(30 * 86_400) as i64;
        if self.rng.below(5) == 0 { source_ts - delta } else { source_ts + delta }
    }
}

fn cap(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// RFC 3339 (UTC) text of Unix seconds.
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Writes the corpus `args` describe.
pub fn run_generate(args: GenerateArgs) -> Result<Generated, DedupError> {
    if !(0.0..=1.0).contains(&(args.exact_fraction + args.near_fraction))
        || args.exact_fraction < 0.0
        || args.near_fraction < 0.0
    {
        return Err(DedupError::Usage(
            "the planted fractions must be >= 0 and sum to at most 1".into(),
        ));
    }
    let mut g = Generated { docs: 0, bytes: 0, exact: 0, near: 0 };
    let mut jsonl = match args.layout {
        Layout::Jsonl => Some(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&args.out).map_err(|e| DedupError::io(args.out.display(), e))?,
        )),
        Layout::Dir => None,
    };
    for page in Pages::new(&args) {
        let planted = match page.planted {
            Planted::Fresh => "fresh".to_string(),
            Planted::Exact(s) => {
                g.exact += 1;
                format!("exact:{s}")
            }
            Planted::Near(s) => {
                g.near += 1;
                format!("near:{s}")
            }
        };
        g.docs += 1;
        match jsonl.as_mut() {
            Some(w) => {
                let line = serde_json::json!({
                    "id": page.index, "url": page.url, "site": page.site,
                    "timestamp": rfc3339(page.timestamp), "planted": planted, "text": page.body,
                })
                .to_string();
                g.bytes += line.len() as u64 + 1;
                writeln!(w, "{line}").map_err(|e| DedupError::io(args.out.display(), e))?;
            }
            None => {
                let dir = args.out.join(format!("{:04}", page.index / 1000));
                if page.index % 1000 == 0 {
                    std::fs::create_dir_all(&dir).map_err(|e| DedupError::io(dir.display(), e))?;
                }
                let ext = if args.plain { "txt" } else { "html" };
                let p = dir.join(format!("{:07}.{ext}", page.index));
                std::fs::write(&p, &page.body).map_err(|e| DedupError::io(p.display(), e))?;
                g.bytes += page.body.len() as u64;
            }
        }
    }
    if let Some(mut w) = jsonl {
        w.flush().map_err(|e| DedupError::io(args.out.display(), e))?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        for secs in [0i64, 1, 86_399, 951_782_400, 1_709_210_096, -1, 4_102_444_800] {
            assert_eq!(crate::timestamp::parse_rfc3339(&rfc3339(secs)), Ok(secs * 1000), "{secs}");
        }
    }

    #[test]
    fn seeded_and_planted() {
        let mut a = GenerateArgs::new(PathBuf::new(), 200);
        a.words = 60;
        let p1: Vec<Page> = Pages::new(&a).collect();
        let p2: Vec<Page> = Pages::new(&a).collect();
        assert_eq!(p1.len(), 200);
        assert!(p1.iter().zip(&p2).all(|(x, y)| x.body == y.body && x.timestamp == y.timestamp));
        assert!(p1.iter().any(|p| matches!(p.planted, Planted::Exact(_))));
        assert!(p1.iter().any(|p| matches!(p.planted, Planted::Near(_))));
        a.seed = 2;
        let p3: Vec<Page> = Pages::new(&a).collect();
        assert!(p1.iter().zip(&p3).any(|(x, y)| x.body != y.body));
    }
}
