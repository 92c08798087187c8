//! Request metrics of the public service: counts and latency histograms by method and
//! status code, plus the items (documents, queries) the batches carried.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::Code;

/// Labels of one series: the gRPC method and the status code it ended with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// Method name, e.g. `Query`.
    pub method: &'static str,
    /// Status code name, e.g. `Ok`, `InvalidArgument`.
    pub code: String,
}

/// Labels of the item counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ItemLabels {
    /// Method name.
    pub method: &'static str,
}

/// The router's metrics; cloning shares the series.
#[derive(Clone)]
pub struct RpcMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    requests: Family<RpcLabels, Counter>,
    latency: Family<RpcLabels, Histogram>,
    items: Family<ItemLabels, Counter>,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        RpcMetrics {
            inner: Arc::new(Inner {
                requests: Family::default(),
                latency: Family::new_with_constructor(|| {
                    // 20 us .. ~20 s.
                    Histogram::new(exponential_buckets(0.000_02, 2.0, 21))
                }),
                items: Family::default(),
            }),
        }
    }
}

impl RpcMetrics {
    /// Registers the series under `neardup_rpc_` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("neardup_rpc");
        r.register("requests", "Requests by method and status code", self.inner.requests.clone());
        r.register(
            "latency_seconds",
            "Request latency by method and status code",
            self.inner.latency.clone(),
        );
        r.register(
            "items",
            "Documents, queries or texts carried by requests, by method",
            self.inner.items.clone(),
        );
    }

    /// Records one finished request.
    pub fn observe(&self, method: &'static str, code: Code, started: Instant) {
        let labels = RpcLabels { method, code: format!("{code:?}") };
        self.inner.requests.get_or_create(&labels).inc();
        self.inner.latency.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    }

    /// Counts items carried by a request.
    pub fn items(&self, method: &'static str, n: usize) {
        self.inner.items.get_or_create(&ItemLabels { method }).inc_by(n as u64);
    }
}
