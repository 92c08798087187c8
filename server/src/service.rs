//! The internal gRPC service of a shard node, `neardup.internal.v1.Shard`, over a [`Shard`].
//!
//! The router reaches a shard through this service: over the network in a cluster, or by
//! calling it in-process in embedded mode, so both paths run the same code. Writes answer
//! only once their log records are durable. Large probe batches run on the blocking pool so
//! they do not stall the async workers.

use std::sync::Arc;

use neardup_proto::internal::raft_server::Raft;
use neardup_proto::internal::shard_server::Shard as ShardRpc;
use neardup_proto::internal::{
    AdmitRequest, AdmitResponse, ProbeRequest, ProbeResponse, RaftAck, RaftMessage,
    ShardStatsRequest, ShardStatsResponse, WaitDurableRequest, WaitDurableResponse, WriteRequest,
    WriteResponse,
};
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::shard::Shard;

/// Probe batches at least this large leave the async worker.
const BLOCKING_PROBE: usize = 64;

/// `neardup.internal.v1.Shard` over a [`Shard`].
#[derive(Debug, Clone)]
pub struct ShardService {
    shard: Arc<Shard>,
}

impl ShardService {
    /// The service of `shard`.
    pub fn new(shard: Arc<Shard>) -> ShardService {
        ShardService { shard }
    }

    /// The shard behind it.
    pub fn shard(&self) -> &Arc<Shard> {
        &self.shard
    }
}

#[tonic::async_trait]
impl ShardRpc for ShardService {
    async fn write(
        &self,
        request: Request<WriteRequest>,
    ) -> Result<Response<WriteResponse>, Status> {
        let WriteRequest { documents, deletes, deletes_must_exist, skip_sync } =
            request.into_inner();
        let out = self.shard.write(&documents, &deletes, deletes_must_exist)?;
        if !skip_sync {
            self.shard.wait_durable(out.seq).await?;
        }
        Ok(Response::new(WriteResponse {
            inserted: out.inserted,
            replaced: out.replaced,
            deleted: out.deleted,
            missing: out.missing,
            seq: out.seq,
        }))
    }

    async fn wait_durable(
        &self,
        request: Request<WaitDurableRequest>,
    ) -> Result<Response<WaitDurableResponse>, Status> {
        let WaitDurableRequest { seq } = request.into_inner();
        self.shard.wait_durable(seq).await?;
        Ok(Response::new(WaitDurableResponse {}))
    }

    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let ProbeRequest { fingerprints, k, limit } = request.into_inner();
        let results = if fingerprints.len() >= BLOCKING_PROBE {
            let shard = self.shard.clone();
            tokio::task::spawn_blocking(move || shard.probe(&fingerprints, k, limit as usize))
                .await
                .map_err(|e| Error::Internal(format!("probe task failed: {e}")))??
        } else {
            self.shard.probe(&fingerprints, k, limit as usize)?
        };
        Ok(Response::new(ProbeResponse { results }))
    }

    async fn admit(
        &self,
        request: Request<AdmitRequest>,
    ) -> Result<Response<AdmitResponse>, Status> {
        let AdmitRequest { document, k, limit, skip_insert_if_duplicate } = request.into_inner();
        let doc =
            document.ok_or_else(|| Error::InvalidInput("an admission needs a document".into()))?;
        let (decision, seq) =
            self.shard.admit(&doc, k, limit as usize, skip_insert_if_duplicate)?;
        self.shard.wait_durable(seq).await?;
        Ok(Response::new(AdmitResponse { decision: Some(decision) }))
    }

    async fn stats(
        &self,
        _request: Request<ShardStatsRequest>,
    ) -> Result<Response<ShardStatsResponse>, Status> {
        Ok(Response::new(ShardStatsResponse { stats: Some(self.shard.stats()?) }))
    }
}

/// The reserved Raft transport: refuses every message until the cluster release.
#[derive(Debug, Clone, Default)]
pub struct RaftService;

#[tonic::async_trait]
impl Raft for RaftService {
    async fn step(&self, _request: Request<RaftMessage>) -> Result<Response<RaftAck>, Status> {
        Err(Status::unimplemented("Raft is not enabled in this release"))
    }
}
