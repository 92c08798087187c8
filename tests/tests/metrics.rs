//! Prometheus metrics over HTTP: requests and latency by method and status, documents,
//! bytes per table, log size, merge activity, and the stages of an admission.

use neardup_client::{doc, text_doc};
use neardup_tests::{Node, free_port, http_get};

fn scrape(addr: &str) -> String {
    scrape_with(addr, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_reports_requests_and_storage() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let metrics = format!("127.0.0.1:{}", free_port());
    let set = format!("metrics_listen={metrics}");
    let mut node =
        Node::start(&["serve", "--data", data.to_str().unwrap(), "--set", &set], dir.path());
    node.serving().await;
    let c = node.client().await;
    let docs: Vec<_> = (0..5000u64)
        .map(|i| doc(format!("m{i}"), i.wrapping_mul(0x9E37_79B9_7F4A_7C15), 0))
        .collect();
    c.insert_all(&docs, 1000).await.unwrap();
    c.query(1, Some(3), 10).await.unwrap();
    let _ = c.query(1, Some(9), 10).await.unwrap_err();
    // Two admissions of one text: the second reads the first's sketch, so every stage of an
    // admission is timed.
    let text = "the crawler fetched this page twice and the second copy is the same";
    for (i, id) in ["a1", "a2"].into_iter().enumerate() {
        let r = c.check_and_insert(text_doc(id, text, i as i64), None, 10, false).await.unwrap();
        assert_eq!(r.duplicate, i == 1, "{r:?}");
    }
    // A rejected write (an empty id) counts as a request, not as items stored.
    let _ = c.insert(vec![doc("", 1, 0), doc("x", 2, 0)]).await.unwrap_err();
    // The gauges are refreshed by the background thread; wait for the documents to show.
    let mut body = String::new();
    for _ in 0..500 {
        body = scrape(&metrics);
        if body.contains("neardup_documents 5002") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"), "{body}");
    for series in [
        "neardup_documents 5002",
        "neardup_rpc_requests_total{method=\"Query\",code=\"Ok\"} 1",
        "neardup_rpc_requests_total{method=\"Query\",code=\"InvalidArgument\"} 1",
        "neardup_rpc_latency_seconds_count{method=\"InsertStream\",code=\"Ok\"} 1",
        "neardup_table_bytes{table=\"9\"}",
        "neardup_wal_bytes",
        "neardup_merges_total",
        "neardup_merges_running",
        "neardup_log_sync_seconds_count",
        "neardup_admission_stage_seconds_count{stage=\"candidates\"} 2",
        "neardup_admission_stage_seconds_count{stage=\"sketch_reads\"} 1",
        "neardup_admission_stage_seconds_count{stage=\"write_lock\"} 2",
        "neardup_admission_stage_seconds_count{stage=\"decide\"} 2",
        "neardup_admission_stage_seconds_count{stage=\"durable\"} 2",
    ] {
        assert!(body.contains(series), "missing {series}:\n{body}");
    }
    assert!(
        body.contains("neardup_rpc_requests_total{method=\"Insert\",code=\"InvalidArgument\"} 1")
    );
    assert!(body.contains("neardup_rpc_items_total{method=\"InsertStream\"} 5000"), "{body}");
    assert!(!body.contains("neardup_rpc_items_total{method=\"Insert\"}"), "rejected items counted");
    node.terminate();
}

/// `GET /metrics` with `authorization` when given; the whole answer.
fn scrape_with(addr: &str, authorization: Option<&str>) -> String {
    http_get(addr, "/metrics", authorization).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_token_guards_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let token_file = dir.path().join("metrics.token");
    std::fs::write(&token_file, "scrape-secret-1\n").unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let (set, tok) = (
        format!("metrics_listen={metrics}"),
        format!("auth.metrics_token_file={}", token_file.display()),
    );
    let mut node = Node::start(
        &["serve", "--data", data.to_str().unwrap(), "--set", &set, "--set", &tok],
        dir.path(),
    );
    node.serving().await;
    let status = |body: &str| body.split_whitespace().nth(1).unwrap_or_default().to_string();
    assert_eq!(status(&scrape_with(&metrics, None)), "401");
    assert_eq!(status(&scrape_with(&metrics, Some("Bearer wrong"))), "401");
    let ok = scrape_with(&metrics, Some("Bearer scrape-secret-1"));
    assert_eq!(status(&ok), "200", "{ok}");
    assert!(ok.contains("neardup_documents"), "{ok}");
    // A new token in the file takes over without a restart; the old one stops working.
    std::fs::write(&token_file, "scrape-secret-2\n").unwrap();
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while status(&scrape_with(&metrics, Some("Bearer scrape-secret-2"))) != "200" {
        assert!(std::time::Instant::now() < limit, "the new token never took over");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status(&scrape_with(&metrics, Some("Bearer scrape-secret-1"))), "401");
    let log = node.log_text();
    assert!(!log.contains("scrape-secret"), "a token in the log:\n{log}");
}
