//! Reading documents: JSONL records, document files (plain text or HTML), or stdin.
//!
//! What is read is bounded: only regular files are opened (a FIFO would wait for a writer
//! forever, a link to `/dev/zero` never ends), each checked before it is opened; a document
//! file larger than `--max-doc-bytes` is not read, and a JSONL line longer than that is
//! skipped over without being kept, so one huge record cannot take the memory of the run.
//! Symbolic links to regular files are followed; links to directories are not (so a link
//! loop cannot make a walk endless), and a link that leads nowhere, or round in a loop, is
//! a document that cannot be read. Document files are decoded from their own encoding
//! ([`crate::decode`]).
//!
//! Input is streamed. A reader thread cuts the input into raw records (a JSONL line or a
//! whole document file) and hands them to the workers in bounded batches; parsing, tag
//! stripping and fingerprinting happen on the workers ([`crate::pipeline`]). Nothing keeps a
//! text after its document is done, so memory follows the number of documents, not the size
//! of the corpus.
//!
//! Every run reads the input in the same order and numbers the records the same way (blank
//! JSONL lines get no number), so a second pass (`--verify`, and the output pass that copies
//! JSONL fields through) finds the same documents under the same numbers. Stdin can be read
//! only once, so the first pass copies it to a temporary file ([`Spool`]) for the later ones.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::decode::{self, Decoding};
use crate::error::{DedupError, SkipReason};
use crate::html;
use crate::timestamp;

/// How to read the inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum InputFormat {
    /// By file name: `.jsonl`/`.ndjson` are JSONL; `.html`/`.htm`/`.xhtml` are HTML documents;
    /// other files are plain-text documents unless they start like an HTML page. Stdin is
    /// JSONL.
    #[default]
    Auto,
    /// Every input (and stdin) is JSONL.
    Jsonl,
    /// Every input file (and stdin) is one plain-text document.
    Text,
    /// Every input file (and stdin) is one HTML document.
    Html,
}

/// How one source is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceKind {
    /// One record per line.
    Jsonl,
    /// The whole file is one document; `Some(true)` HTML, `Some(false)` plain text, `None`
    /// decided by [`html::looks_like_html`].
    Doc(Option<bool>),
}

/// One input: a file, or stdin (no path until it has been spooled).
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub path: Option<PathBuf>,
    /// How locations are shown: the path as given, or `<stdin>`.
    pub display: String,
    pub kind: SourceKind,
    /// Its size in bytes, when known (not for stdin).
    pub size: Option<u64>,
}

/// A temporary copy of stdin, removed when dropped.
#[derive(Debug)]
pub(crate) struct Spool {
    path: PathBuf,
}

impl Spool {
    fn create() -> Result<(Spool, File), DedupError> {
        let dir = std::env::temp_dir();
        for attempt in 0..100u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path =
                dir.join(format!("neardup-stdin-{}-{nanos}-{attempt}.spool", std::process::id()));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(f) => return Ok((Spool { path }, f)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(DedupError::io(path.display(), e)),
            }
        }
        Err(DedupError::Usage(format!("cannot create a spool file in {}", dir.display())))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The resolved inputs of a run, in reading order.
#[derive(Debug)]
pub(crate) struct Inputs {
    pub sources: Vec<Source>,
    /// Treat the text of every document as HTML (`--html`).
    pub force_html: bool,
    pub spool: Option<Spool>,
    /// The largest document read, in bytes (a document file, a JSONL line, stdin as one
    /// document); larger ones are skipped as [`SkipReason::TooLarge`].
    pub max_doc_bytes: u64,
}

impl Inputs {
    /// Resolves `paths` (files and directories; none or `-` for stdin). Directories are
    /// walked recursively in name order; symbolic links to directories are not followed.
    /// Whether each file can be read (a regular file, not too large) is decided when it is
    /// read. Documents are at most [`crate::dedup::DEFAULT_MAX_DOC_BYTES`] until
    /// [`Inputs::max_doc_bytes`] is set.
    pub fn resolve(
        paths: &[PathBuf],
        format: InputFormat,
        force_html: bool,
    ) -> Result<Inputs, DedupError> {
        let mut sources = Vec::new();
        let stdin_kind = match format {
            InputFormat::Auto | InputFormat::Jsonl => SourceKind::Jsonl,
            InputFormat::Text => SourceKind::Doc(Some(false)),
            InputFormat::Html => SourceKind::Doc(Some(true)),
        };
        if paths.is_empty() {
            sources.push(Source {
                path: None,
                display: "<stdin>".into(),
                kind: stdin_kind,
                size: None,
            });
        }
        let mut stdin_seen = false;
        for p in paths {
            if p.as_os_str() == "-" {
                if stdin_seen {
                    return Err(DedupError::Usage("stdin (-) given twice".into()));
                }
                stdin_seen = true;
                sources.push(Source {
                    path: None,
                    display: "<stdin>".into(),
                    kind: stdin_kind,
                    size: None,
                });
                continue;
            }
            let meta = std::fs::metadata(p).map_err(|e| DedupError::io(p.display(), e))?;
            if meta.is_dir() {
                walk(p, format, &mut sources)?;
            } else {
                sources.push(file_source(p, format, Some(regular_len(&meta))));
            }
        }
        Ok(Inputs {
            sources,
            force_html,
            spool: None,
            max_doc_bytes: crate::dedup::DEFAULT_MAX_DOC_BYTES,
        })
    }

