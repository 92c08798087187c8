//! Request metrics of the public service: counts and latency histograms by method and
//! status code, plus the items (documents, queries) the batches carried.
//!
//! Recording one request must cost next to nothing beside a request that itself costs a few
//! microseconds: the series of the service's own methods are looked up once, on their
//! first use, and kept in a table indexed by method and status code, so a request neither
//! formats its labels nor hashes them.

use std::sync::{Arc, OnceLock};
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
    /// The series of `(METHODS[m], code c)` at `m * CODES + c`, once used.
    by_code: Vec<OnceLock<(Counter, Histogram)>>,
    /// The item counter of `METHODS[m]` at `m`, once used.
    items_of: Vec<OnceLock<Counter>>,
}

/// The methods whose series are kept at hand (any other name goes through the families).
const METHODS: [&str; 8] = [
    "Query",
    "QueryBatch",
    "CheckAndInsert",
    "Insert",
    "InsertStream",
    "Delete",
    "Fingerprint",
    "Stats",
];

/// gRPC status codes: 0 (OK) to 16 (UNAUTHENTICATED).
const CODES: usize = 17;

/// Where `method` sits in [`METHODS`].
fn method_index(method: &str) -> Option<usize> {
    METHODS.iter().position(|m| *m == method)
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
                by_code: (0..METHODS.len() * CODES).map(|_| OnceLock::new()).collect(),
                items_of: (0..METHODS.len()).map(|_| OnceLock::new()).collect(),
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
        let seconds = started.elapsed().as_secs_f64();
        let c = code as usize;
        let m = &self.inner;
        let slot = method_index(method).filter(|_| c < CODES).map(|i| &m.by_code[i * CODES + c]);
        match slot {
            Some(slot) => {
                let (count, latency) = slot.get_or_init(|| {
                    let labels = RpcLabels { method, code: format!("{code:?}") };
                    (
                        m.requests.get_or_create(&labels).clone(),
                        m.latency.get_or_create(&labels).clone(),
                    )
                });
                count.inc();
                latency.observe(seconds);
            }
            None => {
                let labels = RpcLabels { method, code: format!("{code:?}") };
                m.requests.get_or_create(&labels).inc();
                m.latency.get_or_create(&labels).observe(seconds);
            }
        }
    }

    /// Counts items carried by a request.
    pub fn items(&self, method: &'static str, n: usize) {
        let m = &self.inner;
        match method_index(method) {
            Some(i) => m.items_of[i]
                .get_or_init(|| m.items.get_or_create(&ItemLabels { method }).clone())
                .inc_by(n as u64),
            None => m.items.get_or_create(&ItemLabels { method }).inc_by(n as u64),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exported text of `metrics`.
    fn exported(metrics: &RpcMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn every_request_is_counted_under_its_method_and_code() {
        let m = RpcMetrics::default();
        let t = Instant::now();
        for _ in 0..3 {
            m.observe("Query", Code::Ok, t);
        }
        m.observe("Query", Code::DeadlineExceeded, t);
        // A method outside the table goes through the families, and is counted the same.
        m.observe("Other", Code::Ok, t);
        m.observe("Other", Code::Ok, t);
        m.items("QueryBatch", 1000);
        m.items("QueryBatch", 24);
        m.items("Other", 5);
        let text = exported(&m);
        for line in [
            r#"neardup_rpc_requests_total{method="Query",code="Ok"} 3"#,
            r#"neardup_rpc_requests_total{method="Query",code="DeadlineExceeded"} 1"#,
            r#"neardup_rpc_requests_total{method="Other",code="Ok"} 2"#,
            r#"neardup_rpc_latency_seconds_count{method="Query",code="Ok"} 3"#,
            r#"neardup_rpc_items_total{method="QueryBatch"} 1024"#,
            r#"neardup_rpc_items_total{method="Other"} 5"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // A clone shares the series.
        m.clone().observe("Query", Code::Ok, t);
        assert!(exported(&m).contains(r#"neardup_rpc_requests_total{method="Query",code="Ok"} 4"#));
    }
}
