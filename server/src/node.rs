//! A shard node's gRPC server: the internal `Shard` service, the reserved `Raft` service
//! and `grpc.health.v1`, whose status for `neardup.internal.v1.Shard` (and `""`) follows the
//! shard: NOT_SERVING while it recovers, when a tablet is corrupt, and from shutdown on.

use std::future::Future;
use std::sync::Arc;

use neardup_proto::internal::raft_server::RaftServer;
use neardup_proto::internal::shard_server::ShardServer;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;

use crate::service::{RaftService, ShardService};
use crate::shard::{Shard, Status};

/// Serves `shard` on `listener` until `shutdown` completes; returns once requests in
/// flight are answered. Does not stop the shard: call [`Shard::shutdown`] after.
pub async fn serve(
    listener: TcpListener,
    shard: Arc<Shard>,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let mut status = shard.watch_status();
    let follow = tokio::spawn(async move {
        loop {
            let s = match *status.borrow_and_update() {
                Status::Serving => ServingStatus::Serving,
                _ => ServingStatus::NotServing,
            };
            reporter.set_service_status("", s).await;
            reporter.set_service_status(neardup_proto::SHARD_SERVICE, s).await;
            if status.changed().await.is_err() {
                return;
            }
        }
    });
    // Served by axum over HTTP/2, as the router's public server is (see
    // `neardup_router::server`): tonic's transport would also enforce `grpc-timeout`,
    // answering CANCELLED instead of DEADLINE_EXCEEDED.
    let routes =
        tonic::service::Routes::new(health).add_service(RaftServer::new(RaftService)).add_service(
            ShardServer::new(ShardService::new(shard))
                .max_decoding_message_size(max_message_bytes)
                .max_encoding_message_size(max_message_bytes),
        );
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let result =
        axum::serve(listener, routes.into_axum_router()).with_graceful_shutdown(shutdown).await;
    follow.abort();
    result
}
