//! Who may call what: bearer tokens with roles, checked for every request of a port before
//! its service sees it (see `docs/security.md`).
//!
//! A client sends `authorization: Bearer <token>`. The server never holds the tokens
//! themselves: its tokens file lists each one's SHA-256 with a role and a name
//! (`neardup token new` makes a token and its entry):
//!
//! ```toml
//! [[token]]
//! name = "crawl-frontier"
//! role = "write"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```
//!
//! Roles nest: `read` may Query, QueryBatch, Fingerprint and Stats; `write` may also Insert,
//! InsertStream, Delete and CheckAndInsert; `admin` may also call `neardup.admin.v1`. Health
//! and reflection stay open unless [`AccessConfig`] closes them (then any role may call
//! them). The services a port serves to other nodes (Raft, data, shard) are not for tokens.
//!
//! A request without a token, or with one the file does not list, is answered
//! UNAUTHENTICATED; a token whose role does not allow the method, PERMISSION_DENIED. No
//! answer, log line or metric names the token. The file is read again on SIGHUP and when it
//! changes ([`Access::watch`]); a file that no longer reads keeps the tokens in force and
//! says why in the log ("did not read").

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::codegen::http;

/// What a token may do; each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Query, QueryBatch, Fingerprint, Stats (and health and reflection when closed).
    Read,
    /// Also Insert, InsertStream, Delete, CheckAndInsert.
    Write,
    /// Also the admin API.
    Admin,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        })
    }
}

/// How a port checks its callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessConfig {
    /// The tokens file.
    pub tokens_file: PathBuf,
    /// Health checks need a token too.
    pub close_health: bool,
    /// Reflection needs a token too.
    pub close_reflection: bool,
}

/// One entry of the tokens file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    role: Role,
    sha256: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<Entry>,
}

/// The tokens in force: by the SHA-256 of the token, its role (names are for the file's
/// readers and its errors).
#[derive(Debug, Default)]
pub struct Tokens {
    by_hash: HashMap<[u8; 32], Role>,
}