    /// Total bytes of the input files, when known (not for stdin).
    pub fn total_bytes(&self) -> Option<u64> {
        self.sources.iter().map(|s| s.size).sum()
    }

    /// Whether any source is JSONL (whose other fields the output copies through).
    pub fn has_jsonl(&self) -> bool {
        self.sources.iter().any(|s| s.kind == SourceKind::Jsonl)
    }
}

/// The size of a regular file; 0 for anything else (it will not be read).
fn regular_len(meta: &std::fs::Metadata) -> u64 {
    if meta.is_file() { meta.len() } else { 0 }
}

fn file_source(p: &Path, format: InputFormat, size: Option<u64>) -> Source {
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let kind = match format {
        InputFormat::Jsonl => SourceKind::Jsonl,
        InputFormat::Text => SourceKind::Doc(Some(false)),
        InputFormat::Html => SourceKind::Doc(Some(true)),
        InputFormat::Auto => match ext.as_str() {
            "jsonl" | "ndjson" => SourceKind::Jsonl,
            "html" | "htm" | "xhtml" => SourceKind::Doc(Some(true)),
            _ => SourceKind::Doc(None),
        },
    };
    Source { path: Some(p.to_path_buf()), display: p.display().to_string(), kind, size }
}

fn walk(dir: &Path, format: InputFormat, out: &mut Vec<Source>) -> Result<(), DedupError> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| DedupError::io(dir.display(), e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| DedupError::io(dir.display(), e))?;
    entries.sort();
    for p in entries {
        let link = std::fs::symlink_metadata(&p).map_err(|e| DedupError::io(p.display(), e))?;
        let meta = if link.file_type().is_symlink() {
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => continue,
                Ok(m) => m,
                // A dangling link is a document that cannot be read: reported as skipped.
                Err(_) => link,
            }
        } else {
            link
        };
        if meta.is_dir() {
            walk(&p, format, out)?;
        } else {
            out.push(file_source(&p, format, Some(regular_len(&meta))));
        }
    }
    Ok(())
}

/// One raw record as the reader cut it.
#[derive(Debug)]
pub(crate) struct Raw {
    /// Record number, from 0, over all sources (blank lines have none).
    pub seq: u64,
    /// Index of its source.
    pub source: u32,
    /// Line number from 1 for JSONL, 0 for a document file.
    pub line: u64,
    /// The line (without its end) or the file, or why it was not read.
    pub bytes: Result<Vec<u8>, SkipReason>,
}

impl Raw {
    /// `FILE:LINE` or the path.
    pub fn location(&self, sources: &[Source]) -> String {
        let s = &sources[self.source as usize];
        if self.line > 0 { format!("{}:{}", s.display, self.line) } else { s.display.clone() }
    }
}

/// What the reader saw besides records.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ReadStats {
    /// Records numbered.
    pub records: u64,
    /// Blank JSONL lines (not records).
    pub blank_lines: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// Reads every source in order, calling `emit` for each record whose number `want` accepts
