//! The internal gRPC service of a shard node, `neardup.internal.v1.Shard`, over a [`Shard`].
//!
//! The router reaches a shard through this service: over the network in a cluster, or by
//! calling it in-process in embedded mode, so both paths run the same code. Writes answer
//! only once their log records are durable. Large probe batches run on the blocking pool so
//! they do not stall the async workers.

use std::sync::Arc;

use neardup_core::sketch::Sketch;
use neardup_proto::internal::raft_server::Raft;
use neardup_proto::internal::shard_server::Shard as ShardRpc;
use neardup_proto::internal::{
    AdmitRequest, AdmitResponse, ProbeRequest, ProbeResponse, RaftAck, RaftBatch, RaftMessage,
    ShardDocument, ShardStatsRequest, ShardStatsResponse, WaitDurableRequest, WaitDurableResponse,
    WriteRequest, WriteResponse,
};
use neardup_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::metrics::AdmissionStage;
use crate::shard::{
    Admission, DocMatch, NewDocument, ProbeBudget, ProbeHits, Shard, ShardStats, TableFootprint,
    Verify, WriteOutcome,
};

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
        let documents: Vec<NewDocument> =
            documents.into_iter().map(new_document).collect::<Result<_, Error>>()?;
        let out = self.shard.write(&documents, &deletes, deletes_must_exist)?;
        if !skip_sync {
            self.shard.wait_durable(out.seq).await?;
        }
        Ok(Response::new(write_response(out)))
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
        let ProbeRequest {
            fingerprints,
            k,
            limit,
            max_matches,
            max_bytes,
            sketches,
            verify_jaccard,
            candidate_k,
        } = request.into_inner();
        let budget = ProbeBudget::at_most(
            usize::try_from(max_matches).unwrap_or(usize::MAX),
            usize::try_from(max_bytes).unwrap_or(usize::MAX),
        );
        let verify = verify_of(verify_jaccard, candidate_k)?;
        if verify.on() && !sketches.is_empty() {
            // Verified queries: one at a time (Query sends one).
            if sketches.len() != fingerprints.len() {
                return Err(Error::InvalidInput(format!(
                    "{} sketches for {} queries",
                    sketches.len(),
                    fingerprints.len()
                ))
                .into());
            }
            let sketches: Vec<Option<Sketch>> =
                sketches.iter().map(|b| sketch_of(b)).collect::<Result<_, Error>>()?;
            let mut left = budget;
            let mut results = Vec::with_capacity(fingerprints.len());
            for (fp, sk) in fingerprints.iter().zip(&sketches) {
                let hits =
                    self.shard.probe_verified(*fp, sk.as_ref(), k, verify, limit as usize, left)?;
                let spent: usize = hits.matches.iter().map(|m| DocMatch::wire_bytes(&m.id)).sum();
                left.max_matches = left.max_matches.saturating_sub(hits.matches.len());
                left.max_bytes = left.max_bytes.saturating_sub(spent);
                results.push(query_result(hits));
            }
            return Ok(Response::new(ProbeResponse { results }));
        }
        let results = if fingerprints.len() >= BLOCKING_PROBE {
            let shard = self.shard.clone();
            tokio::task::spawn_blocking(move || {
                shard.probe_within(&fingerprints, k, limit as usize, budget)
            })
            .await
            .map_err(|e| Error::Internal(format!("probe task failed: {e}")))??
        } else {
            self.shard.probe_within(&fingerprints, k, limit as usize, budget)?
        };
        Ok(Response::new(ProbeResponse {
            results: results.into_iter().map(query_result).collect(),
        }))
    }

    async fn admit(
        &self,
        request: Request<AdmitRequest>,
    ) -> Result<Response<AdmitResponse>, Status> {
        let AdmitRequest {
            document,
            k,
            limit,
            skip_insert_if_duplicate,
            verify_jaccard,
            candidate_k,
        } = request.into_inner();
        let doc =
            document.ok_or_else(|| Error::InvalidInput("an admission needs a document".into()))?;
        let verify = verify_of(verify_jaccard, candidate_k)?;
        let (decision, seq) = self.shard.admit(
            &new_document(doc)?,
            k,
            verify,
            limit as usize,
            skip_insert_if_duplicate,
        )?;
        let waiting = std::time::Instant::now();
        self.shard.wait_durable(seq).await?;
        self.shard
            .metrics()
            .admission_stage(AdmissionStage::Durable, waiting.elapsed().as_secs_f64());
        Ok(Response::new(AdmitResponse { decision: Some(check_and_insert_response(decision)) }))
    }

    async fn stats(
        &self,
        _request: Request<ShardStatsRequest>,
    ) -> Result<Response<ShardStatsResponse>, Status> {
        Ok(Response::new(ShardStatsResponse {
            stats: Some(stats_response(self.shard.stats()?)),
            partitions: Vec::new(),
        }))
    }
}

