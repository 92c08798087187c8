//! One small request must not make a node build an answer without bound. 10,000 stored
//! copies of one page (a soft-404 in a real crawl) and one QueryBatch message of 10,000
//! copies of it with `limit` 10,000 ask for 10^8 matches: the answer fills the response
//! bound (100,000 matches or 3 MiB of them, each counted as its id and 40 bytes) and no
//! more, says `truncated` past it, and the server's peak memory while answering stays under
//! twice its resident size before the request.

use neardup_client::{Target, doc};
use neardup_tests::Node;

/// A `/proc/PID/status` field in kB.
fn status_kb(pid: i32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amplifying_query_batch_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::serve_in(dir.path(), &[]).await;
    let client = node.client().await;
    let fp = 0x0404_0404_0404_0404;
    let docs: Vec<_> =
        (0..10_000).map(|i| doc(format!("https://example.org/404/{i}"), fp, i)).collect();
    client.insert_all(&docs, 1000).await.unwrap();
    // A first small query warms every path; then the resident size is the baseline, and the
    // peak is reset so it measures the batch alone (clear_refs 5 resets VmHWM).
    client.query(fp, Some(0), 10).await.unwrap();
    let pid = node.pid();
    let idle_kb = status_kb(pid, "VmRSS");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();

    let targets = vec![Target::Fingerprint(fp); 10_000];
    let results = client.query_all(&targets, Some(0), 10_000, 10_000).await.unwrap();
    let peak_kb = status_kb(pid, "VmHWM");

    assert_eq!(results.len(), 10_000);
    let total: usize = results.iter().map(|r| r.matches.len()).sum();
    let bytes: usize = results.iter().flat_map(|r| &r.matches).map(|m| m.id.len() + 40).sum();
    assert!(total <= 100_000 && bytes <= 3 << 20, "{total} matches, {bytes} bytes");
    assert!(bytes > (3 << 20) - 100, "the bound is filled: {bytes} bytes");
    assert_eq!(results[0].matches.len(), 10_000, "queries are served in order");
    let full = total / 10_000;
    assert!(results[..full].iter().all(|r| !r.truncated && r.matches.len() == 10_000));
    assert!(results[full].truncated);
    assert!(results[full + 1..].iter().all(|r| r.truncated && r.matches.is_empty()));
    // Every match returned is a real one.
    assert!(
        results.iter().flat_map(|r| &r.matches).all(|m| m.fingerprint == fp && m.distance == 0)
    );
    eprintln!("resident {idle_kb} kB before the batch, peak {peak_kb} kB while answering it");
    assert!(
        peak_kb < 2 * idle_kb,
        "peak {peak_kb} kB while answering, against {idle_kb} kB resident before"
    );
    node.terminate();
}
