//! A tampering GPU: the service answers DATA_LOSS with the reason, never a wrong vector,
//! and then stops serving.

use std::sync::Arc;

use api::v1::{EmbedRequest, embedder_server::Embedder as _};
use protocol::Engine;
use protocol::{Executor as _, MaskedConfig, MaskedExecutor, UVerifyConfig};
use server::{Health, Limits, Metrics, embedder::EmbedderService};

use crate::support::{Corrupting, minilm};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_integrity_failure_is_data_loss_never_a_wrong_answer() {
    let (corrupting, tamper) = Corrupting::new(1);
    let engine: Arc<dyn Engine> = Arc::new(corrupting);
    let cfg = MaskedConfig { verify: Some(UVerifyConfig::default()), ..Default::default() };
    let exec = Arc::new(MaskedExecutor::new(engine, cfg).unwrap());
    let embedder: Arc<dyn models::Embedder> =
        models::load_embedder(&minilm(), exec.clone(), &Default::default()).unwrap().into();
    let metrics = Metrics::new("embedder");
    let health = Health::new();
    health.set_serving();
    let svc = EmbedderService::new(embedder, Limits::default(), metrics.clone(), Arc::new(|| 0.0), health.clone());
    let req = || tonic::Request::new(EmbedRequest { texts: vec!["integrity".into()], ..Default::default() });
    let ok = svc.embed(req()).await.expect("honest engine");
    assert_eq!(ok.into_inner().embeddings[0].values.len(), 384);
    tamper.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = svc.embed(req()).await.expect_err("a tampered product must not produce an answer");
    assert_eq!(err.code(), tonic::Code::DataLoss, "{}", err.message());
    assert!(err.message().contains("integrity"), "{}", err.message());
    assert!(matches!(exec.integrity(), protocol::IntegrityStatus::Compromised { .. }));
    assert!(metrics.encode().contains("gelo_integrity_failures_total{role=\"embedder\"} 1"), "{}", metrics.encode());

    // An engine that returned one wrong product gets no more work: NOT_SERVING, and even
    // with the engine honest again every request is refused with the reason.
    assert!(
        matches!(health.state(), server::health::State::Failed(ref r) if r.contains("integrity")),
        "{:?}",
        health.state()
    );
    tamper.store(false, std::sync::atomic::Ordering::SeqCst);
    let refused = svc.embed(req()).await.expect_err("a compromised service keeps refusing");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{}", refused.message());
    assert!(refused.message().contains("integrity"), "{}", refused.message());
}
