//! Attested routing against in-process RA-TLS backends (no models, loopback TCP): requests
//! spread over verified replicas, move to the survivor when one stops, fail closed with the
//! reasons when none is left, and return to a backend that restarts and verifies again;
//! backends proving another role or key are never called; a backend whose evidence expires
//! leaves the routes until fresh evidence verifies.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use api::v1::{EmbedRequest, EmbedResponse, Embedding, embedder_client::EmbedderClient, embedder_server};
use attest::{
    MockIssuer, MockPki, Policy, ServerIdentity, ServiceClaims, TrustedRoot, issuer::default_mock_measurement,
};
use gateway::{BackendSpec, Pool, Role, Trust, VerifyTiming};
use server::serve::{ServeOptions, Transport, health, serve};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::{Request, Response, Status};

const MODEL: [u8; 32] = [7; 32];

fn pki_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-routing-mock-pki");
    MockPki::load_or_create(&dir).unwrap();
    dir
}

fn policy() -> Policy {
    let pki = MockPki::load_or_create(&pki_dir()).unwrap();
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki.ark_pem())])
        .allow_measurement(default_mock_measurement())
}

/// Answers every text with `[id, 1]` and counts the calls it saw; a text "slow" takes 200 ms,
/// and the most calls it ever had at once is recorded.
struct Fake {
    id: f32,
    calls: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl embedder_server::Embedder for Fake {
    async fn embed(&self, r: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let texts = r.into_inner().texts;
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if texts.iter().any(|t| t == "slow") {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        let embeddings = texts.iter().map(|_| Embedding { values: vec![self.id, 1.0] }).collect();
        Ok(Response::new(EmbedResponse { embeddings, ..Default::default() }))
    }
}

struct Backend {
    addr: SocketAddr,
    peak: Arc<AtomicUsize>,
    /// Hex SHA-256 of its TLS key, as the operator's routing table names it.
    spki: String,
    calls: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Backend {
    async fn start(id: f32, role: &str, at: Option<SocketAddr>, calls: Arc<AtomicUsize>) -> Backend {
        Self::start_running(id, role, at, calls, Some("sealed")).await
    }

    /// A backend whose attested scheme names `executor` as its protection (`None`: none);
    /// `masked` with the project's default settings.
    async fn start_running(
        id: f32,
        role: &str,
        at: Option<SocketAddr>,
        calls: Arc<AtomicUsize>,
        executor: Option<&str>,
    ) -> Backend {
        let protocol = executor.map(|x| match x {
            "masked" => masked_protocol(|_| {}),
            x => serde_json::json!({ "executor": x }),
        });
        Self::start_signed(id, role, at, calls, protocol, &pki_dir()).await
    }

    /// A backend attesting `protocol` as its scheme's protocol, with evidence from the mock
    /// PKI in `pki`.
    async fn start_signed(
        id: f32,
        role: &str,
        at: Option<SocketAddr>,
        calls: Arc<AtomicUsize>,
        protocol: Option<serde_json::Value>,
        pki: &std::path::Path,
    ) -> Backend {
        Self::start_with_issuer(id, role, at, calls, protocol, MockIssuer::load_or_create(pki).unwrap()).await
    }

    /// A backend whose evidence `issuer` signs.
    async fn start_with_issuer(
        id: f32,
        role: &str,
        at: Option<SocketAddr>,
        calls: Arc<AtomicUsize>,
        protocol: Option<serde_json::Value>,
        issuer: MockIssuer,
    ) -> Backend {
        let issuer = Arc::new(issuer);
        let scheme = match protocol {
            Some(p) => serde_json::json!({ "role": role, "protocol": p }),
            None => serde_json::json!({ "role": role }),
        };
        let claims = ServiceClaims { model_identity: MODEL, scheme_json: scheme.to_string(), role: role.into() };
        let identity = Arc::new(ServerIdentity::generate(issuer, claims).unwrap());
        let spki = hex::encode(identity.tls_spki_sha256());
        let mut listener = None;
        for _ in 0..50 {
            match TcpListener::bind(at.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap())).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await, // the old port is still closing
            }
        }
        let listener = listener.expect("binding");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let peak = Arc::new(AtomicUsize::new(0));
        let fake = Fake { id, calls: calls.clone(), active: Arc::default(), peak: peak.clone() };
        let routes = tonic::service::Routes::new(embedder_server::EmbedderServer::new(fake));
        let opts = ServeOptions {
            listener,
            transport: Transport::RaTls { identity, clients: None },
            metrics_listener: None,
            metrics: server::Metrics::new(role),
        };
        let task = tokio::spawn(async move {
            serve(opts, routes, health(), async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Backend { addr, peak, spki, calls, stop: Some(tx), task }
    }

    async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }

    fn spec(&self) -> BackendSpec {
        BackendSpec {
            role: Role::Embedder,
            endpoint: self.addr.to_string(),
            model_identity: Some(MODEL),
            scheme_identity: None,
            tls_spki_sha256: None,
        }
    }
}

/// A masked scheme's `protocol` as a service attests it (the project's defaults: the
/// `auto` family, 8 shield rows, U-Verify with 2 probes), changed by `edit`.
fn masked_protocol(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut p = serde_json::json!({
        "executor": "masked",
        "masked": { "mask": "auto", "shield": { "rows": 8, "energy": 4.0 }, "verify": { "probes": 2, "range": 3 } },
    });
    edit(&mut p);
    p
}

async fn embed(pool: &Pool) -> Result<f32, gateway::GatewayError> {
    pool.unary(Role::Embedder, |ch| async move {
        let r = EmbedderClient::new(ch).embed(EmbedRequest { texts: vec!["t".into()], ..Default::default() }).await?;
        Ok(r.into_inner().embeddings[0].values[0])
    })
    .await
}

async fn verified(pool: &Pool, n: usize) {
    for _ in 0..200 {
        if pool.status().iter().filter(|b| b.verified()).count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("expected {n} verified backends: {:#?}", pool.status());
}

fn fast() -> VerifyTiming {
    VerifyTiming {
        interval: Duration::from_millis(300),
        retry: Duration::from_millis(100),
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spread_fail_over_fail_closed_and_come_back() {
    let mut a = Backend::start(1.0, "embedder", None, Arc::default()).await;
    let mut b = Backend::start(2.0, "embedder", None, Arc::default()).await;
    let pool = Pool::new(policy(), None, fast());
    pool.set_backends(&[a.spec(), b.spec()]);
    verified(&pool, 2).await;

    // A verified backend reports what its fresh evidence proved (the trust report's row).
    let up = pool.status().into_iter().find(|s| s.endpoint == a.addr.to_string()).unwrap();
    assert_eq!((up.trust, up.reason_code, up.issuer.as_str()), (Trust::Verified, "", "mock"));
    assert_eq!(up.measurement, hex::encode(default_mock_measurement()));
    assert_eq!(
        (up.model_identity.clone(), up.expected_model_identity.clone()),
        (hex::encode(MODEL), hex::encode(MODEL))
    );
    assert_eq!(up.chip_id.len(), 128, "{up:?}");
    assert!(up.tcb.is_some() && up.verified_age.is_some(), "{up:?}");
    assert_eq!(up.policy_sha256, hex::encode(policy().digest().unwrap()));
    assert_eq!(pool.policy_sha256(), Some(policy().digest().unwrap()));
    let scheme: serde_json::Value = serde_json::from_str(&up.scheme_json).unwrap();
    assert_eq!(scheme["protocol"]["executor"], "sealed");

    // Round-robin over the verified replicas.
    for _ in 0..10 {
        embed(&pool).await.unwrap();
    }
    assert_eq!((a.calls.load(Ordering::SeqCst), b.calls.load(Ordering::SeqCst)), (5, 5));

    // A stops: every request still succeeds, on B.
    a.stop().await;
    for _ in 0..6 {
        assert_eq!(embed(&pool).await.unwrap(), 2.0);
    }
    let st = pool.status();
    let down = st.iter().find(|s| s.endpoint == a.addr.to_string()).unwrap();
    assert!(!down.verified() && !down.reason.is_empty(), "{down:?}");
    // Gone is unavailable, not refused, and a backend out of rotation proves nothing now.
    assert_eq!(down.trust, Trust::Unavailable, "{down:?}");
    assert!(["request_failed", "unreachable", "timeout"].contains(&down.reason_code), "{down:?}");
    assert!(down.measurement.is_empty() && down.tcb.is_none() && down.verified_age.is_none(), "{down:?}");

    // B stops too: fail closed, UNAVAILABLE, naming the role and each backend's reason.
    b.stop().await;
    let e = loop {
        match embed(&pool).await {
            Err(e) => break e,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let s: Status = e.into();
    assert_eq!(s.code(), tonic::Code::Unavailable);
    assert!(
        s.message().contains("no verified embedder") && s.message().contains(&a.addr.to_string()),
        "{}",
        s.message()
    );

    // A restarts on its port with a new key and new evidence: verified again, used again.
    let calls = a.calls.clone();
    let before = calls.load(Ordering::SeqCst);
    let a2 = Backend::start(3.0, "embedder", Some(a.addr), calls.clone()).await;
    verified(&pool, 1).await;
    assert_eq!(embed(&pool).await.unwrap(), 3.0);
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);
    drop(a2);
}

/// A backend whose evidence expires while it serves (its VCEK certificate's validity ends):
/// the next fresh-nonce check refuses it (`certificate_expired`), it leaves the rotation and
/// the other replica takes every request; started again with fresh evidence at the same
/// address, it verifies and is called again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_evidence_expires_leaves_the_routes_and_returns_with_fresh_evidence() {
    let lifetime = Duration::from_secs(8);
    let expiring = MockIssuer::load_or_create(pki_dir()).unwrap().with_vcek_expiring_in(lifetime).unwrap();
    let minted = std::time::Instant::now();
    let sealed = Some(serde_json::json!({ "executor": "sealed" }));
    let mut a = Backend::start_with_issuer(1.0, "embedder", None, Arc::default(), sealed, expiring).await;
    let b = Backend::start(2.0, "embedder", None, Arc::default()).await;
    let pool = Pool::new(policy(), None, fast());
    pool.set_backends(&[a.spec(), b.spec()]);
    verified(&pool, 2).await;
    assert!(minted.elapsed() < lifetime, "verified before the evidence expired");
    for _ in 0..4 {
        embed(&pool).await.unwrap();
    }
    assert!(a.calls.load(Ordering::SeqCst) > 0, "A served while its evidence was valid");

    // Past the certificate's end, the next re-verification (every 300 ms here) refuses A.
    let endpoint = a.addr.to_string();
    let refused = loop {
        let st = pool.status().into_iter().find(|s| s.endpoint == endpoint).unwrap();
        if !st.verified() {
            break st;
        }
        assert!(minted.elapsed() < lifetime + Duration::from_secs(10), "A is still routed: {st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(minted.elapsed() + Duration::from_secs(1) >= lifetime, "A left before its evidence expired: {refused:?}");
    assert_eq!((refused.trust, refused.reason_code), (Trust::Refused, "certificate_expired"), "{refused:?}");
    let a_calls = a.calls.load(Ordering::SeqCst);
    for _ in 0..6 {
        assert_eq!(embed(&pool).await.unwrap(), 2.0, "only B serves");
    }
    assert_eq!(a.calls.load(Ordering::SeqCst), a_calls, "no request reached A after its evidence expired");

    // Fresh evidence (a new VCEK, as a renewed certificate gives it): verified, called again.
    let calls = a.calls.clone();
    a.stop().await;
    let _a2 = Backend::start(3.0, "embedder", Some(a.addr), calls.clone()).await;
    verified(&pool, 2).await;
    let got: Vec<f32> =
        futures::future::join_all((0..6).map(|_| embed(&pool))).await.into_iter().map(Result::unwrap).collect();
    assert!(got.contains(&3.0), "the renewed backend is routed to again: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_in_flight_limit_wait_in_the_gateway_and_go_to_the_least_loaded() {
    let a = Backend::start(1.0, "embedder", None, Arc::default()).await;
    let b = Backend::start(2.0, "embedder", None, Arc::default()).await;
    let pool = Pool::new(policy(), None, fast());
    pool.set_unary_in_flight(1);
    pool.set_backends(&[a.spec(), b.spec()]);
    verified(&pool, 2).await;
    let calls = (0..8).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.unary(Role::Embedder, |ch| async move {
                EmbedderClient::new(ch)
                    .embed(EmbedRequest { texts: vec!["slow".into()], ..Default::default() })
                    .await
                    .map(|r| r.into_inner())
            })
            .await
        })
    });
    for c in calls.collect::<Vec<_>>() {
        c.await.unwrap().expect("every call succeeds, later ones after waiting");
    }
    assert_eq!(a.peak.load(Ordering::SeqCst), 1, "at most one call at a time per backend");
    assert_eq!(b.peak.load(Ordering::SeqCst), 1);
    assert_eq!(a.calls.load(Ordering::SeqCst) + b.calls.load(Ordering::SeqCst), 8);
    assert!(a.calls.load(Ordering::SeqCst) >= 3 && b.calls.load(Ordering::SeqCst) >= 3, "both replicas share the load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_restarted_with_a_new_key_gets_no_request_until_the_routes_name_its_key() {
    let mut a = Backend::start(1.0, "embedder", None, Arc::default()).await;
    let pool = Pool::new(policy(), None, fast());
    let mut spec = a.spec();
    spec.tls_spki_sha256 = Some(key_of(&a));
    pool.set_backends(&[spec.clone()]);
    verified(&pool, 1).await;
    assert_eq!(embed(&pool).await.unwrap(), 1.0);

    // Restarted on the same address with a new key (its certificate's evidence is genuine):
    // neither the open channel's reconnect nor the verifier's new connection may use it.
    a.stop().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let a2 = Backend::start(2.0, "embedder", Some(a.addr), calls.clone()).await;
    for _ in 0..6 {
        assert!(embed(&pool).await.is_err(), "a request reached an unpinned key");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let reason = pool.status()[0].reason.clone();
    assert!(reason.starts_with("tls_key_not_pinned"), "{reason}");

    // Once the routes name the new key (the operator attested it), it is verified and used.
    spec.tls_spki_sha256 = Some(key_of(&a2));
    pool.set_backends(&[spec]);
    verified(&pool, 1).await;
    assert_eq!(embed(&pool).await.unwrap(), 2.0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

fn key_of(b: &Backend) -> [u8; 32] {
    hex::decode(&b.spki).unwrap().try_into().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_role_or_an_unpinned_key_is_never_called() {
    let good = Backend::start(1.0, "embedder", None, Arc::default()).await;
    // A genuine service with the right model, but it proves the reranker role.
    let reranker = Backend::start(9.0, "reranker", None, Arc::default()).await;
    let pool = Pool::new(policy(), None, fast());
    let mut pinned = good.spec();
    pinned.tls_spki_sha256 = Some([0; 32]);
    pool.set_backends(&[good.spec(), reranker.spec(), pinned]);
    verified(&pool, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // let the others fail at least once
    for _ in 0..8 {
        assert_eq!(embed(&pool).await.unwrap(), 1.0);
    }
    assert_eq!(reranker.calls.load(Ordering::SeqCst), 0);
    let st = pool.status();
    let reasons: Vec<&str> = st.iter().filter(|s| !s.verified()).map(|s| s.reason.as_str()).collect();
    assert!(reasons.iter().any(|r| r.starts_with("role_not_allowed")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.starts_with("tls_key_not_pinned")), "{reasons:?}");
    // Both are verdicts on what the backend proved: refused, with the verifier's reason code.
    let mut codes: Vec<(Trust, &str)> = st.iter().filter(|s| !s.verified()).map(|s| (s.trust, s.reason_code)).collect();
    codes.sort_by_key(|c| c.1);
    assert_eq!(codes, [(Trust::Refused, "role_not_allowed"), (Trust::Refused, "tls_key_not_pinned")]);
    assert_eq!(good.calls.load(Ordering::SeqCst), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_running_a_weaker_protection_than_the_policy_names_are_never_called() {
    let sealed = Backend::start(1.0, "embedder", None, Arc::default()).await;
    let masked = Backend::start_running(2.0, "embedder", None, Arc::default(), Some("masked")).await;
    let plaintext = Backend::start_running(3.0, "embedder", None, Arc::default(), Some("plaintext")).await;
    let unnamed = Backend::start_running(4.0, "embedder", None, Arc::default(), None).await;
    let specs = [sealed.spec(), masked.spec(), plaintext.spec(), unnamed.spec()];
    let pool = Pool::new(policy(), None, fast());
    pool.set_backends(&specs);
    verified(&pool, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // let the others fail at least once
    for _ in 0..8 {
        assert_eq!(embed(&pool).await.unwrap(), 1.0, "only the sealed backend answers");
    }
    for (b, what) in [(&masked, "masked"), (&plaintext, "plaintext"), (&unnamed, "none")] {
        assert_eq!(b.calls.load(Ordering::SeqCst), 0, "the {what} backend was called");
        let st = pool.status().into_iter().find(|s| s.endpoint == b.addr.to_string()).expect("listed");
        assert!(!st.verified());
        assert!(
            st.reason.starts_with("protection_not_allowed") && st.reason.contains(&format!("\"{what}\"")),
            "{what}: {}",
            st.reason
        );
    }
    // A policy that names masked routes to it too, and still never to plaintext.
    let pool = Pool::new(policy().allow_protection("masked"), None, fast());
    pool.set_backends(&specs);
    verified(&pool, 2).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..16 {
        seen.insert(embed(&pool).await.unwrap() as i32);
    }
    assert_eq!(seen, [1, 2].into(), "sealed and masked share the load");
    assert_eq!(plaintext.calls.load(Ordering::SeqCst) + unnamed.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_backends_weaker_than_the_pinned_scheme_are_never_called_and_the_refusal_names_the_field() {
    let start = |id: f32, protocol: serde_json::Value| async move {
        Backend::start_signed(id, "embedder", None, Arc::default(), Some(protocol), &pki_dir()).await
    };
    let conforming = start(1.0, masked_protocol(|_| {})).await;
    let plaintext = start(2.0, serde_json::json!({ "executor": "plaintext" })).await;
    let no_shield = start(3.0, masked_protocol(|p| p["masked"]["shield"]["rows"] = 0.into())).await;
    let no_verify = start(4.0, masked_protocol(|p| p["masked"]["verify"] = serde_json::Value::Null)).await;
    let haar = start(5.0, masked_protocol(|p| p["masked"]["mask"] = "haar".into())).await;
    let weaker = [
        (&plaintext, "protection_not_allowed", "plaintext"),
        (&no_shield, "scheme_setting_not_allowed", "protocol.masked.shield.rows"),
        (&no_verify, "scheme_setting_not_allowed", "protocol.masked.verify.probes"),
        (&haar, "scheme_setting_not_allowed", "protocol.masked.mask"),
    ];
    let mut specs = vec![conforming.spec()];
    specs.extend(weaker.iter().map(|(b, _, _)| b.spec()));
    // A policy that names masked: with the project's masked settings pinned by default.
    let pool = Pool::new(policy().allow_protection("masked"), None, fast());
    pool.set_backends(&specs);
    verified(&pool, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // let the others fail at least once
    for _ in 0..8 {
        assert_eq!(embed(&pool).await.unwrap(), 1.0, "only the conforming backend answers");
    }
    for (b, reason, field) in weaker {
        assert_eq!(b.calls.load(Ordering::SeqCst), 0, "{field}: called");
        let st = pool.status().into_iter().find(|s| s.endpoint == b.addr.to_string()).expect("listed");
        assert!(!st.verified() && st.reason.starts_with(reason) && st.reason.contains(field), "{field}: {}", st.reason);
    }
    // Naming the family in the policy accepts it.
    let mut haar_too = policy().allow_protection("masked");
    haar_too.masked.mask_families.push("haar".into());
    let pool = Pool::new(haar_too, None, fast());
    pool.set_backends(&[conforming.spec(), haar.spec()]);
    verified(&pool, 2).await;
}

#[cfg(feature = "kubernetes")]
#[path = "../../../../operator/tests/support/apiserver.rs"]
mod apiserver;

/// The operator's routing ConfigMap through the Kubernetes API (the operator tests' in-memory
/// API server): the policy read once and kept, routes applied as they change, a policy
/// rewritten to trust more refused, a bad table refused, a deleted ConfigMap routing nowhere.
#[cfg(feature = "kubernetes")]
mod configmap {
    use super::*;

    fn routes(backends: &[&Backend], version: u32) -> String {
        let entries: Vec<serde_json::Value> = backends
            .iter()
            .map(|b| {
                serde_json::json!({
                    "pod": format!("e-{}", b.addr.port()), "ip": b.addr.ip().to_string(), "port": b.addr.port(),
                    "tlsSpkiSha256": b.spki, "modelIdentity": hex::encode(MODEL), "schemeIdentity": "", "measurement": ""
                })
            })
            .collect();
        serde_json::json!({"version": version, "pipeline": "demo", "namespace": "rag", "generation": 1,
            "components": {"embedder": entries, "reranker": [], "generator": [], "gateway": []}})
        .to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_routes_configmap_is_followed_through_the_api() {
        let api = apiserver::FakeApiServer::start().await;
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: the only test in this process that reads the environment's kubeconfig.
        unsafe { std::env::set_var("KUBECONFIG", api.write_kubeconfig(dir.path())) };
        let a = Backend::start(1.0, "embedder", None, Arc::default()).await;
        let b = Backend::start(2.0, "embedder", None, Arc::default()).await;
        let policy_json = serde_json::to_string(&policy()).unwrap();
        let cm = |routes: String| {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-routes", "namespace": "rag"},
                "data": {"routes.json": routes, "policy.json": policy_json}})
        };
        api.insert(cm(routes(&[&a], 1)));
        // Another ConfigMap in the namespace must not matter.
        api.insert(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": "rag"}, "data": {}}));

        // The gateway's policy is the ConfigMap's at start, and its digest is what it attests.
        let attested = gateway::backends::routes::configmap_policy("demo-routes", "rag").await.unwrap();
        let digest = attested.digest().unwrap();
        assert_eq!(digest, policy().digest().unwrap());
        let pool = Pool::new(attested, None, fast());
        let _watch =
            gateway::backends::routes::follow_configmap(pool.clone(), "demo-routes".into(), "rag".into(), Some(digest))
                .await
                .unwrap();
        verified(&pool, 1).await;
        assert_eq!(embed(&pool).await.unwrap(), 1.0);

        // Whoever writes the ConfigMap adds a root of its own and allows any measurement, and
        // routes to a backend only that policy accepts: the gateway keeps its attested policy.
        let rogue_pki = dir.path().join("rogue-pki");
        let sealed = Some(serde_json::json!({ "executor": "sealed" }));
        let rogue = Backend::start_signed(7.0, "embedder", None, Arc::default(), sealed, &rogue_pki).await;
        let mut wider = policy();
        wider.trusted_roots.push(TrustedRoot::MockPem(MockPki::load_or_create(&rogue_pki).unwrap().ark_pem()));
        wider.allow_any_measurement = true;
        let wider_json = serde_json::to_string(&wider).unwrap();
        api.update("core/v1/configmaps", "rag", "demo-routes", |o| {
            o["data"]["routes.json"] = routes(&[&a, &rogue], 1).into();
            o["data"]["policy.json"] = wider_json.clone().into();
        });
        for _ in 0..100 {
            if pool.specs().len() == 2 && pool.status().iter().all(|s| s.verified() || s.reason != "not verified yet") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for _ in 0..6 {
            assert_eq!(embed(&pool).await.unwrap(), 1.0);
        }
        assert_eq!(rogue.calls.load(Ordering::SeqCst), 0, "a backend only the rewritten policy trusts was called");
        let st = pool.status();
        let refused = st.iter().find(|s| s.endpoint == rogue.addr.to_string()).unwrap();
        assert!(!refused.verified() && refused.reason.starts_with("mock_root_not_trusted"), "{refused:?}");
        api.update("core/v1/configmaps", "rag", "demo-routes", |o| {
            o["data"]["policy.json"] = policy_json.clone().into()
        });

        // B joins, A leaves.
        api.update("core/v1/configmaps", "rag", "demo-routes", |o| o["data"]["routes.json"] = routes(&[&b], 1).into());
        for _ in 0..100 {
            if pool.specs().len() == 1 && pool.specs()[0].endpoint == b.addr.to_string() && pool.status()[0].verified()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(embed(&pool).await.unwrap(), 2.0);
        let pinned = pool.specs()[0].tls_spki_sha256.unwrap();
        assert_eq!(hex::encode(pinned), b.spki, "the operator's key is pinned");

        // A table of another version is refused; the last good one stays.
        api.update("core/v1/configmaps", "rag", "demo-routes", |o| o["data"]["routes.json"] = routes(&[&a], 2).into());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(pool.specs().len(), 1);
        assert_eq!(embed(&pool).await.unwrap(), 2.0);

        // Deleted: route nowhere, fail closed.
        api.delete("core/v1/configmaps", "rag", "demo-routes");
        for _ in 0..100 {
            if pool.specs().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let s: Status = embed(&pool).await.unwrap_err().into();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(a.calls.load(Ordering::SeqCst), 7);
    }
}
