//! Fixtures shared by the integration tests: one mock PKI per target dir (RSA-4096 key
//! generation is slow, so it is generated once and reused across test binaries and runs),
//! claims, and a policy that trusts the mock root.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use attest::{
    ExpectedBinding, IssuerKind, MockIssuer, MockPki, Policy, ServiceClaims, TrustedRoot, issue_evidence,
    issuer::default_mock_measurement,
};

pub const MODEL: [u8; 32] = [0x11; 32];
pub const TLS_KEY: [u8; 32] = [0x22; 32];
pub const NONCE: [u8; 32] = [0x33; 32];
pub const SCHEME: &str = r#"{"role":"embedder","protocol":{"executor":"sealed"},"mask":"haar","shield":{"k":8,"energy":4.0},"uverify":{"probes":2}}"#;

pub fn pki_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-attest-test-pki")
}

/// The shared mock PKI (generated on first use, then loaded).
pub fn pki() -> Arc<MockPki> {
    static PKI: OnceLock<Arc<MockPki>> = OnceLock::new();
    PKI.get_or_init(|| Arc::new(MockPki::load_or_create(&pki_dir()).expect("mock PKI"))).clone()
}

pub fn issuer() -> MockIssuer {
    MockIssuer::new(pki())
}

pub fn claims() -> ServiceClaims {
    ServiceClaims { model_identity: MODEL, scheme_json: SCHEME.into(), role: "embedder".into() }
}

/// Trusts the shared mock root and its default measurement; everything else is default.
pub fn policy() -> Policy {
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(pki().ark_pem())])
        .allow_measurement(default_mock_measurement())
}

pub fn expected() -> ExpectedBinding {
    ExpectedBinding {
        model_identity: Some(MODEL),
        scheme_identity: Some(attest::scheme_identity(SCHEME).unwrap()),
        tls_spki_sha256: Some(TLS_KEY),
        nonce: NONCE.to_vec(),
    }
}

pub fn evidence_from(issuer: &MockIssuer) -> attest::Evidence {
    let e = issue_evidence(issuer, &claims(), TLS_KEY, &NONCE).expect("issue");
    assert_eq!(e.issuer, IssuerKind::Mock);
    e
}

pub fn evidence() -> attest::Evidence {
    evidence_from(&issuer())
}
