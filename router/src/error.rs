//! The one error type of `neardup-router`, and its mapping to gRPC status codes.
//!
//! Errors from the shard arrive as statuses already mapped by the shard (one mapping per
//! crate, each in one place) and pass through unchanged.

use tonic::Status;

/// Result alias of this crate.
pub type Result<T, E = RouterError> = std::result::Result<T, E>;

/// Errors of the router.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The request breaks a documented rule (limits, k, exactly one of fingerprint or
    /// text...).
    #[error("{0}")]
    InvalidArgument(String),
    /// The caller's deadline passed before the answer was ready.
    #[error("the deadline passed before the request finished")]
    DeadlineExceeded,
    /// Too many requests are in flight.
    #[error("overloaded: {in_flight} requests in flight, try again with backoff")]
    Overloaded {
        /// The limit that was reached.
        in_flight: usize,
    },
    /// The router is not serving yet (its shard is recovering) or is shutting down.
    #[error("not serving: {0}")]
    Unavailable(String),
    /// The shard answered with an error status.
    #[error("{}", .0.message())]
    Shard(Status),
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Status> for RouterError {
    fn from(s: Status) -> Self {
        RouterError::Shard(s)
    }
}

impl From<neardup_core::Error> for RouterError {
    fn from(e: neardup_core::Error) -> Self {
        match e.kind() {
            neardup_core::ErrorKind::InvalidInput => RouterError::InvalidArgument(e.to_string()),
            neardup_core::ErrorKind::Corrupt => RouterError::Internal(e.to_string()),
        }
    }
}

/// The router's status mapping: the one place it is decided.
impl From<RouterError> for Status {
    fn from(e: RouterError) -> Status {
        match e {
            RouterError::InvalidArgument(m) => Status::invalid_argument(m),
            RouterError::DeadlineExceeded => Status::deadline_exceeded(e.to_string()),
            RouterError::Overloaded { .. } => Status::resource_exhausted(e.to_string()),
            RouterError::Unavailable(m) => Status::unavailable(m),
            RouterError::Shard(s) => s,
            RouterError::Internal(m) => Status::internal(m),
        }
    }
}

impl RouterError {
    /// Shorthand for [`RouterError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        RouterError::InvalidArgument(msg.into())
    }
}
