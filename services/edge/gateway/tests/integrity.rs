//! A GPU that returns a wrong product, behind the gateway: two real MiniLM embedders under
//! the masked scheme with U-Verify at its default, one on an engine that corrupts one
//! product in N. The corrupted request fails at the backend with DATA_LOSS, no client ever
//! receives a wrong vector, the backend reports NOT_SERVING, and the gateway moves every
//! request to the honest one; with only the corrupting backend the client gets an error.

use std::{
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use api::v1::{EmbedRequest, embedder_client::EmbedderClient};
use attest::{
    MockIssuer, MockPki, Policy, ServerIdentity, ServiceClaims, TrustedRoot, issuer::default_mock_measurement,
};
use gateway::{BackendSpec, Pool, Role, VerifyTiming};
use kernels::CpuEngine;
use protocol::Engine;
use protocol::{Executor, MaskedConfig, MaskedExecutor, PlaintextExecutor, UVerifyConfig};
use server::{
    Health, Limits, Metrics,
    embedder::EmbedderService,
    serve::{ServeOptions, Transport, serve},
};
use tokio::net::TcpListener;

fn pki_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-integrity-mock-pki");
    MockPki::load_or_create(&dir).unwrap();
    dir
}

#[path = "../../../tee/server/tests/support/integrity.rs"]
mod support;

use support::{Corrupting, minilm};

struct Backend {
    spec: BackendSpec,
    health: Health,
    metrics: Metrics,
}

/// A masked MiniLM embedder on `engine`, attesting its scheme as `gelo serve` does.
async fn start(engine: Arc<dyn Engine>) -> Backend {
    // U-Verify at the services' default (two probes).
    let cfg = MaskedConfig { verify: Some(UVerifyConfig::default()), ..Default::default() };
    let exec: Arc<dyn Executor> = Arc::new(MaskedExecutor::new(engine, cfg).unwrap());
    let embedder: Arc<dyn models::Embedder> =
        models::load_embedder(&minilm(), exec.clone(), &Default::default()).unwrap().into();
    let identity = embedder.identity().0;
    let scheme = serde_json::json!({ "role": "embedder", "protocol": exec.scheme() });
    let claims = ServiceClaims { model_identity: identity, scheme_json: scheme.to_string(), role: "embedder".into() };
    let issuer = Arc::new(MockIssuer::load_or_create(pki_dir()).unwrap());
    let server_identity = Arc::new(ServerIdentity::generate(issuer, claims).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (health, metrics) = (Health::new(), Metrics::new("embedder"));
    let svc = EmbedderService::new(embedder, Limits::default(), metrics.clone(), Arc::new(|| 0.0), health.clone());
    let routes = tonic::service::Routes::new(svc.into_server());
    let opts = ServeOptions {
        listener,
        transport: Transport::RaTls { identity: server_identity, clients: None },
        metrics_listener: None,
        metrics: metrics.clone(),
    };
    let h = health.clone();
    tokio::spawn(async move { serve(opts, routes, h, std::future::pending()).await.unwrap() });
    let spec = BackendSpec {
        role: Role::Embedder,
        endpoint: addr.to_string(),
        model_identity: Some(identity),
        scheme_identity: None,
        tls_spki_sha256: None,
    };
    Backend { spec, health, metrics }
}

fn policy() -> Policy {
    let pki = MockPki::load_or_create(&pki_dir()).unwrap();
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
        .allow_measurement(default_mock_measurement())
        .allow_protection("masked")
}

async fn embed(pool: &Pool, text: &str) -> Result<Vec<f32>, gateway::GatewayError> {
    let text = text.to_owned();
    pool.unary(Role::Embedder, |ch| {
        let text = text.clone();
        async move {
            let r = EmbedderClient::new(ch).embed(EmbedRequest { texts: vec![text], ..Default::default() }).await?;
            Ok(r.into_inner().embeddings.remove(0).values)
        }
    })
    .await
}

async fn verified(pool: &Pool, n: usize) {
    for _ in 0..600 {
        if pool.status().iter().filter(|b| b.verified()).count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("expected {n} verified backends: {:#?}", pool.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_product_fails_its_request_takes_the_backend_out_and_reaches_no_client() {
    let reference: Arc<dyn models::Embedder> = models::load_embedder(
        &minilm(),
        Arc::new(PlaintextExecutor::new(Arc::new(CpuEngine::new()))),
        &Default::default(),
    )
    .unwrap()
    .into();
    let (corrupting, armed) = Corrupting::new(7);
    let bad = start(Arc::new(corrupting)).await;
    let good = start(Arc::new(CpuEngine::new())).await;
    let timing = VerifyTiming {
        interval: Duration::from_millis(300),
        retry: Duration::from_millis(200),
        timeout: Duration::from_secs(20),
    };

    // With only the corrupting backend: the client gets an error, never a vector.
    let pool = Pool::new(policy(), None, timing);
    pool.set_backends(std::slice::from_ref(&bad.spec));
    verified(&pool, 1).await;
    armed.store(true, Ordering::SeqCst);
    let err =
        embed(&pool, "a question about sealed stores").await.expect_err("a wrong product must not become an answer");
    let status: tonic::Status = err.into();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{}", status.message());
    assert!(status.message().contains("integrity"), "the refusal says why: {}", status.message());
    assert!(
        matches!(bad.health.state(), server::health::State::Failed(ref r) if r.contains("integrity")),
        "{:?}",
        bad.health.state()
    );
    assert!(
        bad.metrics.encode().contains("gelo_integrity_failures_total{role=\"embedder\"} 1"),
        "{}",
        bad.metrics.encode()
    );

    // Both: every answer is the honest one, all from the honest backend; the corrupting one
    // stays out of rotation, reported with its reason.
    let pool = Pool::new(policy(), None, timing);
    pool.set_backends(&[bad.spec.clone(), good.spec.clone()]);
    verified(&pool, 1).await;
    tokio::time::sleep(Duration::from_millis(700)).await; // the broken one is checked at least once
    for i in 0..6 {
        let text = format!("question {i} about attested routing");
        let got = embed(&pool, &text).await.expect("the honest backend answers");
        let want = reference.embed(&[text.as_str()]).unwrap().remove(0);
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-3, "request {i}: an answer differs from the honest embedding by {diff}");
    }
    let st = pool.status();
    let out = st.iter().find(|s| s.endpoint == bad.spec.endpoint).unwrap();
    assert!(!out.verified() && out.reason.contains("not serving"), "{out:?}");
    assert_eq!(out.requests, 0, "the gateway sent the broken backend nothing");
}
