//! What the client commands share: the server address, the connection, fingerprint
//! parsing and JSON output.

use neardup_client::{Client, ClientError, ClientOptions, ClientTls, Match, QueryResult, Token};
use serde_json::{Value, json};
use std::path::Path;

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
    /// The API token, when the server checks tokens.
    #[command(flatten)]
    pub token: TokenArgs,
    /// TLS: the certificate authority that signed the server's certificate (PEM); the
    /// server is then reached over TLS.
    #[arg(long, env = "NEARDUP_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// TLS: the name the server's certificate must hold [default: the address's host].
    #[arg(long, requires = "tls_ca")]
    pub tls_domain: Option<String>,
}

/// The API token sent with every call: from a flag, the environment or a file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TokenArgs {
    /// The API token (prefer NEARDUP_TOKEN or --token-file: a flag shows in the process
    /// list).
    #[arg(long, env = "NEARDUP_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the API token.
    #[arg(long, env = "NEARDUP_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

impl TokenArgs {
    /// The token given, if any.
    pub fn token(&self) -> Result<Option<Token>, CliError> {
        if let Some(t) = &self.token {
            return Ok(Some(Token::new(t)));
        }
        self.token_file.as_deref().map(read_token_file).transpose()
    }
}

/// The token held in the file at `path` (a trailing newline is left out).
pub fn read_token_file(path: &Path) -> Result<Token, CliError> {
    let text = read_file(path, "read the token file")?;
    Ok(Token::new(&String::from_utf8_lossy(&text)))
}

/// The bytes of the file at `path`; the error says what it was read for.
pub fn read_file(path: &Path, action: &'static str) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|source| CliError::File {
        action,
        path: path.display().to_string(),
        source,
    })
}

impl ServerArgs {
    /// A client for the server.
    pub async fn client(&self) -> Result<Client, CliError> {
        let options = ClientOptions {
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            token: self.token.token()?,
            tls: self.tls()?,
            ..ClientOptions::default()
        };
        Client::connect_with(&self.server, options).await.map_err(|e| self.error(e))
    }

    /// The TLS settings asked, if any.
    fn tls(&self) -> Result<Option<ClientTls>, CliError> {
        let Some(path) = &self.tls_ca else { return Ok(None) };
        let ca_pem = read_file(path, "read the TLS CA file")?;
        Ok(Some(ClientTls { ca_pem, domain: self.tls_domain.clone() }))
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

/// Verification flags of `check` and `query`.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// Keep candidates whose estimated word 3-gram Jaccard similarity reaches this (0: no
    /// verification) [default: the server's, 0.9].
    #[arg(long)]
    pub verify_jaccard: Option<f64>,
    /// Verify candidates within this Hamming distance [default: the server's, the design's
    /// maximum].
    #[arg(long)]
    pub candidate_k: Option<u32>,
    /// The sketch of the document (hex, with `--fingerprint`; with `--text` it is computed
    /// here and sent with it).
    #[arg(long, value_parser = parse_hex)]
    pub sketch: Option<Vec<u8>>,
}

impl VerifyArgs {
    /// The verification asked.
    pub fn verification(&self) -> neardup_client::Verification {
        neardup_client::Verification { jaccard: self.verify_jaccard, candidate_k: self.candidate_k }
    }
}

/// Parses hexadecimal bytes.
pub fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if !s.len().is_multiple_of(2) {
        return Err(format!("{s:?} has an odd number of hex digits"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| format!("{s:?} is not hexadecimal"))
        })
        .collect()
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
        "verified": m.verified,
        "jaccard": m.jaccard,
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
