//! A node's internal gRPC server and `grpc.health.v1`, whose status for
//! `neardup.internal.v1.Shard` (and `""`) follows the node's storage: NOT_SERVING while it
//! recovers, when a tablet is corrupt, and from shutdown on.
//!
//! Outside a cluster ([`serve`]) it serves the internal `Shard` service over one [`Shard`],
//! and the `Raft` service refuses every message. A cluster node ([`serve_cluster`]) serves
//! the `Data` service over its [`NodeStore`], hands Raft messages to its [`ClusterNode`] and
//! serves the admin API (`neardup.admin.v1`); its health is SERVING only once the store
//! serves and the node has applied the committed cluster map.

use std::future::Future;
use std::sync::Arc;

use neardup_cluster::map::ClusterMap;
use neardup_cluster::{ClusterNode, NodeId};
use neardup_proto::admin::admin_server::AdminServer;
use neardup_proto::internal::data_server::DataServer;
use neardup_proto::internal::raft_server::RaftServer;
use neardup_proto::internal::shard_server::ShardServer;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;

use crate::access::Access;
use crate::cluster_rpc::{AdminService, RaftRpc};
use crate::data_api::{DataService, NodeApi};
use crate::node_store::NodeStore;
use crate::service::{RaftService, ShardService};
use crate::shard::{Shard, Status};
use crate::tls::{ClusterTls, PeerCert};
use crate::transport::{GrpcServices, Http2Limits, PeerCheck, serve_http2};

/// Serves `shard` on `listener` until `shutdown` completes; returns once requests in
/// flight are answered. Does not stop the shard: call [`Shard::shutdown`] after.
pub async fn serve(
    listener: TcpListener,
    shard: Arc<Shard>,
    max_message_bytes: usize,
    http2: Http2Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // Outside a cluster, nothing to wait for: a channel that stays `true`.
    let (_always, ready) = tokio::sync::watch::channel(true);
    let follow = follow_health(reporter, shard.watch_status(), ready);
    let shard_service = ShardServer::new(ShardService::new(shard))
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    let services =
        GrpcServices::new().with(health).with(shard_service).with(RaftServer::new(RaftService));
    let result = serve_http2(listener, services, http2, None, shutdown).await;
    follow.abort();
    result
}

/// As [`serve`], for a node of a cluster: the `Data` service answers over `data` (the
/// node's [`NodeStore`] under its map), Raft messages go to `cluster`, and the admin API is
/// served beside them. Health is SERVING once the store serves and the node has applied the
/// committed map. With `access`, the admin API needs an admin token (see
/// [`crate::access`]). With `tls`, connections are mutual TLS and callers are checked by
/// their certificate (see [`member_check`]). Does not stop `cluster` or the store.
#[allow(clippy::too_many_arguments)]
pub async fn serve_cluster(
    listener: TcpListener,
    store: Arc<NodeStore>,
    data: Arc<dyn NodeApi>,
    cluster: ClusterNode,
    max_message_bytes: usize,
    http2: Http2Limits,
    access: Option<Arc<Access>>,
    tls: Option<Arc<ClusterTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let follow = follow_health(reporter, store.watch_status(), cluster.watch_ready());
    let peer_check = tls.as_ref().map(|_| member_check(cluster.id(), cluster.watch_map()));
    let data = DataServer::new(DataService::new(data))
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    let services = GrpcServices::new()
        .with(health)
        .with(data)
        .with(
            RaftServer::new(RaftRpc::new(cluster.clone()))
                .max_decoding_message_size(max_message_bytes),
        )
        .with(AdminServer::new(AdminService::new(cluster, tls.clone())))
        .with_access(access)
        .with_peer_check(peer_check);
    let result = serve_http2(listener, services, http2, tls.map(|t| t.server()), shutdown).await;
    follow.abort();
    result
}

