//! # neardup-client
//!
//! A Rust client of neardup's public gRPC API (`neardup.v1`).
//!
//! - Typed calls: [`Client::insert`], [`Client::query`], [`Client::check_and_insert`],
//!   [`Client::delete`], [`Client::fingerprint`], [`Client::stats`].
//! - Verified admission: [`text_doc`] documents carry the text's similarity sketch, computed
//!   here ([`sketch_of_text`]), so the server verifies near-duplicates by estimated Jaccard
//!   similarity; [`Client::check_and_insert_verified`] and [`Client::query_verified`] set
//!   the threshold and candidate distance per call.
//! - One connection, reused: a [`Client`] is cheap to clone and every clone shares it
//!   (HTTP/2 multiplexes concurrent calls).
//! - Retries with exponential backoff and jitter on UNAVAILABLE (the server is starting or
//!   restarting). Writes are safe to retry: writing an id again replaces it.
//! - Batching for streams: [`Client::insert_all`] sends any number of documents as one
//!   `InsertStream` of fixed-size batches; [`Client::query_all`] sends any number of
//!   queries on one `QueryBatch` stream with several batches in flight.
//!
//! ```no_run
//! # async fn run() -> Result<(), neardup_client::ClientError> {
//! use neardup_client::{Client, doc};
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! client.insert(vec![doc("https://a.example/", 0xDEAD_BEEF, 0)]).await?;
//! let hits = client.query(0xDEAD_BEEF ^ 0b101, Some(3), 10).await?;
//! assert_eq!(hits.matches[0].id, "https://a.example/");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use neardup_proto::admin::backup_client::BackupClient;
pub use neardup_proto::admin::{
    BackupDoc, RestoreRequest, RestoreResponse, RestoreStart, SnapshotChunk, SnapshotEnd,
    SnapshotInfo, SnapshotRequest,
};
use neardup_proto::v1::neardup_client::NeardupClient;
use neardup_proto::v1::{
    CheckAndInsertRequest, DeleteRequest, FingerprintRequest, InsertRequest, QueryBatchRequest,
    QueryRequest, QueryTarget, StatsRequest, document, query_target,
};
pub use neardup_proto::v1::{
    CheckAndInsertResponse, DeleteResponse, Document, InsertResponse, Match, QueryResult,
    StatsResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::InterceptedService;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};
use tonic_health::pb::HealthCheckRequest;
/// A service's health, as `grpc.health.v1` reports it.
pub use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address does not parse.
    #[error("bad server address {address}: {reason}")]
    Address {
        /// The address given.
        address: String,
        /// Why it is not usable.
        reason: String,
    },
    /// The server answered with an error (after any retries).
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    /// A text has no words to fingerprint or sketch.
    #[error("the text has no words or characters to fingerprint")]
    EmptyText,
    /// The token cannot be sent in a header (it names no character of the token).
    #[error("the token is not usable: {0}")]
    Token(&'static str),
}