// Conversions between the wire types and the shard's own: every struct is destructured
// whole, so a field added on either side fails to compile here until it is carried over.

/// A sketch on the wire: empty is none; anything else must decode (INVALID_ARGUMENT if not).
/// Public for the fuzz targets (`fuzz/`), which feed it what the service receives.
pub fn sketch_of(bytes: &[u8]) -> Result<Option<Sketch>, Error> {
    if bytes.is_empty() {
        return Ok(None);
    }
    Sketch::from_bytes(bytes).map(Some).map_err(|e| Error::InvalidInput(e.to_string()))
}

/// The verification a request asks for: `verify_jaccard` must be in `[0, 1]`
/// (INVALID_ARGUMENT if not); `candidate_k` counts only when verifying.
pub fn verify_of(jaccard: f64, candidate_k: u32) -> Result<Verify, Error> {
    if !(0.0..=1.0).contains(&jaccard) {
        return Err(Error::InvalidInput(format!(
            "verify_jaccard is {jaccard}; it must be between 0 and 1"
        )));
    }
    Ok(Verify { jaccard, candidate_k: if jaccard > 0.0 { candidate_k } else { 0 } })
}

/// A document of a `WriteRequest` or `AdmitRequest` as the shard takes it, its sketch
/// checked by [`sketch_of`].
pub fn new_document(d: ShardDocument) -> Result<NewDocument, Error> {
    let ShardDocument { id, fingerprint, timestamp_ms, sketch } = d;
    Ok(NewDocument { id, fingerprint, timestamp_ms, sketch: sketch_of(&sketch)? })
}

fn write_response(out: WriteOutcome) -> WriteResponse {
    let WriteOutcome { inserted, replaced, deleted, missing, seq } = out;
    WriteResponse { inserted, replaced, deleted, missing, seq }
}

fn matches(matches: Vec<DocMatch>) -> Vec<pb::Match> {
    matches
        .into_iter()
        .map(|m| {
            let DocMatch { id, fingerprint, distance, timestamp_ms, cluster_id, jaccard } = m;
            pb::Match {
                id,
                fingerprint,
                distance,
                timestamp_ms,
                cluster_id,
                verified: jaccard.is_some(),
                jaccard: jaccard.unwrap_or(0.0),
            }
        })
        .collect()
}

fn query_result(hits: ProbeHits) -> pb::QueryResult {
    let ProbeHits { fingerprint, matches: found, truncated } = hits;
    pb::QueryResult { matches: matches(found), truncated, fingerprint }
}

fn check_and_insert_response(a: Admission) -> pb::CheckAndInsertResponse {
    let Admission {
        duplicate,
        matches: found,
        truncated,
        cluster_id,
        original_id,
        inserted,
        replaced,
        fingerprint,
    } = a;
    pb::CheckAndInsertResponse {
        duplicate,
        matches: matches(found),
        truncated,
        cluster_id,
        original_id,
        inserted,
        replaced,
        fingerprint,
    }
}

fn stats_response(s: ShardStats) -> pb::StatsResponse {
    let ShardStats {
        documents,
        design,
        max_k,
        tables,
        index_bytes,
        document_bytes,
        buffered,
        runs,
        deleted_pending,
        merges,
        wal_bytes,
        disk_bytes,
        version,
        checkpoint_pending,
        merging,
    } = s;
    let tables = tables
        .into_iter()
        .map(|t| {
            let TableFootprint { bytes, entries, bits_per_fingerprint } = t;
            pb::TableStats { bytes, entries, bits_per_fingerprint }
        })
        .collect();
    pb::StatsResponse {
        documents,
        design,
        max_k,
        tables,
        index_bytes,
        document_bytes,
        buffered,
        runs,
        deleted_pending,
        merges,
        wal_bytes,
        disk_bytes,
        version,
        checkpoint_pending,
        merging,
    }
}

fn not_in_a_cluster() -> Status {
    Status::failed_precondition(
        "this node is not in a cluster: it was started without --bootstrap or --join and \
         holds no cluster state",
    )
}

/// The Raft service of a node that is not in a cluster: refuses every message (a cluster
/// node serves [`crate::cluster_rpc::RaftRpc`] instead).
#[derive(Debug, Clone, Default)]
pub struct RaftService;

#[tonic::async_trait]
impl Raft for RaftService {
    async fn step(&self, _request: Request<RaftMessage>) -> Result<Response<RaftAck>, Status> {
        Err(not_in_a_cluster())
    }

    async fn step_batch(&self, _request: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        Err(not_in_a_cluster())
    }
}
