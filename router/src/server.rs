//! The public gRPC server: the router's service, the backup service
//! ([`crate::backup`]), `grpc.health.v1` and reflection (v1 and v1alpha) on one listener,
//! with graceful shutdown.
//!
//! Health follows the shard: `""` and `neardup.v1.Neardup` are SERVING exactly while the
//! shard is, so a load balancer sends no traffic to a router whose shard is recovering,
//! corrupt or unreachable.
//!
//! The listener is [`neardup_server::transport::serve_http2`], with the connection limits of
//! [`Limits::http2`](crate::Limits::http2): the router is the only one enforcing deadlines.

use std::future::Future;
use std::sync::Arc;

use neardup_proto::admin::backup_server::BackupServer;
use neardup_proto::v1::neardup_server::NeardupServer;
use neardup_server::access::Access;
use neardup_server::tls::Tls;
use neardup_server::transport::GrpcServices;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::backup::BackupService;
use crate::service::Router;
use crate::shard::ShardHealth;

/// Sets `""` and `neardup.v1.Neardup` to `status`.
pub async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter.set_service_status(neardup_proto::PUBLIC_SERVICE, status).await;
}

/// Serves `router` on `listener` until `shutdown` completes, then stops taking new
/// requests and returns once those in flight are answered. Health follows the shard's
/// health until shutdown begins. With `access`, every request's token is checked first
/// (see [`neardup_server::access`]); with `tls`, connections are TLS
/// ([`neardup_server::tls`]).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    access: Option<Arc<Access>>,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    set_health(&reporter, ServingStatus::NotServing).await;
    let mut shard_health = router.shard().health();
    let follow = tokio::spawn(async move {
        loop {
            let h = shard_health.borrow_and_update().clone();
            match h {
                ShardHealth::Serving => set_health(&reporter, ServingStatus::Serving).await,
                ShardHealth::NotServing(why) => {
                    tracing::warn!(reason = %why, "shard not serving");
                    set_health(&reporter, ServingStatus::NotServing).await
                }
            }
            if shard_health.changed().await.is_err() {
                set_health(&reporter, ServingStatus::NotServing).await;
                return;
            }
        }
    });
    let reflection = || {
        // Only what this port serves: the descriptor set also holds the internal services.
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(neardup_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(neardup_proto::PUBLIC_SERVICE)
            .with_service_name("grpc.health.v1.Health")
    };
    let reflection_v1 = reflection().build_v1().expect("the descriptor sets are valid");
    let reflection_v1alpha = reflection().build_v1alpha().expect("the descriptor sets are valid");
    let max = router.limits().max_message_bytes;
    let router_shard = router.shard().clone();
    let http2 = router.limits().http2();
    // The public service first: the table is searched in order.
    let services = GrpcServices::new()
        .with(
            NeardupServer::new(router)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .with(
            BackupServer::new(BackupService::new(router_shard))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .with(health)
        .with(reflection_v1)
        .with(reflection_v1alpha)
        .with_access(access);
    let result =
        neardup_server::transport::serve_http2(listener, services, http2, tls, shutdown).await;
    follow.abort();
    result
}