/// The check of who calls a cluster node's internal port under mutual TLS (the handshake
/// already verified the certificate against the cluster CA):
/// - health: anyone;
/// - the admin API: any certificate of the CA (an operator's, or a node's joining); the
///   token and the request are checked after, and a node's certificate may not belong to a
///   removed node;
/// - Raft and the data service: only certificates naming a node. A member of this node's map
///   passes; a removed node is PERMISSION_DENIED; another node is UNAVAILABLE (this node's
///   map may lag behind its joining), except while this node has not joined yet itself (its
///   first map comes through Raft, from the leader).
pub fn member_check(me: NodeId, map: tokio::sync::watch::Receiver<Arc<ClusterMap>>) -> PeerCheck {
    Arc::new(move |path: &str, peer: Option<&PeerCert>| {
        if path.starts_with("/grpc.health.v1.") {
            return Ok(());
        }
        let Some(peer) = peer else {
            return Err(tonic::Status::unauthenticated("a client certificate is required"));
        };
        let map = map.borrow();
        if let Some(id) = peer.node
            && map.is_removed(id)
        {
            return Err(tonic::Status::permission_denied(format!(
                "node {id} was removed from the cluster (certificate {:?})",
                peer.name
            )));
        }
        if !path.starts_with("/neardup.internal.") {
            return Ok(());
        }
        let Some(id) = peer.node else {
            return Err(tonic::Status::permission_denied(format!(
                "certificate {:?} names no node: Raft and the data service are for the \
                 cluster's nodes",
                peer.name
            )));
        };
        if map.nodes.contains_key(&id) || !map.nodes.contains_key(&me) {
            return Ok(());
        }
        Err(tonic::Status::unavailable(format!(
            "node {id} is not a member of the cluster as this node knows it (epoch {})",
            map.epoch
        )))
    })
}

/// Keeps the health of `""` and the shard service at SERVING while `status` is serving and
/// `ready` is true, NOT_SERVING otherwise.
fn follow_health(
    reporter: tonic_health::server::HealthReporter,
    mut status: tokio::sync::watch::Receiver<Status>,
    mut ready: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let serving = matches!(*status.borrow_and_update(), Status::Serving);
            let s = if serving && *ready.borrow_and_update() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status("", s).await;
            reporter.set_service_status(neardup_proto::SHARD_SERVICE, s).await;
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                r = ready.changed() => if r.is_err() { return },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus as Health;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;
    use crate::fault_store::FaultyStore;
    use crate::shard::{NewDocument, ShardConfig};
    use crate::storage::SledStore;
    use crate::{ErrorClass, ShardMetrics};

    /// After a failed sync, health reports NOT_SERVING for the shard service.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_is_not_serving_after_a_failed_sync() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig { min_free_bytes: 0, cache_bytes: 8 << 20, ..Default::default() };
        let sled = Arc::new(SledStore::open(&dir.path().join("db"), config.cache_bytes).unwrap());
        let store = FaultyStore::new(sled);
        let shard =
            Shard::open_with_store(dir.path(), store.clone(), config, ShardMetrics::default())
                .unwrap();
        shard.recover().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(
            listener,
            shard.clone(),
            4 << 20,
            Http2Limits::default(),
            std::future::pending(),
        ));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let health = HealthClient::new(channel);
        let status = || {
            let req = HealthCheckRequest { service: neardup_proto::SHARD_SERVICE.to_string() };
            let mut h = health.clone();
            async move { h.check(req).await.unwrap().into_inner().status }
        };
        assert_eq!(status().await, Health::Serving as i32);
        store.fail_syncs(1);
        let doc = NewDocument { id: "a".into(), fingerprint: 1, timestamp_ms: 1, sketch: None };
        let out = shard.write(&[doc], &[], false).unwrap();
        let e = shard.wait_durable(out.seq).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::FailedPrecondition, "{e}");
        while status().await != Health::NotServing as i32 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shard.close_without_checkpoint();
    }
}
