//! A lean unary gRPC caller for the load generator: one HTTP/2 connection driven with the
//! `h2` crate directly.
//!
//! The generator shares the machine's two cores with the server it measures, so its own
//! cost per call must be small, and it must send what a good client sends. A tonic channel
//! costs the generator about as much CPU per call as the server spends answering (a buffer
//! task, a dispatch task and a codec per call), and often writes a request's HEADERS and
//! DATA frames apart, which makes the server wake and read twice per request. Here a call
//! queues both frames before the connection task runs, so they leave in one write (several
//! calls due at once share it), and the answer is checked by its `grpc-status` alone,
//! without decoding the message.

use std::future::Future;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};

/// One HTTP/2 connection to a gRPC server.
#[derive(Clone)]
pub struct UnaryConn {
    send: h2::client::SendRequest<Bytes>,
    authority: String,
    headers: HeaderMap,
}

/// The gRPC message framing: a 0 byte (not compressed), the length, the message.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message.encode(&mut buf).expect("the buffer has room for the message");
    buf.freeze()
}

impl UnaryConn {
    /// Connects to `addr` (host:port) with prior-knowledge HTTP/2 and TCP_NODELAY; the
    /// connection is driven by a task on the current runtime. Every call carries a
    /// `grpc-timeout` of `timeout`.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<UnaryConn, String> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let (send, connection) = h2::client::Builder::new()
            // Answers are small and read at once: wide windows so flow control never holds
            // an answer back, and window updates are rare.
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 24)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        let millis = timeout.as_millis().clamp(1, 99_999_999);
        headers.insert(
            "grpc-timeout",
            HeaderValue::from_str(&format!("{millis}m")).expect("digits and a unit"),
        );
        Ok(UnaryConn { send, authority: addr.to_string(), headers })
    }

    /// The URI of gRPC method `path` (`/package.Service/Method`) on this server.
    pub fn uri(&self, path: &str) -> Result<Uri, String> {
        format!("http://{}{path}", self.authority).parse().map_err(|e| format!("{path}: {e}"))
    }

    /// Sends one call of `uri` with the framed message `body` (see [`frame`]) and returns
    /// its answer to await: true when it ended with `grpc-status` 0 within `limit`. Waits
    /// first while the connection has as many streams open as the server allows.
    pub async fn call(
        &self,
        uri: &Uri,
        body: Bytes,
        limit: Duration,
    ) -> impl Future<Output = bool> + Send + 'static {
        let sent = async {
            let mut send = self.send.clone().ready().await.ok()?;
            let mut request = Request::new(());
            *request.method_mut() = Method::POST;
            *request.uri_mut() = uri.clone();
            *request.headers_mut() = self.headers.clone();
            let (response, mut stream) = send.send_request(request, false).ok()?;
            stream.send_data(body, true).ok()?;
            Some(response)
        };
        let response = sent.await;
        async move {
            let Some(response) = response else { return false };
            tokio::time::timeout(limit, answer(response)).await.unwrap_or(false)
        }
    }
}

/// Reads an answer to its end: true when its `grpc-status` is 0.
async fn answer(response: h2::client::ResponseFuture) -> bool {
    let Ok(response) = response.await else { return false };
    let (parts, mut body) = response.into_parts();
    if !parts.status.is_success() {
        return false;
    }
    // A "trailers-only" answer (an error, usually) carries its status in the headers.
    if let Some(status) = parts.headers.get("grpc-status") {
        return status == "0";
    }
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { return false };
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    match body.trailers().await {
        Ok(Some(trailers)) => trailers.get("grpc-status").is_some_and(|s| s == "0"),
        _ => false,
    }
}
