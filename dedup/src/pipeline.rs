//! The bounded parallel scan: one reader thread, a worker per core, the caller's thread
//! collecting small results.
//!
//! Fingerprinting is the expensive part of a dedup run, so it runs on every core, each worker
//! with its own state (a `Fingerprinter`). The reader hands out batches of raw records
//! through a channel that holds at most two batches per worker, so however large the input,
//! only a few megabytes of text are in memory at once; what comes back per document is a
//! fingerprint-sized result.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::decode::Decoding;
use crate::error::{DedupError, SkipReason};
use crate::input::{self, Inputs, Parsed, Raw, ReadStats};

/// What to do with a bad document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnError {
    /// Report it (location and reason, on stderr and in the summary) and go on.
    #[default]
    Skip,
    /// Stop the run with an error naming it.
    Stop,
}

/// How a scan runs.
#[derive(Debug, Clone)]
pub(crate) struct ScanOptions {
    pub threads: usize,
    pub on_error: OnError,
    /// Show a progress line on stderr (only when stderr is a terminal).
    pub progress: bool,
    /// What the progress line calls this pass.
    pub label: &'static str,
}

/// A document that went through.
#[derive(Debug)]
pub(crate) struct Accepted<T> {
    pub seq: u64,
    /// Index of its source.
    pub source: u32,
    /// Its line in a JSONL source, 0 for a document file.
    pub line: u64,
    pub id: Box<str>,
    pub timestamp: Option<i64>,
    /// How a document file was decoded.
    pub decoding: Option<Decoding>,
    pub value: T,
}

/// A document that did not.
#[derive(Debug, Clone)]
pub struct Skipped {
    /// Its record number.
    pub seq: u64,
    /// `FILE:LINE` or the path.
    pub location: String,
    /// Why.
    pub reason: SkipReason,
}

/// Everything a scan returns, sorted by record number.
#[derive(Debug)]
pub(crate) struct ScanOutput<T> {
    pub docs: Vec<Accepted<T>>,
    pub skipped: Vec<Skipped>,
    pub stats: ReadStats,
}

type Outcome<T> = Result<Accepted<T>, Skipped>;

const BATCH_RECORDS: usize = 256;
const BATCH_BYTES: usize = 4 << 20;

