//! The crate's error type for everything except a verdict: issuing, loading, encoding,
//! transport. A rejected piece of evidence is a [`crate::VerifyError`] instead, so that a
//! caller can tell "the peer is not trusted" from "something broke".

use std::path::PathBuf;

use crate::rejection::VerifyError;

#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    /// `/dev/sev-guest` does not exist: this is not an SEV-SNP guest (or the driver is not
    /// loaded). Hardware evidence cannot be produced here.
    #[error("no SEV-SNP guest device at {0}: not running in an SEV-SNP CVM (or the sev-guest driver is not loaded)")]
    SevDeviceAbsent(PathBuf),
    /// The AMD-SP refused or failed the guest request.
    #[error("SNP_GET_EXT_REPORT failed: {0}")]
    Firmware(String),
    /// The derived-key request could not be made (the device did not open) or failed.
    #[error("SNP_GET_DERIVED_KEY failed: {0}")]
    DerivedKey(String),
    /// Neither the extended report nor the configured cache holds a usable VCEK chain.
    #[error("no VCEK certificate chain: {0}")]
    MissingCertificates(String),
    #[error("mock PKI at {path}: {detail}")]
    MockPki { path: PathBuf, detail: String },
    #[error("{what}: {detail}")]
    Crypto { what: &'static str, detail: String },
    #[error("report encoding: {0}")]
    Report(String),
    #[error("evidence encoding: {0}")]
    Encoding(String),
    #[error("invalid scheme JSON: {0}")]
    SchemeJson(String),
    #[error("invalid hex for {what}: {detail}")]
    Hex { what: &'static str, detail: String },
    #[error("policy {path}: {detail}")]
    Policy { path: PathBuf, detail: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("transport: {0}")]
    Transport(String),
    /// The peer presented evidence and it was rejected.
    #[error("peer evidence rejected: {0}")]
    PeerRejected(#[from] VerifyError),
    #[error("attestation RPC failed: {0}")]
    Rpc(String),
    #[error("invalid nonce: {0}")]
    Nonce(String),
    /// A setting (environment variable or flag) has an unusable value.
    #[error("configuration: {0}")]
    Config(String),
}

impl AttestError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    pub(crate) fn crypto(what: &'static str, detail: impl std::fmt::Display) -> Self {
        Self::Crypto { what, detail: detail.to_string() }
    }

    /// The verifier's reason when the error is a rejected peer, for logs and metrics.
    pub fn rejection(&self) -> Option<&VerifyError> {
        match self {
            Self::PeerRejected(e) => Some(e),
            _ => None,
        }
    }
}

pub type Result<T, E = AttestError> = std::result::Result<T, E>;
