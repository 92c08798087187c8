//! `neardup delete`: removes documents by id.

use serde_json::json;

use crate::cmd::common::{self, ServerArgs};
use crate::error::CliError;

/// Options of `neardup delete`.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Ids to remove.
    #[arg(required = true)]
    ids: Vec<String>,
    /// Fail (removing nothing) if an id is not stored.
    #[arg(long)]
    must_exist: bool,
}

/// Runs `neardup delete`.
pub async fn run(args: DeleteArgs) -> Result<(), CliError> {
    let client = args.server.client().await?;
    let r = client.delete(args.ids, args.must_exist).await.map_err(|e| args.server.error(e))?;
    common::print(&json!({ "deleted": r.deleted, "missing": r.missing }));
    Ok(())
}