/// Reads `inputs` (the records `want` accepts), runs `work` on every parsed document on
/// `opts.threads` workers (each with state from `init`), and collects the results.
pub(crate) fn scan<S, T, I, F>(
    inputs: &mut Inputs,
    want: &(dyn Fn(u64) -> bool + Sync),
    opts: &ScanOptions,
    init: I,
    work: F,
) -> Result<ScanOutput<T>, DedupError>
where
    I: Fn() -> S + Sync,
    F: Fn(&mut S, &Parsed<'_>) -> Result<T, SkipReason> + Sync,
    T: Send,
{
    let threads = opts.threads.max(1);
    let total = inputs.total_bytes();
    let sources = inputs.sources.clone();
    let force_html = inputs.force_html;
    let cancel = AtomicBool::new(false);
    let bytes_read = AtomicU64::new(0);
    let (batch_tx, batch_rx) = mpsc::sync_channel::<Vec<Raw>>(threads * 2);
    let batch_rx = Arc::new(Mutex::new(batch_rx));
    let (out_tx, out_rx) = mpsc::channel::<Vec<Outcome<T>>>();
    let mut progress = Progress::new(opts.progress, opts.label, total);

    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut batch: Vec<Raw> = Vec::new();
            let mut batch_bytes = 0usize;
            let tx = batch_tx;
            let stats = input::read_all(inputs, want, &bytes_read, |raw| {
                if cancel.load(Relaxed) {
                    return false;
                }
                batch_bytes += raw.bytes.as_ref().map_or(0, Vec::len);
                batch.push(raw);
                if batch.len() >= BATCH_RECORDS || batch_bytes >= BATCH_BYTES {
                    batch_bytes = 0;
                    return tx.send(std::mem::take(&mut batch)).is_ok();
                }
                true
            });
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            stats
        });
        for _ in 0..threads {
            let rx = Arc::clone(&batch_rx);
            let out_tx = out_tx.clone();
            let (sources, init, work, cancel) = (&sources, &init, &work, &cancel);
            scope.spawn(move || {
                let mut state = init();
                loop {
                    let next = rx.lock().map(|r| r.recv());
                    let Ok(Ok(batch)) = next else { return };
                    if cancel.load(Relaxed) {
                        return;
                    }
                    let results: Vec<Outcome<T>> = batch
                        .iter()
                        .map(|raw| {
                            let source = &sources[raw.source as usize];
                            input::parse(raw, source, force_html)
                                .and_then(|p| {
                                    let value = work(&mut state, &p)?;
                                    Ok(Accepted {
                                        seq: raw.seq,
                                        source: raw.source,
                                        line: raw.line,
                                        id: p.id,
                                        timestamp: p.timestamp,
                                        decoding: p.decoding,
                                        value,
                                    })
                                })
                                .map_err(|reason| Skipped {
                                    seq: raw.seq,
                                    location: raw.location(sources),
                                    reason,
                                })
                        })
                        .collect();
                    if out_tx.send(results).is_err() {
                        return;
                    }
                }
            });
        }
        drop(batch_rx);
        drop(out_tx);

        let mut docs = Vec::new();
        let mut skipped = Vec::new();
        let mut stop: Option<Skipped> = None;
        loop {
            match out_rx.recv_timeout(Duration::from_millis(200)) {
                Ok(results) => {
                    for r in results {
                        match r {
                            Ok(a) => docs.push(a),
                            Err(s) => {
                                if opts.on_error == OnError::Stop {
                                    cancel.store(true, Relaxed);
                                    if stop.as_ref().is_none_or(|x| s.seq < x.seq) {
                                        stop = Some(s.clone());
                                    }
                                }
                                skipped.push(s);
                            }
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            progress.show(docs.len() + skipped.len(), bytes_read.load(Relaxed));
        }
        progress.finish();
        let stats =
            reader.join().map_err(|_| DedupError::Usage("the reader thread failed".into()))??;
        if let Some(s) = stop {
            return Err(DedupError::BadInput { location: s.location, reason: s.reason });
        }
        docs.sort_unstable_by_key(|d: &Accepted<T>| d.seq);
        skipped.sort_unstable_by_key(|s| s.seq);
        Ok(ScanOutput { docs, skipped, stats })
    })
}

/// A one-line progress display on stderr, drawn only when stderr is a terminal.
pub(crate) struct Progress {
    on: bool,
    label: &'static str,
    total: Option<u64>,
    start: Instant,
    last: Instant,
    drawn: bool,
}

impl Progress {
    pub fn new(wanted: bool, label: &'static str, total: Option<u64>) -> Progress {
        let now = Instant::now();
        Progress {
            on: wanted && std::io::stderr().is_terminal(),
            label,
            total,
            start: now,
            last: now,
            drawn: false,
        }
    }

    pub fn show(&mut self, docs: usize, bytes: u64) {
        if !self.on || self.last.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let mb = bytes as f64 / 1e6;
        let bar = match self.total {
            Some(t) if t > 0 => {
                let frac = (bytes as f64 / t as f64).min(1.0);
                let filled = (frac * 30.0) as usize;
                format!(
                    "[{}{}] {:3.0}% ",
                    "#".repeat(filled),
                    "-".repeat(30 - filled),
                    frac * 100.0
                )
            }
            _ => String::new(),
        };
        eprint!("\r{}: {bar}{docs} documents, {mb:.1} MB, {:.1} MB/s   ", self.label, mb / secs);
        self.drawn = true;
    }

    /// Shows a one-line status (a phase without a count) until the next line or `finish`.
    pub fn status(&mut self, text: &str) {
        if self.on {
            eprint!("\r{}\r{}: {text}", " ".repeat(100), self.label);
            self.drawn = true;
        }
    }

    pub fn finish(&mut self) {
        if self.drawn {
            eprint!("\r{}\r", " ".repeat(100));
            self.drawn = false;
        }
    }
}
