//! What the client commands share: the server address, the connection, fingerprint
//! parsing and JSON output.

use neardup_client::{Client, ClientError, ClientOptions, Match, QueryResult};
use serde_json::{Value, json};

use crate::error::CliError;

/// Where the server is.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// The server, as http://HOST:PORT or HOST:PORT.
    #[arg(long, env = "NEARDUP_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// Deadline of each call, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

impl ServerArgs {
    /// A client for the server.
    pub async fn client(&self) -> Result<Client, CliError> {
        let options = ClientOptions {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            ..ClientOptions::default()
        };
        Client::connect_with(&self.server, options).await.map_err(|e| self.error(e))
    }

    /// A failed call to this server, as the command's error.
    pub fn error(&self, e: ClientError) -> CliError {
        CliError::client(&self.server, e)
    }
}

/// The content of a document or query, from the command line.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct ContentArgs {
    /// A 64-bit fingerprint: hexadecimal with 0x, or decimal.
    #[arg(long, value_parser = parse_fingerprint)]
    pub fingerprint: Option<u64>,
    /// A text for the server to fingerprint.
    #[arg(long)]
    pub text: Option<String>,
}

/// Parses `0x...` hexadecimal or decimal.
pub fn parse_fingerprint(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a 64-bit fingerprint (0x-hex or decimal): {e}"))
}

/// A fingerprint as JSON: `0x` and 16 hex digits.
pub fn hex(fp: u64) -> Value {
    Value::String(format!("{fp:#018x}"))
}

/// A match as JSON.
pub fn match_json(m: &Match) -> Value {
    json!({
        "id": m.id,
        "fingerprint": hex(m.fingerprint),
        "distance": m.distance,
        "timestamp_ms": m.timestamp_ms,
        "cluster_id": m.cluster_id,
    })
}

/// A query result as JSON.
pub fn result_json(r: &QueryResult) -> Value {
    json!({
        "fingerprint": hex(r.fingerprint),
        "truncated": r.truncated,
        "matches": r.matches.iter().map(match_json).collect::<Vec<_>>(),
    })
}

/// Prints one JSON value on a line.
pub fn print(v: &Value) {
    println!("{v}");
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
