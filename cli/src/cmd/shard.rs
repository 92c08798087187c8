//! `neardup shard`: a shard node alone, serving the internal API for routers elsewhere.

use neardup_server::ShardMetrics;
use prometheus_client::registry::Registry;

use crate::cmd::serve::{open_and_recover, shut_down};
use crate::config::{Config, ConfigFlags};
use crate::error::CliError;
use crate::ops;

/// Options of `neardup shard`.
#[derive(Debug, clap::Args)]
pub struct ShardArgs {
    #[command(flatten)]
    flags: ConfigFlags,
}

/// Runs `neardup shard`.
pub async fn run(args: ShardArgs) -> Result<(), CliError> {
    let config = Config::load(&args.flags, std::env::vars())?;
    if !ops::start_role(args.flags.print_config, &config) {
        return Ok(());
    }
    let listener = ops::bind(&config.listen, "the internal gRPC API").await?;
    let metrics = ShardMetrics::default();
    let shard = open_and_recover(&config, metrics.clone())?;
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    ops::serve_metrics(&config.metrics_listen, registry, config.metrics_token()?).await?;
    tracing::info!(address = %config.listen, data = %config.data.display(), "shard node serving");
    neardup_server::node::serve(
        listener,
        shard.clone(),
        config.limits.max_message_bytes,
        config.limits.http2(),
        ops::shutdown_signal(),
    )
    .await
    .map_err(|e| CliError::Serve(e.to_string()))?;
    shut_down(shard).await
}
