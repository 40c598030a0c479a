//! The HTTP port's access checks on the gateway's real router over real TCP: API keys on
//! every API route (missing, malformed, wrong; rotated and revoked without a restart; a
//! broken keys file failing closed), the rate per key, and the `Host` and `Origin` checks
//! that stop DNS-rebinding and cross-origin pages; the admission limit both ports share; and
//! a corpus of hostile JSON bodies (`hostile_json`). The pipeline has no backends: a request
//! that passes the checks reaches its route, which answers (or fails closed with 503).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use attest::Policy;
use gateway::{
    Pipeline, Pool, Settings, VerifyTiming,
    admission::Admission,
    chunker::Chunker,
    docstore,
    http::{
        Access, AccessConfig, ConnectionLimits,
        keys::{self, ApiKey},
    },
};
use serde_json::{Value, json};
use tokio::net::TcpListener;

mod support;
use support::{Reply, exchange, minilm};

#[path = "http_access/hostile_json.rs"]
mod hostile_json;

/// The test gateways' header read timeout (10 s in the gateway).
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// A gateway's HTTP port with the keys of `keys` in its keys file, `cfg` for the rest.
struct Gateway {
    addr: SocketAddr,
    keys_file: PathBuf,
    pipeline: Arc<Pipeline>,
    _dir: tempfile::TempDir,
}

async fn gateway(cfg: AccessConfig, keys: &[&ApiKey]) -> Gateway {
    gateway_with(cfg, keys, Admission::default()).await
}

/// [`gateway`], its model routes counted in `admission`.
async fn gateway_with(cfg: AccessConfig, keys: &[&ApiKey], admission: Admission) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("api-keys");
    for k in keys {
        keys::append(&keys_file, &k.digest(), None).unwrap();
    }
    let timing = VerifyTiming {
        interval: Duration::from_secs(30),
        retry: Duration::from_secs(5),
        timeout: Duration::from_secs(5),
    };
    let pool = Pool::new(Policy::default(), None, timing);
    let key = docstore::sealing_key(&docstore::KeySource::File(dir.path().join("sealing.key"))).unwrap();
    let store = docstore::DocStore::open(&dir.path().join("store"), key).unwrap();
    let chunker = Chunker::load(&minilm(), 200, 40).unwrap();
    let settings = Settings::default();
    let pipeline = Arc::new(Pipeline { pool, store: Arc::new(store), chunker: Arc::new(chunker), settings });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = AccessConfig { api_keys_file: Some(keys_file.clone()), ..cfg };
    let access = Access::new(&cfg, addr).unwrap();
    let app = gateway::http::router_with(pipeline.clone(), server::Metrics::new("gateway"), access, admission);
    let limits = ConnectionLimits { header_timeout: HEADER_TIMEOUT, ..ConnectionLimits::default() };
    tokio::spawn(gateway::http::serve(listener, app, limits, std::future::pending()));
    Gateway { addr, keys_file, pipeline, _dir: dir }
}

/// An OpenAI-shaped refusal with this status, type and code.
trait Refused {
    fn refused(&self, status: u16, kind: &str, code: &str);
}

