//! `neardup health`: asks a server's `grpc.health.v1` and exits 0 only when it is SERVING;
//! the probe of container health checks and scripts (the image holds no other tool).

use serde_json::json;

use crate::cmd::common::{self, ServerArgs};
use crate::error::CliError;

/// Options of `neardup health`.
#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The service asked about ("" for the server as a whole, which a cluster node reports
    /// SERVING once its storage serves and it has applied the cluster map).
    #[arg(long, default_value = "")]
    service: String,
}

/// Runs `neardup health`: prints `{"status": ...}`; an error unless SERVING.
pub async fn run(args: HealthArgs) -> Result<(), CliError> {
    let status = args
        .server
        .client()
        .await?
        .health(&args.service)
        .await
        .map_err(|e| args.server.error(e))?;
    let name = status.as_str_name();
    common::print(&json!({ "service": args.service, "status": name }));
    if status == neardup_client::ServingStatus::Serving {
        Ok(())
    } else {
        Err(CliError::NotServing(name.to_string()))
    }
}
