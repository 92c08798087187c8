//! Every kind of bad input gets its documented status code and changes nothing.

use neardup_client::{Rpc, doc, text_doc};
use neardup_proto::v1::{
    CheckAndInsertRequest, DeleteRequest, Document, FingerprintRequest, InsertRequest,
    QueryBatchRequest, QueryRequest, QueryTarget, query_target,
};
use neardup_tests::Node;
use prost::Message;
use tonic::Code;

fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

fn target(fp: u64) -> Option<QueryTarget> {
    Some(QueryTarget { target: Some(query_target::Target::Fingerprint(fp)), ..Default::default() })
}

/// What the server holds, to compare before and after: stats and a few answers.
async fn state(c: &neardup_client::Client) -> (u64, u64, String) {
    let s = c.stats().await.unwrap();
    let q = c.query(7, Some(3), 100).await.unwrap();
    (s.documents, s.wal_bytes, format!("{:?}", q.matches))
}

/// Sends raw bytes as a request of `method`, to test what does not parse.
async fn raw_call(addr: &str, method: &str, body: Vec<u8>) -> tonic::Status {
    #[derive(Clone, Default)]
    struct Raw;
    impl tonic::codec::Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }
    impl tonic::codec::Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: Vec<u8>,
            dst: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            use prost::bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(
            &mut self,
            src: &mut tonic::codec::DecodeBuf<'_>,
        ) -> Result<Option<Vec<u8>>, tonic::Status> {
            use prost::bytes::Buf;
            let mut v = vec![0; src.remaining()];
            src.copy_to_slice(&mut v);
            Ok(Some(v))
        }
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = format!("/neardup.v1.Neardup/{method}").parse().unwrap();
    grpc.unary::<Vec<u8>, Vec<u8>, Raw>(tonic::Request::new(body), path, Raw).await.unwrap_err()
}