impl ClientError {
    /// The gRPC code, for errors the server sent.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            ClientError::Address { .. } | ClientError::EmptyText | ClientError::Token(_) => None,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A document given by its fingerprint, without a sketch (its matches are unverified).
pub fn doc(id: impl Into<String>, fingerprint: u64, timestamp_ms: i64) -> Document {
    Document {
        id: id.into(),
        content: Some(document::Content::Fingerprint(fingerprint)),
        timestamp_ms,
        sketch: Vec::new(),
    }
}

/// A document given by its fingerprint and its text's sketch ([`sketch_of_text`]).
pub fn sketched_doc(
    id: impl Into<String>,
    fingerprint: u64,
    sketch: Vec<u8>,
    timestamp_ms: i64,
) -> Document {
    Document { sketch, ..doc(id, fingerprint, timestamp_ms) }
}

/// A document given by its text (the server fingerprints it and computes its sketch).
pub fn text_doc(id: impl Into<String>, text: impl Into<String>, timestamp_ms: i64) -> Document {
    Document {
        id: id.into(),
        content: Some(document::Content::Text(text.into())),
        timestamp_ms,
        sketch: Vec::new(),
    }
}

/// A document given by its text with the sketch computed here: the server checks that it
/// equals its own, so a client and a server that disagree on the spec are found at once.
pub fn text_doc_with_sketch(
    id: impl Into<String>,
    text: impl Into<String>,
    timestamp_ms: i64,
) -> Result<Document> {
    let text = text.into();
    let sketch = sketch_of_text(&text)?;
    Ok(Document { sketch, ..text_doc(id, text, timestamp_ms) })
}

/// The simhash (default configuration) and the encoded sketch of a text
/// (`docs/fingerprint.md`), as the server computes them.
pub fn fingerprint_and_sketch(text: &str) -> Result<(u64, Vec<u8>)> {
    use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
    let mut f = Fingerprinter::new(FingerprintConfig::default())
        .map_err(|e| Status::internal(e.to_string()))?;
    let fp = f.fingerprint(text).map_err(|_| ClientError::EmptyText)?;
    let sketch =
        neardup_core::sketch::Sketch::of_text(&mut f, text).map_err(|_| ClientError::EmptyText)?;
    Ok((fp, sketch.to_bytes().to_vec()))
}

/// The encoded sketch of a text ("neardup sketch", `docs/fingerprint.md` section 15).
pub fn sketch_of_text(text: &str) -> Result<Vec<u8>> {
    fingerprint_and_sketch(text).map(|(_, s)| s)
}

/// Verification asked of one call; `None` fields take the server's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Verification {
    /// Keep a candidate whose estimated Jaccard similarity reaches this (0: no
    /// verification).
    pub jaccard: Option<f64>,
    /// Verify candidates within this distance.
    pub candidate_k: Option<u32>,
}

/// A query: a fingerprint or a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A 64-bit simhash.
    Fingerprint(u64),
    /// A text for the server to fingerprint.
    Text(String),
}

impl From<Target> for QueryTarget {
    fn from(t: Target) -> QueryTarget {
        QueryTarget {
            target: Some(match t {
                Target::Fingerprint(fp) => query_target::Target::Fingerprint(fp),
                Target::Text(s) => query_target::Target::Text(s),
            }),
            sketch: Vec::new(),
        }
    }
}

/// How a client retries and times out.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline of each call (sent to the server as `grpc-timeout`).
    pub timeout: Duration,
    /// Attempts of a call that fails with UNAVAILABLE, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled each time, with jitter.
    pub backoff: Duration,
    /// Longest wait between retries.
    pub max_backoff: Duration,
    /// Largest message sent or received.
    pub max_message_bytes: usize,
    /// The API token sent with every call (`authorization: Bearer`), when the server
    /// checks tokens.
    pub token: Option<Token>,
    /// TLS: the certificate authority to trust (PEM), and the name to check the server's
    /// certificate against (default: the address's host). The address may then be given as
    /// `https://HOST:PORT` or `HOST:PORT`.
    pub tls: Option<ClientTls>,
}

/// How a client checks a TLS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The certificate authority that signed the server's certificate, PEM.
    pub ca_pem: Vec<u8>,
    /// The name the server's certificate must hold; `None`: the address's host.
    pub domain: Option<String>,
}

/// An API token. Its `Debug` shows no character of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token `secret` (surrounding whitespace, a file's newline, is left out).
    pub fn new(secret: &str) -> Token {
        Token(secret.trim().to_string())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Puts the client's token on every call, those of [`Client::raw`] too.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    header: Option<MetadataValue<Ascii>>,
}

