//! `neardup stats`: what the server holds.

use serde_json::json;

use crate::cmd::common::{self, ServerArgs};
use crate::error::CliError;

/// Options of `neardup stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    server: ServerArgs,
}

/// Runs `neardup stats`.
pub async fn run(args: StatsArgs) -> Result<(), CliError> {
    let s = args.server.client().await?.stats().await.map_err(|e| args.server.error(e))?;
    common::print(&json!({
        "documents": s.documents,
        "design": s.design,
        "max_k": s.max_k,
        "runs": s.runs,
        "buffered": s.buffered,
        "deleted_pending": s.deleted_pending,
        "merges": s.merges,
        "merging": s.merging,
        "checkpoint_pending": s.checkpoint_pending,
        "index_bytes": s.index_bytes,
        "document_bytes": s.document_bytes,
        "wal_bytes": s.wal_bytes,
        "disk_bytes": s.disk_bytes,
        "version": s.version,
        "tables": s.tables.iter().map(|t| json!({
            "bytes": t.bytes, "entries": t.entries, "bits_per_fingerprint": t.bits_per_fingerprint,
        })).collect::<Vec<_>>(),
    }));
    Ok(())
}
