//! `neardup serve`: router, shard and storage in one process (embedded mode). The router
//! reaches the shard through the same trait as over the network, with no network between.
//!
//! In cluster mode (`--bootstrap`, `--join`, or a data directory holding cluster state) the
//! process is also a node of a cluster: see [`crate::cmd::cluster_node`]. It still serves its
//! own router and shard on the public listener.

use std::sync::Arc;

use neardup_router::shard::ShardHealth;
use neardup_router::{InProcess, Router, RpcMetrics};
use neardup_server::{Shard, ShardMetrics, ShardService};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::cmd::cluster_node;
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
    // The cluster's state is opened before the shard: a wrong node id stops the start here.
    let (cluster, internal_listener) = if cluster_node::cluster_mode(&config) {
        let (c, l) = cluster_node::start(&config, address, &mut registry).await?;
        (Some(c), Some(l))
    } else {
        (None, None)
    };
    let shard = open_and_recover(&config, shard_metrics.clone())?;
    ops::serve_metrics(&config.metrics_listen, registry).await?;
    let shard_health = neardup_router::shard::health_of(&shard);
    let health = match &cluster {
        Some(c) => with_map_applied(shard_health, c.node.watch_ready()),
        None => shard_health,
    };
    let api = InProcess::new(ShardService::new(shard.clone()), health);
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
    let stop = Arc::new(stop);
    let signal = stop.clone();
    tokio::spawn(async move {
        ops::shutdown_signal().await;
        signal.send_replace(true);
    });
    let internal = match (&cluster, internal_listener) {
        (Some(c), Some(l)) => Some(tokio::spawn(neardup_server::node::serve_cluster(
            l,
            shard.clone(),
            c.node.clone(),
            config.limits.max_message_bytes,
            config.limits.http2(),
            stop_signal(stopped.clone()),
        ))),
        _ => None,
    };
    // A joining node asks a member to add it once its internal listener serves (the leader
    // then replicates the map to it); a refused join stops the process.
    let joined = match &cluster {
        Some(c) => c.join().await,
        None => Ok(()),
    };
    if joined.is_err() {
        stop.send_replace(true);
    }
    let served = neardup_router::server::serve(listener, router, stop_signal(stopped)).await;
    if let Some(task) = internal {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the internal listener failed"),
            Err(e) => tracing::error!(error = %e, "the internal listener's task failed"),
        }
    }
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    let down = shut_down(shard).await;
    joined?;
    served.map_err(|e| CliError::Serve(e.to_string()))?;
    down
}

/// Completes once `stopped` turns true (or its sender is gone).
async fn stop_signal(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// The shard's health, held at NOT_SERVING until the node has applied the committed map.
fn with_map_applied(
    mut shard: watch::Receiver<ShardHealth>,
    mut ready: watch::Receiver<bool>,
) -> watch::Receiver<ShardHealth> {
    let (tx, rx) = watch::channel(ShardHealth::NotServing("starting".into()));
    tokio::spawn(async move {
        loop {
            let h = match (shard.borrow_and_update().clone(), *ready.borrow_and_update()) {
                (ShardHealth::Serving, true) => ShardHealth::Serving,
                (ShardHealth::Serving, false) => {
                    ShardHealth::NotServing("the cluster map is not applied yet".into())
                }
                (not, _) => not,
            };
            tx.send_replace(h);
            tokio::select! {
                r = shard.changed() => if r.is_err() { return },
                r = ready.changed() => if r.is_err() { return },
            }
        }
    });
    rx
}
