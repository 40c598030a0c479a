//! An engine that loses its device: the service reports NOT_SERVING (gRPC health for the
//! server and the service, `/healthz`, `/readyz`), stays up, and answers every request
//! with UNAVAILABLE and the reason, without sending anything more to the engine.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use api::v1::{EmbedRequest, GenerateRequest, embedder_client::EmbedderClient, generator_client::GeneratorClient};
use kernels::CpuEngine;
use protocol::{Engine, EngineError, EngineInfo, Masked, Matrix, Registered, Weight, WeightId};
use protocol::{MaskedConfig, MaskedExecutor};
use server::{
    Health, Limits, Metrics,
    embedder::EmbedderService,
    generator::GeneratorService,
    serve::{ServeOptions, Transport, serve},
};
use tokio::net::TcpListener;
use tonic::{Code, transport::Channel};

use crate::model;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

/// The CPU engine until `lost` is set; then every product fails with DeviceLost. Counts
/// the products asked for after the loss.
struct Losing {
    inner: CpuEngine,
    lost: Arc<AtomicBool>,
    calls_after_loss: Arc<AtomicUsize>,
}

impl Losing {
    fn gate(&self) -> Result<(), EngineError> {
        if self.lost.load(Ordering::SeqCst) {
            self.calls_after_loss.fetch_add(1, Ordering::SeqCst);
            return Err(EngineError::DeviceLost("the test pulled the GPU".into()));
        }
        Ok(())
    }
}

impl Engine for Losing {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn register(&self, id: WeightId, w: Weight) -> Result<Registered, EngineError> {
        self.inner.register(id, w)
    }
    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.inner.unregister(id)
    }
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        self.gate()?;
        self.inner.matmul_many(x, ids)
    }
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, t: bool) -> Result<Matrix, EngineError> {
        self.gate()?;
        self.inner.matmul_dynamic(a, b, t)
    }
    fn softmax_rows(&self, x: &Masked, s: f32) -> Result<Matrix, EngineError> {
        self.gate()?;
        self.inner.softmax_rows(x, s)
    }
}

struct Gpu {
    lost: Arc<AtomicBool>,
    calls_after_loss: Arc<AtomicUsize>,
    exec: Arc<MaskedExecutor>,
}

fn gpu() -> Gpu {
    let (lost, calls_after_loss) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let engine: Arc<dyn Engine> =
        Arc::new(Losing { inner: CpuEngine::new(), lost: lost.clone(), calls_after_loss: calls_after_loss.clone() });
    let exec = Arc::new(MaskedExecutor::new(engine, MaskedConfig::default()).unwrap());
    Gpu { lost, calls_after_loss, exec }
}

