//! `neardup dedup`: every document's duplicate cluster and original.
//!
//! The run, in passes over the input:
//!
//! 1. **Fingerprint** every document on all cores ([`crate::pipeline`]); keep per document
//!    only its simhash, content hash, timestamp, id and record number.
//! 2. **Group exact duplicates** by content hash and **self-join** the groups'
//!    representatives with the core index: every pair within `k` ([`crate::clusters`]).
//! 3. **Verify** (unless `--no-verify`): read the input again, shingle only the documents
//!    in candidate pairs (word 3-grams over normalised units, as the ground truth) and keep
//!    the pairs whose exact Jaccard similarity is at least `J` (`--verify`, 0.9).
//!
//! The defaults (verify at J = 0.9 the candidates within k = 8; k = 3 without verifying)
//! are chosen from measured precision and recall on real text: `docs/quality.md`.
//! 4. **Cluster** under the chosen rule and pick originals.
//! 5. **Write** one record per document in input order (re-reading JSONL input to copy its
//!    other fields through), and the summary.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::jaccard::jaccard;
use neardup_core::cluster::Rule;
use neardup_core::fingerprint::Fingerprinter;
use neardup_core::util::hamming;
use rayon::prelude::*;

use crate::clusters::{Assignments, DocKey, Edge, ExactGroups, assign, near_pairs};
use crate::config::FingerprintArgs;
use crate::decode::Found;
use crate::error::{DedupError, SkipReason};
use crate::input::{InputFormat, Inputs, SourceKind, read_all};
use crate::output::{OutputFormat, Row, RowWriter};
use crate::pipeline::{OnError, Progress, ScanOptions, Skipped, scan};

/// The default Hamming distance with `--no-verify` (chosen in `docs/quality.md`).
pub const DEFAULT_K: u32 = 3;
/// The default candidate distance when pairs are verified (chosen in `docs/quality.md`).
pub const DEFAULT_VERIFY_K: u32 = 8;
/// The default `--verify` Jaccard threshold (chosen in `docs/quality.md`).
pub const DEFAULT_VERIFY_J: f64 = 0.9;
/// Shingle size of the `--verify` Jaccard similarity (word 3-grams, as the ground truth).
pub const VERIFY_NGRAM: usize = 3;
/// The default `--max-doc-bytes`: 16 MiB, far above any web page's text, small enough that
/// one worker per core holding one such document stays within a few hundred MB.
pub const DEFAULT_MAX_DOC_BYTES: u64 = 16 << 20;
/// Duplicate ids named one by one on stderr before the rest are only counted.
const DUPLICATE_IDS_SHOWN: usize = 20;

/// The clustering rule, as a command-line value (see `neardup_core::cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ClusterRule {
    /// Each document joins the cluster of its earliest near-duplicate that is an original,
    /// or is an original itself: every member is a near-duplicate of its original.
    #[default]
    AttachToOriginal,
    /// Connected components of the near-duplicate graph: chains join, so a member can be far
    /// from its original.
    Components,
}

impl From<ClusterRule> for Rule {
    fn from(r: ClusterRule) -> Rule {
        match r {
            ClusterRule::AttachToOriginal => Rule::AttachToOriginal,
            ClusterRule::Components => Rule::ConnectedComponents,
        }
    }
}

