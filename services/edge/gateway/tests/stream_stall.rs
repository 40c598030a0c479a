//! A generation that stops after its first token, its connection still open (a generator
//! stopped mid-answer, a hung host): in-process RA-TLS generators, no model. The gateway
//! gives up on the answer after the call timeout with `DEADLINE_EXCEEDED` naming the
//! generator, the generator leaves the rotation, and a streamed chat answer over HTTP ends
//! with that error instead of waiting for as long as the client does.
//!
//! The other way round (`slow_reader`): a client that stops reading a streamed answer, over
//! HTTP/1.1 and gRPC, has the answer cancelled and its place given back after the send
//! timeout. And the RA-TLS port's connection limits (`attested_port`).

use std::{
    net::SocketAddr,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use api::v1::{
    ChatMessage, FinishReason, GenerateRequest, GenerateResponse, Usage, generator_client::GeneratorClient,
    generator_server,
};
use attest::{
    MockIssuer, MockPki, Policy, ServerIdentity, ServiceClaims, TrustedRoot, issuer::default_mock_measurement,
};
use futures::{Stream, StreamExt};
use gateway::{
    BackendSpec, GatewayError, Pipeline, Pool, Role, Settings, Trust, VerifyTiming,
    chunker::Chunker,
    docstore,
    http::{Access, AccessConfig},
};
use server::serve::{ServeOptions, Transport, health, serve};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

mod support;
use support::{exchange, minilm};

#[path = "stream_stall/attested_port.rs"]
mod attested_port;
#[path = "stream_stall/slow_reader.rs"]
mod slow_reader;

const MODEL: [u8; 32] = [9; 32];
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

fn pki_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-stall-mock-pki");
    MockPki::load_or_create(&dir).unwrap();
    dir
}

fn policy() -> Policy {
    let pki = MockPki::load_or_create(&pki_dir()).unwrap();
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
        .allow_measurement(default_mock_measurement())
}

/// Sends "Bees" at once, then, if `stall`, nothing more while keeping the stream open;
/// otherwise " dance." and the end.
struct Generator {
    stall: bool,
}

type Answer = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

#[tonic::async_trait]
impl generator_server::Generator for Generator {
    type GenerateStream = Answer;

    async fn generate(&self, _r: Request<GenerateRequest>) -> Result<Response<Answer>, Status> {
        let first = GenerateResponse { text: "Bees".into(), ..Default::default() };
        let rest: Answer = if self.stall {
            Box::pin(futures::stream::pending())
        } else {
            let last = GenerateResponse {
                text: " dance.".into(),
                finish_reason: FinishReason::Stop as i32,
                usage: Some(Usage { prompt_tokens: 3, completion_tokens: 2, ..Default::default() }),
                ..Default::default()
            };
            Box::pin(futures::stream::iter([Ok(last)]))
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(first)]).chain(rest))))
    }
}

/// A generator on loopback, serving RA-TLS with mock evidence; its spec for the pool.
async fn start(stall: bool) -> BackendSpec {
    let routes = tonic::service::Routes::new(generator_server::GeneratorServer::new(Generator { stall }));
    start_backend(Role::Generator, routes).await
}

/// The identity of an in-process service proving `role` with mock evidence.
fn identity(role: &str) -> Arc<ServerIdentity> {
    let issuer = Arc::new(MockIssuer::load_or_create(pki_dir()).unwrap());
    let scheme = serde_json::json!({ "role": role, "protocol": { "executor": "sealed" } });
    let claims = ServiceClaims { model_identity: MODEL, scheme_json: scheme.to_string(), role: role.into() };
    Arc::new(ServerIdentity::generate(issuer, claims).unwrap())
}

/// `routes` served on loopback over RA-TLS as a `role` backend; its spec for the pool.
async fn start_backend(role: Role, routes: tonic::service::Routes) -> BackendSpec {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let opts = ServeOptions {
        listener,
        transport: Transport::RaTls { identity: identity(&role.to_string()), clients: None },
        metrics_listener: None,
        metrics: server::Metrics::new("backend"),
    };
    tokio::spawn(async move { serve(opts, routes, health(), std::future::pending()).await.unwrap() });
    BackendSpec {
        role,
        endpoint: addr.to_string(),
        model_identity: Some(MODEL),
        scheme_identity: None,
        tls_spki_sha256: None,
    }
}