/// A server on loopback (plaintext) with its metrics port; stops when dropped.
struct Running {
    channel: Channel,
    metrics: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(routes: tonic::service::Routes, metrics: Metrics, health: Health) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc, http) = (listener.local_addr().unwrap(), metrics_listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let opts =
        ServeOptions { listener, transport: Transport::Insecure, metrics_listener: Some(metrics_listener), metrics };
    tokio::spawn(async move {
        serve(opts, routes, health, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    Running { channel, metrics: http, _stop: stop }
}

async fn grpc_health(ch: &Channel, service: &str) -> ServingStatus {
    let mut h = HealthClient::new(ch.clone());
    let r = h.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

/// HTTP status code and body of a GET.
async fn http(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("an HTTP status line");
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Everything that must say "serving" does.
async fn assert_serving(r: &Running, service: &str) {
    assert_eq!(grpc_health(&r.channel, "").await, ServingStatus::Serving);
    assert_eq!(grpc_health(&r.channel, service).await, ServingStatus::Serving);
    assert_eq!(http(r.metrics, "/healthz").await.0, 200);
    assert_eq!(http(r.metrics, "/readyz").await.0, 200);
}

/// The gRPC health status of `service` once it has followed a state change: the health
/// service's statuses are set by a task that follows the service's state, so they may lag
/// the request that failed by a scheduling round (bounded here at 5 s).
async fn grpc_health_settled(ch: &Channel, service: &str, want: ServingStatus) -> ServingStatus {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let got = grpc_health(ch, service).await;
        if got == want || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Everything that must say "not serving" does, with the reason over HTTP.
async fn assert_not_serving(r: &Running, service: &str) {
    assert_eq!(grpc_health_settled(&r.channel, "", ServingStatus::NotServing).await, ServingStatus::NotServing);
    assert_eq!(grpc_health_settled(&r.channel, service, ServingStatus::NotServing).await, ServingStatus::NotServing);
    for probe in ["/healthz", "/readyz"] {
        let (code, body) = http(r.metrics, probe).await;
        assert_eq!(code, 503, "{probe}: {body}");
        assert!(body.contains("device lost"), "{probe} should say why: {body}");
    }
}

fn expect_unavailable<T: std::fmt::Debug>(r: Result<T, tonic::Status>, needle: &str) {
    let s = r.expect_err("a service without its engine must refuse");
    assert_eq!(s.code(), Code::Unavailable, "{}", s.message());
    assert!(s.message().contains(needle), "{:?} should mention {needle:?}", s.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_that_loses_its_device_reports_not_serving_and_refuses_with_unavailable() {
    let gpu = gpu();
    let embedder: Arc<dyn models::Embedder> =
        models::load_embedder(&model("all-minilm-l6-v2"), gpu.exec.clone(), &Default::default()).unwrap().into();
    let (metrics, health) = (Metrics::new("embedder"), Health::new());
    let svc = EmbedderService::new(embedder, Limits::default(), metrics.clone(), Arc::new(|| 0.0), health.clone());
    let r = start(tonic::service::Routes::new(svc.into_server()), metrics, health).await;
    let mut c = EmbedderClient::new(r.channel.clone());
    let req = || EmbedRequest { texts: vec!["health".into()], ..Default::default() };

    assert_serving(&r, "gelo.v1.Embedder").await;
    assert_eq!(c.embed(req()).await.unwrap().into_inner().embeddings[0].values.len(), 384);

    gpu.lost.store(true, Ordering::SeqCst);
    expect_unavailable(c.embed(req()).await, "device lost");
    let calls = gpu.calls_after_loss.load(Ordering::SeqCst);
    assert!(calls >= 1);
    assert_not_serving(&r, "gelo.v1.Embedder").await;

    // Still up and answering, with the reason, without touching the engine again; the
    // failure is final even if the engine seems to come back.
    gpu.lost.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        expect_unavailable(c.embed(req()).await, "not serving: engine device lost");
    }
    assert_eq!(gpu.calls_after_loss.load(Ordering::SeqCst), calls, "a failed service kept using its engine");
    assert_not_serving(&r, "gelo.v1.Embedder").await;
    let text = http(r.metrics, "/metrics").await.1;
    assert!(text.contains(r#"gelo_requests_total{role="embedder",method="Embed",code="Unavailable"} 4"#), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generator_that_loses_its_device_mid_stream_reports_not_serving() {
    let gpu = gpu();
    let generator = Arc::new(
        models::load_generator(&model("smollm2-135m-instruct.gguf"), gpu.exec.clone(), &Default::default()).unwrap(),
    );
    let (metrics, health) = (Metrics::new("generator"), Health::new());
    let svc = GeneratorService::new(generator, Limits::default(), metrics.clone(), Arc::new(|| 0.0), health.clone());
    let r = start(tonic::service::Routes::new(svc.into_server()), metrics, health).await;
    let mut c = GeneratorClient::new(r.channel.clone());
    let req = || GenerateRequest { raw_prompt: "1, 2, 3,".into(), max_tokens: 200, ..Default::default() };

    assert_serving(&r, "gelo.v1.Generator").await;
    let mut s = c.generate(req()).await.unwrap().into_inner();
    s.message().await.unwrap().expect("the first chunk");
    gpu.lost.store(true, Ordering::SeqCst);
    let err = loop {
        match s.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("200 tokens finished before the device went"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    assert!(err.message().contains("device lost"), "{}", err.message());
    assert_not_serving(&r, "gelo.v1.Generator").await;
    expect_unavailable(c.generate(req()).await, "not serving: engine device lost");
}