impl Tokens {
    /// Parses a tokens file's text; the error names the entry at fault, never a secret.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_hash = HashMap::new();
        for (i, e) in file.token.into_iter().enumerate() {
            let hash = parse_hex32(&e.sha256).ok_or_else(|| {
                format!("token {} ({:?}): sha256 is not 64 hexadecimal digits", i + 1, e.name)
            })?;
            if by_hash.insert(hash, e.role).is_some() {
                return Err(format!("token {} ({:?}) is listed twice", i + 1, e.name));
            }
        }
        Ok(Tokens { by_hash })
    }

    /// Reads and parses the tokens file at `path`.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the tokens file {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("the tokens file {}: {e}", path.display()))
    }

    /// Tokens listed.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether none is listed.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The role of `token`, if listed.
    fn find(&self, token: &str) -> Option<Role> {
        self.by_hash.get(&sha256(token.as_bytes())).copied()
    }
}

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `hash` in lowercase hexadecimal.
pub fn hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The role a request path needs: `None` when it is open to all, or not for tokens.
pub fn required_role(path: &str, config: &AccessConfig) -> Option<Role> {
    if let Some(method) = path.strip_prefix("/neardup.v1.Neardup/") {
        return Some(match method {
            "Query" | "QueryBatch" | "Fingerprint" | "Stats" => Role::Read,
            "Insert" | "InsertStream" | "Delete" | "CheckAndInsert" => Role::Write,
            // A method this list does not know yet: the strictest.
            _ => Role::Admin,
        });
    }
    if path.starts_with("/neardup.admin.v1.") {
        return Some(Role::Admin);
    }
    if path.starts_with("/grpc.health.v1.") {
        return config.close_health.then_some(Role::Read);
    }
    if path.starts_with("/grpc.reflection.") {
        return config.close_reflection.then_some(Role::Read);
    }
    None
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token, a malformed header, or a token not listed.
    Unauthenticated(&'static str),
    /// A listed token whose role does not allow the method.
    PermissionDenied {
        /// The role the method needs.
        needs: Role,
        /// The token's role.
        has: Role,
    },
}

impl Refusal {
    /// The gRPC status to answer with (it names no secret).
    pub fn status(&self) -> tonic::Status {
        match self {
            Refusal::Unauthenticated(why) => tonic::Status::unauthenticated(*why),
            Refusal::PermissionDenied { needs, has } => tonic::Status::permission_denied(format!(
                "this method needs the {needs} role; the token has {has}"
            )),
        }
    }
}

/// The token check of one port.
#[derive(Debug)]
pub struct Access {
    config: AccessConfig,
    tokens: RwLock<Tokens>,
}

impl Access {
    /// Reads the tokens file; an error if it does not read or parse.
    pub fn new(config: AccessConfig) -> Result<Arc<Access>, String> {
        let tokens = Tokens::load(&config.tokens_file)?;
        Ok(Arc::new(Access { config, tokens: RwLock::new(tokens) }))
    }

    /// Tokens in force.
    pub fn tokens(&self) -> usize {
        self.tokens.read().len()
    }

    /// Checks a request for `path` with these headers.
    pub fn check(&self, path: &str, headers: &http::HeaderMap) -> Result<(), Refusal> {
        let Some(needs) = required_role(path, &self.config) else { return Ok(()) };
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err(Refusal::Unauthenticated(
                "this method needs a token (authorization: Bearer)",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthenticated(
                "the authorization header is not \"Bearer <token>\"",
            ))?;
        let Some(has) = self.tokens.read().find(token) else {
            return Err(Refusal::Unauthenticated("the token is not valid"));
        };
        if has < needs {
            return Err(Refusal::PermissionDenied { needs, has });
        }
        Ok(())
    }

    /// Reads the tokens file again. On an error the tokens in force stay.
    pub fn reload(&self) -> Result<usize, String> {
        let tokens = Tokens::load(&self.config.tokens_file)?;
        let n = tokens.len();
        *self.tokens.write() = tokens;
        Ok(n)
    }

    /// Reads the tokens file again on SIGHUP and whenever it changes (looked at every
    /// `every`), until the returned task is aborted.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let access = self.clone();
        let file = self.config.tokens_file.clone();
        crate::reload::watch_files("the tokens file", vec![file], every, move || {
            access.reload().map(|n| format!("{n} tokens"))
        })
    }
}

/// The bearer token `/metrics` asks for, when configured: the one line of a file (its
/// SHA-256 kept, not the token), read again on SIGHUP and when the file changes. Prometheus
/// sends it with `authorization: credentials_file` (or `bearer_token_file`).
#[derive(Debug)]
pub struct MetricsToken {
    file: PathBuf,
    hash: RwLock<[u8; 32]>,
}

impl MetricsToken {
    /// Reads the token in `file`; an error when it does not read or is empty.
    pub fn new(file: PathBuf) -> Result<Arc<MetricsToken>, String> {
        let hash = read_metrics_token(&file)?;
        Ok(Arc::new(MetricsToken { file, hash: RwLock::new(hash) }))
    }

    /// Whether a request with the `authorization` header `header` may read the metrics.
    pub fn allows(&self, header: Option<&http::HeaderValue>) -> bool {
        header
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| sha256(t.trim().as_bytes()) == *self.hash.read())
    }

    /// Reads the file again; on an error the token in force stays.
    pub fn reload(&self) -> Result<(), String> {
        *self.hash.write() = read_metrics_token(&self.file)?;
        Ok(())
    }

    /// Reads it again on SIGHUP and whenever it changes (looked at every `every`).
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let token = self.clone();
        let files = vec![self.file.clone()];
        crate::reload::watch_files("the metrics token", files, every, move || {
            token.reload().map(|()| token.file.display().to_string())
        })
    }
}

