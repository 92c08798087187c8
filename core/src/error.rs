//! The one error type of `neardup-core`.
//!
//! Every fallible operation in the crate returns [`Error`]. Callers (the shard server, the
//! router, the command line) map its variants to their own status codes in one place each;
//! [`Error::kind`] gives the coarse class they need for that.

/// Result alias used throughout `neardup-core`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Coarse class of an [`Error`], so callers can map errors to status codes without matching
/// every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something invalid (bad k, bad design text, empty document...).
    InvalidInput,
    /// Stored bytes are damaged or of a format this build does not understand.
    Corrupt,
}

/// Errors returned by `neardup-core`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A query asked for a Hamming distance the index's table design cannot answer exactly.
    #[error("k = {k} is out of range: this index answers exactly for k <= {max}")]
    KOutOfRange {
        /// The k that was asked for.
        k: u32,
        /// The largest k the design supports.
        max: u32,
    },
    /// A table design was described wrongly (text that does not parse, widths that do not sum
    /// to the fingerprint width, a choice that loses exactness...).
    #[error("invalid table design: {0}")]
    InvalidDesign(String),
    /// An index or codec option is out of its allowed range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A document yields no features (empty, or only punctuation and spaces), so it has no
    /// fingerprint.
    #[error("document has no words or characters to fingerprint")]
    EmptyDocument,
    /// Sketch bytes of the wrong version or length (see [`crate::sketch`]).
    #[error("invalid sketch: {0}")]
    InvalidSketch(String),
    /// Stored bytes failed a checksum, were truncated, or decode to something impossible.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// Stored bytes carry a format version this build does not know.
    #[error("unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version found in the data.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
}

impl Error {
    /// The coarse class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::KOutOfRange { .. }
            | Error::InvalidDesign(_)
            | Error::InvalidConfig(_)
            | Error::EmptyDocument
            | Error::InvalidSketch(_) => ErrorKind::InvalidInput,
            Error::Corrupt(_) | Error::UnsupportedVersion { .. } => ErrorKind::Corrupt,
        }
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }
}