impl Auth {
    /// Sends `token`, if any.
    pub fn new(token: Option<&Token>) -> Result<Auth> {
        let header = match token {
            None => None,
            Some(t) if t.0.is_empty() => return Err(ClientError::Token("it is empty")),
            Some(t) => {
                let mut v: MetadataValue<Ascii> = format!("Bearer {}", t.0)
                    .parse()
                    .map_err(|_| ClientError::Token("it holds characters a header cannot"))?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        Ok(Auth { header })
    }
}

impl Interceptor for Auth {
    fn call(&mut self, mut r: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.header {
            r.metadata_mut().insert("authorization", h.clone());
        }
        Ok(r)
    }
}

/// The generated client on a client's connection, with its token.
pub type Rpc = NeardupClient<InterceptedService<Channel, Auth>>;

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            attempts: 5,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            max_message_bytes: 64 << 20,
            token: None,
            tls: None,
        }
    }
}

/// A connection to a neardup server. Clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    rpc: Rpc,
    health: HealthClient<InterceptedService<Channel, Auth>>,
    backup: BackupClient<InterceptedService<Channel, Auth>>,
    options: ClientOptions,
    /// Calls sent again after UNAVAILABLE, by this client and its clones.
    retried: Arc<AtomicU64>,
}

impl Client {
    /// Connects to `address` (`http://host:port`, or `host:port`) with default options.
    pub async fn connect(address: &str) -> Result<Client> {
        Client::connect_with(address, ClientOptions::default()).await
    }