/// Options of `neardup dedup`.
///
/// Output: one record per document, in input order: `id`, `fingerprint` (16 hex digits),
/// `cluster` (a number from 0, clusters numbered in input order of their originals),
/// `original` (the cluster original's id), `is_original`, `nearest` (the id of its nearest
/// near-duplicate, or null), `distance` (fingerprint bits between the two), and
/// `exact_duplicate_of` (the id of the earliest document with the same normalised text, or
/// null); with verification also `jaccard` (the similarity to `nearest`). JSONL records
/// carry the input's other fields after these (`text` only with `--keep-text`). Skipped
/// documents are not in the output; they are reported on stderr and counted in the summary.
#[derive(Debug, Clone, clap::Args)]
pub struct DedupArgs {
    /// JSONL files, document files (plain text or HTML) or directories of them; none or `-`
    /// reads JSONL from stdin. A JSONL record has `id` (a string or an integer), `text`, an
    /// optional `timestamp` (Unix seconds as a number, or RFC 3339 text such as
    /// 2024-05-01T12:00:00Z; documents without one come after all dated ones) and any other
    /// fields, which are copied to the output. A document file's id is its path; it is
    /// read in the encoding its byte order mark or (for HTML) its `<meta charset>` declares,
    /// else as UTF-8 when it is valid UTF-8, else in a guessed encoding (the summary counts
    /// documents by encoding). Only regular files (and links to them) are read: FIFOs,
    /// devices and sockets are skipped with a reason; links to directories are not followed.
    /// Ids should be unique: one used again is warned about and counted.
    pub inputs: Vec<PathBuf>,
    /// How to read the inputs.
    #[arg(long, value_enum, default_value_t)]
    pub input_format: InputFormat,
    /// Treat every text as HTML (strip tags), also the `text` of JSONL records.
    #[arg(long)]
    pub html: bool,
    /// Write the records here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
    /// Near-duplicates differ in at most k fingerprint bits [default: 8 for candidates to
    /// verify; 3 with --no-verify].
    #[arg(short, long)]
    pub k: Option<u32>,
    /// How near-duplicate pairs become clusters.
    #[arg(long, value_enum, default_value_t)]
    pub rule: ClusterRule,
    /// Confirm each pair within k by exact word 3-gram Jaccard similarity >= J (a second
    /// pass over the input); cluster on confirmed pairs only.
    #[arg(long, value_name = "J", default_value_t = DEFAULT_VERIFY_J)]
    pub verify: f64,
    /// Do not verify: every pair within k (default 3) is a near-duplicate (the paper's
    /// method; one pass, lower recall or precision).
    #[arg(long, conflicts_with = "verify")]
    pub no_verify: bool,
    /// What to do with a bad document (broken JSON, no id or text, too large, not a file,
    /// empty).
    #[arg(long, value_enum, default_value_t)]
    pub on_error: OnError,
    /// The largest document read, in bytes: a document file, a JSONL line, or stdin as one
    /// document. A larger one is skipped (reported and counted) without being read into
    /// memory.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_DOC_BYTES)]
    pub max_doc_bytes: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Write every skipped document (location and reason) as JSONL to this file.
    #[arg(long)]
    pub skipped: Option<PathBuf>,
    /// Copy the `text` field of JSONL input to the output too.
    #[arg(long)]
    pub keep_text: bool,
    /// Worker threads for fingerprinting [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory budget for the self-join's tables, in MB (the design is chosen to fit it).
    #[arg(long, default_value_t = 2048)]
    pub index_memory_mb: u64,
    /// No progress line and no summary on stderr (skipped documents are still reported).
    #[arg(short, long)]
    pub quiet: bool,
    /// The fingerprint configuration.
    #[command(flatten)]
    pub fingerprint: FingerprintArgs,
}

impl DedupArgs {
    /// The Jaccard threshold pairs are verified with, or `None` with `--no-verify`.
    pub fn verify_threshold(&self) -> Option<f64> {
        (!self.no_verify).then_some(self.verify)
    }

    /// Arguments for `inputs` with every default.
    pub fn new(inputs: Vec<PathBuf>) -> DedupArgs {
        DedupArgs {
            inputs,
            input_format: InputFormat::Auto,
            html: false,
            output: None,
            format: OutputFormat::Jsonl,
            k: None,
            rule: ClusterRule::AttachToOriginal,
            verify: DEFAULT_VERIFY_J,
            no_verify: false,
            on_error: OnError::Skip,
            max_doc_bytes: DEFAULT_MAX_DOC_BYTES,
            summary: None,
            skipped: None,
            keep_text: false,
            threads: None,
            index_memory_mb: 2048,
            quiet: false,
            fingerprint: FingerprintArgs::default(),
        }
    }
}

