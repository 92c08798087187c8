//! `neardup-bench replica` on a few documents: both sides are written, held whole, and
//! measured.

use neardup_tests::run_bench;

#[test]
fn the_replica_benchmark_writes_both_sides_and_gives_the_bound() {
    let out = run_bench(&["replica", "--n", "6000", "--batch", "500", "--replicas", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("a JSON line");
    let r: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(r["n"], 6000);
    assert_eq!(r["replicas"], 2);
    for side in ["single", "replica"] {
        assert_eq!(r[side]["documents"], 6000, "{side}");
        for k in ["cpu_us_per_doc_acked", "cpu_us_per_doc_settled", "docs_per_second"] {
            let v = r[side][k].as_f64().unwrap_or(f64::NAN);
            assert!(v >= 0.0, "{side} {k}: {v}");
        }
        // Settled counts the acknowledged work and what followed it.
        assert!(
            r[side]["cpu_us_per_doc_settled"].as_f64().unwrap()
                >= r[side]["cpu_us_per_doc_acked"].as_f64().unwrap()
        );
    }
    // Both sides' bytes, and where the replica's go: its tables and its documents.
    for side in ["single", "replica"] {
        assert!(r[side]["memory_bytes_per_doc"].as_f64().unwrap() > 0.0, "{side}");
        assert!(r[side]["disk_bytes_per_doc"].as_f64().unwrap() > 0.0, "{side}");
    }
    let live = r["replica"]["live_bytes_per_doc"].as_object().expect("keyspaces");
    assert!(live["tables/run_blocks"].as_f64().unwrap() > 0.0, "{live:?}");
    assert!(live["documents/docs"].as_f64().unwrap() > 0.0, "{live:?}");
    // The bound is the single side's CPU over two replicas' (NaN or infinite when a side
    // read 0 CPU ticks, which a few thousand documents may: then it is not checked).
    let single = r["single"]["cpu_us_per_doc_acked"].as_f64().unwrap();
    let replica = r["replica"]["cpu_us_per_doc_acked"].as_f64().unwrap();
    if single > 0.0 && replica > 0.0 {
        let bound = r["insert_rate_bound_acked"].as_f64().unwrap();
        assert!((bound - single / (2.0 * replica)).abs() < 1e-9, "{bound}");
    }
}