/// (all records are numbered either way). `emit` returns `false` to stop early. The first
/// read of stdin is copied to a spool file, which later reads use.
pub(crate) fn read_all(
    inputs: &mut Inputs,
    want: &(dyn Fn(u64) -> bool + Sync),
    bytes_read: &std::sync::atomic::AtomicU64,
    mut emit: impl FnMut(Raw) -> bool,
) -> Result<ReadStats, DedupError> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut stats = ReadStats::default();
    let mut seq = 0u64;
    let max = inputs.max_doc_bytes;
    for si in 0..inputs.sources.len() {
        let source = inputs.sources[si].clone();
        let mut spool_file = None;
        let reader: Box<dyn Read> = match &source.path {
            Some(p) => match source.kind {
                SourceKind::Jsonl => match regular_file(p) {
                    // A JSONL file that cannot be opened fails the run, as it always has.
                    Ok(()) | Err(SkipReason::Unreadable(_)) => {
                        Box::new(File::open(p).map_err(|e| DedupError::io(&source.display, e))?)
                    }
                    Err(reason) => {
                        // Not a file to read lines from: one skipped record.
                        let this = seq;
                        seq += 1;
                        stats.records += 1;
                        if want(this)
                            && !emit(Raw {
                                seq: this,
                                source: si as u32,
                                line: 0,
                                bytes: Err(reason),
                            })
                        {
                            return Ok(stats);
                        }
                        continue;
                    }
                },
                SourceKind::Doc(_) => {
                    // A document file: read whole (only when wanted); an error is this
                    // document's problem, reported by the worker.
                    let this = seq;
                    seq += 1;
                    stats.records += 1;
                    if !want(this) {
                        continue;
                    }
                    let bytes = read_document(p, max);
                    let n = bytes.as_ref().map_or(0, |b| b.len() as u64);
                    stats.bytes += n;
                    bytes_read.fetch_add(n, Relaxed);
                    if !emit(Raw { seq: this, source: si as u32, line: 0, bytes }) {
                        return Ok(stats);
                    }
                    continue;
                }
            },
            None => {
                let (spool, file) = Spool::create()?;
                inputs.sources[si].path = Some(spool.path.clone());
                inputs.spool = Some(spool);
                spool_file = Some(std::io::BufWriter::with_capacity(1 << 20, file));
                Box::new(std::io::stdin().lock())
            }
        };
        let mut reader = BufReader::with_capacity(1 << 20, reader);
        // What is read from stdin is copied to the spool, all of it (also what is skipped),
        // so that later passes number the records the same way.
        let mut copy = |chunk: &[u8]| match spool_file.as_mut() {
            Some(f) => f.write_all(chunk).map_err(|e| DedupError::io("spool", e)),
            None => Ok(()),
        };
        if let SourceKind::Doc(_) = source.kind {
            // stdin as one document.
            let (n, bytes) = read_bounded(&mut reader, "<stdin>", max, false, &mut copy)?;
            stats.bytes += n;
            bytes_read.fetch_add(n, Relaxed);
            let this = seq;
            seq += 1;
            stats.records += 1;
            if want(this) && !emit(Raw { seq: this, source: si as u32, line: 0, bytes }) {
                return Ok(stats);
            }
        } else {
            let mut line_no = 0u64;
            loop {
                let (n, line) = read_bounded(&mut reader, &source.display, max, true, &mut copy)?;
                if n == 0 {
                    break;
                }
                line_no += 1;
                stats.bytes += n;
                bytes_read.fetch_add(n, Relaxed);
                let line = line.map(|mut line| {
                    if line_no == 1 && line.starts_with(b"\xEF\xBB\xBF") {
                        // A UTF-8 byte order mark before the first record.
                        line.drain(..3);
                    }
                    line
                });
                if line.as_ref().is_ok_and(|l| l.iter().all(u8::is_ascii_whitespace)) {
                    stats.blank_lines += 1;
                    continue;
                }
                let this = seq;
                seq += 1;
                stats.records += 1;
                if want(this)
                    && !emit(Raw { seq: this, source: si as u32, line: line_no, bytes: line })
                {
                    return Ok(stats);
                }
            }
        }
        if let Some(mut f) = spool_file {
            f.flush().map_err(|e| DedupError::io("spool", e))?;
        }
    }
    Ok(stats)
}

