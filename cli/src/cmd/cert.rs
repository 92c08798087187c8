//! `neardup cert`: a certificate authority, and certificates it signs, for tests and small
//! deployments (rcgen). Larger ones bring their own PKI: see `docs/security.md`.
//!
//! - `neardup cert ca --out DIR`: `DIR/ca.pem` and `DIR/ca.key`;
//! - `neardup cert issue --ca DIR --name NAME --host HOST... --out DIR`: `DIR/NAME.pem` and
//!   `DIR/NAME.key`, valid for each HOST (a DNS name or an IP address), for servers and
//!   clients alike. With `--node-id ID` it names cluster node ID (a URI SAN
//!   `urn:neardup:node:ID`), as a node's certificate for mutual TLS between nodes must;
//!   without, it is an operator's or a public server's.
//!
//! Keys are written with mode 0600. Each command prints one JSON object naming its files.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use neardup_server::tls::node_uri;
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::json;

use crate::error::CliError;

/// Options of `neardup cert`.
#[derive(Debug, clap::Args)]
pub struct CertArgs {
    /// What to make.
    #[command(subcommand)]
    pub command: CertCommand,
}

/// The `cert` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CertCommand {
    /// Make a certificate authority: DIR/ca.pem and DIR/ca.key.
    Ca {
        /// The directory to write to (made if missing; existing files are not replaced).
        #[arg(long)]
        out: PathBuf,
        /// The authority's common name.
        #[arg(long, default_value = "neardup CA")]
        name: String,
    },
    /// Make a certificate signed by the authority in --ca: DIR/NAME.pem and DIR/NAME.key.
    Issue {
        /// The authority's directory (ca.pem and ca.key).
        #[arg(long)]
        ca: PathBuf,
        /// The certificate's name (its common name and file names).
        #[arg(long)]
        name: String,
        /// A DNS name or IP address it is valid for; repeat for more.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// The cluster node it belongs to (a node's certificate for the internal port).
        #[arg(long)]
        node_id: Option<u64>,
        /// The directory to write to (made if missing; existing files are not replaced).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Runs `neardup cert`.
pub fn run(args: CertArgs) -> Result<(), CliError> {
    let made = match args.command {
        CertCommand::Ca { out, name } => {
            let (cert, key) = make_ca(&name)?;
            write_pair(&out, "ca", &cert, &key)?
        }
        CertCommand::Issue { ca, name, hosts, node_id, out } => {
            if name.is_empty() || name.contains(['/', '\0']) || name == "ca" {
                return Err(CliError::Config(format!("{name:?} cannot name a certificate file")));
            }
            let (cert, key) = issue(&ca, &name, hosts, node_id)?;
            write_pair(&out, &name, &cert, &key)?
        }
    };
    println!("{made}");
    Ok(())
}

/// A new certificate authority named `name`: its certificate and key (PEM).
pub fn make_ca(name: &str) -> Result<(String, String), CliError> {
    let key = KeyPair::generate().map_err(failed)?;
    let cert = ca_params(name)?.self_signed(&key).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A certificate (and its key, PEM) signed by the authority in `ca` (`ca.pem`, `ca.key`),
/// named `name`, valid for `hosts`, for servers and clients; naming cluster node `node_id`
/// when given.
pub fn issue(
    ca: &Path,
    name: &str,
    hosts: Vec<String>,
    node_id: Option<u64>,
) -> Result<(String, String), CliError> {
    let read = |file: &str| {
        let path = ca.join(file);
        std::fs::read_to_string(&path).map_err(|source| CliError::File {
            action: "read",
            path: path.display().to_string(),
            source,
        })
    };
    let ca_key = KeyPair::from_pem(&read("ca.key")?)
        .map_err(|e| CliError::Config(format!("{}: {e}", ca.join("ca.key").display())))?;
    let issuer = Issuer::from_ca_cert_pem(&read("ca.pem")?, ca_key)
        .map_err(|e| CliError::Config(format!("{}: {e}", ca.join("ca.pem").display())))?;
    let mut params =
        CertificateParams::new(hosts).map_err(|e| CliError::Config(format!("--host: {e}")))?;
    params.distinguished_name.push(DnType::CommonName, name);
    if let Some(id) = node_id {
        if id == 0 {
            return Err(CliError::Config("--node-id 0: node ids start at 1".into()));
        }
        let uri = Ia5String::try_from(node_uri(id)).map_err(failed)?;
        params.subject_alt_names.push(SanType::URI(uri));
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().map_err(failed)?;
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn ca_params(name: &str) -> Result<CertificateParams, CliError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

fn failed(e: rcgen::Error) -> CliError {
    CliError::Config(format!("cannot make the certificate: {e}"))
}

/// Writes `DIR/NAME.pem` and `DIR/NAME.key` (mode 0600), refusing to replace either; the
/// JSON naming them.
pub fn write_pair(
    dir: &Path,
    name: &str,
    cert: &str,
    key: &str,
) -> Result<serde_json::Value, CliError> {
    std::fs::create_dir_all(dir).map_err(|source| CliError::File {
        action: "create",
        path: dir.display().to_string(),
        source,
    })?;
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    write_new(&key_path, key, 0o600)?;
    write_new(&cert_path, cert, 0o644)?;
    Ok(json!({ "cert": cert_path.display().to_string(), "key": key_path.display().to_string() }))
}

/// Writes `text` to a new file at `path` with `mode`, synced; refuses to replace a file.
pub fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CliError> {
    let err = |action: &'static str| {
        move |source: std::io::Error| CliError::File {
            action,
            path: path.display().to_string(),
            source,
        }
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err("create"))?;
    f.write_all(text.as_bytes()).map_err(err("write"))?;
    f.sync_all().map_err(err("sync"))
}