/// What a dedup run found.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Documents fingerprinted (skipped ones not included).
    pub documents: usize,
    /// Bytes of input read in the first pass (JSONL lines or files).
    pub input_bytes: u64,
    /// Documents whose normalised text is identical to an earlier document's.
    pub exact_duplicates: usize,
    /// Documents with a near-duplicate that is not an exact duplicate of them.
    pub near_duplicate_documents: usize,
    /// Documents that are not their cluster's original.
    pub duplicate_documents: usize,
    /// Clusters, singletons included.
    pub clusters: usize,
    /// Clusters with two or more members.
    pub duplicate_clusters: usize,
    /// Members of the largest cluster.
    pub largest_cluster: usize,
    /// Pairs of distinct texts within k.
    pub candidate_pairs: usize,
    /// With `--verify`: pairs whose Jaccard similarity reached J.
    pub confirmed_pairs: Option<usize>,
    /// Skipped documents by reason (`broken_json`, `missing_id`, `missing_text`,
    /// `bad_field`, `too_large`, `not_a_file`, `empty`, `unreadable`).
    pub skipped: BTreeMap<String, usize>,
    /// Documents read from document files (and stdin as a document), by the encoding they
    /// were decoded from (`UTF-8`, `windows-1252`, `Shift_JIS`, `UTF-16LE`...). JSONL
    /// records are UTF-8 JSON and not counted here.
    pub encodings: BTreeMap<String, usize>,
    /// Of those, documents whose encoding was guessed (no byte order mark, no declaration,
    /// not UTF-8).
    pub detected_encodings: usize,
    /// Of those, documents with bytes invalid in their encoding (each became U+FFFD).
    pub malformed_documents: usize,
    /// Documents whose id an earlier document already had.
    pub duplicate_ids: usize,
    /// Blank JSONL lines (not documents).
    pub blank_lines: u64,
    /// The k used.
    pub k: u32,
    /// The `--verify` threshold.
    pub verify: Option<f64>,
    /// The clustering rule.
    pub rule: ClusterRule,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Seconds per phase: `fingerprint`, `join`, `verify`, `cluster`, `output`.
    pub phase_seconds: BTreeMap<&'static str, f64>,
}

impl Summary {
    /// Skipped documents in all.
    pub fn skipped_total(&self) -> usize {
        self.skipped.values().sum()
    }

    /// Documents decoded from an encoding other than UTF-8.
    pub fn non_utf8_documents(&self) -> usize {
        self.encodings.iter().filter(|(e, _)| *e != "UTF-8").map(|(_, n)| n).sum()
    }

    /// The summary as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "documents": self.documents,
            "input_bytes": self.input_bytes,
            "exact_duplicates": self.exact_duplicates,
            "near_duplicate_documents": self.near_duplicate_documents,
            "duplicate_documents": self.duplicate_documents,
            "clusters": self.clusters,
            "duplicate_clusters": self.duplicate_clusters,
            "largest_cluster": self.largest_cluster,
            "candidate_pairs": self.candidate_pairs,
            "confirmed_pairs": self.confirmed_pairs,
            "skipped": self.skipped_total(),
            "skipped_by_reason": self.skipped,
            "blank_lines": self.blank_lines,
            "encodings": self.encodings,
            "non_utf8_documents": self.non_utf8_documents(),
            "detected_encodings": self.detected_encodings,
            "malformed_documents": self.malformed_documents,
            "duplicate_ids": self.duplicate_ids,
            "k": self.k,
            "verify": self.verify,
            "rule": match self.rule {
                ClusterRule::AttachToOriginal => "attach-to-original",
                ClusterRule::Components => "components",
            },
            "seconds": self.seconds,
            "phase_seconds": self.phase_seconds,
            "mb_per_second": self.input_bytes as f64 / 1e6 / self.seconds.max(1e-9),
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} documents ({:.1} MB) in {:.2} s ({:.1} MB/s)",
            self.documents,
            self.input_bytes as f64 / 1e6,
            self.seconds,
            self.input_bytes as f64 / 1e6 / self.seconds.max(1e-9)
        )?;
        writeln!(f, "  exact duplicates:         {}", self.exact_duplicates)?;
        writeln!(f, "  near-duplicate documents: {}", self.near_duplicate_documents)?;
        writeln!(f, "  duplicates of an original: {}", self.duplicate_documents)?;
        writeln!(
            f,
            "  clusters:                 {} ({} with 2+ documents, largest {})",
            self.clusters, self.duplicate_clusters, self.largest_cluster
        )?;
        match (self.verify, self.confirmed_pairs) {
            (Some(j), Some(c)) => writeln!(
                f,
                "  pairs within k = {}:      {} candidates, {} with Jaccard >= {j}",
                self.k, self.candidate_pairs, c
            )?,
            _ => writeln!(f, "  pairs within k = {}:      {}", self.k, self.candidate_pairs)?,
        }
        let other = self.non_utf8_documents();
        if other > 0 {
            let which: Vec<String> = self
                .encodings
                .iter()
                .filter(|(e, _)| *e != "UTF-8")
                .map(|(e, n)| format!("{e} {n}"))
                .collect();
            writeln!(
                f,
                "  decoded from other encodings: {other} ({}; {} guessed)",
                which.join(", "),
                self.detected_encodings
            )?;
        }
        if self.malformed_documents > 0 {
            writeln!(
                f,
                "  with undecodable bytes:   {} (each became U+FFFD)",
                self.malformed_documents
            )?;
        }
        if self.duplicate_ids > 0 {
            writeln!(
                f,
                "  duplicate ids:            {} (documents whose id an earlier one has)",
                self.duplicate_ids
            )?;
        }
        let skipped = self.skipped_total();
        if skipped == 0 {
            write!(f, "  skipped:                  0")
        } else {
            let why: Vec<String> = self.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
            write!(f, "  skipped:                  {skipped} ({})", why.join(", "))
        }
    }
}

