//! The console's HTTP routes on the gateway's real router: `POST /v1/documents` through the
//! ingest pipeline (the real MiniLM tokenizer, a sealed store, an in-process RA-TLS embedder
//! returning made-up vectors), `GET /v1/trust` over one verified, one refused and one
//! unavailable backend, and the console page with its assets.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use api::v1::embedder_server;
use attest::{
    MockIssuer, MockPki, Policy, ServerIdentity, ServiceClaims, TrustedRoot, issuer::default_mock_measurement,
};
use gateway::{
    BackendSpec, Pipeline, Pool, Role, Settings, VerifyTiming,
    chunker::Chunker,
    docstore,
    http::{Access, AccessConfig},
};
use serde_json::{Value, json};
use server::serve::{ServeOptions, Transport, health, serve};
use tokio::net::TcpListener;

mod support;
use support::{Reply, exchange, minilm};

const MODEL: [u8; 32] = [7; 32];
const MAX_DOCUMENT_BYTES: usize = 8 << 10;

fn pki_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-console-mock-pki");
    MockPki::load_or_create(&dir).unwrap();
    dir
}

fn policy() -> Policy {
    let pki = MockPki::load_or_create(&pki_dir()).unwrap();
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
        .allow_measurement(default_mock_measurement())
}

/// An RA-TLS embedder service proving `role` with mock evidence; returns its address.
async fn start_backend(role: &str) -> SocketAddr {
    let issuer = Arc::new(MockIssuer::load_or_create(pki_dir()).unwrap());
    let scheme = json!({ "role": role, "protocol": { "executor": "sealed" } });
    let claims = ServiceClaims { model_identity: MODEL, scheme_json: scheme.to_string(), role: role.into() };
    let identity = Arc::new(ServerIdentity::generate(issuer, claims).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = tonic::service::Routes::new(embedder_server::EmbedderServer::new(support::ByteStatsEmbedder));
    let opts = ServeOptions {
        listener,
        transport: Transport::RaTls { identity, clients: None },
        metrics_listener: None,
        metrics: server::Metrics::new(role),
    };
    tokio::spawn(async move { serve(opts, routes, health(), std::future::pending()).await.unwrap() });
    addr
}

fn spec(role: Role, addr: SocketAddr) -> BackendSpec {
    BackendSpec {
        role,
        endpoint: addr.to_string(),
        model_identity: Some(MODEL),
        scheme_identity: None,
        tls_spki_sha256: None,
    }
}

/// The gateway's HTTP router over `specs`, served on loopback; returns its address.
async fn gateway(specs: &[BackendSpec], data: &std::path::Path) -> SocketAddr {
    let timing = VerifyTiming {
        interval: Duration::from_millis(300),
        retry: Duration::from_millis(100),
        timeout: Duration::from_secs(5),
    };
    let pool = Pool::new(policy(), None, timing);
    pool.set_backends(specs);
    let key = docstore::sealing_key(&docstore::KeySource::File(data.join("sealing.key"))).unwrap();
    let store = docstore::DocStore::open(&data.join("store"), key).unwrap();
    let settings = Settings { max_document_bytes: MAX_DOCUMENT_BYTES, ..Default::default() };
    let chunker = Chunker::load(&minilm(), 200, 40).unwrap();
    let pipeline = Arc::new(Pipeline { pool, store: Arc::new(store), chunker: Arc::new(chunker), settings });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // These tests are about the routes: keys, Host and Origin are tests/http_access.rs's.
    let open = AccessConfig { unauthenticated: true, ..AccessConfig::default() };
    let access = Access::new(&open, addr).unwrap();
    let app = gateway::http::router(pipeline, server::Metrics::new("gateway"), access);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One HTTP/1.1 request (`Connection: close`, no chunked replies: none of these routes stream).
async fn call(addr: SocketAddr, method: &str, path: &str, content_type: Option<&str>, body: &str) -> Reply {
    let ct = content_type.map(|c| format!("Content-Type: {c}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, &req).await
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    call(addr, "POST", path, Some("application/json"), &body.to_string()).await
}

fn assert_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["code"], code, "{}", r.body);
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()) && e.get("type").is_some() && e.get("param").is_some(),
        "{}",
        r.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_go_through_the_ingest_pipeline_with_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let embedder = start_backend("embedder").await;
    let gw = gateway(&[spec(Role::Embedder, embedder)], dir.path()).await;

    let long: String = (0..120).map(|i| format!("Sentence {i} is about honey bees and their waggle dance. ")).collect();
    let r = post(
        gw,
        "/v1/documents",
        &json!({ "documents": [
            { "name": "notes/bees.md", "text": "# Bees\nHoney bees dance to show where flowers are." },
            { "name": "long.txt", "text": long },
            { "name": "empty.txt", "text": "   " },
            { "name": "big.txt", "text": "x".repeat(MAX_DOCUMENT_BYTES + 1) },
            { "name": "", "text": "no name" },
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let stored: Vec<(&str, u64)> = v["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["id"].as_str().unwrap(), d["chunks"].as_u64().unwrap()))
        .collect();
    assert_eq!(stored.len(), 2, "{v}");
    assert_eq!(stored[0], ("notes/bees.md", 1));
    assert!(stored[1].0 == "long.txt" && stored[1].1 > 1, "a long text is several passages: {v}");
    assert_eq!(v["chunks"].as_u64().unwrap(), 1 + stored[1].1);
    let skipped: Vec<(&str, &str)> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["id"].as_str().unwrap(), k["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(skipped.len(), 3, "{v}");
    assert_eq!(skipped[0], ("empty.txt", "no text"));
    assert!(skipped[1].0 == "big.txt" && skipped[1].1.contains(&format!("limit {MAX_DOCUMENT_BYTES}")), "{skipped:?}");
    assert!(skipped[2].1.contains("empty id"), "{skipped:?}");

    // Adding a name again replaces that document: one document, the new passage count.
    let r = post(gw, "/v1/documents", &json!({ "documents": [{ "name": "long.txt", "text": "Now short." }] })).await;
    assert_eq!(r.json()["documents"], json!([{ "id": "long.txt", "chunks": 1 }]));

    // Bad requests are 4xx in OpenAI's error shape, never 5xx.
    assert_error(&post(gw, "/v1/documents", &json!({ "documents": [] })).await, 400, "invalid_request");
    assert_eq!(post(gw, "/v1/documents", &json!({ "documents": [] })).await.json()["error"]["param"], "documents");
    assert_error(&post(gw, "/v1/documents", &json!({ "documents": [{ "name": "a" }] })).await, 400, "invalid_request");
    assert_error(
        &post(gw, "/v1/documents", &json!({ "documents": [{ "name": "a", "text": 7 }] })).await,
        400,
        "invalid_request",
    );
    assert_error(&post(gw, "/v1/documents", &json!(["a"])).await, 400, "invalid_request");
    assert_error(
        &call(gw, "POST", "/v1/documents", Some("application/json"), "{\"documents\": [").await,
        400,
        "invalid_request",
    );
    assert_error(&call(gw, "POST", "/v1/documents", Some("text/plain"), "{}").await, 415, "unsupported_media_type");
    assert_error(&call(gw, "GET", "/v1/documents", None, "").await, 405, "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_verified_embedder_adding_documents_fails_closed_with_503() {
    let dir = tempfile::tempdir().unwrap();
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap(); // nothing listens there now
    let gw = gateway(&[spec(Role::Embedder, closed)], dir.path()).await;
    let r = post(gw, "/v1/documents", &json!({ "documents": [{ "name": "a.txt", "text": "Some text." }] })).await;
    assert_error(&r, 503, "service_unavailable");
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("no verified embedder") && message.contains("0 documents were stored before this"),
        "{message}"
    );
    assert!(!message.contains("Some text"), "a document's text is never in an error: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trust_report_tells_verified_refused_and_unavailable_backends_apart() {
    let dir = tempfile::tempdir().unwrap();
    let embedder = start_backend("embedder").await;
    // A genuine service at the generator's address that proves another role: refused.
    let impostor = start_backend("embedder").await;
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let specs = [spec(Role::Embedder, embedder), spec(Role::Reranker, closed), spec(Role::Generator, impostor)];
    let gw = gateway(&specs, dir.path()).await;

    let mut report = Value::Null;
    for _ in 0..100 {
        report = call(gw, "GET", "/v1/trust", None, "").await.json();
        let settled = report["backends"].as_array().unwrap().iter().all(|b| b["reason_code"] != "not_verified_yet");
        if settled && report["backends"][0]["status"] == "verified" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let digest = hex::encode(policy().digest().unwrap());
    assert_eq!(report["backend_policy_sha256"], digest.as_str());
    let rows = report["backends"].as_array().unwrap();
    let roles: Vec<&str> = rows.iter().map(|b| b["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["embedder", "reranker", "generator"]);

    let (e, r, g) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!(
        (e["status"].as_str(), e["endpoint"].as_str()),
        (Some("verified"), Some(embedder.to_string().as_str())),
        "{e}"
    );
    assert!(e["reason_code"].is_null() && e["reason"].is_null(), "{e}");
    assert_eq!(e["measurement"], hex::encode(default_mock_measurement()));
    assert_eq!(e["model_identity"], hex::encode(MODEL));
    assert_eq!(e["chip_id"].as_str().unwrap().len(), 128);
    for field in ["bootloader", "tee", "snp", "microcode"] {
        assert!(e["tcb"][field].is_u64(), "tcb.{field}: {e}");
    }
    assert_eq!(e["scheme"], json!({ "role": "embedder", "protocol": { "executor": "sealed" } }));
    assert_eq!(e["issuer"], "mock");
    assert!(e["evidence_age_seconds"].as_f64().is_some_and(|a| (0.0..60.0).contains(&a)), "{e}");
    assert_eq!(e["policy_sha256"], digest.as_str());

    assert_eq!((r["status"].as_str(), r["reason_code"].as_str()), (Some("unavailable"), Some("unreachable")), "{r}");
    assert!(r["reason"].as_str().unwrap().starts_with("unreachable"), "{r}");
    assert_eq!((g["status"].as_str(), g["reason_code"].as_str()), (Some("refused"), Some("role_not_allowed")), "{g}");
    for out in [r, g] {
        // Nothing is vouched for a backend that is not verified now.
        for field in ["measurement", "tcb", "chip_id", "model_identity", "scheme", "evidence_age_seconds"] {
            assert!(out[field].is_null(), "{field}: {out}");
        }
        assert_eq!(out["expected_model_identity"], hex::encode(MODEL));
        assert_eq!(out["policy_sha256"], digest.as_str());
    }
    assert_error(&post(gw, "/v1/trust", &json!({})).await, 405, "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_from_the_binary_and_loads_nothing_from_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&[], dir.path()).await;
    let page = call(gw, "GET", "/", None, "").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type").as_deref(), Some("text/html; charset=utf-8"));
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert_eq!(page.header("x-content-type-options").as_deref(), Some("nosniff"));
    for id in [
        "key-form",
        "api-key",
        "key-status",
        "doc-form",
        "doc-files",
        "ask-form",
        "answer",
        "sources",
        "trust-table",
        "trust-refresh",
    ] {
        assert!(page.body.contains(&format!("id=\"{id}\"")), "the page has #{id}");
    }
    let mut assets = vec![page.body.clone()];
    for (path, ct) in
        [("/console/console.js", "text/javascript; charset=utf-8"), ("/console/console.css", "text/css; charset=utf-8")]
    {
        let r = call(gw, "GET", path, None, "").await;
        assert_eq!((r.status, r.header("content-type").as_deref()), (200, Some(ct)), "{path}");
        assert!(page.body.contains(path), "the page loads {path}");
        assets.push(r.body);
    }
    for a in &assets {
        assert!(
            !a.contains("http://") && !a.contains("https://") && !a.contains("//cdn"),
            "an asset names another host"
        );
        assert!(
            !a.contains("console.log") && !a.contains("innerHTML"),
            "no content logging, no HTML parsing of content"
        );
    }
    assert!(assets[1].contains("/v1/documents") && assets[1].contains("/v1/trust") && assets[1].contains("gelo-rag"));
    // The key goes in a header from session storage: never a cookie, local storage or the URL.
    assert!(assets[1].contains("sessionStorage") && assets[1].contains("Authorization"));
    assert!(!assets[1].contains("localStorage") && !assets[1].contains("document.cookie"));
    assert!(page.body.contains("type=\"password\""), "the key field is not shown as it is typed");
    assert_error(&call(gw, "GET", "/console/missing.js", None, "").await, 404, "not_found");
}