/// A pool of `specs`, every one of them verified, with the test's call timeout.
async fn pool_of(specs: &[BackendSpec]) -> Pool {
    let timing = VerifyTiming {
        interval: Duration::from_secs(30),
        retry: Duration::from_secs(30),
        timeout: Duration::from_secs(5),
    };
    let pool = Pool::new(policy(), None, timing);
    pool.set_call_timeout(CALL_TIMEOUT);
    pool.set_backends(specs);
    for _ in 0..200 {
        if pool.status().iter().all(|b| b.verified()) {
            return pool;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("generators not verified: {:#?}", pool.status());
}

/// A streamed chat completion as raw HTTP/1.1 to `addr`, with `headers` (each ending in
/// CRLF) after the content headers.
fn streamed_chat(addr: std::net::SocketAddr, headers: &str) -> String {
    let body = serde_json::json!({
        "model": "gelo-generator", "stream": true,
        "messages": [{ "role": "user", "content": "What do bees do?" }],
    })
    .to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
}

fn request() -> GenerateRequest {
    GenerateRequest {
        messages: vec![ChatMessage { role: "user".into(), content: "What do bees do?".into() }],
        max_tokens: 8,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_that_stalls_after_its_first_token_fails_by_name_within_the_call_timeout() {
    let stalling = start(true).await;
    let pool = pool_of(std::slice::from_ref(&stalling)).await;
    let (routed, first, mut rest) = pool
        .stream(Role::Generator, |ch| async move {
            GeneratorClient::new(ch).generate(request()).await.map(|r| r.into_inner())
        })
        .await
        .expect("the stream opens and its first token arrives");
    assert_eq!(first.map(|m| m.text).as_deref(), Some("Bees"));

    let t = Instant::now();
    let next = tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(5), rest.message())
        .await
        .expect("the stalled answer was waited on past the call timeout");
    let took = t.elapsed();
    let e = routed.broken(next.expect_err("a stalled stream is an error, not its end"));
    assert!(matches!(e, GatewayError::Stalled { role: Role::Generator, .. }), "{e:?}");
    assert!(took >= CALL_TIMEOUT - Duration::from_millis(50), "gave up after {took:?}");
    let status: Status = e.into();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    let name = format!("generator {}", stalling.endpoint);
    assert!(status.message().contains(&name) && status.message().contains("retry"), "{}", status.message());

    // It left the rotation, for a reason that says why.
    let s = pool.status().into_iter().find(|b| b.endpoint == stalling.endpoint).unwrap();
    assert_eq!((s.trust, s.reason_code), (Trust::Unavailable, "timeout"), "{s:?}");
}

/// Over HTTP: a streamed plain chat answer from a generator that stalls ends with an error
/// event (`timeout`, naming the generator) after the call timeout; from one that does not,
/// it is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_answer_from_a_stalled_generator_ends_with_a_timeout_event() {
    for stall in [false, true] {
        let spec = start(stall).await;
        let pool = pool_of(std::slice::from_ref(&spec)).await;
        let dir = tempfile::tempdir().unwrap();
        let key = docstore::sealing_key(&docstore::KeySource::File(dir.path().join("sealing.key"))).unwrap();
        let store = docstore::DocStore::open(&dir.path().join("store"), key).unwrap();
        let chunker = Chunker::load(&minilm(), 200, 40).unwrap();
        let pipeline = Arc::new(Pipeline {
            pool,
            store: Arc::new(store),
            chunker: Arc::new(chunker),
            settings: Settings::default(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let access = Access::new(&AccessConfig { unauthenticated: true, ..AccessConfig::default() }, addr).unwrap();
        let app = gateway::http::router(pipeline, server::Metrics::new("gateway"), access);
        let limits = gateway::http::ConnectionLimits::default();
        tokio::spawn(gateway::http::serve(listener, app, limits, std::future::pending()));

        let request = streamed_chat(addr, "Connection: close\r\n");
        let t = Instant::now();
        let reply = tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(10), exchange(addr, &request))
            .await
            .expect("the streamed answer never ended");
        assert_eq!(reply.status, 200, "{}", reply.head);
        assert!(reply.body.contains("Bees"), "{}", reply.body);
        if stall {
            assert!(t.elapsed() >= CALL_TIMEOUT - Duration::from_millis(50), "ended after {:?}", t.elapsed());
            assert!(reply.body.contains("\"code\":\"timeout\""), "{}", reply.body);
            assert!(reply.body.contains(&format!("generator {}", spec.endpoint)), "{}", reply.body);
        } else {
            assert!(reply.body.contains("dance.") && reply.body.contains("[DONE]"), "{}", reply.body);
        }
    }
}
