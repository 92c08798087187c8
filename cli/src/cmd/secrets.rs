//! `neardup secrets`: everything a small cluster needs to run with TLS and tokens, made in
//! one directory by one command, and only once: what exists is kept, so the command can run
//! before every start (the Compose file's `secrets` step does). Larger deployments bring
//! their own PKI and token store (`docs/security.md`).
//!
//! In `--out DIR`:
//! - `ca.pem`, `ca.key`: the cluster's certificate authority;
//! - `HOST.pem`, `HOST.key` for each `--node ID=HOST[,MORE...]`: the node's certificate,
//!   naming node ID (for mutual TLS between nodes), valid for HOST, any MORE names,
//!   `localhost` and `127.0.0.1` (it serves the public port too);
//! - `tokens.toml` (the server's `auth.tokens_file`) and `NAME.token` for each
//!   `--token NAME=ROLE`;
//! - `metrics.token` with `--metrics-token` (`auth.metrics_token_file`, and Prometheus's
//!   `credentials_file`).
//!
//! Keys and tokens are written with mode 0600. Prints one JSON object: what was made and
//! what was kept.

use std::path::{Path, PathBuf};

use neardup_server::access::Role;
use serde_json::json;

use crate::cmd::cert::{issue, make_ca, write_new, write_pair};
use crate::cmd::token::{append_entry, new_token, parse_role};
use crate::error::CliError;

/// Options of `neardup secrets`.
#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    /// The directory to write to (made if missing).
    #[arg(long)]
    out: PathBuf,
    /// A cluster node, as ID=HOST[,MORE...]: the host name the other nodes reach it by
    /// (its files are HOST.pem and HOST.key), and more names clients may use; repeat for
    /// each node.
    #[arg(long = "node", value_parser = parse_node)]
    nodes: Vec<(u64, Vec<String>)>,
    /// An API token, as NAME=ROLE (read, write or admin): its entry goes to tokens.toml, the
    /// token to NAME.token; repeat for more.
    #[arg(long = "token", value_parser = parse_token)]
    tokens: Vec<(String, Role)>,
    /// Also make metrics.token, the bearer token of the metrics endpoint.
    #[arg(long)]
    metrics_token: bool,
}

fn parse_node(s: &str) -> Result<(u64, Vec<String>), String> {
    let (id, hosts) = s.split_once('=').ok_or_else(|| format!("{s:?}: give ID=HOST"))?;
    let id: u64 = id.parse().map_err(|e| format!("{s:?}: node id {id:?}: {e}"))?;
    let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
    let file_name = |h: &String| {
        !h.is_empty()
            && !h.starts_with('.')
            && h.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
    };
    if id == 0 || !hosts.iter().all(file_name) || hosts[0] == "ca" {
        return Err(format!(
            "{s:?}: give ID=HOST[,MORE...] with an id from 1 and host names (letters, digits, \
             -, . and _)"
        ));
    }
    Ok((id, hosts))
}

fn parse_token(s: &str) -> Result<(String, Role), String> {
    let (name, role) = s.split_once('=').ok_or_else(|| format!("{s:?}: give NAME=ROLE"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("{s:?}: a token name here is letters, digits, - and _ (a file name)"));
    }
    Ok((name.to_string(), parse_role(role)?))
}

/// Whether both files of a pair exist; an error when only one does.
fn pair_exists(dir: &Path, name: &str) -> Result<bool, CliError> {
    let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    match (cert.exists(), key.exists()) {
        (true, true) => Ok(true),
        (false, false) => Ok(false),
        _ => Err(CliError::Config(format!(
            "{} and {} go together, and only one exists: remove it or restore the other",
            cert.display(),
            key.display()
        ))),
    }
}

/// Runs `neardup secrets`.
pub fn run(args: SecretsArgs) -> Result<(), CliError> {
    let dir = &args.out;
    std::fs::create_dir_all(dir).map_err(|source| CliError::File {
        action: "create",
        path: dir.display().to_string(),
        source,
    })?;
    let (mut made, mut kept) = (Vec::new(), Vec::new());
    if pair_exists(dir, "ca")? {
        kept.push("ca".to_string());
    } else {
        let (cert, key) = make_ca("neardup cluster CA")?;
        write_pair(dir, "ca", &cert, &key)?;
        made.push("ca".to_string());
    }
    for (id, hosts) in &args.nodes {
        let name = hosts[0].clone();
        if pair_exists(dir, &name)? {
            kept.push(name);
            continue;
        }
        let mut hosts = hosts.clone();
        hosts.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
        let (cert, key) = issue(dir, &name, hosts, Some(*id))?;
        write_pair(dir, &name, &cert, &key)?;
        made.push(name);
    }
    for (name, role) in &args.tokens {
        let file = dir.join(format!("{name}.token"));
        if file.exists() {
            kept.push(format!("{name}.token"));
            continue;
        }
        // The entry first: a stop between the two leaves an entry nobody holds the token
        // of, never a token the server refuses.
        let (token, _, entry) = new_token(name, *role)?;
        append_entry(&dir.join("tokens.toml"), &entry)?;
        write_new(&file, &token, 0o600)?;
        made.push(format!("{name}.token"));
    }
    if args.metrics_token {
        let file = dir.join("metrics.token");
        if file.exists() {
            kept.push("metrics.token".to_string());
        } else {
            let (token, _, _) = new_token("metrics", Role::Read)?;
            write_new(&file, &token, 0o600)?;
            made.push("metrics.token".to_string());
        }
    }
    println!("{}", json!({ "dir": dir.display().to_string(), "made": made, "kept": kept }));
    Ok(())
}
