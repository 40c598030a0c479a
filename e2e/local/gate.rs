//! The attestation gate: backends that prove another model, another launch measurement, a
//! root the policy does not trust, another role, or a TLS key other than the one the routing
//! table pins are never sent a request — their own request counters stay at zero — while the
//! verified one serves everything; and with only such backends the gateway fails closed.

use std::path::{Path, PathBuf};

use api::v1::SearchRequest;
use attest::MockPki;

use crate::{stack::*, support::*};

/// MiniLM with one harmless config change: loads the same, hashes differently.
fn other_minilm(dir: &Path) -> PathBuf {
    let copy = dir.join("minilm-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(minilm()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
        }
    }
    let cfg = copy.join("tokenizer_config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["gelo_e2e_note"] = "a different model identity".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    copy
}

/// A second mock PKI: real-looking evidence from a root the test policy does not name.
fn untrusted_pki() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-e2e-untrusted-mock-pki");
    MockPki::load_or_create(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_verified_backends_are_ever_sent_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let good = service("gate-good", "embedder", &minilm(), &[], &[]);
    let other = other_minilm(dir.path());
    assert_ne!(identity(&other), identity(&minilm()));
    let wrong_model = service("gate-model", "embedder", &other, &[], &[]);
    let bad_measurement = "ba".repeat(48);
    let wrong_measurement =
        service("gate-measurement", "embedder", &minilm(), &[], &[("GELO_MOCK_MEASUREMENT", &bad_measurement)]);
    let pki = untrusted_pki();
    let wrong_root = service("gate-root", "embedder", &minilm(), &[], &[("GELO_MOCK_PKI_DIR", pki.to_str().unwrap())]);
    // A genuine, verified-looking generator listed as an embedder (with its own model identity).
    let generator = service("gate-role", "generator", &smollm(), &[], &[]);

    // The routing table (operator format) adds the role confusion and a pinned key that is
    // not the good embedder's.
    let routes = dir.path().join("routes.json");
    let route = |ep: &str, spki: &str, model: &str| {
        let (ip, port) = ep.rsplit_once(':').unwrap();
        serde_json::json!({"pod": "p", "ip": ip, "port": port.parse::<u16>().unwrap(), "tlsSpkiSha256": spki, "modelIdentity": model, "schemeIdentity": "", "measurement": ""})
    };
    let table = serde_json::json!({
        "version": 1, "pipeline": "e2e", "namespace": "test", "generation": 1,
        "components": {
            "embedder": [route(&generator.target(), &"00".repeat(32), &hex_identity(&smollm())),
                         route(&good.target(), &"11".repeat(32), &hex_identity(&minilm()))],
            "reranker": [], "generator": [], "gateway": []
        }
    });
    std::fs::write(&routes, table.to_string()).unwrap();

    let bad = [&wrong_model, &wrong_measurement, &wrong_root];
    let endpoints: Vec<String> = std::iter::once(&good).chain(bad).map(|p| p.target()).collect();
    let data = dir.path().join("data");
    let gw = gateway(
        "gate-gateway",
        &data,
        &[
            "--embedder",
            &endpoints.join(","),
            "--embedder-identity",
            &hex_identity(&minilm()),
            "--routes-file",
            routes.to_str().unwrap(),
        ],
    );
    let mut client = rag(&gw).await;
    eventually(std::time::Duration::from_secs(30), "every backend has a verdict", || {
        let mut c = client.clone();
        async move { stats(&mut c).await.backends.iter().all(|b| b.verified || !b.reason.contains("not verified yet")) }
    })
    .await;

    // Traffic: ingest and searches, all of which need the embedder.
    let docs = (0..6).map(|i| doc(&format!("d{i}"), "", &paragraph(&format!("topic {i}"), 3))).collect();
    let s = ingest(&mut client, docs).await.unwrap();
    assert_eq!(s.documents, 6);
    for i in 0..20 {
        let r = client
            .search(SearchRequest { query: format!("effect of topic {}", i % 6), top_k: 3, rerank: None })
            .await
            .unwrap();
        assert_eq!(r.into_inner().passages.len(), 3);
    }

    let st = stats(&mut client).await;
    // Every reason given for an endpoint (the good one is listed twice: static and pinned).
    let reason = |ep: &str| -> String {
        st.backends.iter().filter(|b| b.endpoint == ep).map(|b| b.reason.clone()).collect::<Vec<_>>().join(" | ")
    };
    let verified: Vec<&str> = st.backends.iter().filter(|b| b.verified).map(|b| b.endpoint.as_str()).collect();
    assert_eq!(verified, [good.target()], "{:#?}", st.backends);
    assert!(reason(&wrong_model.target()).contains("model_identity_mismatch"), "{:#?}", st.backends);
    assert!(reason(&wrong_measurement.target()).contains("measurement_not_allowed"), "{:#?}", st.backends);
    assert!(reason(&wrong_root.target()).contains("mock_root_not_trusted"), "{:#?}", st.backends);
    assert!(reason(&generator.target()).contains("role_not_allowed"), "{:#?}", st.backends);
    assert!(reason(&good.target()).contains("tls_key_not_pinned"), "{:#?}", st.backends);

    // The gate, observed from the backends themselves.
    assert!(requests(&good).await >= 21.0, "the verified embedder served everything");
    for p in bad.iter().copied().chain(std::iter::once(&generator)) {
        assert_eq!(requests(p).await, 0.0, "{} was sent a request", p.target());
    }
    let st = stats(&mut client).await;
    for b in &st.backends {
        assert_eq!(b.requests > 0, b.verified, "{b:?}");
    }

    // Fail closed: a gateway that can verify none of its embedders refuses with the reasons.
    let lonely = gateway(
        "gate-lonely",
        &dir.path().join("data2"),
        &["--embedder", &wrong_measurement.target(), "--embedder-identity", &hex_identity(&minilm())],
    );
    let mut c2 = rag(&lonely).await;
    eventually(std::time::Duration::from_secs(30), "the bad embedder is rejected", || {
        let mut c = c2.clone();
        async move { stats(&mut c).await.backends.iter().any(|b| b.reason.contains("measurement_not_allowed")) }
    })
    .await;
    let err = c2.search(SearchRequest { query: "anything".into(), top_k: 1, rerank: None }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("no verified embedder") && err.message().contains("measurement_not_allowed"),
        "{}",
        err.message()
    );
    let err = c2.query(api::v1::QueryRequest { question: "q".into(), ..Default::default() }).await;
    let status = match err {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(requests(&wrong_measurement).await, 0.0);
}

/// `gelo rag verify` as a client runs it: the gateway verified against the test policy,
/// MiniLM's identity, and (with `extra`) the backend policy it must attest.
fn verify_gateway(gw: &Proc, extra: &[&str]) -> (bool, String, String) {
    let (policy, target) = (policy_file(), gw.target());
    let mut args = vec!["rag", "verify", "--gateway", &target, "--policy", policy.to_str().unwrap()];
    let identity = hex_identity(&minilm());
    args.extend(["--expect-identity", &identity]);
    args.extend_from_slice(extra);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gelo"))
        .args(&args)
        .env("GELO_UP_DIR", "/nonexistent")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refuses_a_gateway_that_attests_another_backend_policy() {
    let dir = tempfile::tempdir().unwrap();
    // P: the test policy. P′: P plus someone else's root and any launch measurement, as a
    // rewritten ConfigMap would give the gateway.
    let mut wider = (*policy()).clone();
    wider
        .trusted_roots
        .push(attest::TrustedRoot::MockPem(MockPki::load_or_create(&untrusted_pki()).unwrap().ark_pem()));
    wider.allow_any_measurement = true;
    let wider_file = dir.path().join("wider.yaml");
    std::fs::write(&wider_file, wider.to_yaml()).unwrap();
    let minilm = minilm();
    let data = dir.path().join("data-wider");
    let args = [
        "gateway",
        "--model",
        minilm.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--policy",
        wider_file.to_str().unwrap(),
    ];
    let mut args = args.to_vec();
    args.extend(["--data-dir", data.to_str().unwrap()]);
    let on_wider = Proc::start("policy-gateway-wider", &args, &[]);

    let (ok, _, err) = verify_gateway(&on_wider, &[]);
    assert!(!ok, "a client expecting P accepted a gateway running P′");
    assert!(err.contains("gateway_policy_mismatch") && err.contains(&hex::encode(wider.digest().unwrap())), "{err}");
    let (ok, out, err) = verify_gateway(&on_wider, &["--backend-policy", wider_file.to_str().unwrap()]);
    assert!(ok, "{err}");
    let proved: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(proved["backend_policy_sha256"], hex::encode(wider.digest().unwrap()));
    assert_eq!(proved["role"], "gateway");

    // The same gateway on P passes with no flag: the client's own policy is the default.
    let on_p = gateway("policy-gateway-p", &dir.path().join("data-p"), &[]);
    let (ok, out, err) = verify_gateway(&on_p, &[]);
    assert!(ok, "{err}");
    let proved: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(proved["backend_policy_sha256"], hex::encode(policy().digest().unwrap()));
}
