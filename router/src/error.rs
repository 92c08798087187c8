//! The one error type of `neardup-router`, and its mapping to gRPC status codes.
//!
//! Errors from the shard arrive as statuses already mapped by the shard and pass through
//! unchanged. Errors of the engine (`neardup_core`, met when fingerprinting a text) are
//! mapped by the shard's mapping ([`neardup_server::error::core_error_code`]), so each
//! engine error has one code whichever service reports it.

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
    /// A client stream sent no message for the idle limit.
    #[error("no message on this stream for {secs} s (limits.stream_idle_secs): closed")]
    StreamIdle {
        /// The limit.
        secs: u64,
    },
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
    /// The engine refused the request or failed.
    #[error(transparent)]
    Engine(neardup_core::Error),
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
        RouterError::Engine(e)
    }
}

/// The router's status mapping: the one place it is decided.
impl From<RouterError> for Status {
    fn from(e: RouterError) -> Status {
        match e {
            RouterError::InvalidArgument(m) => Status::invalid_argument(m),
            RouterError::DeadlineExceeded | RouterError::StreamIdle { .. } => {
                Status::deadline_exceeded(e.to_string())
            }
            RouterError::Overloaded { .. } => Status::resource_exhausted(e.to_string()),
            RouterError::Unavailable(m) => Status::unavailable(m),
            RouterError::Shard(s) => s,
            RouterError::Engine(e) => {
                Status::new(neardup_server::error::core_error_code(&e), e.to_string())
            }
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

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    /// A damaged run is DATA_LOSS whether the router or the shard reports it.
    #[test]
    fn a_corrupt_run_is_data_loss_through_the_router_and_the_shard() {
        let corrupt = || neardup_core::Error::Corrupt("run 3: checksum mismatch".into());
        assert_eq!(Status::from(RouterError::from(corrupt())).code(), Code::DataLoss);
        let shard = tonic::Status::from(neardup_server::Error::from(corrupt()));
        assert_eq!(shard.code(), Code::DataLoss);
        // And bad input is INVALID_ARGUMENT on both, with the engine's message.
        let bad_k = || neardup_core::Error::KOutOfRange { k: 9, max: 3 };
        let routed = Status::from(RouterError::from(bad_k()));
        assert_eq!(routed.code(), Code::InvalidArgument);
        assert_eq!(routed.message(), bad_k().to_string());
        let shard = tonic::Status::from(neardup_server::Error::from(bad_k()));
        assert_eq!(shard.code(), Code::InvalidArgument);
    }
}
