//! RA-TLS end to end over real TCP on loopback: a tonic server with mock evidence, clients
//! with policies. A rejected peer must fail before any request reaches the server.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use api::v1::attestation_server::{Attestation, AttestationServer};
use api::v1::{GetEvidenceRequest, GetEvidenceResponse};
use attest::ratls::verifier::AttestedClientVerifier;
use attest::ratls::{self, EVIDENCE_OID};
use attest::{AttestError, AttestationService, ExpectedPeer, Policy, ServerIdentity, ServiceClaims, VerifyError};
use common::*;
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

fn identity(role: &str) -> Arc<ServerIdentity> {
    let claims =
        ServiceClaims { model_identity: MODEL, scheme_json: SCHEME.replace("embedder", role), role: role.into() };
    Arc::new(ServerIdentity::generate(Arc::new(issuer()), claims).expect("identity"))
}

fn expected_peer() -> ExpectedPeer {
    ExpectedPeer {
        model_identity: Some(MODEL),
        scheme_identity: Some(attest::scheme_identity(SCHEME).unwrap()),
        tls_spki_sha256: None,
    }
}

/// `Attestation` that counts requests and records the attested client, if any.
#[derive(Clone)]
struct Counting {
    inner: AttestationService,
    calls: Arc<AtomicUsize>,
    clients: Option<Arc<AttestedClientVerifier>>,
    seen_role: Arc<std::sync::Mutex<Option<String>>>,
}

#[tonic::async_trait]
impl Attestation for Counting {
    async fn get_evidence(
        &self,
        request: Request<GetEvidenceRequest>,
    ) -> Result<Response<GetEvidenceResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(clients) = &self.clients {
            let peer = clients.peer_of(&request).ok_or_else(|| Status::unauthenticated("no attested client"))?;
            *self.seen_role.lock().unwrap() = Some(peer.role().to_owned());
        }
        self.inner.get_evidence(request).await
    }
}

struct Served {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    seen_role: Arc<std::sync::Mutex<Option<String>>>,
}

async fn serve(
    config: Arc<ServerConfig>,
    evidence_from: Arc<ServerIdentity>,
    clients: Option<Arc<AttestedClientVerifier>>,
) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen_role = Arc::new(std::sync::Mutex::new(None));
    let svc = Counting {
        inner: AttestationService::new(evidence_from),
        calls: calls.clone(),
        clients,
        seen_role: seen_role.clone(),
    };
    let incoming = ratls::serve_incoming(listener, config);
    tokio::spawn(
        tonic::transport::Server::builder().add_service(AttestationServer::new(svc)).serve_with_incoming(incoming),
    );
    Served { addr, calls, seen_role }
}

async fn serve_identity(id: &Arc<ServerIdentity>) -> Served {
    serve(id.server_config().unwrap(), id.clone(), None).await
}

fn rejection(result: Result<ratls::AttestedChannel, AttestError>) -> VerifyError {
    match result {
        Err(AttestError::PeerRejected(e)) => e,
        Err(other) => panic!("expected a rejection, got {other}"),
        Ok(_) => panic!("expected a rejection, got a connection"),
    }
}

