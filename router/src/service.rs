//! The public service, `neardup.v1.Neardup`: validation, text fingerprints, deadlines,
//! admission control, metrics, and the call to the shard.
//!
//! Every method validates its whole request before anything reaches the shard, so a bad
//! request changes nothing. Every method runs under `Router::call`, which refuses work
//! beyond the in-flight limit (RESOURCE_EXHAUSTED), gives up at the caller's deadline
//! (DEADLINE_EXCEEDED, a little before the deadline so the answer still arrives), records
//! the request's metrics, and maps errors to statuses in one place ([`crate::error`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_proto::internal::{AdmitRequest, ProbeRequest, ShardDocument, WriteRequest};
use neardup_proto::v1::neardup_server::Neardup;
use neardup_proto::v1::{
    CheckAndInsertRequest, CheckAndInsertResponse, DeleteRequest, DeleteResponse, Document,
    FingerprintRequest, FingerprintResponse, InsertRequest, InsertResponse, QueryBatchRequest,
    QueryBatchResponse, QueryRequest, QueryResponse, QueryTarget, StatsRequest, StatsResponse,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::error::{Result, RouterError};
use crate::limits::{Content, Limits};
use crate::metrics::RpcMetrics;
use crate::shard::ShardApi;
use crate::text;
use crate::verify::{VerifyDefaults, wire_sketch};

/// QueryBatch messages answered at once on one stream (responses stay in order).
const PIPELINE: usize = 4;

struct Inner {
    shard: Arc<dyn ShardApi>,
    limits: Limits,
    verify: VerifyDefaults,
    max_k: u32,
    metrics: RpcMetrics,
    in_flight: Arc<Semaphore>,
}

/// The public service over one shard. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

/// Reads the caller's deadline from `grpc-timeout`, and returns the moment to give up: a
/// little before it (5%, at most 10 ms), so the DEADLINE_EXCEEDED answer reaches the caller
/// in time.
pub fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let timeout = neardup_server::transport::grpc_timeout(req.metadata())?;
    let margin = (timeout / 20).min(Duration::from_millis(10));
    Instant::now().checked_add(timeout - margin)
}

/// Runs CPU-heavy work without stalling other requests: on a multi-threaded runtime the
/// worker hands its other tasks away meanwhile.
fn heavy<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The next message of a client stream; DEADLINE_EXCEEDED when none comes within `idle`, so
/// a silent stream does not hold an in-flight slot for ever.
async fn next_message<T>(stream: &mut Streaming<T>, idle: Option<Duration>) -> Result<Option<T>> {
    let next = stream.message();
    match idle {
        None => Ok(next.await?),
        Some(d) => match tokio::time::timeout(d, next).await {
            Ok(m) => Ok(m?),
            Err(_) => Err(RouterError::StreamIdle { secs: d.as_secs() }),
        },
    }
}

