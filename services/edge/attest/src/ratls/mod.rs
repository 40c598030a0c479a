//! RA-TLS: TLS whose certificate carries SEV-SNP evidence bound to the certificate's own
//! key, so a peer is accepted for what it runs, not for who signed its certificate.
//!
//! A service makes a [`ServerIdentity`] at start: a fresh TLS key generated inside the
//! CVM, evidence binding (model identity, scheme identity, SHA-256 of the key's SPKI,
//! [`STARTUP_NONCE`]), and a self-signed certificate carrying that evidence in the
//! [`EVIDENCE_OID`] extension. A client verifies the evidence during the handshake
//! ([`verifier::AttestedServerVerifier`]) before any application byte flows; the TLS 1.3
//! CertificateVerify then proves the peer holds that key, so a copied certificate is
//! useless. Freshness comes after the handshake: `Attestation.GetEvidence(nonce)` must
//! return evidence bound to the same key ([`crate::challenge`]).
//!
//! Only TLS 1.3, only rustls with ring, and no session resumption: every connection is
//! verified from scratch.

mod transport;
pub mod verifier;

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::NoServerSessionStorage;
use rustls::{ClientConfig, ServerConfig};
use x509_cert::der::{Decode, Encode};

pub use transport::{AttestedChannel, RaTlsConnector, connect, error_chain, serve_incoming};

use crate::binding::{STARTUP_NONCE, spki_sha256};
use crate::error::{AttestError, Result};
use crate::evidence::{Evidence, ServiceClaims};
use crate::issuer::{ReportIssuer, issue_evidence};
use crate::verify::VerifyError;

/// OID of the certificate extension holding `gelo.v1.Evidence` (protobuf bytes as the
/// extension's OCTET STRING). Provisional: GELO has no IANA private enterprise number yet.
pub const EVIDENCE_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 59999, 1, 1];
const EVIDENCE_OID_STR: &str = "1.3.6.1.4.1.59999.1.1";

/// ALPN for gRPC over our TLS.
const ALPN_H2: &[u8] = b"h2";

/// The TLS crypto: ring only (no aws-lc-rs, no OpenSSL in the graph).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

/// A service's attested TLS identity: key, certificate with embedded evidence, and the
/// issuer to produce fresh evidence for the same key.
pub struct ServerIdentity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    tls_spki_sha256: [u8; 32],
    evidence: Evidence,
    claims: ServiceClaims,
    issuer: Arc<dyn ReportIssuer>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("role", &self.claims.role)
            .field("tls_spki_sha256", &hex::encode(self.tls_spki_sha256))
            .field("issuer", &self.issuer.kind())
            .finish_non_exhaustive()
    }
}

impl ServerIdentity {
    /// Generates a TLS key (ECDSA P-256) and a self-signed certificate carrying evidence for
    /// `claims` bound to that key and [`STARTUP_NONCE`]. The private key never leaves
    /// this process.
    pub fn generate(issuer: Arc<dyn ReportIssuer>, claims: ServiceClaims) -> Result<Self> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| AttestError::Tls(e.to_string()))?;
        use rcgen::PublicKeyData as _;
        let tls_spki_sha256 = spki_sha256(&key.subject_public_key_info());
        let evidence = issue_evidence(issuer.as_ref(), &claims, tls_spki_sha256, &STARTUP_NONCE)?;

        let role = if claims.role.is_empty() { "service" } else { claims.role.as_str() };
        let mut params = rcgen::CertificateParams::new(vec![format!("{role}.gelo.invalid")])
            .map_err(|e| AttestError::Tls(e.to_string()))?;
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("gelo {role} (RA-TLS)"));
        params.custom_extensions.push(rcgen::CustomExtension::from_oid_content(EVIDENCE_OID, evidence.to_bytes()));
        let cert = params.self_signed(&key).map_err(|e| AttestError::Tls(e.to_string()))?;

        // What a peer will hash is the SPKI as it appears in the certificate.
        let (_, in_cert) = evidence_from_certificate(cert.der()).map_err(|e| AttestError::Tls(e.to_string()))?;
        if in_cert != tls_spki_sha256 {
            return Err(AttestError::Tls("certificate SPKI differs from the generated key".into()));
        }
        Ok(Self {
            cert: cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            tls_spki_sha256,
            evidence,
            claims,
            issuer,
        })
    }

    /// The evidence embedded in the certificate (nonce = [`STARTUP_NONCE`]).
    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }
    pub fn tls_spki_sha256(&self) -> [u8; 32] {
        self.tls_spki_sha256
    }
    pub fn claims(&self) -> &ServiceClaims {
        &self.claims
    }

    /// Fresh evidence for the same claims and TLS key, bound to `nonce`.
    pub fn fresh_evidence(&self, nonce: &[u8]) -> Result<Evidence> {
        issue_evidence(self.issuer.as_ref(), &self.claims, self.tls_spki_sha256, nonce)
    }

    fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }

    /// Server config without client authentication.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| AttestError::Tls(e.to_string()))?;
        finish_server(builder.with_no_client_auth(), self)
    }

    /// Server config that requires an attested client (e.g. a backend that only serves an
    /// attested gateway). Read the client's evidence with
    /// [`verifier::AttestedClientVerifier::peer_of`].
    pub fn server_config_mutual(&self, clients: Arc<verifier::AttestedClientVerifier>) -> Result<Arc<ServerConfig>> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| AttestError::Tls(e.to_string()))?;
        finish_server(builder.with_client_cert_verifier(clients), self)
    }

    /// Client config presenting this identity as a client certificate (mutual mode).
    pub(crate) fn client_config(&self, servers: Arc<verifier::AttestedServerVerifier>) -> Result<ClientConfig> {
        client_builder(servers)?
            .with_client_auth_cert(vec![self.cert.clone()], self.private_key())
            .map_err(|e| AttestError::Tls(e.to_string()))
    }
}

fn finish_server(
    builder: rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>,
    identity: &ServerIdentity,
) -> Result<Arc<ServerConfig>> {
    let mut config = builder
        .with_single_cert(vec![identity.cert.clone()], identity.private_key())
        .map_err(|e| AttestError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // No resumption: a resumed session would skip certificate verification.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

pub(crate) fn client_builder(
    servers: Arc<verifier::AttestedServerVerifier>,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| AttestError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(servers))
}

pub(crate) fn finish_client(mut config: ClientConfig) -> Arc<ClientConfig> {
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// The evidence in an RA-TLS certificate and SHA-256 of the certificate's SPKI. Parsing
/// only: nothing is verified.
pub fn evidence_from_certificate(cert_der: &[u8]) -> Result<(Evidence, [u8; 32]), VerifyError> {
    let cert = x509_cert::Certificate::from_der(cert_der)
        .map_err(|e| VerifyError::EvidenceMalformed(format!("TLS certificate: {e}")))?;
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| VerifyError::EvidenceMalformed(format!("TLS certificate SPKI: {e}")))?;
    let mut found =
        cert.tbs_certificate.extensions.iter().flatten().filter(|e| e.extn_id.to_string() == EVIDENCE_OID_STR);
    let ext = found
        .next()
        .ok_or_else(|| VerifyError::EvidenceMalformed("TLS certificate carries no evidence extension".into()))?;
    if found.next().is_some() {
        return Err(VerifyError::EvidenceMalformed("TLS certificate carries two evidence extensions".into()));
    }
    let evidence =
        Evidence::from_bytes(ext.extn_value.as_bytes()).map_err(|e| VerifyError::EvidenceMalformed(e.to_string()))?;
    Ok((evidence, spki_sha256(&spki)))
}
