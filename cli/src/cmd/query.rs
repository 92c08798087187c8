//! `neardup query`: the stored documents near a fingerprint or a text.

use neardup_client::Target;

use crate::cmd::common::{self, ContentArgs, ServerArgs, VerifyArgs};
use crate::error::CliError;

/// Options of `neardup query`.
#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    content: ContentArgs,
    /// Largest Hamming distance [default: the design's maximum].
    #[arg(short, long)]
    k: Option<u32>,
    /// Most matches [default: the server's, 100].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    limit: u32,
    #[command(flatten)]
    verify: VerifyArgs,
}

/// Runs `neardup query`.
pub async fn run(args: QueryArgs) -> Result<(), CliError> {
    let client = args.server.client().await?;
    let (target, sketch) = match (args.content.fingerprint, args.content.text) {
        (Some(fp), _) => (Target::Fingerprint(fp), args.verify.sketch.clone().unwrap_or_default()),
        (None, Some(t)) => {
            let s = neardup_client::sketch_of_text(&t).map_err(|e| args.server.error(e))?;
            (Target::Text(t), s)
        }
        (None, None) => return Err(CliError::Usage("give --fingerprint or --text".into())),
    };
    let r = client
        .query_verified(target, sketch, args.k, args.verify.verification(), args.limit)
        .await
        .map_err(|e| args.server.error(e))?;
    common::print(&common::result_json(&r));
    Ok(())
}