/// Fingerprints and sketches of documents: a text's computed here (a sketch sent with it
/// must equal the computed one), a fingerprint's as sent (empty: none; otherwise it must
/// decode).
fn fingerprints_and_sketches(
    contents: &[Content<'_>],
    sent: &[&[u8]],
) -> Result<Vec<(u64, Vec<u8>)>> {
    let text_bytes = text_bytes(contents);
    let run = || {
        contents
            .iter()
            .zip(sent)
            .map(|(c, &sent)| {
                let given = wire_sketch(sent)?;
                match *c {
                    Content::Fingerprint(fp) => {
                        Ok((fp, given.map(|s| s.to_bytes().to_vec()).unwrap_or_default()))
                    }
                    Content::Text(t) => {
                        let (fp, sketch) = text::fingerprint_and_sketch(t)?;
                        if given.is_some_and(|g| g != sketch) {
                            return Err(RouterError::invalid(
                                "the sketch sent with a text differs from the text's own \
                                 (send none, or the one docs/fingerprint.md section 15 gives)",
                            ));
                        }
                        Ok((fp, sketch.to_bytes().to_vec()))
                    }
                }
            })
            .collect()
    };
    if text_bytes >= text::BLOCKING_TEXT_BYTES { heavy(run) } else { run() }
}

/// Bytes of text among contents: past [`text::BLOCKING_TEXT_BYTES`] they are fingerprinted on
/// a blocking thread.
fn text_bytes(contents: &[Content<'_>]) -> usize {
    contents
        .iter()
        .map(|c| match c {
            Content::Text(t) => t.len(),
            Content::Fingerprint(_) => 0,
        })
        .sum()
}

/// Fingerprints of contents (texts fingerprinted here).
fn fingerprints(contents: &[Content<'_>]) -> Result<Vec<u64>> {
    let text_bytes = text_bytes(contents);
    let run = || {
        contents
            .iter()
            .map(|c| match *c {
                Content::Fingerprint(fp) => Ok(fp),
                Content::Text(t) => text::fingerprint(t),
            })
            .collect()
    };
    if text_bytes >= text::BLOCKING_TEXT_BYTES { heavy(run) } else { run() }
}

impl Router {
    /// The service over `shard`, whose design answers k up to `max_k`.
    /// Verification follows [`VerifyDefaults::default`].
    pub fn new(shard: Arc<dyn ShardApi>, max_k: u32, limits: Limits, metrics: RpcMetrics) -> Self {
        Router::with_verify(shard, max_k, limits, VerifyDefaults::default(), metrics)
    }

    /// The service over `shard`, with the verification defaults `verify` (the `[verify]`
    /// section of the configuration).
    pub fn with_verify(
        shard: Arc<dyn ShardApi>,
        max_k: u32,
        limits: Limits,
        verify: VerifyDefaults,
        metrics: RpcMetrics,
    ) -> Self {
        let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
        Router { inner: Arc::new(Inner { shard, limits, verify, max_k, metrics, in_flight }) }
    }

    /// The verification defaults in force.
    pub fn verify_defaults(&self) -> &VerifyDefaults {
        &self.inner.verify
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The shard behind the router.
    pub fn shard(&self) -> &Arc<dyn ShardApi> {
        &self.inner.shard
    }

    /// Runs one request: admission, deadline, metrics, error mapping.
    async fn call<T>(
        &self,
        method: &'static str,
        deadline: Option<Instant>,
        work: impl Future<Output = Result<T>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let result = match self.inner.in_flight.clone().try_acquire_owned() {
            Err(_) => Err(RouterError::Overloaded { in_flight: self.inner.limits.max_in_flight }),
            Ok(_permit) => match deadline {
                Some(d) if d <= Instant::now() => Err(RouterError::DeadlineExceeded),
                Some(d) => match tokio::time::timeout_at(d.into(), work).await {
                    Ok(r) => r,
                    Err(_) => Err(RouterError::DeadlineExceeded),
                },
                None => work.await,
            },
        };
        let result = result.map_err(Status::from);
        let code = result.as_ref().map_or_else(|s| s.code(), |_| Code::Ok);
        self.inner.metrics.observe(method, code, started);
        result.map(Response::new)
    }

    /// Validates and fingerprints documents for the shard.
    fn shard_documents(&self, docs: Vec<Document>) -> Result<Vec<ShardDocument>> {
        let limits = &self.inner.limits;
        limits.batch("documents", docs.len())?;
        let contents: Vec<Content<'_>> =
            docs.iter().map(|d| limits.document(d)).collect::<Result<_>>()?;
        let sent: Vec<&[u8]> = docs.iter().map(|d| d.sketch.as_slice()).collect();
        let fps = fingerprints_and_sketches(&contents, &sent)?;
        Ok(docs
            .into_iter()
            .zip(fps)
            .map(|(d, (fingerprint, sketch))| {
                let Document { id, content: _, timestamp_ms, sketch: _ } = d;
                ShardDocument { id, fingerprint, timestamp_ms, sketch }
            })
            .collect())
    }

    async fn answer_batch(
        &self,
        queries: &[QueryTarget],
        k: Option<u32>,
        limit: u32,
        deadline: Option<Instant>,
    ) -> Result<Vec<neardup_proto::v1::QueryResult>> {
        let limits = &self.inner.limits;
        limits.batch("queries", queries.len())?;
        let k = limits.k(k, self.inner.max_k)?;
        let limit = limits.limit(limit)?;
        let contents: Vec<Content<'_>> =
            queries.iter().map(|q| limits.target(Some(q))).collect::<Result<_>>()?;
        let fingerprints = fingerprints(&contents)?;
        let request = ProbeRequest {
            fingerprints,
            k,
            limit,
            max_matches: limits.max_response_matches as u64,
            max_bytes: limits.max_response_bytes as u64,
            ..Default::default()
        };
        let resp = self.inner.shard.probe(request, deadline).await?;
        if resp.results.len() != queries.len() {
            return Err(RouterError::Internal(format!(
                "the shard answered {} of {} queries",
                resp.results.len(),
                queries.len()
            )));
        }
        Ok(resp.results)
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Neardup for Router {
    async fn insert(
        &self,
        req: Request<InsertRequest>,
    ) -> Result<Response<InsertResponse>, Status> {
        let deadline = deadline_of(&req);
        let InsertRequest { documents } = req.into_inner();
        self.call("Insert", deadline, async {
            let n = documents.len();
            let documents = self.shard_documents(documents)?;
            self.inner.metrics.items("Insert", n);
            let w = WriteRequest { documents, ..Default::default() };
            let r = self.inner.shard.write(w, deadline).await?;
            Ok(InsertResponse { inserted: r.inserted, replaced: r.replaced })
        })
        .await
    }

    async fn insert_stream(
        &self,
        req: Request<Streaming<InsertRequest>>,
    ) -> Result<Response<InsertResponse>, Status> {
        let deadline = deadline_of(&req);
        let mut stream = req.into_inner();
        self.call("InsertStream", deadline, async {
            let (mut inserted, mut replaced, mut seq) = (0, 0, 0);
            let idle = self.inner.limits.stream_idle();
            while let Some(InsertRequest { documents }) = next_message(&mut stream, idle).await? {
                let n = documents.len();
                let documents = self.shard_documents(documents)?;
                self.inner.metrics.items("InsertStream", n);
                let w = WriteRequest { documents, skip_sync: true, ..Default::default() };
                let r = self.inner.shard.write(w, deadline).await?;
                inserted += r.inserted;
                replaced += r.replaced;
                seq = seq.max(r.seq);
            }
            if seq > 0 {
                self.inner.shard.wait_durable(seq, deadline).await?;
            }
            Ok(InsertResponse { inserted, replaced })
        })
        .await
    }

    async fn query(&self, req: Request<QueryRequest>) -> Result<Response<QueryResponse>, Status> {
        let deadline = deadline_of(&req);
        let QueryRequest { target, k, limit, verify_jaccard, candidate_k } = req.into_inner();
        self.call("Query", deadline, async {
            let limits = &self.inner.limits;
            let target = target
                .ok_or_else(|| RouterError::invalid("a query needs a fingerprint or a text"))?;
            let max_k = self.inner.max_k;
            let (jaccard, candidate_k) =
                self.inner.verify.resolve(verify_jaccard, candidate_k, max_k)?;
            let content = limits.target(Some(&target))?;
            let k = limits.k(k, max_k)?;
            let limit = limits.limit(limit)?;
            let mut fs = fingerprints_and_sketches(&[content], &[target.sketch.as_slice()])?;
            let (fp, sketch) = fs.pop().ok_or_else(|| RouterError::Internal("no query".into()))?;
            let request = ProbeRequest {
                fingerprints: vec![fp],
                k,
                limit,
                max_matches: limits.max_response_matches as u64,
                max_bytes: limits.max_response_bytes as u64,
                sketches: if sketch.is_empty() { Vec::new() } else { vec![sketch] },
                verify_jaccard: jaccard,
                candidate_k,
            };
            let mut resp = self.inner.shard.probe(request, deadline).await?;
            if resp.results.len() != 1 {
                return Err(RouterError::Internal(format!(
                    "the shard answered {} results to one query",
                    resp.results.len()
                )));
            }
            Ok(QueryResponse { result: resp.results.pop() })
        })
        .await
    }

    type QueryBatchStream = ResponseStream<QueryBatchResponse>;

    async fn query_batch(
        &self,
        req: Request<Streaming<QueryBatchRequest>>,
    ) -> Result<Response<Self::QueryBatchStream>, Status> {
        let deadline = deadline_of(&req);
        let started = Instant::now();
        let permit = self.inner.in_flight.clone().try_acquire_owned().map_err(|_| {
            self.inner.metrics.observe("QueryBatch", Code::ResourceExhausted, started);
            Status::from(RouterError::Overloaded { in_flight: self.inner.limits.max_in_flight })
        })?;
        let mut input = req.into_inner();
        let (jobs_tx, mut jobs_rx) = mpsc::channel(PIPELINE);
        let (out_tx, out_rx) = mpsc::channel(PIPELINE);
        let me = self.clone();
        // Reader: each message becomes a task, so up to PIPELINE are answered at once.
        let idle = self.inner.limits.stream_idle();
        tokio::spawn(async move {
            loop {
                let (job, last) = match next_message(&mut input, idle).await {
                    Ok(Some(m)) => {
                        let me = me.clone();
                        let job = tokio::spawn(async move {
                            let QueryBatchRequest { queries, k, limit } = m;
                            let n = queries.len();
                            let work = me.answer_batch(&queries, k, limit, deadline);
                            let r = match deadline {
                                Some(d) => tokio::time::timeout_at(d.into(), work)
                                    .await
                                    .unwrap_or(Err(RouterError::DeadlineExceeded)),
                                None => work.await,
                            };
                            if r.is_ok() {
                                me.inner.metrics.items("QueryBatch", n);
                            }
                            r.map(|results| QueryBatchResponse { results }).map_err(Status::from)
                        });
                        (job, false)
                    }
                    Ok(None) => break,
                    Err(e) => (tokio::spawn(async move { Err(Status::from(e)) }), true),
                };
                if jobs_tx.send(job).await.is_err() || last {
                    break;
                }
            }
        });
        // Writer: answers in request order; the first error ends the stream.
        let metrics = self.inner.metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut code = Code::Ok;
            while let Some(job) = jobs_rx.recv().await {
                let r = job.await.unwrap_or_else(|e| Err(Status::internal(e.to_string())));
                if let Err(s) = &r {
                    code = s.code();
                }
                let stop = r.is_err();
                if out_tx.send(r).await.is_err() || stop {
                    break;
                }
            }
            metrics.observe("QueryBatch", code, started);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }

    async fn check_and_insert(
        &self,
        req: Request<CheckAndInsertRequest>,
    ) -> Result<Response<CheckAndInsertResponse>, Status> {
        let deadline = deadline_of(&req);
        let CheckAndInsertRequest {
            document,
            k,
            limit,
            skip_insert_if_duplicate,
            verify_jaccard,
            candidate_k,
        } = req.into_inner();
        self.call("CheckAndInsert", deadline, async {
            let limits = &self.inner.limits;
            let document =
                document.ok_or_else(|| RouterError::invalid("CheckAndInsert needs a document"))?;
            let k = limits.k(k, self.inner.max_k)?;
            let (verify_jaccard, candidate_k) =
                self.inner.verify.resolve(verify_jaccard, candidate_k, self.inner.max_k)?;
            let limit = limits.limit(limit)?;
            let mut docs = self.shard_documents(vec![document])?;
            let a = AdmitRequest {
                document: docs.pop(),
                k,
                limit,
                skip_insert_if_duplicate,
                verify_jaccard,
                candidate_k,
            };
            let r = self.inner.shard.admit(a, deadline).await?;
            r.decision.ok_or_else(|| RouterError::Internal("the shard sent no decision".into()))
        })
        .await
    }

    async fn delete(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let deadline = deadline_of(&req);
        let DeleteRequest { ids, must_exist } = req.into_inner();
        self.call("Delete", deadline, async {
            let limits = &self.inner.limits;
            limits.batch("ids", ids.len())?;
            for id in &ids {
                limits.id(id)?;
            }
            let w =
                WriteRequest { deletes: ids, deletes_must_exist: must_exist, ..Default::default() };
            let r = self.inner.shard.write(w, deadline).await?;
            Ok(DeleteResponse { deleted: r.deleted, missing: r.missing })
        })
        .await
    }

    async fn fingerprint(
        &self,
        req: Request<FingerprintRequest>,
    ) -> Result<Response<FingerprintResponse>, Status> {
        let deadline = deadline_of(&req);
        let FingerprintRequest { texts } = req.into_inner();
        self.call("Fingerprint", deadline, async {
            let limits = &self.inner.limits;
            limits.batch("texts", texts.len())?;
            let contents: Vec<Content<'_>> =
                texts.iter().map(|t| limits.text(t)).collect::<Result<_>>()?;
            Ok(FingerprintResponse { fingerprints: fingerprints(&contents)? })
        })
        .await
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        let deadline = deadline_of(&req);
        self.call("Stats", deadline, async { Ok(self.inner.shard.stats(deadline).await?) }).await
    }
}
