//! The HTTP/2 listener behind every gRPC port of a node (the public API and the internal
//! one), with the limits a server facing untrusted clients needs.
//!
//! gRPC runs on HTTP/2 with prior knowledge. Each connection may open at most
//! [`Http2Limits::max_streams_per_connection`] streams at once (HTTP/2's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`), so a few connections cannot take every in-flight
//! slot of the server; HTTP/2 keepalive pings find peers that went away without closing.
//! Idle streams are cut off by the services themselves (a client stream that sends nothing
//! for a while): see the router's `limits.stream_idle_secs`.
//!
//! The services are served by hyper directly rather than by tonic's transport, which would
//! enforce the caller's `grpc-timeout` itself and answer CANCELLED when it passes, racing
//! the services, which answer DEADLINE_EXCEEDED as gRPC specifies.
//!
//! Requests reach their service through [`GrpcServices`], a table of the port's services
//! looked up by the first segment of the request's path, rather than through tonic's
//! `Routes` (an axum router): at tens of thousands of small requests a second, the router's
//! pattern matching, path parameters, per-request clone and the extra boxing of every body
//! cost a measurable share of a request's CPU time.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;

use crate::access::Access;
use crate::tls::{PeerCert, Tls};

/// A port's check of who calls, for ports under mutual TLS: the request's path and the
/// caller's certificate (`None`: the connection presented none), before any token check.
pub type PeerCheck =
    Arc<dyn Fn(&str, Option<&PeerCert>) -> Result<(), tonic::Status> + Send + Sync>;

/// Longest a TLS handshake may take before the connection is closed.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The caller's timeout from its `grpc-timeout` header (`100m`, `5S`...), if it sent a valid
/// one: the one reading of it for every service of the project.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Limits of each HTTP/2 connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// Most streams (requests) one connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Send a keepalive ping after this long without a frame from the peer; `None`: never.
    pub keepalive: Option<Duration>,
    /// Close the connection when a ping is not answered within this long.
    pub keepalive_timeout: Duration,
}