#[tokio::test]
async fn attested_client_connects_and_challenges() {
    let server_id = identity("embedder");
    let served = serve_identity(&server_id).await;
    let channel =
        ratls::connect(&served.addr.to_string(), Arc::new(policy()), expected_peer(), None).await.expect("connects");
    assert_eq!(channel.peer().role(), "embedder");
    assert_eq!(channel.peer().tls_spki_sha256(), &server_id.tls_spki_sha256());
    assert_eq!(served.calls.load(Ordering::SeqCst), 0, "the handshake alone sends no request");

    let fresh = channel.challenge().await.expect("fresh evidence for the same key");
    assert_eq!(fresh.tls_spki_sha256(), &server_id.tls_spki_sha256());
    assert_eq!(fresh.nonce().len(), 32);
    assert_ne!(fresh.nonce(), attest::STARTUP_NONCE);
    let again = channel.challenge().await.unwrap();
    assert_ne!(again.nonce(), fresh.nonce(), "every challenge has a new nonce");
    // Short nonces are refused: they would make replays cheap.
    let short = api::v1::attestation_client::AttestationClient::new(channel.channel())
        .get_evidence(GetEvidenceRequest { nonce: vec![1; 8] })
        .await
        .unwrap_err();
    assert_eq!(short.code(), tonic::Code::InvalidArgument);
    assert_eq!(served.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn wrong_measurement_fails_before_any_request() {
    let served = serve_identity(&identity("embedder")).await;
    let mut p = policy();
    p.measurements = vec![attest::Hex([0x42; 48])];
    let err = rejection(ratls::connect(&served.addr.to_string(), Arc::new(p), expected_peer(), None).await);
    assert!(matches!(err, VerifyError::MeasurementNotAllowed(_)), "{err}");
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn wrong_model_identity_fails_before_any_request() {
    let served = serve_identity(&identity("embedder")).await;
    let expected = ExpectedPeer { model_identity: Some([0x99; 32]), ..expected_peer() };
    let err = rejection(ratls::connect(&served.addr.to_string(), Arc::new(policy()), expected, None).await);
    assert_eq!(err, VerifyError::ModelIdentityMismatch);
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn untrusted_mock_root_fails_before_any_request() {
    let served = serve_identity(&identity("embedder")).await;
    let amd_only = Policy::default().allow_measurement(attest::issuer::default_mock_measurement());
    let err = rejection(ratls::connect(&served.addr.to_string(), Arc::new(amd_only), expected_peer(), None).await);
    assert_eq!(err, VerifyError::MockRootNotTrusted);
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);
}

/// Serves a certificate it does not hold the key for.
#[derive(Debug)]
struct Relay(Arc<CertifiedKey>);

impl ResolvesServerCert for Relay {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn attacker_key() -> rcgen::KeyPair {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
}

fn h2(mut config: ServerConfig) -> Arc<ServerConfig> {
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

fn tls13_server() -> rustls::ConfigBuilder<ServerConfig, rustls::WantsVerifier> {
    ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
}

#[tokio::test]
async fn relayed_certificate_fails_before_any_request() {
    // The attacker copies a genuine service's certificate but cannot sign with its key.
    let victim = identity("embedder");
    let provider = rustls::crypto::ring::default_provider();
    let key = attacker_key();
    let signer = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
        .unwrap();
    let relayed = CertifiedKey::new(vec![victim.certificate().clone()], signer);
    let config = h2(tls13_server().with_no_client_auth().with_cert_resolver(Arc::new(Relay(Arc::new(relayed)))));
    let served = serve(config, victim.clone(), None).await;
    let result = ratls::connect(&served.addr.to_string(), Arc::new(policy()), expected_peer(), None).await;
    assert!(matches!(result, Err(AttestError::Tls(_)) | Err(AttestError::Transport(_))), "{:?}", result.err());
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn evidence_copied_into_another_certificate_fails_before_any_request() {
    // The attacker holds its own key and pastes a genuine service's evidence into its cert.
    let victim = identity("embedder");
    let key = attacker_key();
    let mut params = rcgen::CertificateParams::new(vec!["embedder.gelo.invalid".into()]).unwrap();
    params.custom_extensions.push(rcgen::CustomExtension::from_oid_content(EVIDENCE_OID, victim.evidence().to_bytes()));
    let cert = params.self_signed(&key).unwrap();
    let config = h2(tls13_server()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
        .unwrap());
    let served = serve(config, victim.clone(), None).await;
    let err = rejection(ratls::connect(&served.addr.to_string(), Arc::new(policy()), expected_peer(), None).await);
    assert_eq!(err, VerifyError::TlsKeyMismatch);
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn challenge_answered_for_another_key_is_rejected() {
    // A front that terminates TLS with its own attested identity but forwards GetEvidence
    // to another service: the fresh evidence names the other service's key.
    let front = identity("embedder");
    let other = identity("embedder");
    let served = serve(front.server_config().unwrap(), other.clone(), None).await;
    let channel = ratls::connect(&served.addr.to_string(), Arc::new(policy()), expected_peer(), None).await.unwrap();
    match channel.challenge().await {
        Err(AttestError::PeerRejected(VerifyError::TlsKeyMismatch)) => {}
        other => panic!("expected tls_key_mismatch, got {:?}", other.map(|v| v.summary())),
    }
}

#[tokio::test]
async fn mutual_mode_requires_an_attested_client() {
    let backend = identity("embedder");
    let gateway = identity("gateway");
    let mut only_gateways = policy();
    only_gateways.roles = Some(vec!["gateway".into()]);
    let clients = Arc::new(AttestedClientVerifier::new(Arc::new(only_gateways), ExpectedPeer::default()));
    let config = backend.server_config_mutual(clients.clone()).unwrap();
    let served = serve(config, backend.clone(), Some(clients)).await;
    let target = served.addr.to_string();

    // Without a client certificate the handshake fails.
    let anonymous = ratls::connect(&target, Arc::new(policy()), expected_peer(), None).await;
    let fails = match anonymous {
        Err(_) => true,
        // TLS 1.3 clients learn of a refused certificate only on their first read.
        Ok(ch) => ch.challenge().await.is_err(),
    };
    assert!(fails, "an anonymous client must not be served");
    // An attested embedder is not the gateway the policy asks for.
    let wrong_role = ratls::connect(&target, Arc::new(policy()), expected_peer(), Some(identity("reranker"))).await;
    let fails = match wrong_role {
        Err(_) => true,
        Ok(ch) => ch.challenge().await.is_err(),
    };
    assert!(fails, "a client outside the policy must not be served");
    assert_eq!(served.calls.load(Ordering::SeqCst), 0);

    let channel =
        ratls::connect(&target, Arc::new(policy()), expected_peer(), Some(gateway)).await.expect("gateway connects");
    channel.challenge().await.expect("served");
    assert_eq!(served.seen_role.lock().unwrap().as_deref(), Some("gateway"));
}

/// What a restarted server answers to `GetEvidence`.
#[derive(Clone)]
enum Answer {
    /// Fresh evidence for its own key, bound to the nonce asked.
    Honest(AttestationService),
    /// The same evidence whatever the nonce (a replay of what it once issued).
    Stale(Box<attest::Evidence>),
}

/// `Attestation` that records every nonce it is asked to answer.
#[derive(Clone)]
struct Recording {
    answer: Answer,
    nonces: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

#[tonic::async_trait]
impl Attestation for Recording {
    async fn get_evidence(
        &self,
        request: Request<GetEvidenceRequest>,
    ) -> Result<Response<GetEvidenceResponse>, Status> {
        self.nonces.lock().unwrap().push(request.get_ref().nonce.clone());
        match &self.answer {
            Answer::Honest(inner) => inner.get_evidence(request).await,
            Answer::Stale(evidence) => {
                Ok(Response::new(GetEvidenceResponse { evidence: Some((**evidence).clone().into()) }))
            }
        }
    }
}

/// A server at a fixed address that can be stopped (closing its connections) and replaced.
struct Restartable {
    nonces: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Restartable {
    async fn start(addr: SocketAddr, id: &Arc<ServerIdentity>, answer: Answer) -> Self {
        // The previous server's listener closes a moment after it stops.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind {addr}: {e}"),
            }
        };
        let nonces = Arc::new(std::sync::Mutex::new(Vec::new()));
        let svc = Recording { answer, nonces: nonces.clone() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = ratls::serve_incoming(listener, id.server_config().unwrap());
        let server = tonic::transport::Server::builder()
            .add_service(AttestationServer::new(svc))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            });
        let done = tokio::spawn(async move {
            server.await.unwrap();
        });
        Restartable { nonces, stop, done }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.done.await.unwrap();
        // Let the client's connection task see the connection close.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    fn saw(&self, nonce: &[u8]) -> bool {
        self.nonces.lock().unwrap().iter().any(|n| n == nonce)
    }

    fn calls(&self) -> usize {
        self.nonces.lock().unwrap().len()
    }
}

/// An application request over the channel: `GetEvidence` with a nonce the test recognises.
async fn request(channel: &ratls::AttestedChannel, nonce: &[u8]) -> Result<(), tonic::Status> {
    api::v1::attestation_client::AttestationClient::new(channel.channel())
        .get_evidence(GetEvidenceRequest { nonce: nonce.to_vec() })
        .await
        .map(|_| ())
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test]
async fn a_peer_restarted_with_a_new_key_gets_no_request_until_reattested() {
    let addr = free_addr();
    let first = identity("embedder");
    let server = Restartable::start(addr, &first, Answer::Honest(AttestationService::new(first.clone()))).await;
    let channel = ratls::connect(&addr.to_string(), Arc::new(policy()), expected_peer(), None).await.expect("connects");
    channel.challenge().await.expect("fresh");
    request(&channel, &[0x11; 48]).await.expect("served");
    assert!(server.saw(&[0x11; 48]));
    server.stop().await;

    // Restarted: a new key, a valid startup certificate, and stale evidence on demand.
    let second = identity("embedder");
    let server = Restartable::start(addr, &second, Answer::Stale(Box::new(first.evidence().clone()))).await;
    for _ in 0..3 {
        assert!(request(&channel, &[0x22; 48]).await.is_err(), "the old channel must not reach a new key");
    }
    assert_eq!(server.calls(), 0, "no request, not even a challenge, crossed to the new key");
    match channel.latest_verdict() {
        Some(Err(VerifyError::TlsKeyNotPinned { pinned, .. })) => {
            assert_eq!(pinned, hex::encode(first.tls_spki_sha256()))
        }
        other => panic!("expected tls_key_not_pinned, got {:?}", other.map(|r| r.map(|v| v.summary()))),
    }
    // Attesting it afresh: the certificate passes, the challenge does not (stale evidence).
    let fresh = ratls::connect(&addr.to_string(), Arc::new(policy()), expected_peer(), None).await.expect("handshake");
    assert!(fresh.challenge().await.is_err(), "stale evidence must not re-attest");
    assert!(!server.saw(&[0x22; 48]));
    server.stop().await;

    // An honest restart is re-attested by a new connection, and only then served.
    let third = identity("embedder");
    let server = Restartable::start(addr, &third, Answer::Honest(AttestationService::new(third.clone()))).await;
    assert!(request(&channel, &[0x33; 48]).await.is_err(), "still not the pinned key");
    let fresh = ratls::connect(&addr.to_string(), Arc::new(policy()), expected_peer(), None).await.expect("handshake");
    fresh.challenge().await.expect("re-attested");
    request(&fresh, &[0x33; 48]).await.expect("served after re-attestation");
    assert_eq!(server.calls(), 2, "the challenge, then the request");
    server.stop().await;
}

#[tokio::test]
async fn a_reconnect_is_challenged_before_any_request_crosses() {
    let addr = free_addr();
    let id = identity("embedder");
    let server = Restartable::start(addr, &id, Answer::Honest(AttestationService::new(id.clone()))).await;
    let channel = ratls::connect(&addr.to_string(), Arc::new(policy()), expected_peer(), None).await.expect("connects");
    request(&channel, &[0x11; 48]).await.expect("served");
    server.stop().await;

    // Same key (its certificate replayed), but no fresh evidence: the reconnect's challenge
    // fails and the request never crosses.
    let server = Restartable::start(addr, &id, Answer::Stale(Box::new(id.evidence().clone()))).await;
    assert!(request(&channel, &[0x44; 48]).await.is_err());
    assert!(!server.saw(&[0x44; 48]), "the request crossed an unchallenged reconnect");
    assert_eq!(server.calls(), 1, "exactly the reconnect's challenge");
    match channel.latest_verdict() {
        Some(Err(VerifyError::NonceMismatch)) => {}
        other => panic!("expected nonce_mismatch, got {:?}", other.map(|r| r.map(|v| v.summary()))),
    }
    server.stop().await;

    // The same key answering fresh: the reconnect passes its challenge, then the request crosses.
    let server = Restartable::start(addr, &id, Answer::Honest(AttestationService::new(id.clone()))).await;
    let mut served = false;
    for _ in 0..3 {
        if request(&channel, &[0x55; 48]).await.is_ok() {
            served = true;
            break;
        }
    }
    assert!(served, "a reconnect to the same, fresh peer is served");
    let nonces = server.nonces.lock().unwrap().clone();
    assert_eq!(nonces.len(), 2, "challenge, then request: {nonces:?}");
    assert_ne!(nonces[0], vec![0x55; 48], "the challenge came first");
    assert_eq!(nonces[1], vec![0x55; 48]);
    assert_eq!(
        channel.current_peer().map(|v| v.nonce().to_vec()),
        Some(nonces[0].clone()),
        "the verdict is the challenge's"
    );
    drop(nonces);
    server.stop().await;
}
