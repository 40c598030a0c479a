//! The operator binary, end to end over real HTTP: `gelo-operator run` against the fake API
//! server, with local RA-TLS attestation servers (gelo-attest's `AttestationService` and
//! `MockIssuer`) standing in for the pods. The test plays the Job controller and the
//! kubelet: it completes fetch Jobs and creates ready pods once Deployments exist.
//!
//! Checks: the pipeline reaches Ready; the pod presenting the wrong model identity is
//! excluded, with an Event and a status message naming it; the routing table carries the
//! TLS key each pod proved; a pod that stops answering leaves the table within an
//! attestation period; the Lease and the metrics endpoint work.

mod support;

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use attest::issuer::default_mock_measurement;
use attest::{AttestationService, MockIssuer, MockPki, ServerIdentity, ServiceClaims};
use gelo_operator::crd::{Component, PrivateRAGPipeline};
use gelo_operator::fixtures;
use gelo_operator::routes::RoutingTable;
use serde_json::json;
use support::*;

const NS: &str = "default";
const PERIOD_S: u64 = 2;

fn pki() -> Arc<MockPki> {
    static PKI: OnceLock<Arc<MockPki>> = OnceLock::new();
    PKI.get_or_init(|| {
        // RSA-4096 key generation is slow: generate once per target dir, then load.
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-operator-test-pki");
        Arc::new(MockPki::load_or_create(&dir).expect("mock PKI"))
    })
    .clone()
}

/// A local stand-in for one pod: RA-TLS gRPC server answering `Attestation.GetEvidence`.
struct FakePod {
    name: String,
    component: Component,
    port: u16,
    tls_spki_sha256: [u8; 32],
    server: tokio::task::JoinHandle<()>,
}