/// Per-document data kept through the run.
struct DocInfo {
    key: DocKey,
    source: u32,
    seq: u64,
    /// Line in a JSONL source (0 for a document file), for messages.
    line: u64,
}

/// An id as a value: the contents of a JSON string, or an integer's text. `"a"` and
/// `"\u0061"` are the same id; `"1"` and `1` are not.
fn id_key(id: &str) -> (bool, std::borrow::Cow<'_, str>) {
    match id.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => (true, inner.into()),
        Some(_) => (true, serde_json::from_str::<String>(id).map_or(id.into(), Into::into)),
        None => (false, id.into()),
    }
}

/// Warns on stderr about ids that more than one document has (each id once, the first
/// [`DUPLICATE_IDS_SHOWN`] of them, with where they are) and returns how many documents
/// have an id an earlier one had. Sorts 16-byte hashes rather than building a map of the
/// ids, so that it costs little memory beside the ids.
fn duplicate_ids(ids: &[Box<str>], location: impl Fn(usize) -> String) -> usize {
    use xxhash_rust::xxh3::xxh3_64_with_seed;
    let mut hashed: Vec<(u64, u32)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (string, key) = id_key(id);
            (xxh3_64_with_seed(key.as_bytes(), string as u64), i as u32)
        })
        .collect();
    hashed.sort_unstable();
    // Groups of documents with the same id, each in input order.
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for run in hashed.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
        let mut members: Vec<(std::borrow::Cow<'_, str>, bool, u32)> = run
            .iter()
            .map(|&(_, i)| {
                let (string, key) = id_key(&ids[i as usize]);
                (key, string, i)
            })
            .collect();
        members.sort_unstable();
        for same in members.chunk_by(|a, b| (&a.0, a.1) == (&b.0, b.1)).filter(|g| g.len() > 1) {
            groups.push(same.iter().map(|m| m.2).collect());
        }
    }
    groups.sort_unstable_by_key(|g| g[0]);
    for g in groups.iter().take(DUPLICATE_IDS_SHOWN) {
        let more = match g.len() - 2 {
            0 => String::new(),
            n => format!(" (and {n} more)"),
        };
        eprintln!(
            "neardup: warning: duplicate id {} at {} and {}{more}",
            ids[g[0] as usize],
            location(g[0] as usize),
            location(g[1] as usize)
        );
    }
    if groups.len() > DUPLICATE_IDS_SHOWN {
        eprintln!(
            "neardup: warning: ... and {} more ids used more than once (the summary counts \
             every document)",
            groups.len() - DUPLICATE_IDS_SHOWN
        );
    }
    groups.iter().map(|g| g.len() - 1).sum()
}

pub(crate) fn threads(arg: Option<usize>) -> usize {
    arg.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1)
}

