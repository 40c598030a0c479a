//! SEV-SNP attestation for GELO: evidence, issuers, verifier with policy, RA-TLS.
//!
//! Where things are:
//! - [`evidence`]: `Evidence` (mirrors `gelo.v1.Evidence`) and its byte form.
//! - [`binding`]: what REPORT_DATA commits to (model, scheme, TLS key, nonce).
//! - [`report`]: the ATTESTATION_REPORT layout and its raw signature.
//! - [`issuer`]: reports from `/dev/sev-guest` (`HardwareIssuer`) or a mock AMD-SP (`MockIssuer`).
//! - [`derived_key`]: keys the AMD-SP derives from the launch (`SNP_GET_DERIVED_KEY`), for sealing.
//! - [`verify`]: where evidence is verified; every rejection is a distinct `VerifyError`
//!   ([`rejection`]).
//! - [`policy`]: what a verifier accepts (JSON/YAML); [`role`] the attested model roles.
//! - [`release`]: the release log a policy can require for its measurements (manifests,
//!   signed checkpoints, inclusion and consistency proofs).
//! - [`ratls`]: RA-TLS certificates, rustls verifiers (`ratls::verifier`), tonic transport.
//! - [`service`]: the `Attestation.GetEvidence` server; [`challenge`] its client side.
//!
//! Kept free of model code so the operator and the gateway can depend on it cheaply.

pub mod amd;
pub mod binding;
pub mod challenge;
pub mod derived_key;
mod error;
pub mod evidence;
mod fixed_hex;
pub mod issuer;
pub mod policy;
pub mod ratls;
pub mod rejection;
pub mod release;
pub mod report;
pub mod role;
pub mod service;
pub mod verify;

pub use binding::{Binding, STARTUP_NONCE, report_data, scheme_identity, spki_sha256};
pub use challenge::{challenge, random_nonce};
pub use error::{AttestError, Result};
pub use evidence::{CertChain, Evidence, IssuerKind, ServiceClaims};
pub use issuer::{
    HardwareIssuer, IssuedReport, MockCa, MockCrl, MockIssuer, MockPki, MockSettings, ReportIssuer, issue_evidence,
    issuer_from_env_or_default,
};
pub use policy::{CrlSource, DualLpnRequirements, Hex, MaskedRequirements, Policy, TrustedRoot};
pub use ratls::ServerIdentity;
pub use ratls::verifier::ExpectedPeer;
pub use report::Tcb;
pub use role::Role;
pub use service::AttestationService;
pub use verify::{ExpectedBinding, Verified, VerifiedReport, VerifiedSummary, Verifier, VerifyError, verify};
