use std::sync::Arc;

use api::v1::{EmbedRequest, embedder_client::EmbedderClient};
use kernels::CpuEngine;
use models::{LoadOptions, load_embedder, ops::cosine};
use protocol::{MaskedConfig, MaskedExecutor};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_process_matches_in_process_and_serves_64_concurrent_clients() {
    let path = model("all-minilm-l6-v2");
    let p = Proc::start(
        "embedder",
        &["embedder", "--model", path.to_str().unwrap(), "--metrics-listen", "127.0.0.1:0"],
        &[],
    );
    let ch = connect(&p, Some(identity(&path))).await;
    // The freshness challenge: new nonce, same TLS key.
    ch.challenge().await.expect("fresh evidence");
    let mut client = EmbedderClient::new(ch.channel());
    let texts: Vec<String> = (0..64).map(|i| format!("document number {i} is about topic {}", i % 7)).collect();

    // In-process reference on its own masked executor (the service runs the sealed default).
    let exec = Arc::new(MaskedExecutor::new(Arc::new(CpuEngine::new()), MaskedConfig::default()).unwrap());
    let local = load_embedder(&path, exec, &LoadOptions::default()).unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = local.embed(&refs).unwrap();

    let got =
        client.embed(EmbedRequest { texts: texts[..3].to_vec(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(got.embeddings.len(), 3);
    assert_eq!(got.model, hex::encode(identity(&path)));
    for (g, w) in got.embeddings.iter().zip(&want) {
        assert!(cosine(&g.values, w) > 0.99999);
    }

    // 64 concurrent clients, one text each: every answer is its own text's embedding.
    let mut tasks = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let mut c = client.clone();
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let r = c.embed(EmbedRequest { texts: vec![t], ..Default::default() }).await.unwrap().into_inner();
            (i, r.embeddings[0].values.clone())
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        let (i, v) = t.await.unwrap();
        assert!(cosine(&v, &want[i]) > 0.99999, "client {i} got someone else's embedding");
        seen.push(v);
    }
    for i in 0..seen.len() {
        for j in i + 1..seen.len() {
            assert!(cosine(&seen[i], &seen[j]) < 0.9999, "clients {i} and {j} got the same vector");
        }
    }
    // Requests were batched: fewer forward passes than requests.
    let passes = p.metric("gelo_batch_items_count", "embedder").await;
    assert!((1.0..65.0).contains(&passes), "batches: {passes}");
    // The default protection (sealed) computes in the TEE: the service's engine did no work.
    assert_eq!(p.metric("gelo_engine_seconds_total", "").await, 0.0, "the sealed default used the engine");
    assert!(p.metric("gelo_tee_seconds_total", "").await > 0.0);
}

/// A service started with a weaker protection than the policy names is refused at the
/// handshake, before any request: `masked` is accepted only by a policy that lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masked_service_is_refused_unless_the_policy_names_masked() {
    let path = model("all-minilm-l6-v2");
    let p = Proc::start("embedder", &["embedder", "--model", path.to_str().unwrap(), "--protection", "masked"], &[]);
    let expected = attest::ExpectedPeer { model_identity: Some(identity(&path)), ..Default::default() };
    match attest::ratls::connect(&p.target(), policy(), expected.clone(), None).await {
        Err(attest::AttestError::PeerRejected(e)) => {
            assert_eq!(e.reason(), "protection_not_allowed");
            assert!(e.to_string().contains("\"masked\""), "{e}");
        }
        Err(other) => panic!("expected a protection refusal, got {other}"),
        Ok(_) => panic!("the default policy accepted a masked embedder"),
    }
    let allows_masked = std::sync::Arc::new((*policy()).clone().allow_protection("masked"));
    let ch = attest::ratls::connect(&p.target(), allows_masked, expected, None).await.expect("masked allowed");
    let got = EmbedderClient::new(ch.channel())
        .embed(EmbedRequest { texts: vec!["a masked request".into()], ..Default::default() })
        .await
        .expect("embed")
        .into_inner();
    assert_eq!(got.embeddings.len(), 1);
}
