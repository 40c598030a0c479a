//! The RA-TLS port (gRPC and the HTTP API beside it) under its connection limits, served as
//! the gateway serves it (`connections::attested`, `server::serve::serve_incoming`): a
//! connection over the limit is closed at once; a connection that sends nothing, or trickles
//! its HTTP/2 preface, is closed after the head timeout, its TLS handshake included; a
//! request head over the size limit is refused; a connection whose answer is still streaming
//! is not closed by the head timer; and the port answers normally throughout.

use std::sync::atomic::AtomicBool;

use attest::{ExpectedPeer, ratls::RaTlsConnector};
use gateway::{
    connections::{self, ConnectionLimits},
    http::attested::alongside_grpc,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tower::Service;

use super::*;

/// The head timeout: room for an RA-TLS handshake and its fresh-nonce challenge on a loaded
/// machine.
const HEAD: Duration = Duration::from_secs(3);
const MAX: usize = 3;

/// The gateway's RA-TLS port over a flooding generator, at most [`MAX`] connections and a
/// [`HEAD`] head timeout; its address.
async fn port(dir: &std::path::Path) -> (SocketAddr, Arc<AtomicBool>) {
    let (pipeline, cancelled) = super::slow_reader::flooded_pipeline(false, dir).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = server::Metrics::new("gateway");
    let rag = gateway::grpc::RagService::new(pipeline.clone(), metrics.clone());
    let access = Access::attested(&AccessConfig { unauthenticated: true, ..AccessConfig::default() }, addr).unwrap();
    let app = gateway::http::router(pipeline, metrics.clone(), access);
    let routes = alongside_grpc(tonic::service::Routes::new(rag.into_server()), app);
    let identity = identity("gateway");
    let config = identity.server_config().unwrap();
    let limits = ConnectionLimits { max_connections: MAX, header_timeout: HEAD, ..ConnectionLimits::default() };
    let (routes, incoming) = connections::attested(listener, config, limits, routes, identity);
    let serving = server::serve::serve_incoming(incoming, None, metrics, routes, health(), std::future::pending());
    tokio::spawn(serving);
    (addr, cancelled)
}

/// A verified RA-TLS connection to `addr`, its handshake done, nothing sent.
async fn handshake(addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut connector = RaTlsConnector::new(Arc::new(policy()), ExpectedPeer::default(), None);
    let io = connector.call(format!("http://{addr}").parse().unwrap()).await.expect("RA-TLS handshake");
    io.into_inner()
}

/// `GET path` over a fresh verified channel, with `extra` headers; the status or the error.
async fn get(addr: SocketAddr, path: &str, extra: &[(&str, String)]) -> Result<u16, String> {
    let ch = attest::ratls::connect(&addr.to_string(), Arc::new(policy()), ExpectedPeer::default(), None)
        .await
        .map_err(|e| e.to_string())?
        .channel();
    let mut req = http::Request::builder().uri(format!("http://{addr}{path}"));
    for (k, v) in extra {
        req = req.header(*k, v);
    }
    let req = req.body(tonic::body::Body::empty()).unwrap();
    let mut ch = ch;
    tower::ServiceExt::ready(&mut ch).await.map_err(|e| e.to_string())?;
    ch.call(req).await.map(|r| r.status().as_u16()).map_err(|e| format!("{e:?}"))
}

/// Reads until the server closes `r`; how long that took. Fails when it is open after `bound`.
async fn closed_within(r: &mut (impl tokio::io::AsyncRead + Unpin), bound: Duration, what: &str) -> Duration {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(bound.saturating_sub(t.elapsed()), r.read(&mut buf)).await {
            Err(_) => panic!("{what}: the connection was still open {bound:?} later"),
            Ok(Ok(0) | Err(_)) => return t.elapsed(),
            Ok(Ok(_)) => {} // the server's SETTINGS, a GOAWAY
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ratls_port_limits_connections_heads_and_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = port(dir.path()).await;
    let bound = HEAD + Duration::from_secs(4);
    assert_eq!(get(addr, "/v1/models", &[]).await, Ok(200), "the port answers");

    // Connections that send nothing: a bare TCP connection (no handshake) and a verified
    // TLS connection that sends no request; both closed after the head timeout.
    let mut bare = TcpStream::connect(addr).await.unwrap();
    let mut silent = handshake(addr).await;
    // The third is the last place; one more is closed at once, before any handshake.
    let mut third = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    let took = closed_within(&mut over, Duration::from_millis(900), "a connection over the limit").await;
    assert!(took < HEAD, "refused after {took:?}");
    eprintln!("RA-TLS: a connection over the limit closed in {took:?}");
    drop(third.shutdown().await);
    drop(third);
    let took = closed_within(&mut bare, bound, "a connection that never started its handshake").await;
    assert!(took >= HEAD - Duration::from_millis(300), "closed after {took:?}, before its head timeout");
    let idle = closed_within(&mut silent, bound, "a verified connection that sent no request").await;
    eprintln!("RA-TLS: head timeout {HEAD:?}: no handshake closed after {took:?}, no request {idle:?} later");

    // A client that trickles its HTTP/2 preface a byte every 100 ms never sends a head in time.
    let mut trickle = handshake(addr).await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".iter().copied().cycle();
    let t = Instant::now();
    for b in preface {
        if trickle.write_all(&[b]).await.is_err() || t.elapsed() > bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = t.elapsed();
    assert!(took < bound, "a trickling client kept its connection for {took:?}");
    closed_within(&mut trickle, bound, "a trickling client").await;

    // A head over the size limit is refused; a normal one on a new connection is answered.
    let big = "a".repeat(connections::MAX_HEAD_BYTES + 1);
    let refused = get(addr, "/v1/models", &[("x-big", big)]).await;
    assert!(refused.is_err() || refused.as_ref().is_ok_and(|s| *s >= 400), "{refused:?}");
    eprintln!("RA-TLS: a head over {} bytes: {refused:?}", connections::MAX_HEAD_BYTES);
    assert_eq!(get(addr, "/v1/models", &[]).await, Ok(200), "the port answers after");
}

/// A connection whose answer is still streaming is busy, not idle: a streamed chat answer
/// read for twice the head timeout keeps coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_answer_outlives_the_head_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _) = port(dir.path()).await;
    let ch = attest::ratls::connect(&addr.to_string(), Arc::new(policy()), ExpectedPeer::default(), None)
        .await
        .unwrap()
        .channel();
    let body = serde_json::json!({
        "model": "gelo-generator", "stream": true,
        "messages": [{ "role": "user", "content": "What do bees do?" }],
    });
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(tonic::body::Body::new(http_body_full(body.to_string())))
        .unwrap();
    let mut ch = ch;
    tower::ServiceExt::ready(&mut ch).await.unwrap();
    let response = ch.call(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (t, mut bytes) = (Instant::now(), 0usize);
    while t.elapsed() < 2 * HEAD {
        let frame = tokio::time::timeout(HEAD, http_body_util_frame(&mut body)).await.expect("the answer stopped");
        bytes += frame.expect("the answer was cut while streaming");
        // A slow reader, well within the send timeout.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(bytes > 0);
}

/// A whole request body.
fn http_body_full(text: String) -> axum::body::Body {
    axum::body::Body::from(text)
}

/// The next data frame's length, or an error when the body ended or failed.
async fn http_body_util_frame(body: &mut tonic::body::Body) -> Result<usize, String> {
    use hyper::body::Body as _;
    let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await;
    match frame {
        Some(Ok(f)) => Ok(f.data_ref().map_or(0, |d| d.len())),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("the body ended".into()),
    }
}