pub(crate) fn report_skipped(
    skipped: &[Skipped],
    file: Option<&PathBuf>,
) -> Result<BTreeMap<String, usize>, DedupError> {
    const SHOWN: usize = 20;
    let mut counts = BTreeMap::new();
    for (i, s) in skipped.iter().enumerate() {
        *counts.entry(s.reason.key().to_string()).or_insert(0) += 1;
        if i < SHOWN {
            eprintln!("neardup: skipped {}: {}", s.location, s.reason);
        }
    }
    if skipped.len() > SHOWN {
        let more = skipped.len() - SHOWN;
        match file {
            Some(p) => {
                eprintln!("neardup: ... and {more} more skipped, all listed in {}", p.display())
            }
            None => eprintln!("neardup: ... and {more} more skipped (--skipped FILE lists all)"),
        }
    }
    if let Some(p) = file {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| DedupError::io(p.display(), e))?,
        );
        for s in skipped {
            let line = serde_json::json!({
                "location": s.location,
                "reason": s.reason.key(),
                "message": s.reason.to_string(),
            });
            writeln!(out, "{line}").map_err(|e| DedupError::io(p.display(), e))?;
        }
        out.flush().map_err(|e| DedupError::io(p.display(), e))?;
    }
    Ok(counts)
}

/// Runs `neardup dedup`: writes one record per document and returns the summary (also
/// printed on stderr unless `quiet`, and written to `--summary` as JSON).
pub fn run_dedup(args: DedupArgs) -> Result<Summary, DedupError> {
    let start = Instant::now();
    let config = args.fingerprint.config()?;
    let verify = args.verify_threshold();
    if let Some(j) = verify
        && !(j > 0.0 && j <= 1.0)
    {
        return Err(DedupError::Usage(format!("--verify {j}: J must be in (0, 1]")));
    }
    let k = args.k.unwrap_or(if verify.is_some() { DEFAULT_VERIFY_K } else { DEFAULT_K });
    if k > 16 {
        return Err(DedupError::Usage(format!("-k {k}: at most 16 bits are supported")));
    }
    if args.format == OutputFormat::Csv && args.keep_text {
        return Err(DedupError::Usage("--keep-text needs --format jsonl".into()));
    }
    if args.max_doc_bytes == 0 {
        return Err(DedupError::Usage("--max-doc-bytes 0: must be at least 1".into()));
    }
    let mut inputs = Inputs::resolve(&args.inputs, args.input_format, args.html)?;
    inputs.max_doc_bytes = args.max_doc_bytes;
    // Open the output first: a bad path should fail before the work.
    let sink: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| DedupError::io(p.display(), e))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let opts = ScanOptions {
        threads: threads(args.threads),
        on_error: args.on_error,
        progress: !args.quiet,
        label: "fingerprinting",
    };
    let mut phases = BTreeMap::new();

    // 1. Fingerprints.
    let t = Instant::now();
    let scanned = scan(
        &mut inputs,
        &|_| true,
        &opts,
        || Fingerprinter::new(config).expect("configuration checked above"),
        |f, doc| match f.fingerprint_doc(&doc.text) {
            Ok(d) => Ok((d.simhash, d.content_hash)),
            Err(neardup_core::Error::EmptyDocument) => Err(SkipReason::Empty),
            Err(e) => Err(SkipReason::BadField(e.to_string())),
        },
    )?;
    phases.insert("fingerprint", t.elapsed().as_secs_f64());
    let skipped = report_skipped(&scanned.skipped, args.skipped.as_ref())?;
    let input_bytes = scanned.stats.bytes;
    let mut ids: Vec<Box<str>> = Vec::with_capacity(scanned.docs.len());
    let mut docs: Vec<DocInfo> = Vec::with_capacity(scanned.docs.len());
    let mut encodings: BTreeMap<String, usize> = BTreeMap::new();
    let (mut detected_encodings, mut malformed_documents) = (0, 0);
    for a in scanned.docs {
        if let Some(d) = a.decoding {
            *encodings.entry(d.encoding.name().to_string()).or_default() += 1;
            detected_encodings += usize::from(d.found == Found::Detected);
            malformed_documents += usize::from(d.malformed);
        }
        ids.push(a.id);
        docs.push(DocInfo {
            key: DocKey { fp: a.value.0, content_hash: a.value.1, timestamp: a.timestamp },
            source: a.source,
            seq: a.seq,
            line: a.line,
        });
    }
    let duplicate_ids = duplicate_ids(&ids, |i| {
        let d = &docs[i];
        let shown = &inputs.sources[d.source as usize].display;
        if d.line > 0 { format!("{shown}:{}", d.line) } else { shown.clone() }
    });
    let keys: Vec<DocKey> = docs.iter().map(|d| d.key).collect();

    // 2. Exact groups and the self-join over their representatives.
    let mut status = Progress::new(!args.quiet, "dedup", None);
    status.status(&format!("finding every pair within k = {k}"));
    let t = Instant::now();
    let groups = ExactGroups::new(&keys)?;
    let rep_fps: Vec<u64> = groups.reps.iter().map(|&d| keys[d as usize].fp).collect();
    let pairs = near_pairs(&rep_fps, k, args.index_memory_mb.saturating_mul(1 << 20))?;
    let candidate_pairs = pairs.len();
    phases.insert("join", t.elapsed().as_secs_f64());

    // 3. Verification.
    let edges: Vec<Edge> = match verify {
        None => pairs
            .iter()
            .map(|&(a, b, _)| Edge {
                a: groups.reps[a as usize],
                b: groups.reps[b as usize],
                jaccard: None,
            })
            .collect(),
        Some(threshold) => {
            let t = Instant::now();
            let e = verify_pairs(&mut inputs, &docs, &groups, &pairs, threshold, &opts, config)?;
            phases.insert("verify", t.elapsed().as_secs_f64());
            e
        }
    };
    let confirmed_pairs = verify.map(|_| edges.len());

    // 4. Clusters.
    status.status("clustering");
    let t = Instant::now();
    let assigned: Assignments = assign(&keys, &groups, &edges, args.rule.into())?;
    phases.insert("cluster", t.elapsed().as_secs_f64());

    // 5. Output.
    status.status("writing the records");
    let t = Instant::now();
    write_output(&mut inputs, sink, &args, &docs, &ids, &assigned)?;
    phases.insert("output", t.elapsed().as_secs_f64());

    let clusters = assigned.cluster_sizes.len();
    let summary = Summary {
        documents: docs.len(),
        input_bytes,
        exact_duplicates: groups.duplicates(),
        near_duplicate_documents: assigned.near_duplicate_documents,
        duplicate_documents: docs.len() - clusters,
        clusters,
        duplicate_clusters: assigned.cluster_sizes.iter().filter(|&&s| s > 1).count(),
        largest_cluster: assigned.cluster_sizes.iter().copied().max().unwrap_or(0) as usize,
        candidate_pairs,
        confirmed_pairs,
        skipped,
        blank_lines: scanned.stats.blank_lines,
        encodings,
        detected_encodings,
        malformed_documents,
        duplicate_ids,
        k,
        verify,
        rule: args.rule,
        seconds: start.elapsed().as_secs_f64(),
        phase_seconds: phases,
    };
    status.finish();
    if let Some(p) = &args.summary {
        let text = serde_json::to_string_pretty(&summary.to_json()).unwrap_or_default();
        std::fs::write(p, text + "\n").map_err(|e| DedupError::io(p.display(), e))?;
    }
    if !args.quiet {
        eprintln!("{summary}");
    }
    Ok(summary)
}

