//! Building blocks of the e2e tests: model services, gateways and clients.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use api::v1::{Document, StatsRequest, StatsResponse, rag_client::RagClient};
use tonic::transport::Channel;

use crate::support::{self, Proc};

pub fn minilm() -> PathBuf {
    support::model("all-minilm-l6-v2")
}

pub fn smollm() -> PathBuf {
    support::model("smollm2-135m-instruct.gguf")
}

pub fn hex_identity(path: &Path) -> String {
    hex::encode(support::identity(path))
}

/// The test policy (mock root of the test run, default mock measurement) as a file.
pub fn policy_file() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("e2e-policy-{}.yaml", std::process::id()));
    if !path.exists() {
        std::fs::write(&path, support::policy().to_yaml()).unwrap();
    }
    path
}

/// A model service process (`role` = embedder, reranker or generator).
pub fn service(name: &str, role: &str, model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let model = model.to_str().unwrap();
    let mut args = vec![role, "--model", model, "--metrics-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    Proc::start(name, &args, env)
}

/// A gateway over `data` with the test policy; `args` adds backends and settings.
pub fn gateway(name: &str, data: &Path, args: &[&str]) -> Proc {
    let policy = policy_file();
    let minilm = minilm();
    let mut all = vec![
        "gateway",
        "--model",
        minilm.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--policy",
        policy.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    Proc::start(name, &all, &[])
}

/// An RA-TLS `Rag` client, verified against the test policy, MiniLM's identity, role and a
/// fresh nonce.
pub async fn rag(gw: &Proc) -> RagClient<Channel> {
    let ch = support::connect(gw, Some(support::identity(&minilm()))).await;
    assert_eq!(ch.peer().role(), "gateway");
    ch.challenge().await.expect("fresh evidence from the gateway");
    RagClient::new(ch.channel()).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20)
}

pub fn doc(id: &str, title: &str, text: &str) -> Document {
    Document { id: id.into(), title: title.into(), text: text.into(), ..Default::default() }
}

pub async fn ingest(
    client: &mut RagClient<Channel>,
    docs: Vec<Document>,
) -> Result<api::v1::IngestSummary, tonic::Status> {
    client.ingest(futures::stream::iter(docs)).await.map(|r| r.into_inner())
}

pub async fn stats(client: &mut RagClient<Channel>) -> StatsResponse {
    client.stats(StatsRequest {}).await.expect("stats").into_inner()
}

/// Polls `f` every 200 ms until it is true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < timeout, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Requests a model service has answered (any method, any code), from its `/metrics`.
pub async fn requests(p: &Proc) -> f64 {
    p.metric("gelo_requests_total", "").await
}

/// A paragraph of `n` sentences that mentions `topic` (distinct enough per topic for
/// retrieval to find it).
pub fn paragraph(topic: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("Finding {i} about {topic}: the measured effect of {topic} was replicated in cohort {i}. "))
        .collect()
}
