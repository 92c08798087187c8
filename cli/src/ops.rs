//! What every server role shares: logging, the `/metrics` endpoint, signals, listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use neardup_server::access::MetricsToken;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::error::CliError;

/// Starts structured logging: filter from `RUST_LOG` (default `info`), text or JSON lines
/// on stderr.
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = if format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// A role's start: with `--print-config`, prints `config` and returns false (the role
/// exits); otherwise starts logging, turns transparent huge pages off for the process (see
/// [`neardup_server::no_transparent_huge_pages`]) and returns true.
pub fn start_role(print_config: bool, config: &crate::config::Config) -> bool {
    if print_config {
        print!("{}", config.to_toml());
        return false;
    }
    init_logging(&config.log_format);
    if let Err(e) = neardup_server::no_transparent_huge_pages() {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off; serving with them");
    }
    true
}

/// Binds a TCP listener, with an error that names the address.
pub async fn bind(addr: &str, what: &'static str) -> Result<TcpListener, CliError> {
    TcpListener::bind(addr).await.map_err(|source| CliError::Listen {
        what,
        address: addr.to_string(),
        source,
    })
}

/// Serves `registry` at `http://addr/metrics` (OpenMetrics text) until the process ends;
/// returns the bound address. With `token`, a request without it is answered 401.
pub async fn serve_metrics(
    addr: &str,
    registry: Registry,
    token: Option<Arc<MetricsToken>>,
) -> Result<Option<SocketAddr>, CliError> {
    if addr.is_empty() {
        return Ok(None);
    }
    let listener = bind(addr, "metrics").await?;
    let local = listener.local_addr().map_err(|source| CliError::Listen {
        what: "metrics",
        address: addr.to_string(),
        source,
    })?;
    let registry = Arc::new(registry);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let (registry, token) = (registry.clone(), token.clone());
            async move {
                use axum::http::{StatusCode, header};
                if let Some(t) = &token
                    && !t.allows(headers.get(header::AUTHORIZATION))
                {
                    return (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "the metrics need the metrics token (authorization: Bearer)\n".to_string(),
                    );
                }
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &registry) {
                    Ok(()) => (
                        StatusCode::OK,
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    ),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                        format!("cannot encode metrics: {e}"),
                    ),
                }
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    tracing::info!(address = %local, "metrics at /metrics");
    Ok(Some(local))
}

/// Completes on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining requests, then stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining requests, then stopping"),
    }
}
