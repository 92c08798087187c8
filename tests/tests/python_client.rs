//! A client in another language: Python grpcio with stubs generated from `proto/` at test
//! time runs insert, query, check and the health check against a real server.
//! Needs `python3` with `grpcio` and `grpcio-tools` (`pip install grpcio grpcio-tools`).

use std::path::PathBuf;
use std::process::Command;

use neardup_tests::Node;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client() {
    if !neardup_tests::has_python_grpc() {
        neardup_tests::skip_without(
            "python3 with grpcio and grpcio-tools (pip install grpcio grpcio-tools): the Python client is not checked",
        );
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let stubs = dir.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    let generated = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(root.join("proto"))
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg("neardup/v1/neardup.proto")
        .output()
        .expect("python3 must be installed");
    assert!(
        generated.status.success(),
        "generating Python stubs failed (pip install grpcio grpcio-tools): {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let node = Node::serve_in(dir.path(), &[]).await;
    let script = root.join("tests/python/client_test.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(&node.addr)
            .env("PYTHONPATH", &stubs)
            .output()
            .map(|o| (o, node))
    })
    .await
    .unwrap()
    .unwrap();
    let (out, mut node) = out;
    assert!(
        out.status.success(),
        "python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("python client: all checks passed"));
    node.terminate();
}
