//! `Evidence`: an SEV-SNP report, its ARK → ASK → VCEK chain, and the claims whose hash the
//! report's REPORT_DATA carries. Mirrors `gelo.v1.Evidence`; its byte form is that
//! message's protobuf encoding, which is also what an RA-TLS certificate embeds.

use prost::Message;

use crate::binding::{Binding, scheme_identity};
use crate::error::{AttestError, Result};

/// Evidence larger than this is refused before decoding (a real one is about 6 KiB).
pub const MAX_EVIDENCE_BYTES: usize = 64 * 1024;

/// Who produced the report. Only informative until a verifier has matched the chain to a
/// trusted root; [`crate::Verified::issuer`] is the proven kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IssuerKind {
    /// The AMD Secure Processor, through `/dev/sev-guest`.
    SevSnp,
    /// [`crate::MockIssuer`]: a software test PKI shaped like AMD's.
    Mock,
}

impl IssuerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SevSnp => "sev-snp",
            Self::Mock => "mock",
        }
    }
}

impl std::fmt::Display for IssuerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for IssuerKind {
    type Err = AttestError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sev-snp" => Ok(Self::SevSnp),
            "mock" => Ok(Self::Mock),
            other => Err(AttestError::Encoding(format!("unknown issuer kind {other:?}"))),
        }
    }
}

/// The DER certificates that certify a report's signing key, root first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertChain {
    pub ark_der: Vec<u8>,
    pub ask_der: Vec<u8>,
    pub vcek_der: Vec<u8>,
}

/// What a service says about itself; the evidence's REPORT_DATA commits to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceClaims {
    /// SHA-256 of the canonical model manifest.
    pub model_identity: [u8; 32],
    /// The protocol settings (mask family, shield, U-Verify, engine kind, role) as JSON.
    pub scheme_json: String,
    /// embedder, reranker, generator or gateway.
    pub role: String,
}

impl ServiceClaims {
    pub fn scheme_identity(&self) -> Result<[u8; 32]> {
        scheme_identity(&self.scheme_json)
    }
}

/// SEV-SNP evidence as it travels (`gelo.v1.Evidence`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The 1184-byte ATTESTATION_REPORT as signed.
    pub report: Vec<u8>,
    pub ark_der: Vec<u8>,
    pub ask_der: Vec<u8>,
    pub vcek_der: Vec<u8>,
    pub model_identity: [u8; 32],
    pub scheme_identity: [u8; 32],
    pub tls_spki_sha256: [u8; 32],
    pub nonce: Vec<u8>,
    pub issuer: IssuerKind,
    pub role: String,
    pub scheme_json: String,
}

impl Evidence {
    /// The binding this evidence claims; a verifier recomputes REPORT_DATA from it.
    pub fn binding(&self) -> Binding {
        Binding {
            model_identity: self.model_identity,
            scheme_identity: self.scheme_identity,
            tls_spki_sha256: self.tls_spki_sha256,
            nonce: self.nonce.clone(),
        }
    }

    pub fn chain(&self) -> CertChain {
        CertChain { ark_der: self.ark_der.clone(), ask_der: self.ask_der.clone(), vcek_der: self.vcek_der.clone() }
    }

    /// Protobuf encoding of `gelo.v1.Evidence`.
    pub fn to_bytes(&self) -> Vec<u8> {
        api::v1::Evidence::from(self.clone()).encode_to_vec()
    }

    /// Decodes `gelo.v1.Evidence`; wrong field widths, unknown issuers and oversized input
    /// are typed errors.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_EVIDENCE_BYTES {
            return Err(AttestError::Encoding(format!(
                "evidence is {} bytes, more than the {MAX_EVIDENCE_BYTES} accepted",
                bytes.len()
            )));
        }
        let proto = api::v1::Evidence::decode(bytes).map_err(|e| AttestError::Encoding(e.to_string()))?;
        Self::try_from(proto)
    }
}

impl From<Evidence> for api::v1::Evidence {
    fn from(e: Evidence) -> Self {
        Self {
            report: e.report,
            ark_der: e.ark_der,
            ask_der: e.ask_der,
            vcek_der: e.vcek_der,
            model_identity: e.model_identity.to_vec(),
            scheme_identity: e.scheme_identity.to_vec(),
            tls_spki_sha256: e.tls_spki_sha256.to_vec(),
            nonce: e.nonce,
            issuer: e.issuer.as_str().to_owned(),
            role: e.role,
            scheme_json: e.scheme_json,
        }
    }
}

impl TryFrom<api::v1::Evidence> for Evidence {
    type Error = AttestError;

    fn try_from(p: api::v1::Evidence) -> Result<Self> {
        Ok(Self {
            model_identity: fixed("model_identity", &p.model_identity)?,
            scheme_identity: fixed("scheme_identity", &p.scheme_identity)?,
            tls_spki_sha256: fixed("tls_spki_sha256", &p.tls_spki_sha256)?,
            issuer: p.issuer.parse()?,
            report: p.report,
            ark_der: p.ark_der,
            ask_der: p.ask_der,
            vcek_der: p.vcek_der,
            nonce: p.nonce,
            role: p.role,
            scheme_json: p.scheme_json,
        })
    }
}

/// A DER certificate as PEM, for tools that want files (`snpguest`, `openssl`).
pub fn certificate_pem(der: &[u8]) -> Result<String> {
    use x509_cert::der::{Decode, EncodePem};
    x509_cert::Certificate::from_der(der)
        .and_then(|c| c.to_pem(x509_cert::der::pem::LineEnding::LF))
        .map_err(|e| AttestError::Encoding(format!("certificate: {e}")))
}

fn fixed<const N: usize>(field: &str, bytes: &[u8]) -> Result<[u8; N]> {
    bytes.try_into().map_err(|_| AttestError::Encoding(format!("{field} must be {N} bytes, got {}", bytes.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Evidence {
        Evidence {
            report: vec![7; 1184],
            ark_der: vec![1, 2, 3],
            ask_der: vec![4, 5],
            vcek_der: vec![6],
            model_identity: [9; 32],
            scheme_identity: [8; 32],
            tls_spki_sha256: [7; 32],
            nonce: vec![0; 32],
            issuer: IssuerKind::Mock,
            role: "embedder".into(),
            scheme_json: r#"{"role":"embedder"}"#.into(),
        }
    }

    #[test]
    fn proto_round_trip_is_lossless() {
        let e = sample();
        assert_eq!(Evidence::try_from(api::v1::Evidence::from(e.clone())).unwrap(), e);
        assert_eq!(Evidence::from_bytes(&e.to_bytes()).unwrap(), e);
    }

    #[test]
    fn wrong_widths_and_issuers_are_rejected() {
        let mut p = api::v1::Evidence::from(sample());
        p.model_identity.pop();
        assert!(matches!(Evidence::try_from(p), Err(AttestError::Encoding(_))));
        let mut p = api::v1::Evidence::from(sample());
        p.issuer = "intel".into();
        assert!(matches!(Evidence::try_from(p), Err(AttestError::Encoding(_))));
    }

    #[test]
    fn oversized_input_is_rejected_before_decoding() {
        assert!(matches!(Evidence::from_bytes(&vec![0; MAX_EVIDENCE_BYTES + 1]), Err(AttestError::Encoding(_))));
    }
}