/// Reads one line (`line`, ending at a newline or the end) or everything (`!line`) from
/// `reader` (called `name` in errors), passing every byte read to `copy`, and keeping at
/// most `max` bytes (not counting the line end): returns the bytes read and the line
/// without its end, or [`SkipReason::TooLarge`] when it was longer (then only `max` + 2
/// bytes were ever held).
fn read_bounded(
    reader: &mut impl BufRead,
    name: &str,
    max: u64,
    line: bool,
    copy: &mut impl FnMut(&[u8]) -> Result<(), DedupError>,
) -> Result<(u64, Result<Vec<u8>, SkipReason>), DedupError> {
    let keep = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(2);
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut over = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DedupError::io(name, e)),
        };
        if buf.is_empty() {
            break;
        }
        let (chunk, done) = match line.then(|| memchr::memchr(b'\n', buf)).flatten() {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        copy(chunk)?;
        if !over {
            if out.len() + chunk.len() > keep {
                over = true;
                out = Vec::new();
            } else {
                out.extend_from_slice(chunk);
            }
        }
        let n = chunk.len();
        total += n as u64;
        reader.consume(n);
        if done {
            break;
        }
    }
    if line {
        while matches!(out.last(), Some(b'\n' | b'\r')) {
            out.pop();
        }
    }
    if over || out.len() as u64 > max {
        return Ok((total, Err(SkipReason::TooLarge { bytes: total, max })));
    }
    Ok((total, Ok(out)))
}

/// `Ok` when `p` is a regular file (or a link to one): decided from its metadata, before it
/// is opened, since opening a FIFO waits for a writer.
fn regular_file(p: &Path) -> Result<(), SkipReason> {
    let meta = std::fs::metadata(p).map_err(|e| SkipReason::Unreadable(e.to_string()))?;
    if meta.is_file() { Ok(()) } else { Err(SkipReason::NotAFile(file_kind(&meta))) }
}

/// What a file that is not a regular file is, for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        } else if t.is_char_device() {
            return "a character device";
        } else if t.is_block_device() {
            return "a block device";
        } else if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() { "a directory" } else { "a special file" }
}

/// Reads a document file of at most `max` bytes. Its type and size are checked before it
/// is opened, and again on the opened file (it may have been replaced in between); at most
/// `max` + 1 bytes are read whatever the file does meanwhile.
fn read_document(p: &Path, max: u64) -> Result<Vec<u8>, SkipReason> {
    let unreadable = |e: std::io::Error| SkipReason::Unreadable(e.to_string());
    regular_file(p)?;
    let file = File::open(p).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(SkipReason::NotAFile(file_kind(&meta)));
    }
    if meta.len() > max {
        return Err(SkipReason::TooLarge { bytes: meta.len(), max });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(unreadable)?;
    if bytes.len() as u64 > max {
        return Err(SkipReason::TooLarge { bytes: bytes.len() as u64, max });
    }
    Ok(bytes)
}

/// A parsed document.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    /// The id as JSON text (`"a string"` or an integer).
    pub id: Box<str>,
    /// Milliseconds since the epoch.
    pub timestamp: Option<i64>,
    /// The text to fingerprint (tags already stripped for HTML).
    pub text: Cow<'a, str>,
    /// How a document file was decoded (`None` for JSONL records, which are UTF-8).
    pub decoding: Option<Decoding>,
}

/// Parses one raw record of `source`.
pub(crate) fn parse<'a>(
    raw: &'a Raw,
    source: &Source,
    force_html: bool,
) -> Result<Parsed<'a>, SkipReason> {
    let bytes = raw.bytes.as_ref().map_err(Clone::clone)?;
    match source.kind {
        SourceKind::Jsonl => {
            let rec = parse_record(bytes)?;
            let text = if force_html { Cow::Owned(strip(&rec.text)) } else { rec.text };
            Ok(Parsed { id: rec.id, timestamp: rec.timestamp, text, decoding: None })
        }
        SourceKind::Doc(html_kind) => {
            let (text, decoding) = decode::decode(bytes, force_html.then_some(true).or(html_kind));
            // Decided on the text, so that a UTF-16 page is recognised too.
            let is_html =
                force_html || html_kind.unwrap_or_else(|| html::looks_like_html(text.as_bytes()));
            let text = if is_html { Cow::Owned(strip(&text)) } else { text };
            let id = serde_json::to_string(&source.display)
                .map_err(|e| SkipReason::BadField(e.to_string()))?;
            Ok(Parsed { id: id.into(), timestamp: None, text, decoding: Some(decoding) })
        }
    }
}

