//! `neardup serve`: router, shard and storage in one process (embedded mode). The router
//! reaches the shard through the same trait as over the network, with no network between.

use std::sync::Arc;

use neardup_router::{InProcess, Router, RpcMetrics};
use neardup_server::{Shard, ShardMetrics, ShardService};
use prometheus_client::registry::Registry;

use crate::config::{Config, ConfigFlags};
use crate::error::CliError;
use crate::ops;

/// Options of `neardup serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    flags: ConfigFlags,
}

/// Opens the shard and starts its recovery on a blocking thread.
pub fn open_and_recover(config: &Config, metrics: ShardMetrics) -> Result<Arc<Shard>, CliError> {
    let shard =
        Shard::open(&config.data, config.shard_config()?, metrics).map_err(CliError::Start)?;
    let s = shard.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = s.recover() {
            tracing::error!(error = %e, "recovery failed; not serving");
        }
    });
    Ok(shard)
}

/// Stops the shard (flush, checkpoint, sync) on a blocking thread.
pub async fn shut_down(shard: Arc<Shard>) -> Result<(), CliError> {
    tokio::task::spawn_blocking(move || shard.shutdown())
        .await
        .map_err(|e| CliError::Shutdown(e.to_string()))?
        .map_err(|e| CliError::Shutdown(e.to_string()))
}

/// Runs `neardup serve`.
pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let config = Config::load(&args.flags, std::env::vars())?;
    if !ops::start_role(args.flags.print_config, &config) {
        return Ok(());
    }
    let listener = ops::bind(&config.listen, "gRPC").await?;
    let shard_metrics = ShardMetrics::default();
    let rpc_metrics = RpcMetrics::default();
    let shard = open_and_recover(&config, shard_metrics.clone())?;
    let mut registry = Registry::default();
    shard_metrics.register(&mut registry);
    rpc_metrics.register(&mut registry);
    ops::serve_metrics(&config.metrics_listen, registry).await?;
    let api =
        InProcess::new(ShardService::new(shard.clone()), neardup_router::shard::health_of(&shard));
    let router = Router::with_verify(
        Arc::new(api),
        shard.max_k(),
        config.limits.clone(),
        config.verify.clone(),
        rpc_metrics,
    );
    let address = listener.local_addr().map_err(|source| CliError::Listen {
        what: "gRPC",
        address: config.listen.clone(),
        source,
    })?;
    tracing::info!(
        address = %address,
        data = %config.data.display(),
        design = %config.index.design,
        "neardup serving (embedded router and shard)"
    );
    neardup_router::server::serve(listener, router, ops::shutdown_signal())
        .await
        .map_err(|e| CliError::Serve(e.to_string()))?;
    shut_down(shard).await
}
