//! How the router reaches a shard: one trait, two implementations.
//!
//! [`ShardApi`] is the shard role as the router sees it, in the internal API's messages
//! (`neardup.internal.v1`). [`InProcess`] calls a shard service in the same process
//! (embedded mode: no network, no encoding); [`Remote`] calls one over gRPC. Both carry the
//! caller's deadline and report the shard's health, so the router behaves the same in
//! either mode.

use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_proto::admin::{RestoreStart, SnapshotChunk, SnapshotInfo};
use neardup_proto::internal::shard_client::ShardClient;
use neardup_proto::internal::shard_server::Shard as ShardRpc;
use neardup_proto::internal::{
    AdmitRequest, AdmitResponse, ProbeRequest, ProbeResponse, ShardStatsRequest,
    WaitDurableRequest, WriteRequest, WriteResponse,
};
use neardup_proto::v1::StatsResponse;
use neardup_server::Status as ShardStatus;
use neardup_server::{DataError, DocInfo, Shard};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use tonic::{Request, Status};

/// Whether a shard answers requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardHealth {
    /// It answers.
    Serving,
    /// It does not, and why (recovering, corrupt tablet, unreachable, shutting down).
    NotServing(String),
}

/// The shard role, as the router calls it.
///
/// # Contract
/// An implementation:
/// - answers each call as the `neardup.internal.v1.Shard` service documents it, with its
///   errors as gRPC statuses already mapped by the shard (the router passes them on);
/// - gives up at `deadline` (if any) with DEADLINE_EXCEEDED or CANCELLED, and never blocks
///   the calling async task on CPU-heavy work;
/// - keeps [`health`](ShardApi::health) current: a router only reports SERVING while its
///   shard does.
#[tonic::async_trait]
pub trait ShardApi: Send + Sync + 'static {
    /// Stores and removes documents.
    async fn write(
        &self,
        req: WriteRequest,
        deadline: Option<Instant>,
    ) -> Result<WriteResponse, Status>;
    /// Waits until log sequence `seq` is durable.
    async fn wait_durable(&self, seq: u64, deadline: Option<Instant>) -> Result<(), Status>;
    /// Answers a batch of queries.
    async fn probe(
        &self,
        req: ProbeRequest,
        deadline: Option<Instant>,
    ) -> Result<ProbeResponse, Status>;
    /// Admits one document.
    async fn admit(
        &self,
        req: AdmitRequest,
        deadline: Option<Instant>,
    ) -> Result<AdmitResponse, Status>;
    /// The shard's statistics.
    async fn stats(&self, deadline: Option<Instant>) -> Result<StatsResponse, Status>;
    /// The shard's health, kept current.
    fn health(&self) -> watch::Receiver<ShardHealth>;
    /// Sends a snapshot of every document into `tx`, chunk by chunk
    /// ([`crate::backup`]); an error ends it. Refused where the shard keeps no documents.
    async fn snapshot(&self, tx: mpsc::Sender<Result<SnapshotChunk, Status>>) {
        let _ = tx.send(Err(Status::unimplemented("this server takes no backups"))).await;
    }
    /// Restores a backup (`start`, then the documents `docs` yields, chunk by chunk, under
    /// their own ids); an `Err` from `docs` aborts it with that error. Returns the documents
    /// stored once all are durable. Refused where the shard keeps no documents.
    async fn restore(
        &self,
        _start: RestoreStart,
        _docs: mpsc::Receiver<Result<Vec<DocInfo>, Status>>,
    ) -> Result<u64, Status> {
        Err(Status::unimplemented("this server takes no restores"))
    }
}

fn request<T>(msg: T, deadline: Option<Instant>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(d) = deadline {
        r.set_timeout(d.saturating_duration_since(Instant::now()));
    }
    r
}

