//! `neardup fingerprint`: texts in, fingerprints out (by the server, or locally).

use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use serde_json::json;

use crate::cmd::common::{self, ServerArgs};
use crate::error::CliError;

/// Options of `neardup fingerprint`.
#[derive(Debug, clap::Args)]
pub struct FingerprintArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Texts to fingerprint.
    texts: Vec<String>,
    /// Read one text from this file ("-": stdin) instead.
    #[arg(long, conflicts_with = "texts")]
    file: Option<String>,
    /// Compute here, without a server (same specification and result).
    #[arg(long)]
    local: bool,
}

/// Runs `neardup fingerprint`.
pub async fn run(args: FingerprintArgs) -> Result<(), CliError> {
    let read = |path: &str, source| CliError::File { action: "read", path: path.into(), source };
    let texts = match &args.file {
        Some(p) if p == "-" => {
            vec![std::io::read_to_string(std::io::stdin()).map_err(|e| read("<stdin>", e))?]
        }
        Some(p) => vec![std::fs::read_to_string(p).map_err(|e| read(p, e))?],
        None if args.texts.is_empty() => {
            return Err(CliError::Usage("give texts or --file".into()));
        }
        None => args.texts,
    };
    let fps = if args.local {
        let mut f = Fingerprinter::new(FingerprintConfig::default())?;
        texts.iter().map(|t| f.fingerprint(t)).collect::<Result<Vec<_>, _>>()?
    } else {
        let client = args.server.client().await?;
        client.fingerprint(texts).await.map_err(|e| args.server.error(e))?
    };
    for fp in fps {
        common::print(&json!({ "fingerprint": common::hex(fp) }));
    }
    Ok(())
}
