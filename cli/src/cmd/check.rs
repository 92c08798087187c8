//! `neardup check`: crawl-frontier admission of one document (CheckAndInsert).

use neardup_client::{doc, sketched_doc, text_doc_with_sketch};
use serde_json::json;

use crate::cmd::common::{self, ContentArgs, ServerArgs, VerifyArgs};
use crate::error::CliError;

/// Options of `neardup check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The document's id.
    #[arg(long)]
    id: String,
    #[command(flatten)]
    content: ContentArgs,
    /// Its timestamp, ms since the Unix epoch [default: now].
    #[arg(long)]
    timestamp_ms: Option<i64>,
    /// Near-duplicate distance [default: the design's maximum].
    #[arg(short, long)]
    k: Option<u32>,
    /// Most matches to list [default: 100].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    limit: u32,
    /// Do not store the document when it is a near-duplicate.
    #[arg(long)]
    skip_duplicates: bool,
    #[command(flatten)]
    verify: VerifyArgs,
}

/// Runs `neardup check`.
pub async fn run(args: CheckArgs) -> Result<(), CliError> {
    let client = args.server.client().await?;
    let ts = args.timestamp_ms.unwrap_or_else(common::now_ms);
    let d = match (args.content.fingerprint, args.content.text) {
        (Some(fp), _) => match args.verify.sketch.clone() {
            Some(s) => sketched_doc(args.id, fp, s, ts),
            None => doc(args.id, fp, ts),
        },
        (None, Some(t)) => {
            text_doc_with_sketch(args.id, t, ts).map_err(|e| args.server.error(e))?
        }
        (None, None) => return Err(CliError::Usage("give --fingerprint or --text".into())),
    };
    let r = client
        .check_and_insert_verified(
            d,
            args.k,
            args.verify.verification(),
            args.limit,
            args.skip_duplicates,
        )
        .await
        .map_err(|e| args.server.error(e))?;
    common::print(&json!({
        "duplicate": r.duplicate,
        "original_id": r.original_id,
        "cluster_id": r.cluster_id,
        "inserted": r.inserted,
        "replaced": r.replaced,
        "fingerprint": common::hex(r.fingerprint),
        "truncated": r.truncated,
        "matches": r.matches.iter().map(common::match_json).collect::<Vec<_>>(),
    }));
    Ok(())
}