impl Default for Http2Limits {
    /// 100 streams a connection, a ping after 30 s of silence, answered within 20 s.
    fn default() -> Self {
        Http2Limits {
            max_streams_per_connection: 100,
            keepalive: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// The response future of a gRPC service, as tonic generates them.
type GrpcFuture = BoxFuture<http::Response<Body>, Infallible>;

/// A service of the table: calls a clone of a tonic server (an `Arc` and a few settings).
type Handler = Box<dyn Fn(http::Request<Body>) -> GrpcFuture + Send + Sync>;

/// The gRPC services of one port, found by the request path's first segment
/// (`/package.Service/Method`); any other path is answered UNIMPLEMENTED, as gRPC asks.
#[derive(Clone, Default)]
pub struct GrpcServices {
    /// `(/package.Service/, handler)`.
    services: Arc<Vec<(String, Handler)>>,
    /// The token check of every request, when the port has one.
    access: Option<Arc<Access>>,
    /// The check of the caller's certificate, when the port has one.
    peer_check: Option<PeerCheck>,
    /// The caller's certificate: set per connection, and passed to the services in each
    /// request's extensions.
    peer: Option<Arc<PeerCert>>,
}

impl GrpcServices {
    /// No services yet.
    pub fn new() -> GrpcServices {
        GrpcServices::default()
    }

    /// Adds `service` (a server tonic generated) under its name.
    pub fn with<S>(mut self, service: S) -> GrpcServices
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Into<GrpcFuture>,
    {
        let handler: Handler = Box::new(move |req| service.clone().call(req).into());
        Arc::get_mut(&mut self.services)
            .expect("services are added before serving")
            .push((format!("/{}/", S::NAME), handler));
        self
    }

    /// Checks every request's token with `access` before its service sees it (see
    /// [`crate::access`]).
    pub fn with_access(mut self, access: Option<Arc<Access>>) -> GrpcServices {
        self.access = access;
        self
    }

    /// Checks every request's caller certificate with `check` first (see [`PeerCheck`]).
    pub fn with_peer_check(mut self, check: Option<PeerCheck>) -> GrpcServices {
        self.peer_check = check;
        self
    }

    /// The services of one connection, whose peer presented `peer`.
    fn for_peer(&self, peer: Option<PeerCert>) -> GrpcServices {
        GrpcServices { peer: peer.map(Arc::new), ..self.clone() }
    }

    /// The future answering `req`.
    fn dispatch(&self, mut req: http::Request<Body>) -> GrpcFuture {
        if let Some(check) = &self.peer_check
            && let Err(status) = check(req.uri().path(), self.peer.as_deref())
        {
            return Box::pin(std::future::ready(Ok(refused(status))));
        }
        if let Some(peer) = &self.peer {
            req.extensions_mut().insert(peer.clone());
        }
        let path = req.uri().path();
        if let Some(access) = &self.access
            && let Err(refusal) = access.check(path, req.headers())
        {
            return Box::pin(std::future::ready(Ok(refused(refusal.status()))));
        }
        match self.services.iter().find(|(prefix, _)| path.starts_with(prefix.as_str())) {
            Some((_, handler)) => handler(req),
            None => Box::pin(std::future::ready(Ok(unimplemented()))),
        }
    }
}

/// The answer to a path no service serves: UNIMPLEMENTED, in headers alone.
fn unimplemented() -> http::Response<Body> {
    refused(tonic::Status::unimplemented(""))
}

/// An answer of `status` alone, in headers.
fn refused(status: tonic::Status) -> http::Response<Body> {
    let (parts, ()) = status.into_http::<()>().into_parts();
    http::Response::from_parts(parts, Body::empty())
}

impl hyper::service::Service<http::Request<Incoming>> for GrpcServices {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = GrpcFuture;

    fn call(&self, req: http::Request<Incoming>) -> GrpcFuture {
        self.dispatch(req.map(Body::new))
    }
}

/// Serves the gRPC `services` on `listener` over HTTP/2 (prior knowledge, or negotiated by
/// ALPN under `tls`) with TCP_NODELAY and `limits` until `shutdown` completes, then stops
/// accepting and returns once the requests in flight are answered. With `tls`, a connection
/// whose handshake fails (plaintext, an untrusted client) or takes over
/// [`TLS_HANDSHAKE_TIMEOUT`] is closed.
pub async fn serve_http2(
    listener: TcpListener,
    services: GrpcServices,
    limits: Http2Limits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = services;
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        // gRPC has no use for a Date header; leaving it out saves a header per answer.
        .auto_date_header(false);
    if let Some(every) = limits.keepalive {
        builder.keep_alive_interval(every).keep_alive_timeout(limits.keepalive_timeout);
    }
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // wait a moment and go on, as a server must.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (watcher, builder, service) = (graceful.watcher(), builder.clone(), service.clone());
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            let Some(acceptor) = acceptor else {
                return serve_connection(&builder, tcp, service, watcher).await;
            };
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let service = service.for_peer(PeerCert::of_connection(stream.get_ref().1));
                    serve_connection(&builder, stream, service, watcher).await
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Serves one accepted connection until it ends, or shutdown ends it.
async fn serve_connection<IO>(
    builder: &http2::Builder<TokioExecutor>,
    io: IO,
    service: GrpcServices,
    watcher: Watcher,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if let Err(e) = watcher.watch(builder.serve_connection(TokioIo::new(io), service)).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_grpc_timeout(v: &str) -> Option<Duration> {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&m)
    }

    /// Sends `body` to `path` through `services`; the answer's headers and, when it has a
    /// body, its trailers.
    async fn call(
        services: &GrpcServices,
        path: &str,
        body: &str,
    ) -> (http::HeaderMap, Option<http::HeaderMap>) {
        use hyper::body::Body as _;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Body::new(body.to_string()))
            .unwrap();
        let (parts, mut body) = services.dispatch(req).await.unwrap().into_parts();
        let mut trailers = None;
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            if let Ok(t) = frame.unwrap().into_trailers() {
                trailers = Some(t);
            }
        }
        (parts.headers, trailers)
    }

    #[tokio::test]
    async fn requests_reach_their_service_by_path() {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let services = GrpcServices::new().with(health);
        // An empty HealthCheckRequest, framed: not compressed, length 0. Service "" is
        // SERVING from the start.
        let (headers, trailers) =
            call(&services, "/grpc.health.v1.Health/Check", "\0\0\0\0\0").await;
        assert_eq!(headers["content-type"], "application/grpc");
        assert!(headers.get("grpc-status").is_none(), "{headers:?}");
        assert_eq!(trailers.expect("a unary answer ends with trailers")["grpc-status"], "0");
        // A method the service lacks, a service the port lacks, a path that is no gRPC
        // method: UNIMPLEMENTED (12).
        for path in ["/grpc.health.v1.Health/Nope", "/neardup.v1.Neardup/Query", "/", "/grpc"] {
            let (headers, _) = call(&services, path, "").await;
            assert_eq!(headers["grpc-status"], "12", "{path}");
        }
    }

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(grpc_timeout(&tonic::metadata::MetadataMap::new()), None);
    }
}