fn strip(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    html::strip_html(html, &mut out);
    out
}

/// The fields of a JSONL record that dedup reads.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub id: Box<str>,
    pub timestamp: Option<i64>,
    pub text: Cow<'a, str>,
}

/// Parses a JSONL line: `id` (string or integer), `text` (string), optional `timestamp`
/// (Unix seconds as a number, or RFC 3339 text; null is none).
pub(crate) fn parse_record(line: &[u8]) -> Result<Record<'_>, SkipReason> {
    let fields: Fields<'_> =
        serde_json::from_slice(line).map_err(|e| SkipReason::BrokenJson(e.to_string()))?;
    let id = match fields.id.map(RawValue::get) {
        None | Some("null") => return Err(SkipReason::MissingId),
        Some(s) if s.starts_with('"') => {
            let v: Cow<'_, str> = serde_json::from_str::<Text<'_>>(s)
                .map_err(|e| SkipReason::BadField(format!("id: {e}")))?
                .0;
            if v.is_empty() {
                return Err(SkipReason::BadField("id is an empty string".into()));
            }
            s
        }
        Some(s) if s.parse::<i64>().is_ok() || s.parse::<u64>().is_ok() => s,
        Some(s) => {
            return Err(SkipReason::BadField(format!(
                "id must be a string or an integer, not {}",
                abbreviate(s)
            )));
        }
    };
    let text = match fields.text.map(RawValue::get) {
        None | Some("null") => return Err(SkipReason::MissingText),
        Some(s) if s.starts_with('"') => {
            serde_json::from_str::<Text<'_>>(s)
                .map_err(|e| SkipReason::BadField(format!("text: {e}")))?
                .0
        }
        Some(s) => {
            return Err(SkipReason::BadField(format!(
                "text must be a string, not {}",
                abbreviate(s)
            )));
        }
    };
    let timestamp = match fields.timestamp.map(RawValue::get) {
        None | Some("null") => None,
        Some(s) if s.starts_with('"') => {
            let v = serde_json::from_str::<Text<'_>>(s)
                .map_err(|e| SkipReason::BadField(format!("timestamp: {e}")))?
                .0;
            Some(timestamp::parse_rfc3339(&v).map_err(SkipReason::BadField)?)
        }
        Some(s) => Some(if let Ok(i) = s.parse::<i64>() {
            timestamp::from_integer_seconds(i)
        } else {
            s.parse::<f64>().ok().and_then(timestamp::from_seconds).ok_or_else(|| {
                SkipReason::BadField(format!(
                    "timestamp must be Unix seconds or RFC 3339 text, not {}",
                    abbreviate(s)
                ))
            })?
        }),
    };
    Ok(Record { id: id.into(), timestamp, text })
}

fn abbreviate(s: &str) -> String {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    if end < s.len() { format!("{}...", &s[..end]) } else { s.to_string() }
}

/// A JSON string, borrowed from the input when it has no escapes.
pub(crate) struct Text<'a>(pub Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The three fields dedup reads, as raw JSON; every other field is skipped unparsed.
struct Fields<'a> {
    id: Option<&'a RawValue>,
    text: Option<&'a RawValue>,
    timestamp: Option<&'a RawValue>,
}