impl Refused for Reply {
    fn refused(&self, status: u16, kind: &str, code: &str) {
        assert_eq!(self.status, status, "{}\n{}", self.head, self.body);
        let e = &self.json()["error"];
        assert_eq!((e["type"].as_str(), e["code"].as_str()), (Some(kind), Some(code)), "{}", self.body);
        assert!(e["param"].is_null() && e["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", self.body);
        assert!(self.header("access-control-allow-origin").is_none(), "no CORS: {}", self.head);
    }
}

/// One HTTP/1.1 request; `Host` is the gateway's address unless `headers` give one.
struct Req {
    addr: SocketAddr,
    line: String,
    headers: Vec<(String, String)>,
    body: String,
}

fn req(addr: SocketAddr, method: &str, path: &str) -> Req {
    Req { addr, line: format!("{method} {path} HTTP/1.1"), headers: vec![], body: String::new() }
}

impl Req {
    fn h(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    fn key(self, key: &ApiKey) -> Self {
        self.h("Authorization", &format!("Bearer {}", key.expose()))
    }

    fn json(mut self, body: &Value) -> Self {
        self.body = body.to_string();
        self.h("Content-Type", "application/json")
    }

    async fn send(self) -> Reply {
        let mut text = format!("{}\r\n", self.line);
        if !self.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) && self.line.ends_with("1.1") {
            text.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in &self.headers {
            text.push_str(&format!("{k}: {v}\r\n"));
        }
        text.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{}", self.body.len(), self.body));
        exchange(self.addr, &text).await
    }
}

const API: &[(&str, &str)] = &[
    ("GET", "/v1/models"),
    ("GET", "/v1/trust"),
    ("POST", "/v1/documents"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("GET", "/v1/nothing"),
    ("POST", "/openapi.json"),
    ("DELETE", "/"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_route_needs_a_key_and_a_refusal_is_openai_shaped() {
    let (key, other) = (ApiKey::generate(), ApiKey::generate());
    let gw = gateway(AccessConfig::default(), &[&key]).await;
    let a = gw.addr;
    let doc = json!({ "documents": [{ "name": "a.txt", "text": "Some text." }] });
    for (method, path) in API {
        let r = req(a, method, path).json(&doc).send().await;
        r.refused(401, "invalid_request_error", "invalid_api_key");
        assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer realm=\"gelo\""), "{method} {path}");
        let r = req(a, method, path).key(&other).json(&doc).send().await;
        r.refused(401, "invalid_request_error", "invalid_api_key");
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer "), "{}", r.head);
        assert!(!r.body.contains(other.expose()) && !r.body.contains(key.expose()), "{}", r.body);
    }
    for bad in [format!("Basic {}", key.expose()), "Bearer".into(), format!("Bearer {} x", key.expose())] {
        req(a, "GET", "/v1/models").h("Authorization", &bad).send().await.refused(
            401,
            "invalid_request_error",
            "invalid_api_key",
        );
    }

    // With the key each request reaches its route.
    let models = req(a, "GET", "/v1/models").key(&key).send().await;
    assert_eq!((models.status, models.json()["object"].as_str()), (200, Some("list")), "{}", models.body);
    assert_eq!(req(a, "GET", "/v1/trust").key(&key).send().await.status, 200);
    let added = req(a, "POST", "/v1/documents").key(&key).json(&doc).send().await;
    added.refused(503, "server_error", "service_unavailable");
    req(a, "GET", "/v1/nothing").key(&key).send().await.refused(404, "invalid_request_error", "not_found");

    // The console's files and the OpenAPI document need no key: nothing in them is the store's.
    for path in ["/", "/console/console.js", "/console/console.css", "/openapi.json"] {
        let r = req(a, "GET", path).send().await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    assert_eq!(req(a, "HEAD", "/").send().await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_or_origin_is_refused_even_with_the_key() {
    let key = ApiKey::generate();
    let cfg = AccessConfig { allowed_hosts: vec!["gelo.internal".into()], ..AccessConfig::default() };
    let gw = gateway(cfg, &[&key]).await;
    let (a, port) = (gw.addr, gw.addr.port());
    let get = |path: &str| req(a, "GET", path).key(&key);

    // DNS rebinding: the page's own name arrives as Host. Nothing is served, the console
    // page neither.
    let evil = format!("evil.example:{port}");
    for path in ["/v1/trust", "/", "/openapi.json"] {
        get(path).h("Host", &evil).send().await.refused(421, "invalid_request_error", "host_not_allowed");
    }
    let doc = json!({ "documents": [{ "name": "a.txt", "text": "x" }] });
    let r = req(a, "POST", "/v1/documents").key(&key).h("Host", &evil).json(&doc).send().await;
    r.refused(421, "invalid_request_error", "host_not_allowed");
    for bad in
        [format!("localhost:{}", port.wrapping_add(1)), "localhost".into(), format!("127.0.0.1.evil.example:{port}")]
    {
        get("/v1/models").h("Host", &bad).send().await.refused(421, "invalid_request_error", "host_not_allowed");
    }
    let absolute = Req { line: format!("GET http://evil.example:{port}/v1/models HTTP/1.1"), ..get("/") };
    absolute.send().await.refused(421, "invalid_request_error", "host_not_allowed");
    let no_host = Req { line: "GET /v1/models HTTP/1.0".into(), ..get("/") };
    no_host.send().await.refused(421, "invalid_request_error", "host_not_allowed");
    // The same requests under the gateway's own names pass.
    for good in
        [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}"), "gelo.internal".into()]
    {
        let r = get("/v1/models").h("Host", &good).send().await;
        assert_eq!(r.status, 200, "{good}: {}", r.body);
    }

    // Another origin: refused before the route runs (403, not the route's 503), preflight
    // included, and no CORS header ever tells a browser it may read an answer.
    let foreign =
        [format!("http://evil.example:{port}"), format!("http://127.0.0.1:{}", port.wrapping_add(1)), "null".into()];
    for origin in &foreign {
        let r = req(a, "POST", "/v1/documents").key(&key).h("Origin", origin).json(&doc).send().await;
        r.refused(403, "invalid_request_error", "origin_not_allowed");
        get("/v1/trust").h("Origin", origin).send().await.refused(403, "invalid_request_error", "origin_not_allowed");
        let preflight = req(a, "OPTIONS", "/v1/chat/completions")
            .h("Origin", origin)
            .h("Access-Control-Request-Method", "POST")
            .h("Access-Control-Request-Headers", "authorization,content-type")
            .send()
            .await;
        preflight.refused(403, "invalid_request_error", "origin_not_allowed");
    }
    let cross = get("/v1/trust").h("Sec-Fetch-Site", "cross-site").send().await;
    cross.refused(403, "invalid_request_error", "origin_not_allowed");
    // The console's own calls: same origin.
    for origin in
        [format!("http://127.0.0.1:{port}"), format!("http://localhost:{port}"), "https://gelo.internal".into()]
    {
        let r = get("/v1/trust").h("Origin", &origin).h("Sec-Fetch-Site", "same-origin").send().await;
        assert_eq!(r.status, 200, "{origin}: {}", r.body);
        assert!(r.header("access-control-allow-origin").is_none(), "{}", r.head);
    }
}

/// Replaces the keys file as an editor or `gelo api-key revoke` would: whole, by rename.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Polls `/v1/models` with `key` until it answers `status`; returns how long that took.
async fn until(a: SocketAddr, key: &ApiKey, status: u16) -> Duration {
    let t = Instant::now();
    loop {
        let got = req(a, "GET", "/v1/models").key(key).send().await.status;
        if got == status {
            return t.elapsed();
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{} still answers {got}, not {status}", key.digest().id());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_and_revoke_without_a_restart_and_a_broken_file_fails_closed() {
    let (old, new, third) = (ApiKey::generate(), ApiKey::generate(), ApiKey::generate());
    let gw = gateway(AccessConfig::default(), &[&old]).await;
    let (a, file) = (gw.addr, gw.keys_file.clone());
    assert_eq!(req(a, "GET", "/v1/models").key(&old).send().await.status, 200);
    assert_eq!(req(a, "GET", "/v1/models").key(&new).send().await.status, 401);

    // Rotation: the new key replaces the old one in the file.
    replace(&file, &format!("{}{}\n", keys::FILE_HEADER, new.digest().line(Some("rotated"))));
    let took = until(a, &old, 401).await;
    assert!(took < Duration::from_millis(2500), "the old key was refused after {took:?}");
    assert_eq!(req(a, "GET", "/v1/models").key(&new).send().await.status, 200);

    // A key appended in place (same inode, the file only grows) is picked up too.
    keys::append(&file, &third.digest(), Some("third")).unwrap();
    until(a, &third, 200).await;

    // A bad edit refuses every key until it is fixed: a revocation is never undone by it.
    replace(&file, "sha256:not-a-digest\n");
    until(a, &new, 401).await;
    assert_eq!(req(a, "GET", "/v1/models").key(&third).send().await.status, 401);
    std::fs::remove_file(&file).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(req(a, "GET", "/v1/models").key(&third).send().await.status, 401, "a missing file accepts nothing");
    keys::append(&file, &new.digest(), None).unwrap();
    keys::append(&file, &third.digest(), Some("third")).unwrap();
    until(a, &new, 200).await;

    // Revocation by name.
    keys::remove(&file, "third").unwrap();
    until(a, &third, 401).await;
    assert_eq!(req(a, "GET", "/v1/models").key(&new).send().await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_has_its_own_rate_and_a_429_says_when_to_retry() {
    let (a_key, b_key) = (ApiKey::generate(), ApiKey::generate());
    let cfg = AccessConfig { rate_per_second: 0.5, burst: 2, ..AccessConfig::default() };
    let gw = gateway(cfg, &[&a_key, &b_key]).await;
    let a = gw.addr;
    for _ in 0..2 {
        assert_eq!(req(a, "GET", "/v1/models").key(&a_key).send().await.status, 200);
    }
    let r = req(a, "GET", "/v1/models").key(&a_key).send().await;
    r.refused(429, "rate_limit_error", "rate_limit_exceeded");
    let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=2).contains(&retry), "retry after {retry} s");
    assert_eq!(req(a, "GET", "/v1/models").key(&b_key).send().await.status, 200, "another key is not slowed");
    // Refused requests without a key take nothing from anyone's bucket.
    for _ in 0..5 {
        assert_eq!(req(a, "GET", "/v1/models").send().await.status, 401);
    }
    assert_eq!(req(a, "GET", "/v1/models").key(&b_key).send().await.status, 200);
}

/// Over the admission limit every model route answers 429 `overloaded` with `Retry-After`
/// at once (before reading its body or calling a backend), and the gRPC port, sharing the
/// limit, `RESOURCE_EXHAUSTED` with `retry-after`; routes that do no model work still
/// answer; a finished request gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_admission_limit_model_requests_are_refused_at_once() {
    use api::v1::{SearchRequest, rag_server::Rag};
    let key = ApiKey::generate();
    let admission = Admission::new(1).with_body_timeout(Duration::from_millis(500));
    let gw = gateway_with(AccessConfig::default(), &[&key], admission.clone()).await;
    let a = gw.addr;
    let doc = json!({ "documents": [{ "name": "a.txt", "text": "Some text." }] });
    let held = admission.try_admit().expect("the one place");
    for path in ["/v1/documents", "/v1/embeddings", "/v1/chat/completions", "/v1/rerank"] {
        let t = Instant::now();
        let r = req(a, "POST", path).key(&key).json(&doc).send().await;
        r.refused(429, "rate_limit_error", "overloaded");
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{path}: {}", r.head);
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("--max-concurrent-requests"), "{}", r.body);
        assert!(t.elapsed() < Duration::from_secs(1), "{path}: refused after {:?}", t.elapsed());
    }
    assert_eq!(req(a, "GET", "/v1/models").key(&key).send().await.status, 200);
    assert_eq!(req(a, "GET", "/v1/trust").key(&key).send().await.status, 200);
    let rag = gateway::grpc::RagService::new(gw.pipeline.clone(), server::Metrics::new("gateway"))
        .with_admission(admission.clone());
    let search = || tonic::Request::new(SearchRequest { query: "q".into(), top_k: 1, rerank: None });
    let refused = rag.search(search()).await.expect_err("over the limit");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.metadata().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));

    // The place is free again: the same requests reach their routes (and fail closed there,
    // this pipeline has no backends), and leave the place free behind them.
    drop(held);
    req(a, "POST", "/v1/documents").key(&key).json(&doc).send().await.refused(
        503,
        "server_error",
        "service_unavailable",
    );
    let after = rag.search(search()).await.expect_err("no embedder");
    assert_eq!(after.code(), tonic::Code::Unavailable, "{after:?}");
    assert_eq!(admission.in_flight(), 0, "every finished request gave its place back");

    // A client that sends its body slowly holds no place, and is answered 408 after the
    // body timeout.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut slow = tokio::net::TcpStream::connect(a).await.unwrap();
    let head = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: {a}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"input\"",
        key.expose()
    );
    let t = Instant::now();
    slow.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(admission.in_flight(), 0, "a body still arriving holds no place");
    let mut reply = String::new();
    slow.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("request_timeout"), "{reply}");
    assert!(t.elapsed() < Duration::from_secs(3), "the 408 came after {:?}", t.elapsed());
}

/// Waits for the server to close the connection `r` reads from; how long that took. Fails
/// when it is still open after `bound`.
async fn closed_within(r: &mut (impl tokio::io::AsyncRead + Unpin), bound: Duration, what: &str) -> Duration {
    use tokio::io::AsyncReadExt;
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(bound.saturating_sub(t.elapsed()), r.read(&mut buf)).await {
            Err(_) => panic!("{what}: the connection was still open {bound:?} later"),
            Ok(Ok(0) | Err(_)) => return t.elapsed(),
            Ok(Ok(_)) => {} // a 408 or the like before the close
        }
    }
}

/// Every connection must send a request's head within the header timeout: a client that
/// sends nothing, one that trickles its headers a byte every 100 ms without ever ending
/// them (slowloris), and a keep-alive connection left idle after its answer each lose the
/// connection when the timeout passes; requests on other connections are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_idle_connection_is_closed_after_the_header_timeout() {
    use tokio::{io::AsyncWriteExt, net::TcpStream};
    let key = ApiKey::generate();
    let gw = gateway(AccessConfig::default(), &[&key]).await;
    let a = gw.addr;
    let bound = HEADER_TIMEOUT + Duration::from_secs(3);