    /// Connects with `options`. The connection is made lazily and re-made when it breaks,
    /// so this succeeds even if the server is not up yet.
    pub async fn connect_with(address: &str, options: ClientOptions) -> Result<Client> {
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let uri = if address.contains("://") {
            address.to_string()
        } else {
            format!("{scheme}://{address}")
        };
        let bad = |reason: String| ClientError::Address { address: address.into(), reason };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30));
        if let Some(tls) = &options.tls {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some(d) = &tls.domain {
                config = config.domain_name(d.clone());
            }
            endpoint = endpoint.tls_config(config).map_err(|e| bad(e.to_string()))?;
        }
        let channel = endpoint.connect_lazy();
        let auth = Auth::new(options.token.as_ref())?;
        let health = HealthClient::with_interceptor(channel.clone(), auth.clone());
        let backup = BackupClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);
        let rpc = NeardupClient::with_interceptor(channel, auth)
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);
        Ok(Client { rpc, health, backup, options, retried: Arc::default() })
    }

    /// The generated client on the same connection, for calls this library does not wrap
    /// (no retries, no default deadline).
    pub fn raw(&self) -> Rpc {
        self.rpc.clone()
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// Calls this client and its clones sent again after UNAVAILABLE (each call counted once,
    /// however many times it was sent).
    pub fn calls_retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        self.stream_request(msg, 0)
    }

    /// A streaming request of `messages` messages: its deadline grows by a second a message,
    /// so that a long stream is not cut off by a deadline meant for one call.
    fn stream_request<T>(&self, msg: T, messages: usize) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(self.options.timeout + Duration::from_secs(messages as u64));
        r
    }

    /// Runs `call` until it succeeds, fails with a code other than UNAVAILABLE, or runs out
    /// of attempts.
    async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Rpc) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut wait = self.options.backoff;
        let mut attempt = 1;
        loop {
            match call(self.rpc.clone()).await {
                Err(s) if s.code() == Code::Unavailable && attempt < self.options.attempts => {
                    // Jitter: between half and all of the wait, so clients spread out.
                    let nanos = wait.as_nanos() as u64;
                    let jitter = nanos / 2 + (jitter_seed() % (nanos / 2 + 1));
                    tracing::debug!(attempt, message = s.message(), "unavailable; retrying");
                    if attempt == 1 {
                        self.retried.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_nanos(jitter)).await;
                    wait = (wait * 2).min(self.options.max_backoff);
                    attempt += 1;
                }
                r => return r.map_err(ClientError::from),
            }
        }
    }

    /// Stores documents (at most 10,000 per call); durable when this returns.
    pub async fn insert(&self, documents: Vec<Document>) -> Result<InsertResponse> {
        self.retry(|mut c| {
            let r = self.request(InsertRequest { documents: documents.clone() });
            async move { c.insert(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Stores any number of documents as one stream of `batch`-document messages; durable
    /// when this returns. Retried whole on UNAVAILABLE (writes replace, so that is safe).
    pub async fn insert_all(&self, documents: &[Document], batch: usize) -> Result<InsertResponse> {
        let batch = batch.clamp(1, 10_000);
        self.retry(|mut c| {
            let (tx, rx) = mpsc::channel(4);
            let docs = documents.to_vec();
            tokio::spawn(async move {
                for chunk in docs.chunks(batch) {
                    if tx.send(InsertRequest { documents: chunk.to_vec() }).await.is_err() {
                        return;
                    }
                }
            });
            let r = self.stream_request(ReceiverStream::new(rx), documents.len().div_ceil(batch));
            async move { c.insert_stream(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// The stored documents within `k` (default: the design's maximum) of a fingerprint,
    /// at most `limit` (0: the server's default).
    pub async fn query(&self, fingerprint: u64, k: Option<u32>, limit: u32) -> Result<QueryResult> {
        self.query_target(Target::Fingerprint(fingerprint), k, limit).await
    }

    /// Like [`query`](Self::query), for a fingerprint or a text.
    pub async fn query_target(
        &self,
        target: Target,
        k: Option<u32>,
        limit: u32,
    ) -> Result<QueryResult> {
        self.query_verified(target, Vec::new(), k, Verification::default(), limit).await
    }

    /// A query with a sketch (empty: none; with a text the server computes it) and the
    /// verification asked (see `CheckAndInsertRequest.verify_jaccard`).
    pub async fn query_verified(
        &self,
        target: Target,
        sketch: Vec<u8>,
        k: Option<u32>,
        verify: Verification,
        limit: u32,
    ) -> Result<QueryResult> {
        let target = QueryTarget { sketch, ..target.into() };
        self.retry(|mut c| {
            let r = self.request(QueryRequest {
                target: Some(target.clone()),
                k,
                limit,
                verify_jaccard: verify.jaccard,
                candidate_k: verify.candidate_k,
            });
            async move {
                c.query(r).await?.into_inner().result.ok_or_else(|| Status::internal("no result"))
            }
        })
        .await
    }

    /// Answers any number of queries over one `QueryBatch` stream, `batch` queries per
    /// message, several messages in flight; `result[i]` answers `targets[i]`.
    pub async fn query_all(
        &self,
        targets: &[Target],
        k: Option<u32>,
        limit: u32,
        batch: usize,
    ) -> Result<Vec<QueryResult>> {
        let batch = batch.clamp(1, 10_000);
        let messages: Vec<QueryBatchRequest> = targets
            .chunks(batch)
            .map(|chunk| QueryBatchRequest {
                queries: chunk.iter().cloned().map(QueryTarget::from).collect(),
                k,
                limit,
            })
            .collect();
        self.retry(|mut c| {
            let r = self.stream_request(tokio_stream::iter(messages.clone()), messages.len());
            async move {
                let mut out = Vec::new();
                let mut stream = c.query_batch(r).await?.into_inner();
                while let Some(m) = stream.message().await? {
                    out.extend(m.results);
                }
                Ok(out)
            }
        })
        .await
        .and_then(|out: Vec<QueryResult>| {
            if out.len() == targets.len() {
                Ok(out)
            } else {
                Err(Status::internal(format!(
                    "{} answers for {} queries",
                    out.len(),
                    targets.len()
                ))
                .into())
            }
        })
    }

    /// Crawl-frontier admission: near-duplicate or not, of which documents, in which
    /// cluster; stores the document unless `skip_insert_if_duplicate` and it is one.
    pub async fn check_and_insert(
        &self,
        document: Document,
        k: Option<u32>,
        limit: u32,
        skip_insert_if_duplicate: bool,
    ) -> Result<CheckAndInsertResponse> {
        self.check_and_insert_verified(
            document,
            k,
            Verification::default(),
            limit,
            skip_insert_if_duplicate,
        )
        .await
    }

    /// [`check_and_insert`](Self::check_and_insert) with the verification asked.
    pub async fn check_and_insert_verified(
        &self,
        document: Document,
        k: Option<u32>,
        verify: Verification,
        limit: u32,
        skip_insert_if_duplicate: bool,
    ) -> Result<CheckAndInsertResponse> {
        self.retry(|mut c| {
            let r = self.request(CheckAndInsertRequest {
                document: Some(document.clone()),
                k,
                limit,
                skip_insert_if_duplicate,
                verify_jaccard: verify.jaccard,
                candidate_k: verify.candidate_k,
            });
            async move { c.check_and_insert(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Removes documents by id; with `must_exist`, fails with NOT_FOUND (removing nothing)
    /// if one is not stored.
    pub async fn delete(&self, ids: Vec<String>, must_exist: bool) -> Result<DeleteResponse> {
        self.retry(|mut c| {
            let r = self.request(DeleteRequest { ids: ids.clone(), must_exist });
            async move { c.delete(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Fingerprints of texts, computed by the server.
    pub async fn fingerprint(&self, texts: Vec<String>) -> Result<Vec<u64>> {
        self.retry(|mut c| {
            let r = self.request(FingerprintRequest { texts: texts.clone() });
            async move { c.fingerprint(r).await.map(|r| r.into_inner().fingerprints) }
        })
        .await
    }

    /// The health `grpc.health.v1` reports for `service` (`""`: the server as a whole;
    /// [`neardup_proto::PUBLIC_SERVICE`]: the public API). One call, not retried: a probe
    /// wants the answer of now.
    pub async fn health(&self, service: &str) -> Result<ServingStatus> {
        let r = self.request(HealthCheckRequest { service: service.to_string() });
        let status = self.health.clone().check(r).await?.into_inner().status;
        Ok(ServingStatus::try_from(status).unwrap_or(ServingStatus::Unknown))
    }

    /// Every stored document, as the server sends it: a stream of snapshot chunks
    /// (`neardup.admin.v1.Backup`, the admin role). No deadline: a backup takes as long as
    /// the data does.
    pub async fn snapshot(&self) -> Result<tonic::Streaming<SnapshotChunk>> {
        Ok(self.backup.clone().snapshot(SnapshotRequest {}).await?.into_inner())
    }

    /// Restores the documents `messages` carry (the first one carries `start`); answered
    /// once all are durable. No deadline, as [`snapshot`](Self::snapshot).
    pub async fn restore(
        &self,
        messages: impl tokio_stream::Stream<Item = RestoreRequest> + Send + 'static,
    ) -> Result<RestoreResponse> {
        Ok(self.backup.clone().restore(messages).await?.into_inner())
    }

    /// The server's statistics.
    pub async fn stats(&self) -> Result<StatsResponse> {
        self.retry(|mut c| {
            let r = self.request(StatsRequest {});
            async move { c.stats(r).await.map(|r| r.into_inner()) }
        })
        .await
    }
}

/// A cheap, varying number for jitter (no randomness crate needed for this).
fn jitter_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call to a port nobody listens on fails with UNAVAILABLE after every attempt; it
    /// counts once as retried.
    #[tokio::test]
    async fn a_retried_call_counts_once() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let options = ClientOptions {
            attempts: 3,
            backoff: Duration::from_millis(1),
            ..ClientOptions::default()
        };
        let client = Client::connect_with(&format!("127.0.0.1:{port}"), options).await.unwrap();
        assert_eq!(client.calls_retried(), 0);
        assert!(client.clone().insert(Vec::new()).await.is_err());
        assert_eq!(client.calls_retried(), 1);
    }
}