/// Pass 2 of `--verify`: shingles of the documents in candidate pairs, and the pairs whose
/// Jaccard similarity reaches `threshold`.
fn verify_pairs(
    inputs: &mut Inputs,
    docs: &[DocInfo],
    groups: &ExactGroups,
    pairs: &[(u32, u32, u32)],
    threshold: f64,
    opts: &ScanOptions,
    config: neardup_core::fingerprint::FingerprintConfig,
) -> Result<Vec<Edge>, DedupError> {
    // Documents (representatives) in a candidate pair, by record number.
    let mut needed: Vec<u32> = pairs
        .iter()
        .flat_map(|&(a, b, _)| [groups.reps[a as usize], groups.reps[b as usize]])
        .collect();
    needed.sort_unstable();
    needed.dedup();
    let seqs: Vec<u64> = needed.iter().map(|&d| docs[d as usize].seq).collect();
    let want = |seq: u64| seqs.binary_search(&seq).is_ok();
    let opts = ScanOptions { label: "verifying", on_error: OnError::Stop, ..opts.clone() };
    let scanned = scan(
        inputs,
        &want,
        &opts,
        || Fingerprinter::new(config).expect("configuration checked before"),
        |f, doc| {
            f.word_shingles(&doc.text, VERIFY_NGRAM)
                .map_err(|e| SkipReason::BadField(e.to_string()))
        },
    )
    .map_err(|e| DedupError::Usage(format!("the input changed between passes: {e}")))?;
    if scanned.docs.len() != seqs.len() || scanned.docs.iter().zip(&seqs).any(|(a, &s)| a.seq != s)
    {
        return Err(DedupError::Usage(
            "the input changed between passes: documents of the first pass are missing".into(),
        ));
    }
    // needed[i] has the shingles scanned.docs[i].value (both in record order).
    let sets: Vec<Vec<u64>> = scanned.docs.into_iter().map(|a| a.value).collect();
    let pos = |d: u32| {
        needed
            .binary_search(&d)
            .map_err(|_| DedupError::Usage("internal: document not shingled".into()))
    };
    let mut jobs = Vec::with_capacity(pairs.len());
    for &(a, b, _) in pairs {
        let (da, db) = (groups.reps[a as usize], groups.reps[b as usize]);
        jobs.push((da, db, pos(da)?, pos(db)?));
    }
    Ok(jobs
        .par_iter()
        .filter_map(|&(da, db, pa, pb)| {
            let j = jaccard(&sets[pa], &sets[pb]);
            (j >= threshold).then_some(Edge { a: da, b: db, jaccard: Some(j) })
        })
        .collect())
}

