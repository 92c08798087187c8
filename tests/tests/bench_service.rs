//! `neardup-bench service` end to end on a small index: every phase runs against a real
//! server process and reports what it did, the floors included.

use neardup_tests::{binary, run_bench};

#[test]
fn the_service_benchmark_runs_every_phase_and_reports_the_floors() {
    let neardup = binary();
    let out = run_bench(&[
        "service",
        "--neardup",
        neardup.to_str().unwrap(),
        "--n",
        "3000",
        "--queries",
        "500",
        "--rates",
        "100,300",
        "--seconds",
        "1",
        "--batch-queries",
        "2000",
        "--mixed-rate",
        "100",
        "--mixed-insert-rate",
        "500",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("a JSON line");
    let r: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");

    assert_eq!(r["n"], 3000);
    assert_eq!(r["insert"]["documents"], 3000);
    assert_eq!(r["server"]["documents"], 3000);
    assert!(r["machine_stalls"]["seconds"].as_f64().unwrap() >= 3.0);

    let unary = r["unary"].as_array().expect("one entry a rate");
    assert_eq!(unary.len(), 2);
    for (u, rate) in unary.iter().zip([100u64, 300]) {
        assert_eq!(u["offered_qps"], rate);
        assert_eq!(u["sent"], rate, "one second of queries at {rate}/s");
        assert_eq!(u["errors"], 0);
        assert!(u["p99_us"].as_f64().unwrap() >= u["p50_us"].as_f64().unwrap());
        // CPU per call, of the server and of the generator: figures, not nulls.
        assert!(u["server_cpu_us_per_call"].as_f64().unwrap() >= 0.0);
        assert!(u["generator_cpu_us_per_call"].as_f64().unwrap() >= 0.0);
        for floor in ["grpc_health", "tcp_echo"] {
            assert!(u["floor"][floor]["server_cpu_us_per_call"].as_f64().unwrap() >= 0.0);
            assert_eq!(u["floor"][floor]["sent"], rate, "{floor} at {rate}/s");
            assert_eq!(u["floor"][floor]["errors"], 0, "{floor} at {rate}/s");
            assert!(u["floor"][floor]["p50_us"].as_f64().unwrap() > 0.0);
        }
    }

    // Every QueryBatch query is answered.
    assert_eq!(r["query_batch"]["queries"], 2000);
    assert!(r["query_batch"]["server_cpu_us_per_query"].as_f64().unwrap() >= 0.0);
    assert!(r["query_batch"]["client_cpu_us_per_query"].as_f64().unwrap() >= 0.0);
    assert!(r["in_process"]["cpu_us_per_query_one_thread"].as_f64().unwrap() > 0.0);
    assert_eq!(r["mixed"]["reads"]["sent"], 100);
    assert_eq!(r["mixed"]["reads"]["errors"], 0);
    assert_eq!(r["mixed"]["documents_written"], 500);
    for key in ["clean_seconds_to_serving", "after_kill9_seconds_to_serving"] {
        assert!(r["restart"][key].as_f64().unwrap() > 0.0, "{key}");
    }
}