/// The SHA-256 of the token in `file` (surrounding white space left out).
fn read_metrics_token(file: &Path) -> Result<[u8; 32], String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("the metrics token file {}: {e}", file.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the metrics token file {} is empty", file.display()));
    }
    Ok(sha256(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, role: &str, token: &str) -> String {
        format!(
            "[[token]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{}\"\n",
            hex(&sha256(token.as_bytes()))
        )
    }

    fn headers(token: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(t) = token {
            h.insert(http::header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
        }
        h
    }

    fn access(text: &str, config: AccessConfig) -> (tempfile::TempDir, Arc<Access>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, text).unwrap();
        let a = Access::new(AccessConfig { tokens_file: path, ..config }).unwrap();
        (dir, a)
    }

    #[test]
    fn roles_nest_and_refusals_say_which() {
        let text = [entry("r", "read", "tr"), entry("w", "write", "tw"), entry("a", "admin", "ta")]
            .concat();
        let (_d, a) = access(&text, AccessConfig::default());
        let query = "/neardup.v1.Neardup/Query";
        let insert = "/neardup.v1.Neardup/Insert";
        let admin = "/neardup.admin.v1.Admin/AddNode";
        for (token, path, ok) in [
            ("tr", query, true),
            ("tr", insert, false),
            ("tr", admin, false),
            ("tw", query, true),
            ("tw", insert, true),
            ("tw", admin, false),
            ("ta", admin, true),
            ("ta", insert, true),
        ] {
            let got = a.check(path, &headers(Some(token)));
            assert_eq!(got.is_ok(), ok, "{token} {path}: {got:?}");
            if let Err(r) = got {
                assert!(matches!(r, Refusal::PermissionDenied { .. }));
                assert_eq!(r.status().code(), tonic::Code::PermissionDenied);
            }
        }
        for h in [headers(None), headers(Some("wrong")), headers(Some(""))] {
            let r = a.check(query, &h).unwrap_err();
            assert_eq!(r.status().code(), tonic::Code::Unauthenticated);
        }
        // A refusal never names the token sent.
        let r = a.check(query, &headers(Some("secret-guess"))).unwrap_err();
        assert!(!r.status().message().contains("secret-guess"));
        // Open: health, reflection, the internal services; closed on request.
        let health = "/grpc.health.v1.Health/Check";
        assert!(a.check(health, &headers(None)).is_ok());
        assert!(a.check("/neardup.internal.v1.Data/TabletProbe", &headers(None)).is_ok());
        let closed = AccessConfig { close_health: true, ..AccessConfig::default() };
        let (_d, c) = access(&text, closed);
        assert!(c.check(health, &headers(None)).is_err());
        assert!(c.check(health, &headers(Some("tr"))).is_ok());
        // A method the list does not know needs admin.
        assert!(a.check("/neardup.v1.Neardup/Future", &headers(Some("tw"))).is_err());
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named() {
        assert!(Tokens::parse("").unwrap().is_empty());
        let e = Tokens::parse("[[token]]\nname = \"x\"\nrole = \"read\"\nsha256 = \"abc\"\n")
            .unwrap_err();
        assert!(e.contains("token 1 (\"x\")"), "{e}");
        let e = Tokens::parse(&entry("x", "root", "t")).unwrap_err();
        assert!(e.contains("root") || e.contains("role"), "{e}");
        let twice = [entry("x", "read", "t"), entry("y", "write", "t")].concat();
        assert!(Tokens::parse(&twice).unwrap_err().contains("twice"));
    }

    #[test]
    fn reload_takes_new_tokens_and_keeps_the_old_on_a_bad_file() {
        let (dir, a) = access(&entry("r", "read", "one"), AccessConfig::default());
        let path = dir.path().join("tokens.toml");
        let q = "/neardup.v1.Neardup/Query";
        assert!(a.check(q, &headers(Some("one"))).is_ok());
        std::fs::write(&path, entry("r", "read", "two")).unwrap();
        assert_eq!(a.reload(), Ok(1));
        assert!(a.check(q, &headers(Some("one"))).is_err());
        assert!(a.check(q, &headers(Some("two"))).is_ok());
        std::fs::write(&path, "not toml [").unwrap();
        assert!(a.reload().is_err());
        assert!(a.check(q, &headers(Some("two"))).is_ok());
    }

    #[test]
    fn the_metrics_token_is_a_bearer_token_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("metrics.token");
        std::fs::write(&file, "").unwrap();
        assert!(MetricsToken::new(file.clone()).unwrap_err().contains("empty"));
        std::fs::write(&file, "s3cret\n").unwrap();
        let token = MetricsToken::new(file.clone()).unwrap();
        let header = |v: &str| http::HeaderValue::from_str(v).unwrap();
        assert!(token.allows(Some(&header("Bearer s3cret"))));
        assert!(!token.allows(Some(&header("Bearer other"))));
        assert!(!token.allows(Some(&header("s3cret"))));
        assert!(!token.allows(None));
        std::fs::write(&file, "n3w").unwrap();
        token.reload().unwrap();
        assert!(token.allows(Some(&header("Bearer n3w"))));
        assert!(!token.allows(Some(&header("Bearer s3cret"))));
        std::fs::remove_file(&file).unwrap();
        assert!(token.reload().is_err());
        assert!(token.allows(Some(&header("Bearer n3w"))), "a failed reload keeps the token");
    }
}