/// Calls `path` over a bare HTTP/2 connection with the given `grpc-timeout` and a
/// protobuf `message`, returning the `grpc-status` the server answers.
async fn h2_call(addr: &str, path: &str, timeout: &str, message: Vec<u8>) -> Code {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    body.send_data(frame.into(), true).unwrap();
    let response = response.await.unwrap();
    let status = |h: &http::HeaderMap| h.get("grpc-status").map(|v| Code::from_bytes(v.as_bytes()));
    if let Some(code) = status(response.headers()) {
        return code; // a trailers-only response
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let trailers = body.trailers().await.unwrap().expect("gRPC trailers");
    status(&trailers).expect("grpc-status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_codes_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--set",
        "limits.max_message_bytes=1048576",
        "--set",
        "limits.max_text_bytes=100000",
    ];
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    let c = node.client().await;
    c.insert(vec![doc("https://ok/1", 7, 1), doc("https://ok/2", 7 ^ 0b11, 2)]).await.unwrap();
    let before = state(&c).await;
    let mut rpc: Rpc = c.raw();
    let d = |id: &str| doc(id, 1, 1);
    let none =
        Document { id: "https://x".into(), content: None, timestamp_ms: 0, ..Default::default() };
    let cases: Vec<(&str, Code, Code)> = vec![
        (
            "k above the design's maximum",
            Code::InvalidArgument,
            code(
                rpc.query(QueryRequest {
                    target: target(1),
                    // The default design, 8c2, answers k <= 6.
                    k: Some(7),
                    limit: 0,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "query without fingerprint or text",
            Code::InvalidArgument,
            code(
                rpc.query(QueryRequest { target: None, k: None, limit: 0, ..Default::default() })
                    .await,
            ),
        ),
        (
            "query target empty",
            Code::InvalidArgument,
            code(
                rpc.query(QueryRequest {
                    target: Some(QueryTarget { target: None, ..Default::default() }),
                    k: None,
                    limit: 0,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "limit above the maximum",
            Code::InvalidArgument,
            code(
                rpc.query(QueryRequest {
                    target: target(1),
                    k: None,
                    limit: 10_001,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "text without words",
            Code::InvalidArgument,
            code(
                rpc.query(QueryRequest {
                    target: Some(QueryTarget {
                        target: Some(query_target::Target::Text(" ,;- ".into())),
                        ..Default::default()
                    }),
                    k: None,
                    limit: 0,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "text over the limit",
            Code::InvalidArgument,
            code(
                rpc.insert(InsertRequest {
                    documents: vec![text_doc("https://t", "word ".repeat(25_000), 1)],
                })
                .await,
            ),
        ),
        (
            "empty id",
            Code::InvalidArgument,
            code(rpc.insert(InsertRequest { documents: vec![d("https://fine"), d("")] }).await),
        ),
        (
            "id over 1024 bytes",
            Code::InvalidArgument,
            code(rpc.insert(InsertRequest { documents: vec![d(&"u".repeat(1025))] }).await),
        ),
        (
            "document without content",
            Code::InvalidArgument,
            code(
                rpc.insert(InsertRequest { documents: vec![d("https://fine"), none.clone()] })
                    .await,
            ),
        ),
        (
            "empty batch",
            Code::InvalidArgument,
            code(rpc.insert(InsertRequest { documents: vec![] }).await),
        ),
        (
            "batch over 10,000",
            Code::InvalidArgument,
            code(
                rpc.insert(InsertRequest {
                    documents: (0..10_001).map(|i| d(&format!("b{i}"))).collect(),
                })
                .await,
            ),
        ),
        (
            "bad document inside a stream",
            Code::InvalidArgument,
            code(
                rpc.insert_stream(tokio_stream::iter(vec![InsertRequest {
                    documents: vec![none.clone()],
                }]))
                .await,
            ),
        ),
        (
            "check without document",
            Code::InvalidArgument,
            code(
                rpc.check_and_insert(CheckAndInsertRequest {
                    document: None,
                    k: None,
                    limit: 0,
                    skip_insert_if_duplicate: false,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "check with k too large",
            Code::InvalidArgument,
            code(
                rpc.check_and_insert(CheckAndInsertRequest {
                    document: Some(d("https://c")),
                    k: Some(9),
                    limit: 0,
                    skip_insert_if_duplicate: false,
                    ..Default::default()
                })
                .await,
            ),
        ),
        (
            "delete nothing",
            Code::InvalidArgument,
            code(rpc.delete(DeleteRequest { ids: vec![], must_exist: false }).await),
        ),
        (
            "delete a missing id with must_exist",
            Code::NotFound,
            code(
                rpc.delete(DeleteRequest {
                    ids: vec!["https://ok/1".into(), "https://nope".into()],
                    must_exist: true,
                })
                .await,
            ),
        ),
        (
            "fingerprint of nothing",
            Code::InvalidArgument,
            code(rpc.fingerprint(FingerprintRequest { texts: vec![] }).await),
        ),
        (
            "message over the size limit",
            Code::OutOfRange,
            code(
                rpc.insert(InsertRequest {
                    documents: (0..1500).map(|i| d(&format!("{i:0>1000}"))).collect(),
                })
                .await,
            ),
        ),
    ];
    for (what, want, got) in &cases {
        assert_eq!(got, want, "{what}");
    }
    // A QueryBatch stream ends with the status of its first bad message.
    let bad = QueryBatchRequest {
        queries: vec![QueryTarget { target: None, ..Default::default() }],
        k: None,
        limit: 0,
    };
    let good = QueryBatchRequest {
        queries: vec![QueryTarget { target: target(7).unwrap().target, ..Default::default() }],
        k: Some(3),
        limit: 0,
    };
    let mut s = rpc.query_batch(tokio_stream::iter(vec![good, bad])).await.unwrap().into_inner();
    assert_eq!(s.message().await.unwrap().unwrap().results[0].matches.len(), 2);
    assert_eq!(s.message().await.unwrap_err().code(), Code::InvalidArgument);
    // Bytes that are not a protobuf message.
    let s = raw_call(&node.addr, "Insert", vec![0x0A, 0xFF, 0xFF, 0xFF]).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    // A deadline that has already passed. Sent over plain HTTP/2: tonic's client would
    // enforce grpc-timeout itself and report CANCELLED, hiding what the server answers.
    let late = InsertRequest { documents: vec![d("https://late")] };
    let code = h2_call(&node.addr, "/neardup.v1.Neardup/Insert", "1n", late.encode_to_vec()).await;
    assert_eq!(code, Code::DeadlineExceeded);
    // Nothing changed.
    assert_eq!(state(&c).await, before);
    node.terminate();

    // Overload: a server allowed no request in flight refuses every one.
    let data2 = dir.path().join("data2");
    let mut node = Node::start(
        &["serve", "--data", data2.to_str().unwrap(), "--set", "limits.max_in_flight=0"],
        dir.path(),
    );
    node.serving().await;
    let mut rpc = node.client().await.raw();
    let r = rpc
        .query(QueryRequest { target: target(1), k: None, limit: 0, ..Default::default() })
        .await;
    assert_eq!(r.unwrap_err().code(), Code::ResourceExhausted);
    node.terminate();
}
