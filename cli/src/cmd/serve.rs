//! `neardup serve`: router, shard and storage in one process (embedded mode). The router
//! reaches the shard through the same trait as over the network, with no network between.
//!
//! In cluster mode (`--bootstrap`, `--join`, or a data directory holding cluster state) the
//! process is a node of a cluster instead: see [`crate::cmd::cluster_serve`].

use std::sync::Arc;

use neardup_router::{InProcess, Router, RpcMetrics};
use neardup_server::{Shard, ShardMetrics, ShardService};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::cmd::{cluster_node, cluster_serve};
use crate::config::{ClusterFlags, Config, ConfigFlags};
use crate::error::CliError;
use crate::ops;

/// Options of `neardup serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    flags: ConfigFlags,
    #[command(flatten)]
    cluster: ClusterFlags,
    /// The version this node reports instead of the build's (rolling-upgrade tests tell a
    /// restarted node by it).
    #[arg(long, hide = true)]
    report_version: Option<String>,
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
    let config = Config::load(&args.flags, std::env::vars())?.with_cluster_flags(&args.cluster)?;
    if !ops::start_role(args.flags.print_config, &config) {
        return Ok(());
    }
    if let Some(v) = args.report_version {
        neardup_server::set_reported_version(v);
    }
    if cluster_node::cluster_mode(&config) {
        config.check_exposure()?;
    }
    let listener = ops::bind(&config.listen, "gRPC").await?;
    let address = listener.local_addr().map_err(|source| CliError::Listen {
        what: "gRPC",
        address: config.listen.clone(),
        source,
    })?;
    let shard_metrics = ShardMetrics::default();
    let rpc_metrics = RpcMetrics::default();
    let mut registry = Registry::default();
    shard_metrics.register(&mut registry);
    rpc_metrics.register(&mut registry);
    if cluster_node::cluster_mode(&config) {
        return cluster_serve::run(config, listener, address, shard_metrics, rpc_metrics, registry)
            .await;
    }
    // Files that do not read stop the start here.
    let (access, tls) = (config.access()?, config.tls()?);
    let shard = open_and_recover(&config, shard_metrics.clone())?;
    ops::serve_metrics(&config.metrics_listen, registry, config.metrics_token()?).await?;
    let health = neardup_router::shard::health_of(&shard);
    let api = InProcess::new(ShardService::new(shard.clone()), health).with_shard(shard.clone());
    let router = Router::with_verify(
        Arc::new(api),
        shard.max_k(),
        config.limits.clone(),
        config.verify.clone(),
        rpc_metrics,
    );
    tracing::info!(
        address = %address,
        data = %config.data.display(),
        design = %config.index.design,
        "neardup serving (embedded router and shard)"
    );
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        ops::shutdown_signal().await;
        stop.send_replace(true);
    });
    let served =
        neardup_router::server::serve(listener, router, access, tls, stop_signal(stopped)).await;
    let down = shut_down(shard).await;
    served.map_err(|e| CliError::Serve(e.to_string()))?;
    down
}

/// Completes once `stopped` turns true (or its sender is gone).
pub async fn stop_signal(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}
