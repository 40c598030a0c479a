//! rustls verifiers that replace WebPKI with attestation: they accept self-signed
//! certificates, and are safe because the evidence inside is verified against a policy
//! and bound to the certificate's key. They implement rustls's `danger` traits, but they
//! are the production path, so they do not live in a module of that name: in this project
//! `danger` names only deliberate opt-outs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme};
use sha2::{Digest, Sha256};

use super::{evidence_from_certificate, provider};
use crate::binding::STARTUP_NONCE;
use crate::policy::Policy;
use crate::verify::{ExpectedBinding, Verified, Verifier, VerifyError};

/// Identities a peer must prove, beyond what the policy requires of everyone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedPeer {
    pub model_identity: Option<[u8; 32]>,
    pub scheme_identity: Option<[u8; 32]>,
    /// SHA-256 of the TLS key's SPKI the peer must present (a routing table's pin). The
    /// connector also pins the key of its first verified connection for every reconnect.
    pub tls_spki_sha256: Option<[u8; 32]>,
}

/// Verifies the evidence in a peer's RA-TLS certificate: bound to the certificate's own key
/// and the startup nonce, accepted by `policy`, and matching `expected`.
pub fn verify_certificate(
    cert_der: &[u8],
    expected: &ExpectedPeer,
    policy: &Policy,
    verifier: &Verifier,
) -> Result<Verified, VerifyError> {
    let (evidence, tls_spki_sha256) = evidence_from_certificate(cert_der)?;
    let binding = ExpectedBinding {
        model_identity: expected.model_identity,
        scheme_identity: expected.scheme_identity,
        // The relay defence: evidence must name the key this handshake proves possession of.
        tls_spki_sha256: Some(tls_spki_sha256),
        nonce: STARTUP_NONCE.to_vec(),
    };
    let verified = verifier.verify(&evidence, &binding, policy)?;
    match expected.tls_spki_sha256 {
        Some(pin) if pin != tls_spki_sha256 => {
            Err(VerifyError::TlsKeyNotPinned { got: hex::encode(tls_spki_sha256), pinned: hex::encode(pin) })
        }
        _ => Ok(verified),
    }
}

fn rejected(e: VerifyError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

/// Client side: accepts a server only if its certificate's evidence verifies. Build one
/// per connection to read the outcome back with [`Self::outcome`] (what
/// [`super::connect`] does).
#[derive(Debug)]
pub struct AttestedServerVerifier {
    policy: Arc<Policy>,
    expected: ExpectedPeer,
    verifier: Verifier,
    outcome: Mutex<Option<Result<Verified, VerifyError>>>,
}

impl AttestedServerVerifier {
    pub fn new(policy: Arc<Policy>, expected: ExpectedPeer) -> Self {
        Self { policy, expected, verifier: Verifier::new(), outcome: Mutex::new(None) }
    }

    /// The verdict of the latest handshake: the peer's proven facts, or why it was refused.
    pub fn outcome(&self) -> Option<Result<Verified, VerifyError>> {
        self.outcome.lock().ok()?.clone()
    }
}

impl ServerCertVerifier for AttestedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The server name is not an identity here: the evidence is.
        let verdict = verify_certificate(end_entity, &self.expected, &self.policy, &self.verifier);
        match &verdict {
            Ok(v) => tracing::debug!(role = v.role(), root = v.root(), "RA-TLS server evidence accepted"),
            Err(e) => tracing::warn!(reason = e.reason(), error = %e, "RA-TLS server evidence rejected"),
        }
        let result = verdict.clone().map(|_| ServerCertVerified::assertion()).map_err(rejected);
        if let Ok(mut slot) = self.outcome.lock() {
            *slot = Some(verdict);
        }
        result
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}

/// How many verified client certificates a server remembers for [`AttestedClientVerifier::peer_of`].
const CLIENT_CACHE: usize = 1024;

/// Server side of mutual RA-TLS: requires a client certificate whose evidence verifies.
/// One verifier serves all connections; it remembers the latest verified clients by
/// certificate hash so handlers can read who called.
#[derive(Debug)]
pub struct AttestedClientVerifier {
    policy: Arc<Policy>,
    expected: ExpectedPeer,
    verifier: Verifier,
    verified: Mutex<VecDeque<([u8; 32], Verified)>>,
}

impl AttestedClientVerifier {
    pub fn new(policy: Arc<Policy>, expected: ExpectedPeer) -> Self {
        Self { policy, expected, verifier: Verifier::new(), verified: Mutex::new(VecDeque::new()) }
    }

    /// What the client with this certificate proved during its handshake.
    pub fn peer(&self, cert: &CertificateDer<'_>) -> Option<Verified> {
        let key: [u8; 32] = Sha256::digest(cert.as_ref()).into();
        let cache = self.verified.lock().ok()?;
        cache.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
    }

    /// The verified client behind a tonic request served over [`super::serve_incoming`].
    pub fn peer_of<T>(&self, request: &tonic::Request<T>) -> Option<Verified> {
        let certs = request.peer_certs()?;
        self.peer(certs.first()?)
    }
}

impl ClientCertVerifier for AttestedClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match verify_certificate(end_entity, &self.expected, &self.policy, &self.verifier) {
            Ok(verified) => {
                tracing::debug!(role = verified.role(), "RA-TLS client evidence accepted");
                let key: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
                if let Ok(mut cache) = self.verified.lock() {
                    cache.retain(|(k, _)| *k != key);
                    if cache.len() == CLIENT_CACHE {
                        cache.pop_front();
                    }
                    cache.push_back((key, verified));
                }
                Ok(ClientCertVerified::assertion())
            }
            Err(e) => {
                tracing::warn!(reason = e.reason(), error = %e, "RA-TLS client evidence rejected");
                Err(rejected(e))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}
