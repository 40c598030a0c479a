//! `gelo proxy` as a user on another machine runs it: the gateway's RA-TLS port on a
//! non-loopback address of this machine (the first global IPv4 address `ip` lists; the
//! model services stay on loopback, as inside the gateway's host), `gelo proxy` on
//! loopback pointed at it, and the official `openai` Python client through the proxy
//! (`scripts/openai_client_check.py`: access, models, embeddings, chat whole and
//! streamed, `gelo-rag`), and `curl`. Then gateways that fail the user's policy — another
//! launch measurement, another backend policy, stale evidence — with every call refused by
//! name and none of them reaching the gateway.

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use api::v1::{
    GetEvidenceRequest, GetEvidenceResponse,
    attestation_server::{Attestation, AttestationServer},
};
use attest::{MockIssuer, MockPki, ServerIdentity, ServiceClaims};

use crate::{stack::*, support::*};

/// The first global IPv4 address of this machine: what another machine would dial.
fn non_loopback_ip() -> IpAddr {
    let out = Command::new("ip").args(["-o", "-4", "addr", "show", "scope", "global"]).output().expect("running `ip`");
    let text = String::from_utf8_lossy(&out.stdout);
    let ip = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse::<IpAddr>().ok())
        .unwrap_or_else(|| panic!("this machine has no global IPv4 address to serve the gateway on:\n{text}"));
    assert!(!ip.is_loopback());
    ip
}

/// A running `gelo proxy`.
struct ProxyProc {
    child: Child,
    http: SocketAddr,
    log: PathBuf,
}

impl ProxyProc {
    fn start(name: &str, gateway: &str, extra: &[&str]) -> ProxyProc {
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.log", std::process::id()));
        let (policy, identity) = (policy_file(), hex_identity(&minilm()));
        let mut args = vec!["proxy", "--gateway", gateway, "--policy", policy.to_str().unwrap()];
        args.extend(["--expect-identity", &identity, "--listen", "127.0.0.1:0"]);
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_gelo"))
            .args(&args)
            .env("GELO_UP_DIR", "/nonexistent")
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawning gelo proxy");
        let line = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("GELO_READY role=proxy"))
            .unwrap_or_else(|| panic!("{name} did not start: {}", std::fs::read_to_string(&log).unwrap_or_default()));
        let http = line.split_whitespace().find_map(|w| w.strip_prefix("http=")).unwrap().parse().unwrap();
        ProxyProc { child, http, log }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.http)
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `scripts/openai_client_check.py ARGS` against `base_url` with `key`; panics with its
/// output unless it passes.
fn openai_check(base_url: &str, key: &str, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../scripts/openai_client_check.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--base-url", base_url])
        .args(args)
        .env("OPENAI_API_KEY", key)
        .output()
        .expect("python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openai_client_check.py {args:?} failed:\n{text}");
    eprintln!("{text}");
}