fn write_output(
    inputs: &mut Inputs,
    sink: Box<dyn Write>,
    args: &DedupArgs,
    docs: &[DocInfo],
    ids: &[Box<str>],
    assigned: &Assignments,
) -> Result<(), DedupError> {
    let mut w = RowWriter::new(
        std::io::BufWriter::with_capacity(1 << 20, sink),
        args.format,
        args.keep_text,
        args.verify_threshold().is_some(),
    )?;
    let verified = args.verify_threshold().is_some();
    let row = |i: usize| {
        let a = &assigned.docs[i];
        Row {
            id: &ids[i],
            fingerprint: docs[i].key.fp,
            cluster: a.cluster,
            original: &ids[a.original as usize],
            is_original: a.is_original,
            nearest: a.nearest.map(|n| &*ids[n as usize]),
            distance: a.nearest.map(|n| hamming(docs[i].key.fp, docs[n as usize].key.fp)),
            exact_duplicate_of: a.exact_duplicate_of.map(|n| &*ids[n as usize]),
            jaccard: verified.then_some(a.nearest_jaccard),
        }
    };
    let copy_fields = args.format == OutputFormat::Jsonl && inputs.has_jsonl();
    if !copy_fields {
        for i in 0..docs.len() {
            w.row(&row(i), None)?;
        }
        return w.finish();
    }
    // Re-read the JSONL records of accepted documents in order; documents from other
    // sources are written in between, by record number.
    let is_jsonl: Vec<bool> = inputs.sources.iter().map(|s| s.kind == SourceKind::Jsonl).collect();
    let wanted: Vec<u64> =
        docs.iter().filter(|d| is_jsonl[d.source as usize]).map(|d| d.seq).collect();
    let want = |seq: u64| wanted.binary_search(&seq).is_ok();
    let mut next = 0usize;
    let mut failure: Option<DedupError> = None;
    let bytes = std::sync::atomic::AtomicU64::new(0);
    read_all(inputs, &want, &bytes, |raw| {
        let result = (|| {
            while next < docs.len() && docs[next].seq < raw.seq {
                w.row(&row(next), None)?;
                next += 1;
            }
            if next >= docs.len() || docs[next].seq != raw.seq {
                return Err(DedupError::Usage("the input changed between passes".into()));
            }
            let line = raw.bytes.as_ref().map_err(|e| DedupError::Usage(e.to_string()))?;
            w.row(&row(next), Some(line))?;
            next += 1;
            Ok(())
        })();
        match result {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    while next < docs.len() {
        w.row(&row(next), None)?;
        next += 1;
    }
    w.finish()
}
