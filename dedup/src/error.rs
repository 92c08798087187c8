//! The one error type of `neardup-dedup`, and the reasons a document can be skipped.
//!
//! A run either fails ([`DedupError`]: the input cannot be opened, the output cannot be
//! written, an option is wrong, or `--on-error stop` met a bad document) or goes on past bad
//! documents, each reported with a [`SkipReason`] and counted in the summary.

use std::fmt;

/// Result alias of `neardup-dedup`.
pub type Result<T, E = DedupError> = std::result::Result<T, E>;

/// Errors of `neardup dedup` and `neardup-bench eval`.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// Reading or writing a file (or stdin/stdout) failed.
    #[error("{path}: {source}")]
    Io {
        /// The file, `<stdin>` or `<stdout>`.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A document was bad and `--on-error stop` was chosen.
    #[error("{location}: {reason} (stopped: --on-error stop)")]
    BadInput {
        /// `FILE:LINE` for JSONL, the path for a document file.
        location: String,
        /// What was wrong.
        reason: SkipReason,
    },
    /// The options do not make sense together, or a value is out of range.
    #[error("{0}")]
    Usage(String),
    /// The engine refused something (a design for this k, a fingerprint configuration).
    #[error(transparent)]
    Core(#[from] neardup_core::Error),
    /// A plot of `neardup-bench eval` could not be drawn or written.
    #[error("plot {path}: {message}")]
    Plot {
        /// The PNG being written.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl DedupError {
    /// An [`Io`](DedupError::Io) error on `path`.
    pub fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        DedupError::Io { path: path.to_string(), source }
    }
}

/// Why a document was skipped. Every skipped document is reported with its location and
/// one of these, and counted by [`SkipReason::key`] in the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The line is not valid JSON, or not a JSON object.
    BrokenJson(String),
    /// The record has no `id` (or it is null).
    MissingId,
    /// The record has no `text` (or it is null).
    MissingText,
    /// A field has the wrong type or value (`id` not a string or integer, `text` not a
    /// string, a timestamp that does not parse).
    BadField(String),
    /// The document is larger than `--max-doc-bytes` (a document file, a JSONL line, or
    /// stdin as one document); it was not read into memory.
    TooLarge {
        /// Its size in bytes (a JSONL line with its line end; for a file that grew while it
        /// was read, at least this).
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A path in the input is not a regular file (a FIFO, a device, a socket, or a link to
    /// one): it is not opened, since reading it could wait or go on forever.
    NotAFile(&'static str),
    /// The document has no words or characters to fingerprint (empty, only spaces,
    /// punctuation, markup or emoji).
    Empty,
    /// A document file could not be read (the system's message, e.g. a link that leads
    /// nowhere or round in a loop).
    Unreadable(String),
}

impl SkipReason {
    /// A short stable name for counting: `broken_json`, `missing_id`, `missing_text`,
    /// `bad_field`, `too_large`, `not_a_file`, `empty`, `unreadable`.
    pub fn key(&self) -> &'static str {
        match self {
            SkipReason::BrokenJson(_) => "broken_json",
            SkipReason::MissingId => "missing_id",
            SkipReason::MissingText => "missing_text",
            SkipReason::BadField(_) => "bad_field",
            SkipReason::TooLarge { .. } => "too_large",
            SkipReason::NotAFile(_) => "not_a_file",
            SkipReason::Empty => "empty",
            SkipReason::Unreadable(_) => "unreadable",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::BrokenJson(e) => write!(f, "broken JSON: {e}"),
            SkipReason::MissingId => write!(f, "no \"id\" field"),
            SkipReason::MissingText => write!(f, "no \"text\" field"),
            SkipReason::BadField(e) => write!(f, "{e}"),
            SkipReason::TooLarge { bytes, max } => {
                write!(f, "larger than --max-doc-bytes {max} ({bytes} bytes)")
            }
            SkipReason::NotAFile(kind) => write!(f, "not a regular file ({kind})"),
            SkipReason::Empty => write!(f, "empty document: no words to fingerprint"),
            SkipReason::Unreadable(e) => write!(f, "cannot read: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages are for people: the system's words, not Rust's `Debug` of an error.
    #[test]
    fn messages_show_no_rust_internals() {
        let would_block = std::io::Error::from_raw_os_error(11);
        let messages = [
            DedupError::io("<stdin>", would_block).to_string(),
            DedupError::io("x", std::io::Error::other("boom")).to_string(),
            DedupError::BadInput {
                location: "a.txt".into(),
                reason: SkipReason::TooLarge { bytes: 20, max: 10 },
            }
            .to_string(),
            SkipReason::NotAFile("a FIFO").to_string(),
            SkipReason::Unreadable("Too many levels of symbolic links (os error 40)".into())
                .to_string(),
        ];
        for m in &messages {
            for internal in ["Os {", "kind:", "Some(", "Custom {", "code:"] {
                assert!(!m.contains(internal), "{m}");
            }
        }
        assert_eq!(messages[1], "x: boom");
        assert_eq!(
            messages[2],
            "a.txt: larger than --max-doc-bytes 10 (20 bytes) (stopped: --on-error stop)"
        );
        assert_eq!(messages[3], "not a regular file (a FIFO)");
    }
}