/// The health of a shard in this process (embedded mode), kept current from its status:
/// what [`InProcess::new`] takes.
pub fn health_of(shard: &neardup_server::Shard) -> watch::Receiver<ShardHealth> {
    let mut status = shard.watch_status();
    let (tx, rx) = watch::channel(ShardHealth::NotServing("starting".into()));
    tokio::spawn(async move {
        loop {
            let h = match &*status.borrow_and_update() {
                ShardStatus::Serving => ShardHealth::Serving,
                ShardStatus::Recovering => ShardHealth::NotServing("recovering".into()),
                ShardStatus::Corrupt(m) => ShardHealth::NotServing(format!("corrupt tablet: {m}")),
                ShardStatus::Failed(m) => ShardHealth::NotServing(format!("storage failed: {m}")),
                ShardStatus::ShuttingDown => ShardHealth::NotServing("shutting down".into()),
            };
            tx.send_replace(h);
            if status.changed().await.is_err() {
                return;
            }
        }
    });
    rx
}

/// A shard service in this process (embedded mode): the router calls it directly.
///
/// The calls carry no deadline: the shard service reads none (its work is bounded by its
/// own budgets), and the router gives up at the caller's deadline around every call, so
/// writing one into each request's metadata would only cost time.
pub struct InProcess<S> {
    service: S,
    health: watch::Receiver<ShardHealth>,
    /// The shard itself, for backups and restores ([`with_shard`](Self::with_shard)).
    shard: Option<Arc<Shard>>,
}

impl<S: ShardRpc> InProcess<S> {
    /// Calls `service`; `health` is kept current by whoever owns the shard.
    pub fn new(service: S, health: watch::Receiver<ShardHealth>) -> Self {
        InProcess { service, health, shard: None }
    }

    /// Takes backups and restores through `shard` (the one `service` serves).
    pub fn with_shard(mut self, shard: Arc<Shard>) -> Self {
        self.shard = Some(shard);
        self
    }

    fn backups(&self) -> Result<&Arc<Shard>, Status> {
        self.shard.as_ref().ok_or_else(|| Status::unimplemented("this server takes no backups"))
    }
}

#[tonic::async_trait]
impl<S: ShardRpc> ShardApi for InProcess<S> {
    async fn write(
        &self,
        req: WriteRequest,
        _deadline: Option<Instant>,
    ) -> Result<WriteResponse, Status> {
        Ok(self.service.write(Request::new(req)).await?.into_inner())
    }

    async fn wait_durable(&self, seq: u64, _deadline: Option<Instant>) -> Result<(), Status> {
        self.service.wait_durable(Request::new(WaitDurableRequest { seq })).await?;
        Ok(())
    }

    async fn probe(
        &self,
        req: ProbeRequest,
        _deadline: Option<Instant>,
    ) -> Result<ProbeResponse, Status> {
        Ok(self.service.probe(Request::new(req)).await?.into_inner())
    }

    async fn admit(
        &self,
        req: AdmitRequest,
        _deadline: Option<Instant>,
    ) -> Result<AdmitResponse, Status> {
        Ok(self.service.admit(Request::new(req)).await?.into_inner())
    }

    async fn stats(&self, _deadline: Option<Instant>) -> Result<StatsResponse, Status> {
        let r = self.service.stats(Request::new(ShardStatsRequest {})).await?;
        r.into_inner().stats.ok_or_else(|| Status::internal("the shard sent no statistics"))
    }

    fn health(&self) -> watch::Receiver<ShardHealth> {
        self.health.clone()
    }

    async fn snapshot(&self, tx: mpsc::Sender<Result<SnapshotChunk, Status>>) {
        let start = async {
            let shard = self.backups()?.clone();
            let s = self.stats(None).await?;
            let info = SnapshotInfo {
                kind: "node".into(),
                design: s.design,
                partitions: 0,
                documents: s.documents,
            };
            Ok::<_, Status>((shard, info))
        };
        match start.await {
            Ok((shard, info)) => {
                let copy = move || crate::backup::node_snapshot(&shard, info, &tx);
                let _ = tokio::task::spawn_blocking(copy).await;
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
            }
        }
    }