enum Key {
    Id,
    Text,
    Timestamp,
    Other,
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "id" => Key::Id,
                    "text" => Key::Text,
                    "timestamp" => Key::Timestamp,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Fields { id: None, text: None, timestamp: None };
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Id => out.id = Some(map.next_value()?),
                        Key::Text => out.text = Some(map.next_value()?),
                        Key::Timestamp => out.timestamp = Some(map.next_value()?),
                        Key::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// The fields of a JSONL record in their order, as raw JSON, for copying them through.
pub(crate) struct OrderedFields<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for OrderedFields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    out.push((key.0, map.next_value()?));
                }
                Ok(OrderedFields(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records() {
        let r =
            parse_record(br#"{"id": "a\"b", "text": "hello world", "x": [1, {"y": 2}]}"#).unwrap();
        assert_eq!(&*r.id, r#""a\"b""#);
        assert_eq!(r.text, "hello world");
        assert!(matches!(r.text, Cow::Borrowed(_)));
        assert_eq!(r.timestamp, None);
        let r = parse_record(br#"{"text":"caf\u00e9","timestamp":"1970-01-01T00:00:02Z","id":7}"#)
            .unwrap();
        assert_eq!((&*r.id, &*r.text, r.timestamp), ("7", "café", Some(2000)));
        let r = parse_record(br#"{"id":1,"text":"t","timestamp":1.5}"#).unwrap();
        assert_eq!(r.timestamp, Some(1500));
        let r = parse_record(br#"{"id":1,"text":"t","timestamp":null}"#).unwrap();
        assert_eq!(r.timestamp, None);
    }

    #[test]
    fn bad_records() {
        let key = |line: &[u8]| parse_record(line).unwrap_err().key();
        assert_eq!(key(b"{\"id\": 1, \"text\": \"unterminated}"), "broken_json");
        assert_eq!(key(b"[1, 2]"), "broken_json");
        assert_eq!(key(b"\"just a string\""), "broken_json");
        assert_eq!(key(br#"{"text": "x"}"#), "missing_id");
        assert_eq!(key(br#"{"id": null, "text": "x"}"#), "missing_id");
        assert_eq!(key(br#"{"id": 1}"#), "missing_text");
        assert_eq!(key(br#"{"id": 1.5, "text": "x"}"#), "bad_field");
        assert_eq!(key(br#"{"id": "", "text": "x"}"#), "bad_field");
        assert_eq!(key(br#"{"id": [1], "text": "x"}"#), "bad_field");
        assert_eq!(key(br#"{"id": 1, "text": 5}"#), "bad_field");
        assert_eq!(key(br#"{"id": 1, "text": "x", "timestamp": "yesterday"}"#), "bad_field");
        assert_eq!(key(br#"{"id": 1, "text": "x", "timestamp": true}"#), "bad_field");
        assert_eq!(key(b"{\"id\": 1, \"text\": \"\xff\"}"), "broken_json");
    }

    #[test]
    fn long_lines_are_passed_over_not_kept() {
        let input = b"12345\r\n123456\nabc\n123456789012345";
        // A small buffer, so that a long line comes in several chunks.
        let mut reader = std::io::BufReader::with_capacity(4, &input[..]);
        let mut copied = Vec::new();
        let mut copy = |c: &[u8]| -> Result<(), DedupError> {
            copied.extend_from_slice(c);
            Ok(())
        };
        let mut lines = Vec::new();
        loop {
            let (n, line) = read_bounded(&mut reader, "t", 5, true, &mut copy).unwrap();
            if n == 0 {
                break;
            }
            lines.push((n, line.map_err(|e| e.to_string())));
        }
        let too_large = |bytes| Err(format!("larger than --max-doc-bytes 5 ({bytes} bytes)"));
        assert_eq!(
            lines,
            [
                (7, Ok(b"12345".to_vec())),
                (7, too_large(7)),
                (4, Ok(b"abc".to_vec())),
                (15, too_large(15)),
            ]
        );
        assert_eq!(copied, input, "everything read is copied (the stdin spool)");
        let mut whole = &b"0123456789"[..];
        let (n, doc) = read_bounded(&mut whole, "t", 9, false, &mut |_| Ok(())).unwrap();
        assert_eq!((n, doc.map_err(|e| e.key())), (10, Err("too_large")));
    }

    #[test]
    fn ordered_fields_keep_order_and_raw_values() {
        let line = br#"{"z": 1, "id": "x", "a": {"b": [1, 2]}, "text": "t"}"#;
        let f: OrderedFields<'_> = serde_json::from_slice(line).unwrap();
        let got: Vec<(String, String)> =
            f.0.iter().map(|(k, v)| (k.to_string(), v.get().to_string())).collect();
        assert_eq!(
            got,
            [("z", "1"), ("id", "\"x\""), ("a", r#"{"b": [1, 2]}"#), ("text", "\"t\"")]
                .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }
}
