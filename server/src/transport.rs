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
//! The routes are served by hyper directly rather than by tonic's transport, which would
//! enforce the caller's `grpc-timeout` itself and answer CANCELLED when it passes, racing
//! the services, which answer DEADLINE_EXCEEDED as gRPC specifies.

use std::future::Future;
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

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

/// Serves gRPC `routes` on `listener` over HTTP/2 (prior knowledge) with TCP_NODELAY and
/// `limits` until `shutdown` completes, then stops accepting and returns once the requests
/// in flight are answered.
pub async fn serve_http2(
    listener: TcpListener,
    routes: tonic::service::Routes,
    limits: Http2Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = TowerToHyperService::new(routes.into_axum_router());
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new()).max_concurrent_streams(limits.max_streams_per_connection);
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
        let connection =
            graceful.watch(builder.serve_connection(TokioIo::new(tcp), service.clone()));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_grpc_timeout(v: &str) -> Option<Duration> {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&m)
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