async fn fake_pod(name: &str, component: Component, model_identity: [u8; 32]) -> FakePod {
    let claims = ServiceClaims {
        model_identity,
        scheme_json: format!(
            r#"{{"role":"{component}","protocol":{{"executor":"sealed"}},"mask":"haar","shield":{{"k":8}}}}"#
        ),
        role: component.as_str().into(),
    };
    let identity = Arc::new(ServerIdentity::generate(Arc::new(MockIssuer::new(pki())), claims).expect("identity"));
    let config = identity.server_config().expect("server config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let incoming = attest::ratls::serve_incoming(listener, config);
    let service = AttestationService::new(identity.clone()).into_server();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
    });
    FakePod { name: name.into(), component, port, tls_spki_sha256: identity.tls_spki_sha256(), server }
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn routes(api: &FakeApiServer) -> Option<RoutingTable> {
    let cm = api.get(CONFIGMAPS, NS, "demo-routes")?;
    serde_json::from_str(cm["data"]["routes.json"].as_str()?).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reconciles_a_pipeline_to_ready_and_excludes_a_wrong_model() {
    let api = FakeApiServer::start().await;
    let pki = pki();
    api.insert(mock_root_secret(NS, fixtures::MOCK_SECRET, &pki.ark_pem()));
    let mut p = PrivateRAGPipeline::test().with_spec(|s| {
        s.attestation.allowed_measurements = vec![hex::encode(default_mock_measurement())];
        s.attestation.period_seconds = PERIOD_S as u32;
        s.embedder.replicas = 3;
    });
    p.metadata.namespace = Some(NS.into());
    let mut obj = serde_json::to_value(&p).expect("serialize");
    obj["metadata"].as_object_mut().map(|m| {
        m.remove("uid");
        m.remove("resourceVersion")
    });
    api.insert(obj);

    // Honest pods for every component, a second honest embedder, and one embedder whose
    // evidence names another model than the pinned one.
    let mut pods = Vec::new();
    for c in Component::ALL {
        pods.push(fake_pod(&format!("demo-{c}-0"), c, fixtures::identity_bytes(c)).await);
    }
    pods.push(fake_pod("demo-embedder-1", Component::Embedder, fixtures::identity_bytes(Component::Embedder)).await);
    pods.push(fake_pod("demo-embedder-rogue", Component::Embedder, [0xee; 32]).await);

    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let metrics_port = free_port();
    let log_path = dir.path().join("operator.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let _operator = Operator(
        Command::new(env!("CARGO_BIN_EXE_gelo-operator"))
            .args(["run", "--metrics-addr", &format!("127.0.0.1:{metrics_port}"), "--lease-namespace", NS])
            .args(["--identity", "operator-under-test", "--log-format", "text", "--attest-timeout-seconds", "5"])
            .args(["--allow-mock-roots", "true"])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,gelo_operator=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start gelo-operator"),
    );

    // Play the Job controller, then the kubelet.
    let jobs = api.wait_for(Duration::from_secs(30), |a| (a.list(JOBS).len() == 3).then(|| a.names(JOBS))).await;
    for job in jobs.expect("three fetch jobs") {
        complete_job(&api, NS, &job);
    }
    api.wait_for(Duration::from_secs(30), |a| (a.list(DEPLOYMENTS).len() == 4).then_some(()))
        .await
        .expect("four deployments");
    for pod in &pods {
        api.insert(ready_pod(NS, "demo", pod.component, &pod.name, "127.0.0.1", pod.port));
    }

    let ready = api
        .wait_for(Duration::from_secs(60), |a| {
            let p = stored_pipeline(a, NS, "demo");
            let r = routes(a)?;
            let ok = condition(&p, "Ready").is_some_and(|c| c.status == "True")
                && r.components["embedder"].len() == 2
                && condition(&p, "Attested").is_some_and(|c| c.message.contains("demo-embedder-rogue"));
            ok.then_some(p)
        })
        .await;
    let p = match ready {
        Some(p) => p,
        None => panic!(
            "not Ready in time: {:#?}\noperator log:\n{}",
            stored_pipeline(&api, NS, "demo").status,
            std::fs::read_to_string(&log_path).unwrap_or_default()
        ),
    };

    // The routing table holds exactly the honest pods, with the TLS keys they proved.
    let table = routes(&api).expect("routes");
    let mut routed: Vec<&str> = table.pods().collect();
    routed.sort();
    assert_eq!(routed, ["demo-embedder-0", "demo-embedder-1", "demo-gateway-0", "demo-generator-0", "demo-reranker-0"]);
    for pod in pods.iter().filter(|p| p.name != "demo-embedder-rogue") {
        let route = table.components[pod.component.as_str()].iter().find(|r| r.pod == pod.name).expect("route");
        assert_eq!(route.tls_spki_sha256, hex::encode(pod.tls_spki_sha256), "{}", pod.name);
        assert_eq!(route.port, pod.port);
        assert_eq!(route.model_identity, fixtures::identity(pod.component));
        assert_eq!(route.measurement, hex::encode(default_mock_measurement()));
    }

    // The rogue pod: excluded, unlabelled, named by an Event and by the status.
    let attested = condition(&p, "Attested").expect("Attested");
    assert_eq!(attested.reason, "EvidenceRejected");
    assert!(attested.message.contains("demo-embedder-rogue (model_identity_mismatch)"), "{}", attested.message);
    let rogue = api.get(PODS, NS, "demo-embedder-rogue").expect("rogue pod");
    assert!(rogue.pointer("/metadata/labels/gelo.dev~1attested").is_none());
    let honest = api.get(PODS, NS, "demo-embedder-0").expect("pod");
    assert_eq!(honest.pointer("/metadata/labels/gelo.dev~1attested"), Some(&json!("true")));
    let events = api.list(EVENTS);
    let event = events
        .iter()
        .find(|e| {
            e["reason"] == json!("ModelIdentityMismatch")
                && e.pointer("/related/name") == Some(&json!("demo-embedder-rogue"))
        })
        .unwrap_or_else(|| panic!("no rejection event: {events:#?}"));
    assert_eq!(event["type"], json!("Warning"));
    let status = p.status.as_ref().expect("status");
    let embedder = status.components.iter().find(|c| c.name == "embedder").expect("embedder");
    assert_eq!((embedder.desired, embedder.ready, embedder.verified), (3, 3, 2));
    assert_eq!(status.verified.as_deref(), Some("5/6"));

    // A verified pod that stops answering leaves the table within an attestation period
    // (plus the debounce and one handshake timeout at most).
    let started = std::time::Instant::now();
    pods.iter().find(|p| p.name == "demo-embedder-1").expect("pod").server.abort();
    let gone = api
        .wait_for(Duration::from_secs(PERIOD_S + 8), |a| {
            routes(a).filter(|r| !r.pods().any(|p| p == "demo-embedder-1")).map(|_| ())
        })
        .await;
    assert!(gone.is_some(), "demo-embedder-1 still routed after {:?}", started.elapsed());

    // Leader election took the Lease; metrics count attestation results by reason.
    let lease = api.get(LEASES, NS, "gelo-operator").expect("lease");
    assert_eq!(lease.pointer("/spec/holderIdentity"), Some(&json!("operator-under-test")));
    let metrics = http_get(metrics_port, "/metrics").await;
    assert!(metrics.contains(r#"gelo_operator_attestations_total{component="embedder",result="rejected",reason="model_identity_mismatch"}"#), "{metrics}");
    assert!(metrics.contains("gelo_operator_leader 1"), "{metrics}");

    // The loop settles: with nothing changing, reconciles come from the period, not from
    // the operator's own writes waking it up.
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(!log.contains('\u{1b}'), "text logs written to a file carry terminal colour codes");
    let before = log.matches("reconciled").count();
    tokio::time::sleep(Duration::from_secs(3 * PERIOD_S)).await;
    let after = std::fs::read_to_string(&log_path).unwrap_or_default().matches("reconciled").count();
    assert!(after - before <= 5, "{} reconciles in {}s: a write loop", after - before, 3 * PERIOD_S);
}

/// A minimal HTTP/1.1 GET (the test needs one request; no client dependency for it).
async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect metrics");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}