    let mut silent = TcpStream::connect(a).await.unwrap();
    let (mut slow_r, mut slow_w) = TcpStream::connect(a).await.unwrap().into_split();
    let trickle = tokio::spawn(async move {
        let head = format!("GET /v1/models HTTP/1.1\r\nHost: {a}\r\n");
        let endless = head.into_bytes().into_iter().chain(b"X-Slow: 1\r\n".iter().copied().cycle());
        for b in endless {
            if slow_w.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Others are served meanwhile.
    assert_eq!(req(a, "GET", "/v1/models").key(&key).send().await.status, 200);
    let took = closed_within(&mut silent, bound, "a client that sent nothing").await;
    assert!(took >= HEADER_TIMEOUT - Duration::from_millis(500), "closed after {took:?}, before its timeout");
    closed_within(&mut slow_r, bound, "a client trickling its headers").await;
    trickle.abort();

    // A kept-alive connection: answered, then closed once idle for the timeout.
    let mut idle = TcpStream::connect(a).await.unwrap();
    let request = format!("GET /v1/models HTTP/1.1\r\nHost: {a}\r\nAuthorization: Bearer {}\r\n\r\n", key.expose());
    idle.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let complete = |r: &[u8]| {
        let text = String::from_utf8_lossy(r);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let length: usize =
            head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:")?.trim().parse().ok())?;
        (body.len() >= length).then_some(())
    };
    while complete(&reply).is_none() {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(bound, tokio::io::AsyncReadExt::read(&mut idle, &mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before its answer: {}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&buf[..n]);
    }
    assert!(reply.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&reply));
    closed_within(&mut idle, bound, "an idle keep-alive connection").await;
    assert_eq!(req(a, "GET", "/v1/models").key(&key).send().await.status, 200);
}

/// A gRPC ingest stream holds its admission place only while its documents keep coming: a
/// client that pauses past the stream hold gives the place back, a document it sends while
/// the gateway is full is refused at once (`RESOURCE_EXHAUSTED`, `retry-after`, how many
/// documents were stored), and a client that sends nothing for the message timeout is
/// answered `DEADLINE_EXCEEDED` saying so, instead of holding the call open for as long as
/// it likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ingest_stream_gives_its_place_back_and_a_silent_one_ends() {
    use api::v1::{Document, rag_client::RagClient};
    use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
    let (hold, limit) = (Duration::from_millis(300), Duration::from_secs(2));
    let admission = Admission::new(1).with_stream_timeouts(hold, limit);
    let gw = gateway_with(AccessConfig::default(), &[&ApiKey::generate()], admission.clone()).await;
    let rag = gateway::grpc::RagService::new(gw.pipeline.clone(), server::Metrics::new("gateway"))
        .with_admission(admission.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grpc = tonic::transport::Server::builder().add_service(rag.into_server());
    tokio::spawn(grpc.serve_with_incoming(TcpListenerStream::new(listener)));
    let client = RagClient::connect(format!("http://{addr}")).await.unwrap();
    let doc = |id: &str| Document { id: id.into(), text: "Some text.".into(), ..Default::default() };
    let open = |docs: tokio::sync::mpsc::Receiver<Document>| {
        let mut client = client.clone();
        tokio::spawn(async move { client.ingest(ReceiverStream::new(docs)).await })
    };
    // Waits until the stream holds its place, then until it gives it back.
    let held_then_freed = |d: Duration| {
        let admission = admission.clone();
        async move {
            let t = Instant::now();
            while admission.in_flight() == 0 && t.elapsed() < d {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(admission.in_flight(), 1, "the stream was not admitted");
            while admission.in_flight() > 0 && t.elapsed() < d {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            admission.in_flight() == 0
        }
    };

    // A pause: the place is given back; a document sent while the gateway is full is refused.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let call = open(rx);
    tx.send(doc("a")).await.unwrap();
    assert!(held_then_freed(hold + Duration::from_secs(2)).await, "a stream waiting on its client kept its place");
    let held = admission.try_admit().expect("the place the stream gave back");
    tx.send(doc("b")).await.unwrap();
    let refused = tokio::time::timeout(limit, call).await.expect("refused at once").unwrap().unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.metadata().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    assert!(refused.message().contains("0 documents were stored before this"), "{}", refused.message());
    drop(held);

    // Silence: the call ends after the message timeout, and holds no place meanwhile.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let t = Instant::now();
    let call = open(rx);
    tx.send(doc("c")).await.unwrap();
    assert!(held_then_freed(hold + Duration::from_secs(2)).await, "a silent stream kept its place");
    let ended =
        tokio::time::timeout(limit + Duration::from_secs(5), call).await.expect("a silent stream was kept open");
    let ended = ended.unwrap().unwrap_err();
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended:?}");
    assert!(ended.message().contains("the client sent no next document within 2s"), "{}", ended.message());
    assert!(t.elapsed() >= limit, "ended after {:?}", t.elapsed());
    drop(tx);
    assert_eq!(admission.in_flight(), 0);
}

/// The HTTP port holds at most `max_connections` open: one more is answered at once `503`
/// `too_many_connections` with `Retry-After` and closed, never left waiting; once a
/// connection closes, its place serves the next. A request head over the size limit is
/// refused `431`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_connection_limit_a_connection_is_refused_at_once() {
    use tokio::{io::AsyncWriteExt, net::TcpStream};
    let key = ApiKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("api-keys");
    keys::append(&keys_file, &key.digest(), None).unwrap();
    let gw = gateway(AccessConfig::default(), &[&key]).await;
    // A second port on the same pipeline, limited to two connections.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = listener.local_addr().unwrap();
    let access = Access::new(&AccessConfig { api_keys_file: Some(keys_file), ..AccessConfig::default() }, a).unwrap();
    let app = gateway::http::router(gw.pipeline.clone(), server::Metrics::new("gateway"), access);
    let limits = ConnectionLimits { max_connections: 2, header_timeout: HEADER_TIMEOUT, ..ConnectionLimits::default() };
    tokio::spawn(gateway::http::serve(listener, app, limits, std::future::pending()));

    let held = [TcpStream::connect(a).await.unwrap(), TcpStream::connect(a).await.unwrap()];
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..3 {
        let t = Instant::now();
        let r = req(a, "GET", "/v1/models").key(&key).send().await;
        assert!(t.elapsed() < Duration::from_secs(1), "refused after {:?}", t.elapsed());
        eprintln!("a connection over the limit answered {} in {:?}", r.status, t.elapsed());
        assert_eq!(r.status, 503, "{}\n{}", r.head, r.body);
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{}", r.head);
        assert_eq!(r.json()["error"]["code"], "too_many_connections", "{}", r.body);
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("--max-connections"), "{}", r.body);
    }
    drop(held);
    let t = Instant::now();
    loop {
        let r = req(a, "GET", "/v1/models").key(&key).send().await;
        if r.status == 200 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "the closed connections' places never came back: {}", r.head);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A head over 64 KiB.
    let big = "a".repeat(gateway::connections::MAX_HEAD_BYTES + 1);
    let r = req(a, "GET", "/v1/models").key(&key).h("X-Big", &big).send().await;
    assert_eq!(r.status, 431, "{}", r.head);
    let mut s = TcpStream::connect(a).await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(req(a, "GET", "/v1/models").key(&key).send().await.status, 200, "the port answers after");
}
