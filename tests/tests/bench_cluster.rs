//! `neardup-bench cluster` end to end on a small load: 3 real nodes and one, every phase
//! runs and reports what it did, the floors and the kill included.

use neardup_tests::{binary, run_bench};

/// The small load both tests run: few queries, one-second phases, a fast Raft tick.
const SMALL: [&str; 15] = [
    "--queries",
    "500",
    "--rates",
    "100",
    "--seconds",
    "1",
    "--batch-queries",
    "2000",
    "--kill-rate",
    "100",
    "--kill-seconds",
    "2",
    "--tick-ms",
    "20",
    "--json",
];

#[test]
fn the_cluster_benchmark_runs_every_phase_for_three_nodes_and_one() {
    let neardup = binary();
    let mut args = vec!["cluster", "--neardup", neardup.to_str().unwrap(), "--docs", "3000"];
    args.extend(SMALL);
    let out = run_bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| durable inserts, documents/s |"), "{stdout}");
    let last = stdout.lines().last().expect("a JSON line");
    let r: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(r["docs"], 3000);
    for side in ["cluster", "single"] {
        let s = &r[side];
        assert_eq!(s["documents_inserted"], 3000, "{side}");
        assert_eq!(s["query_batch_queries"], 2000, "{side}");
        let held: u64 =
            s["documents_per_node"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).sum();
        assert!(held >= 3000, "{side}: every document is held by some node: {s}");
        // Index and document table apart, on both sides.
        for key in ["memory_bytes_per_doc", "document_table_bytes_per_doc"] {
            assert!(s[key].as_f64().unwrap() > 0.0, "{side} {key}: {s}");
        }
        // The servers' CPU is read (/proc counts it in 10 ms ticks: a phase of a few
        // milliseconds, as QueryBatch here, may read 0).
        for key in ["insert_cpu_us_per_doc", "insert_settled_cpu_us_per_doc", "query_batch_cpu_us"]
        {
            assert!(s[key].as_f64().unwrap() >= 0.0, "{side} {key}: {s}");
        }
        let u = &s["unary"][0];
        for kind in ["query", "grpc_health", "tcp_echo"] {
            assert_eq!(u[kind]["sent"], 100, "{side} {kind}");
            assert_eq!(u[kind]["errors"], 0, "{side} {kind}");
        }
    }
    assert_eq!(r["cluster"]["documents_per_node"].as_array().unwrap().len(), 3);
    // The map's health from the nodes' logs: counts, not nulls (a loaded machine may log
    // some, so their values are not checked).
    let h = &r["cluster"]["raft_health"];
    for k in [
        "slow_store_syncs",
        "slow_readies",
        "slow_deliveries",
        "slowest_delivery_ms",
        "leader_step_downs",
        "nodes_marked_down",
    ] {
        assert!(h[k].is_u64(), "{k}: {h}");
    }
    let kill = &r["cluster"]["kill"];
    assert_eq!(kill["query"]["sent"], 200, "two seconds at 100/s: {kill}");
    assert!(kill["writes_back_after_seconds"].as_f64().unwrap() >= 0.0);
}

/// `--grow` on a small load: one node grown to four, figures at each size and each join's
/// rebalance; every document stays held, and at four nodes every node holds a share.
#[test]
fn the_cluster_benchmark_grows_from_one_node_to_four() {
    let neardup = binary();
    let mut args = vec!["cluster", "--grow", "--neardup", neardup.to_str().unwrap()];
    args.extend(["--docs", "3000", "--grow-inserts", "500"]);
    args.extend(SMALL);
    let out = run_bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| largest distance of a node from the mean, % |"), "{stdout}");
    let last = stdout.lines().last().expect("a JSON line");
    let r: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    let g = &r["grow"];
    assert_eq!(g["loaded"], 3000);
    let sizes = g["sizes"].as_array().unwrap();
    assert_eq!(sizes.iter().map(|s| s["nodes"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 4]);
    for (i, s) in sizes.iter().enumerate() {
        assert_eq!(s["documents_inserted"], 500, "{s}");
        // Every document loaded or inserted so far is held.
        assert_eq!(s["documents"], 3000 + 500 * (i as u64 + 1), "{s}");
        let per_node = s["per_node"].as_array().unwrap();
        assert_eq!(per_node.len() as u64, s["nodes"].as_u64().unwrap(), "{s}");
        for n in per_node {
            assert!(n["memory_bytes"].as_u64().unwrap() > 0, "every node holds a share: {s}");
        }
        assert_eq!(s["query_batch_queries"], 2000, "{s}");
        assert_eq!(s["unary"][0]["query"]["errors"], 0, "{s}");
    }
    let joins = g["joins"].as_array().unwrap();
    assert_eq!(joins.iter().map(|j| j["node"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 3, 4]);
    for j in joins {
        assert!(j["new_node_bytes"].as_f64().unwrap() > 0.0, "{j}");
        assert_eq!(j["query_after"]["sent"], 200, "{j}");
    }
}
