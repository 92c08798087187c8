//! `neardup router`: the public service alone, in front of a shard node over the network.

use std::sync::Arc;

use neardup_router::{Remote, Router, RpcMetrics};
use prometheus_client::registry::Registry;

use crate::config::{Config, ConfigFlags};
use crate::error::CliError;
use crate::ops;

/// Options of `neardup router`.
#[derive(Debug, clap::Args)]
pub struct RouterArgs {
    /// The shard node, as http://HOST:PORT [default: http://127.0.0.1:50061].
    #[arg(long)]
    shard: Option<String>,
    #[command(flatten)]
    flags: ConfigFlags,
}

/// Runs `neardup router`.
pub async fn run(args: RouterArgs) -> Result<(), CliError> {
    let mut config = Config::load(&args.flags, std::env::vars())?;
    if let Some(s) = args.shard {
        config.router.shard = s;
    }
    if !ops::start_role(args.flags.print_config, &config) {
        return Ok(());
    }
    let access = config.access()?;
    let tls = config.tls()?;
    let listener = ops::bind(&config.listen, "gRPC").await?;
    let max_k = config.index_config()?.design.max_k();
    // Only an address that does not parse fails here: the connection is made lazily.
    let remote = Remote::connect(&config.router.shard, config.limits.max_message_bytes)
        .map_err(|e| CliError::Config(e.message().into()))?;
    let metrics = RpcMetrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    ops::serve_metrics(&config.metrics_listen, registry, config.metrics_token()?).await?;
    let router = Router::with_verify(
        Arc::new(remote),
        max_k,
        config.limits.clone(),
        config.verify.clone(),
        metrics,
    );
    tracing::info!(address = %config.listen, shard = %config.router.shard, "router serving");
    neardup_router::server::serve(listener, router, access, tls, ops::shutdown_signal())
        .await
        .map_err(|e| CliError::Serve(e.to_string()))
}
