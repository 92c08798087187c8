//! The one error type of the command line.
//!
//! Every subcommand returns [`CliError`]; `main` prints it as one line after `neardup: ` and
//! exits with [`CliError::exit_code`]. The variants say what went wrong (the flags, the
//! configuration, a named file, the connection, the server's answer, the storage...) so that
//! the line reads as a sentence and never shows Rust internals (`Some(..)`, `Os { .. }`).

use neardup_client::ClientError;
use tonic::Code;

/// Result alias of the command line.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// What went wrong in a `neardup` command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The flags do not make sense together (what clap cannot check itself).
    #[error("{0}")]
    Usage(String),
    /// The configuration (file, environment, `--set` and the other flags) is wrong.
    #[error("{0}")]
    Config(String),
    /// A named file (or stdin) cannot be opened, read or written.
    #[error("cannot {action} {path}: {source}")]
    File {
        /// What was being done: `open`, `read`, `read config file`...
        action: &'static str,
        /// The file, or `<stdin>`.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A record of the input (JSON lines) is wrong.
    #[error("line {line}: {reason}")]
    Input {
        /// Line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The server's address is not usable, or nothing answers there.
    #[error("cannot connect to {server}: {reason}")]
    Connect {
        /// The address given.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server answered the call with an error status.
    #[error("the server answered {}: {message}", code_name(*.code))]
    Server {
        /// The gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// An address to serve on cannot be listened on.
    #[error("cannot listen for {what} on {address}: {source}")]
    Listen {
        /// Which endpoint: `gRPC`, `metrics`...
        what: &'static str,
        /// The address.
        address: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The shard's storage cannot be opened (data directory, disk space, configuration).
    #[error("cannot start: {0}")]
    Start(#[source] neardup_server::Error),
    /// The cluster node cannot start or join (its identity, its Raft state, the join).
    #[error("{0}")]
    Cluster(String),
    /// Stopping the shard (flush, checkpoint, sync) failed.
    #[error("shutdown failed: {0}")]
    Shutdown(String),
    /// A backup is incomplete, damaged or of another format, or could not be made.
    #[error("{0}")]
    Backup(String),
    /// The server answers health checks, but not SERVING.
    #[error("the server is not serving: its health is {0}")]
    NotServing(String),
    /// A gRPC server stopped with an error while serving.
    #[error("gRPC server failed: {0}")]
    Serve(String),
    /// The async runtime the servers and clients run on cannot be started.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The engine refused a local computation (a text with nothing to fingerprint...).
    #[error(transparent)]
    Core(#[from] neardup_core::Error),
    /// Offline dedup failed (see `neardup_dedup::DedupError`).
    #[error(transparent)]
    Dedup(#[from] neardup_dedup::DedupError),
}

impl CliError {
    /// The process exit code for this error: 1, for every error (clap's own usage errors,
    /// reported before any command runs, exit with 2).
    pub fn exit_code(&self) -> i32 {
        1
    }

    /// A client error from a call to `server`: the address or the connection when the call
    /// never reached a server, else the server's status.
    pub fn client(server: &str, e: ClientError) -> CliError {
        match e {
            ClientError::Address { address, reason } => {
                CliError::Connect { server: address, reason }
            }
            // A status made on this side of the wire (it carries the transport's error): the
            // connection failed.
            ClientError::Status(s)
                if s.code() == Code::Unavailable && std::error::Error::source(&s).is_some() =>
            {
                CliError::Connect { server: server.to_string(), reason: innermost(&s) }
            }
            ClientError::Status(s) => {
                CliError::Server { code: s.code(), message: s.message().to_string() }
            }
            e @ (ClientError::EmptyText | ClientError::Token(_)) => CliError::Usage(e.to_string()),
        }
    }
}

/// The message of a status followed by its deepest cause (`tcp connect error: Connection
/// refused (os error 111)`).
fn innermost(s: &tonic::Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        Some(l) if l != s.message() => format!("{}: {l}", s.message()),
        _ => s.message().to_string(),
    }
}

/// The canonical name of a gRPC status code, as the gRPC documentation and `docs/` write it.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_one_clear_line() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let cases = [
            (
                CliError::File { action: "open", path: "docs.jsonl".into(), source: missing },
                "cannot open docs.jsonl: entity not found",
            ),
            (
                CliError::client(
                    "127.0.0.1:1",
                    ClientError::Status(tonic::Status::invalid_argument("k = 60 is out of range")),
                ),
                "the server answered INVALID_ARGUMENT: k = 60 is out of range",
            ),
            (
                CliError::client(
                    "nowhere",
                    ClientError::Address { address: "a b".into(), reason: "invalid uri".into() },
                ),
                "cannot connect to a b: invalid uri",
            ),
            (
                CliError::Input { line: 3, reason: "no string \"id\"".into() },
                "line 3: no string \"id\"",
            ),
        ];
        for (e, says) in cases {
            assert_eq!(e.to_string(), says);
            assert_eq!(e.exit_code(), 1);
        }
    }

    #[test]
    fn a_refused_connection_says_so() {
        let mut status = tonic::Status::unavailable("tcp connect error");
        status.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let e = CliError::client("127.0.0.1:1", ClientError::Status(status));
        assert!(matches!(&e, CliError::Connect { server, .. } if server == "127.0.0.1:1"), "{e:?}");
        assert!(e.to_string().starts_with("cannot connect to 127.0.0.1:1: "), "{e}");
        assert_eq!(
            e.to_string(),
            "cannot connect to 127.0.0.1:1: tcp connect error: connection refused"
        );
    }
}
