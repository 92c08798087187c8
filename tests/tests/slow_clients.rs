//! Clients that open streams and send nothing must not lock anyone out.
//!
//! The attack: 21 connections, each trying to open 200 InsertStream streams that send
//! headers and never a message. Before the connection limits, all 4,200 held in-flight slots
//! and every legitimate call got RESOURCE_EXHAUSTED for as long as they stayed open. Now a
//! connection may open 100 streams at once (the rest wait in the client), and a stream
//! silent for `limits.stream_idle_secs` is ended with DEADLINE_EXCEEDED. The test checks
//! that legitimate calls succeed while the attack is on, and prints their latency (it
//! asserts nothing on time).

use std::time::{Duration, Instant};

use neardup_client::doc;
use neardup_tests::Node;
use tonic::Code;

/// Asks for `streams` header-only InsertStream streams on one new connection and keeps
/// them (and the connection) until the returned handles are dropped.
async fn silent_streams(addr: &str, streams: usize) -> Vec<h2::SendStream<bytes::Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut held = Vec::new();
    let mut client = client;
    for _ in 0..streams {
        client = match tokio::time::timeout(Duration::from_millis(200), client.ready()).await {
            Ok(Ok(c)) => c,
            _ => break,
        };
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}/neardup.v1.Neardup/InsertStream"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let Ok((_response, body)) = client.send_request(request, false) else { break };
        held.push(body);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_streams_lock_out_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::serve_in(dir.path(), &[]).await;
    let client = node.client().await;
    client.insert(vec![doc("a", 0xA5A5, 1)]).await.unwrap();

    let mut attack = Vec::new();
    for _ in 0..21 {
        attack.push(silent_streams(&node.addr, 200).await);
    }
    // What the clients asked for; the server lets 100 a connection open, and h2 keeps the
    // rest waiting in the client.
    let opened: usize = attack.iter().map(Vec::len).sum();

    let mut latencies = Vec::new();
    for i in 0..200u64 {
        let started = Instant::now();
        let r = client.query(0xA5A5 ^ (i & 1), Some(3), 10).await;
        latencies.push(started.elapsed());
        let hits = r.unwrap_or_else(|e| panic!("a legitimate query failed during the attack: {e}"));
        assert_eq!(hits.matches.len(), 1);
    }
    latencies.sort();
    eprintln!(
        "{opened} silent streams asked for; 200 legitimate queries: p50 {:?}, p99 {:?}",
        latencies[100], latencies[197]
    );
    drop(attack);
    node.terminate();
}

/// A stream that sends nothing is ended with DEADLINE_EXCEEDED once the idle limit passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_is_ended() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::serve_in(dir.path(), &["--set", "limits.stream_idle_secs=1"]).await;
    let tcp = tokio::net::TcpStream::connect(&node.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/neardup.v1.Neardup/InsertStream", node.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, _body) = client.send_request(request, false).unwrap();
    // Bounded: the server must answer well within a minute.
    let response = tokio::time::timeout(Duration::from_secs(60), response)
        .await
        .expect("the silent stream was not ended")
        .unwrap();
    let status = |h: &http::HeaderMap| h.get("grpc-status").map(|v| Code::from_bytes(v.as_bytes()));
    let code = match status(response.headers()) {
        Some(code) => code,
        None => {
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                chunk.unwrap();
            }
            status(&body.trailers().await.unwrap().expect("trailers")).expect("grpc-status")
        }
    };
    assert_eq!(code, Code::DeadlineExceeded);
    node.terminate();
}
