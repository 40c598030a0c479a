//! The proxy against in-process gateways on loopback: RA-TLS with mock evidence, the HTTP
//! side composed beside gRPC exactly as the gateway composes it
//! (`gateway::http::attested::alongside_grpc`), a stand-in router that records what
//! reaches it. Requests go to the proxy as a local client sends them (HTTP/1.1 over TCP).
//!
//! - a request and a streamed answer cross, the API key with them, the page's `Origin`
//!   and hop-by-hop headers not; a foreign `Host` or `Origin` is refused before anything
//!   is sent;
//! - a gateway restarted with a new key is verified from scratch and served; one restarted
//!   with another launch measurement is refused by name and gets no request.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use attest::{
    AttestationService, MockIssuer, MockPki, Policy, ServerIdentity, ServiceClaims, TrustedRoot,
    issuer::default_mock_measurement,
};
use axum::{
    Router,
    body::Body,
    extract::Request,
    http::{HeaderMap, header},
    routing::{get, post},
};
use proxy::{GatewayTarget, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pki_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-proxy-mock-pki");
    MockPki::load_or_create(&dir).expect("mock PKI");
    dir
}

fn policy() -> Policy {
    let pki = MockPki::load_or_create(&pki_dir()).unwrap();
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
        .allow_measurement(default_mock_measurement())
}

/// What reached a stand-in gateway's HTTP side.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    headers: Mutex<Vec<HeaderMap>>,
}

/// A gateway on `addr`: its evidence names `measurement` and the test policy as its backend
/// policy; its HTTP side answers `/v1/models` and streams `/v1/chat/completions`.
struct FakeGateway {
    seen: Arc<Seen>,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl FakeGateway {
    async fn start(addr: SocketAddr, measurement: [u8; 48]) -> FakeGateway {
        let issuer = Arc::new(MockIssuer::load_or_create(pki_dir()).unwrap().with_measurement(measurement));
        let scheme = serde_json::json!({ "role": "gateway", gateway::BACKEND_POLICY_FIELD: hex::encode(policy().digest().unwrap()) });
        let claims = ServiceClaims { model_identity: [7; 32], scheme_json: scheme.to_string(), role: "gateway".into() };
        let id = Arc::new(ServerIdentity::generate(issuer, claims).unwrap());
        let seen = Arc::new(Seen::default());
        let record = |seen: &Arc<Seen>, headers: &HeaderMap| {
            seen.requests.fetch_add(1, Ordering::SeqCst);
            seen.headers.lock().unwrap().push(headers.clone());
        };
        let (s1, s2) = (seen.clone(), seen.clone());
        let http = Router::new()
            .route(
                "/v1/models",
                get(move |req: Request| async move {
                    record(&s1, req.headers());
                    axum::Json(serde_json::json!({ "object": "list", "data": [{ "id": "gelo-rag" }] }))
                }),
            )
            .route(
                "/v1/chat/completions",
                post(move |req: Request| async move {
                    record(&s2, req.headers());
                    let events = events();
                    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(events))
                }),
            );
        let routes = tonic::service::Routes::new(AttestationService::new(id.clone()).into_server());
        let routes = gateway::http::attested::alongside_grpc(routes, http);
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let incoming = attest::ratls::serve_incoming(listener, id.server_config().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder().add_routes(routes);
        let done = tokio::spawn(async move {
            let _ = server.serve_with_incoming_shutdown(incoming, async { drop(stopped.await) }).await;
        });
        FakeGateway { seen, stop, done }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.done.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    fn requests(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }
}

/// Three server-sent events, 50 ms apart.
fn events() -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures::stream::unfold(0, |n| async move {
        if n == 3 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Some((Ok(bytes::Bytes::from(format!("data: event {}\n\n", n + 1))), n + 1))
    })
}

/// The proxy on a free loopback port, forwarding to `gateway`.
async fn start_proxy(gateway: SocketAddr) -> SocketAddr {
    let policy = policy();
    let target = GatewayTarget {
        address: gateway.to_string(),
        backend_policy: policy.digest().unwrap(),
        policy: Arc::new(policy),
        model_identity: Some([7; 32]),
        backend_policy_name: "the test policy".into(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let app = proxy::router(Arc::new(Upstream::new(target)), local);
    tokio::spawn(async move { axum::serve(listener, app).await });
    local
}

/// One HTTP/1.1 request to the proxy: (status, head, body as received, chunked framing
/// included).
async fn call(proxy: SocketAddr, request: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn get_request(proxy: SocketAddr, path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer gelo-test\r\n{extra}Connection: close\r\n\r\n",
        proxy.port()
    )
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_streams_cross_with_the_key_and_without_the_page_s_headers() {
    let addr = free_addr();
    let gw = FakeGateway::start(addr, default_mock_measurement()).await;
    let proxy = start_proxy(addr).await;

    let origin = format!("Origin: http://127.0.0.1:{}\r\nSec-Fetch-Site: same-origin\r\n", proxy.port());
    let (status, _, body) = call(proxy, &get_request(proxy, "/v1/models", &origin)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("gelo-rag"), "{body}");
    let headers = gw.seen.headers.lock().unwrap()[0].clone();
    assert_eq!(headers.get(header::AUTHORIZATION).unwrap(), "Bearer gelo-test", "the key goes to the gateway");
    for local in ["origin", "sec-fetch-site", "connection", "host"] {
        assert!(headers.get(local).is_none(), "{local} crossed: {headers:?}");
    }

    let body = "{\"model\":\"gelo-rag\",\"stream\":true}";
    let post = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        proxy.port(),
        body.len()
    );
    let (status, head, answer) = call(proxy, &post).await;
    assert_eq!(status, 200, "{answer}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    for n in 1..=3 {
        assert!(answer.contains(&format!("data: event {n}")), "{answer}");
    }
    assert_eq!(gw.requests(), 2);

    // A rebound page's Host, a foreign Origin: refused here, nothing sent.
    let (status, _, body) =
        call(proxy, &get_request(proxy, "/v1/models", "").replace("127.0.0.1:", "evil.example:")).await;
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("host_not_allowed"), "{body}");
    let (status, _, body) = call(proxy, &get_request(proxy, "/v1/models", "Origin: http://evil.example\r\n")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("origin_not_allowed"), "{body}");
    assert_eq!(gw.requests(), 2, "a refused request was sent on");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_is_verified_from_scratch_before_it_gets_a_request() {
    let addr = free_addr();
    let first = FakeGateway::start(addr, default_mock_measurement()).await;
    let proxy = start_proxy(addr).await;
    assert_eq!(call(proxy, &get_request(proxy, "/v1/models", "")).await.0, 200);
    first.stop().await;

    // The same launch, a new key: the old connection's pin refuses it, the proxy verifies
    // it from scratch, and the request is sent once.
    let second = FakeGateway::start(addr, default_mock_measurement()).await;
    let (status, _, body) = call(proxy, &get_request(proxy, "/v1/models", "")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(second.requests(), 1);
    second.stop().await;

    // Another launch measurement at the same address: refused by name, sent nothing.
    let other = FakeGateway::start(addr, [0xba; 48]).await;
    for _ in 0..2 {
        let (status, _, body) = call(proxy, &get_request(proxy, "/v1/models", "")).await;
        assert_eq!(status, 502, "{body}");
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"]["code"], "measurement_not_allowed", "{body}");
        assert_eq!(error["error"]["type"], "attestation_error", "{body}");
        assert!(error["error"]["message"].as_str().unwrap().contains("sent nothing"), "{body}");
    }
    assert_eq!(other.requests(), 0, "the refused gateway got a request");
    other.stop().await;
}
