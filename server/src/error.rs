//! The one error type of `neardup-server`, and the one mapping of errors to gRPC codes.
//!
//! [`Error::class`] gives the coarse class of each variant, so a new variant is placed once;
//! `From<Error> for tonic::Status` turns a class into a code. Errors of the engine
//! (`neardup_core::Error`) are mapped by [`core_error_code`], which the router uses too, so
//! a damaged run reads DATA_LOSS whichever service reports it.
//!
//! That function lives here because the shard is where engine errors become service
//! errors, and both services can see it: the router depends on this crate, never the other
//! way round. `neardup-proto` cannot hold it without depending on the engine, which the
//! client library (proto only) should not pull in.

use neardup_core::ErrorKind;
use tonic::Code;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a caller should make of an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is wrong; retrying it unchanged fails again.
    InvalidInput,
    /// A named document is not stored.
    NotFound,
    /// The shard cannot answer now (starting, shutting down, storage failing); a retry may
    /// work.
    Unavailable,
    /// The shard is in a state that only an operator can end (a restart after a failed
    /// sync); retrying the request unchanged fails until then.
    FailedPrecondition,
    /// Stored data is damaged; the shard does not serve it.
    DataLoss,
    /// A bug.
    Internal,
}

/// Errors of the shard node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is invalid (bad k, id too long, conflicting operations...).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// The index refused the request (for example k out of range).
    #[error(transparent)]
    Index(neardup_core::Error),
    /// Delete with `must_exist` named ids that are not stored.
    #[error("{} document(s) not stored, among them {:?}", .0.len(), .0.first().map_or("", String::as_str))]
    NotFound(Vec<String>),
    /// The shard is still recovering its data.
    #[error("the shard is recovering its data")]
    Recovering,
    /// The shard is shutting down and takes no new work.
    #[error("the shard is shutting down")]
    ShuttingDown,
    /// A stored tablet is damaged beyond repair; nothing is served from it.
    #[error("tablet is corrupt and not served: {0}")]
    CorruptTablet(String),
    /// A sync of the store failed. Records appended before it may have been lost whatever a
    /// later sync reports, so the shard acknowledges and serves nothing until restarted.
    #[error(
        "the shard's storage failed to sync ({0}); it acknowledges nothing until it is \
         restarted and has recovered from its disk"
    )]
    SyncFailed(String),
    /// The storage engine failed (I/O error, disk full, damaged database files).
    #[error("storage failed: {0}")]
    Storage(String),
    /// The data directory cannot be used.
    #[error("data directory {path}: {reason}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The data directory was written by another, incompatible configuration or format.
    #[error("data directory is incompatible: {0}")]
    Incompatible(String),
    /// A read that walks the document table across calls met a compaction of it (which
    /// moves entries to other slots): it must begin again.
    #[error("{0}")]
    BeginAgain(String),
    /// A bug: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The coarse class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidInput(_) => ErrorClass::InvalidInput,
            Error::Index(e) => match core_error_code(e) {
                Code::InvalidArgument => ErrorClass::InvalidInput,
                Code::DataLoss => ErrorClass::DataLoss,
                _ => ErrorClass::Internal,
            },
            Error::NotFound(_) => ErrorClass::NotFound,
            Error::Recovering | Error::ShuttingDown | Error::Storage(_) => ErrorClass::Unavailable,
            Error::CorruptTablet(_) => ErrorClass::DataLoss,
            Error::SyncFailed(_) => ErrorClass::FailedPrecondition,
            Error::DataDir { .. } | Error::Incompatible(_) => ErrorClass::Unavailable,
            Error::BeginAgain(_) => ErrorClass::Unavailable,
            Error::Internal(_) => ErrorClass::Internal,
        }
    }
}

impl From<neardup_core::Error> for Error {
    fn from(e: neardup_core::Error) -> Self {
        Error::Index(e)
    }
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::Storage(e.to_string())
    }
}

/// The gRPC code of an engine error: bad input is INVALID_ARGUMENT, damaged or unknown
/// stored data (a corrupt run) DATA_LOSS. The one place engine errors are mapped; the
/// router's mapping calls it.
pub fn core_error_code(e: &neardup_core::Error) -> Code {
    match e.kind() {
        ErrorKind::InvalidInput => Code::InvalidArgument,
        ErrorKind::Corrupt => Code::DataLoss,
    }
}

/// Maps a shard error to its gRPC status: the one place this crate does so.
impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        let msg = e.to_string();
        match e.class() {
            ErrorClass::InvalidInput => tonic::Status::invalid_argument(msg),
            ErrorClass::NotFound => tonic::Status::not_found(msg),
            ErrorClass::Unavailable => tonic::Status::unavailable(msg),
            ErrorClass::FailedPrecondition => tonic::Status::failed_precondition(msg),
            ErrorClass::DataLoss => tonic::Status::data_loss(msg),
            ErrorClass::Internal => tonic::Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Messages speak of the documents, not of Rust values.
    #[test]
    fn not_found_names_an_id_in_words() {
        let e = Error::NotFound(vec!["nope".into(), "gone".into()]);
        assert_eq!(e.to_string(), "2 document(s) not stored, among them \"nope\"");
    }

    use super::*;

    #[test]
    fn engine_errors_map_to_their_codes() {
        let corrupt = neardup_core::Error::Corrupt("run 3: checksum mismatch".into());
        assert_eq!(core_error_code(&corrupt), Code::DataLoss);
        let e = Error::from(corrupt);
        assert_eq!(e.class(), ErrorClass::DataLoss);
        assert_eq!(tonic::Status::from(e).code(), Code::DataLoss);
        let bad_k = neardup_core::Error::KOutOfRange { k: 9, max: 3 };
        assert_eq!(tonic::Status::from(Error::from(bad_k)).code(), Code::InvalidArgument);
    }
}