/// An API key in a new keys file: (file, key).
fn api_key(dir: &Path) -> (PathBuf, String) {
    let file = dir.join("api-keys");
    let out = Command::new(env!("CARGO_BIN_EXE_gelo"))
        .args(["api-key", "new", "--keys-file", file.to_str().unwrap(), "--name", "proxy-e2e"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (file, String::from_utf8(out.stdout).unwrap().trim().to_string())
}

/// HTTP requests a gateway has counted (the OpenAI routes, documents, trust, and its access
/// and admission refusals; any code), from its metrics.
async fn http_requests(gw: &Proc) -> f64 {
    let mut n = 0.0;
    for family in ["method=\"openai.", "method=\"http."] {
        n += gw.metric("gelo_requests_total", family).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_works_through_the_proxy_and_refused_gateways_get_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ip = non_loopback_ip();
    let listen = format!("{ip}:0");
    let embedder = service("proxy-embedder", "embedder", &minilm(), &[], &[]);
    let generator = service("proxy-generator", "generator", &smollm(), &[], &[]);
    let (keys, key) = api_key(dir.path());
    let (minilm_id, smollm_id) = (hex_identity(&minilm()), hex_identity(&smollm()));
    let backends = [
        "--listen",
        &listen,
        "--api-keys-file",
        keys.to_str().unwrap(),
        "--embedder",
        &embedder.target(),
        "--embedder-identity",
        &minilm_id,
        "--generator",
        &generator.target(),
        "--generator-identity",
        &smollm_id,
    ];

    // The gateway the policy accepts: no plain-HTTP port at all, only RA-TLS on `ip`.
    let gw = gelo_gateway("proxy-gateway", &dir.path().join("data"), &backends, &[]);
    assert_eq!(gw.grpc.ip(), ip);
    let proxy = ProxyProc::start("proxy", &gw.target(), &[]);
    openai_check(&proxy.base_url(), &key, &["--add-document"]);
    // curl, as it is.
    let auth = format!("Authorization: Bearer {key}");
    let curl =
        Command::new("curl").args(["-sS", "-H", &auth, &format!("{}/models", proxy.base_url())]).output().unwrap();
    assert!(String::from_utf8_lossy(&curl.stdout).contains("\"gelo-rag\""), "{curl:?}");
    assert!(http_requests(&gw).await >= 6.0, "the calls reached the gateway");
    let log = std::fs::read_to_string(&proxy.log).unwrap();
    assert!(log.contains("gateway verified") && !log.contains(&key), "{log}");
    let check = Command::new(env!("CARGO_BIN_EXE_gelo"))
        .args(["proxy", "--check", "--gateway", &gw.target(), "--policy", policy_file().to_str().unwrap()])
        .env("GELO_UP_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let proved: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(proved["verified"], true);
    assert_eq!(proved["role"], "gateway");
    assert_eq!(proved["measurement"], hex::encode(attest::issuer::default_mock_measurement()));
    assert_eq!(proved["backend_policy_sha256"], hex::encode(policy().digest().unwrap()));
    assert_eq!(proved["scheme"]["role"], "gateway");

    // Another launch measurement: refused in the handshake.
    let measurement = "ba".repeat(48);
    let data = dir.path().join("data-measurement");
    let other = gelo_gateway("proxy-gateway-measurement", &data, &backends, &[("GELO_MOCK_MEASUREMENT", &measurement)]);
    refused(&other, &key, "measurement_not_allowed").await;

    // Another backend policy: P plus a root the user never agreed to, and any measurement.
    let mut wider = (*policy()).clone();
    let untrusted = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-e2e-untrusted-mock-pki");
    wider.trusted_roots.push(attest::TrustedRoot::MockPem(MockPki::load_or_create(&untrusted).unwrap().ark_pem()));
    wider.allow_any_measurement = true;
    let wider_file = dir.path().join("wider.yaml");
    std::fs::write(&wider_file, wider.to_yaml()).unwrap();
    let mut args = vec!["--policy", wider_file.to_str().unwrap()];
    args.extend_from_slice(&backends);
    let wide = gelo_gateway("proxy-gateway-wider", &dir.path().join("data-wider"), &args, &[]);
    refused(&wide, &key, "gateway_policy_mismatch").await;

    // Stale evidence: a valid certificate, but the same old evidence whatever the nonce.
    let stale = StaleGateway::start(ip).await;
    let proxy = ProxyProc::start("proxy-stale", &stale.addr.to_string(), &[]);
    openai_check(&proxy.base_url(), &key, &["--expect-refusal", "nonce_mismatch"]);
    assert_eq!(stale.forwarded.load(Ordering::SeqCst), 0, "a request crossed to the stale gateway");
    assert!(stale.challenges.load(Ordering::SeqCst) >= 7, "each call asked for fresh evidence");
}

/// A `gelo gateway` over `data` with the test policy (unless `args` names another) and `args`.
fn gelo_gateway(name: &str, data: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let (policy, minilm) = (policy_file(), minilm());
    let mut all = vec!["gateway", "--model", minilm.to_str().unwrap(), "--metrics-listen", "127.0.0.1:0"];
    all.extend(["--data-dir", data.to_str().unwrap()]);
    if !args.contains(&"--policy") {
        all.extend(["--policy", policy.to_str().unwrap()]);
    }
    all.extend_from_slice(args);
    Proc::start(name, &all, env)
}

/// Through a proxy to `gw`, every call of the openai client is refused with `reason`, and
/// none reaches the gateway.
async fn refused(gw: &Proc, key: &str, reason: &str) {
    let proxy = ProxyProc::start(&format!("proxy-{reason}"), &gw.target(), &[]);
    openai_check(&proxy.base_url(), key, &["--expect-refusal", reason]);
    assert_eq!(http_requests(gw).await, 0.0, "a request reached the refused gateway");
    let check = Command::new(env!("CARGO_BIN_EXE_gelo"))
        .args(["proxy", "--check", "--gateway", &gw.target(), "--policy", policy_file().to_str().unwrap()])
        .env("GELO_UP_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1), "{}", String::from_utf8_lossy(&check.stdout));
    let verdict: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!((verdict["verified"].as_bool(), verdict["reason"].as_str()), (Some(false), Some(reason)));
}

/// A gateway impostor on `ip`: its RA-TLS certificate carries valid evidence (trusted mock
/// root, default measurement, MiniLM, the test backend policy), but asked for evidence for a
/// fresh nonce it replays the evidence it was started with. Counts the challenges and every
/// other request.
struct StaleGateway {
    addr: SocketAddr,
    forwarded: Arc<AtomicUsize>,
    challenges: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Replay {
    evidence: attest::Evidence,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Attestation for Replay {
    async fn get_evidence(
        &self,
        _: tonic::Request<GetEvidenceRequest>,
    ) -> Result<tonic::Response<GetEvidenceResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(tonic::Response::new(GetEvidenceResponse { evidence: Some(self.evidence.clone().into()) }))
    }
}

impl StaleGateway {
    async fn start(ip: IpAddr) -> StaleGateway {
        let issuer = Arc::new(MockIssuer::load_or_create(pki_dir()).unwrap());
        let scheme = serde_json::json!({
            "role": "gateway", "store": "redb/aes-256-gcm", "chunk_tokens": 200, "chunk_overlap": 40,
            gateway::BACKEND_POLICY_FIELD: hex::encode(policy().digest().unwrap()),
        });
        let claims = ServiceClaims {
            model_identity: identity(&minilm()),
            scheme_json: scheme.to_string(),
            role: "gateway".into(),
        };
        let id = Arc::new(ServerIdentity::generate(issuer, claims).unwrap());
        let (forwarded, challenges) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let replay = Replay { evidence: id.evidence().clone(), calls: challenges.clone() };
        let mut routes = tonic::service::Routes::new(AttestationServer::new(replay));
        let count = forwarded.clone();
        let router = std::mem::take(routes.axum_router_mut()).fallback(move || {
            count.fetch_add(1, Ordering::SeqCst);
            async { http::StatusCode::OK }
        });
        *routes.axum_router_mut() = router;
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = attest::ratls::serve_incoming(listener, id.server_config().unwrap());
        tokio::spawn(tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming));
        tokio::time::sleep(Duration::from_millis(100)).await;
        StaleGateway { addr, forwarded, challenges }
    }
}