    async fn restore(
        &self,
        start: RestoreStart,
        mut docs: mpsc::Receiver<Result<Vec<DocInfo>, Status>>,
    ) -> Result<u64, Status> {
        let shard = self.backups()?.clone();
        let held = self.stats(None).await?.documents;
        if held > 0 && !start.resume {
            return Err(Status::failed_precondition(format!(
                "this node holds {held} documents: a restore goes into an empty node (or is \
                 resumed with --resume)"
            )));
        }
        let failed = |e: neardup_server::Error| Status::from(DataError::from(e));
        let joined =
            |e: tokio::task::JoinError| Status::internal(format!("the restore failed: {e}"));
        if held == 0 {
            // An empty node: everything at once (built whole, no log), or nothing.
            let mut all = Vec::new();
            while let Some(chunk) = docs.recv().await {
                all.extend(chunk?);
            }
            let n = all.len() as u64;
            tokio::task::spawn_blocking(move || shard.restore_bulk(&all))
                .await
                .map_err(joined)?
                .map_err(failed)?;
            return Ok(n);
        }
        // Resumed over documents held: through the log, chunk by chunk.
        let (mut n, mut seq) = (0u64, 0u64);
        while let Some(chunk) = docs.recv().await {
            let chunk = chunk?;
            n += chunk.len() as u64;
            let s = shard.clone();
            seq = seq.max(
                tokio::task::spawn_blocking(move || s.restore_docs(&chunk))
                    .await
                    .map_err(joined)?
                    .map_err(failed)?,
            );
        }
        shard.wait_durable(seq).await.map_err(failed)?;
        Ok(n)
    }
}

/// A shard on another process, over the internal gRPC API. Its health is watched with
/// `grpc.health.v1` (service `neardup.internal.v1.Shard`).
pub struct Remote {
    client: ShardClient<Channel>,
    health: watch::Receiver<ShardHealth>,
}

impl Remote {
    /// Connects lazily to the shard at `endpoint` (`http://host:port`) and starts watching
    /// its health (the first check happens at once). `max_message_bytes` bounds what the
    /// shard may send back.
    pub fn connect(endpoint: &str, max_message_bytes: usize) -> Result<Remote, Status> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| Status::invalid_argument(format!("bad shard address {endpoint}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .connect_lazy();
        let client = ShardClient::new(channel.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        let (tx, rx) = watch::channel(ShardHealth::NotServing("not checked yet".into()));
        tokio::spawn(watch_health(channel, tx));
        Ok(Remote { client, health: rx })
    }
}

/// Polls the shard's health every half second while anyone listens.
async fn watch_health(channel: Channel, tx: watch::Sender<ShardHealth>) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let mut client = HealthClient::new(channel);
    loop {
        let mut req =
            Request::new(HealthCheckRequest { service: neardup_proto::SHARD_SERVICE.to_string() });
        req.set_timeout(Duration::from_secs(2));
        let h = match client.check(req).await {
            Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => ShardHealth::Serving,
            Ok(r) => {
                ShardHealth::NotServing(format!("shard reports status {}", r.get_ref().status))
            }
            Err(e) => ShardHealth::NotServing(format!("shard unreachable: {}", e.message())),
        };
        tx.send_if_modified(|cur| {
            let changed = *cur != h;
            *cur = h;
            changed
        });
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tonic::async_trait]
impl ShardApi for Remote {
    async fn write(
        &self,
        req: WriteRequest,
        deadline: Option<Instant>,
    ) -> Result<WriteResponse, Status> {
        Ok(self.client.clone().write(request(req, deadline)).await?.into_inner())
    }

    async fn wait_durable(&self, seq: u64, deadline: Option<Instant>) -> Result<(), Status> {
        self.client.clone().wait_durable(request(WaitDurableRequest { seq }, deadline)).await?;
        Ok(())
    }

    async fn probe(
        &self,
        req: ProbeRequest,
        deadline: Option<Instant>,
    ) -> Result<ProbeResponse, Status> {
        Ok(self.client.clone().probe(request(req, deadline)).await?.into_inner())
    }

    async fn admit(
        &self,
        req: AdmitRequest,
        deadline: Option<Instant>,
    ) -> Result<AdmitResponse, Status> {
        Ok(self.client.clone().admit(request(req, deadline)).await?.into_inner())
    }

    async fn stats(&self, deadline: Option<Instant>) -> Result<StatsResponse, Status> {
        let r = self.client.clone().stats(request(ShardStatsRequest {}, deadline)).await?;
        r.into_inner().stats.ok_or_else(|| Status::internal("the shard sent no statistics"))
    }

    fn health(&self) -> watch::Receiver<ShardHealth> {
        self.health.clone()
    }
}
