//! Revocation against offline CRLs shaped like AMD's KDS ones (issued and signed by the ARK,
//! RSASSA-PSS/SHA-384), minted by the mock PKI.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use attest::issuer::default_mock_measurement;
use attest::verify::{CertRole, REASONS};
use attest::{CrlSource, Evidence, MockCa, MockCrl, MockIssuer, MockPki, Policy, TrustedRoot, Verifier, VerifyError};
use common::*;
use x509_cert::der::Decode;
use x509_cert::der::pem::LineEnding;
use x509_cert::serial_number::SerialNumber;

const DAY: Duration = Duration::from_secs(86_400);

/// A PKI generated in this process: only such a one holds the ARK key that signs CRLs (it
/// is never saved, so the shared test PKI loaded from disk has none).
fn fresh_pki() -> Arc<MockPki> {
    static PKI: OnceLock<Arc<MockPki>> = OnceLock::new();
    PKI.get_or_init(|| Arc::new(MockPki::generate().expect("mock PKI"))).clone()
}

fn fresh_evidence() -> Evidence {
    evidence_from(&MockIssuer::new(fresh_pki()))
}

fn serial(der: &[u8]) -> SerialNumber {
    x509_cert::Certificate::from_der(der).unwrap().tbs_certificate.serial_number
}

fn crl(spec: MockCrl) -> CrlSource {
    let der = fresh_pki().crl(&spec).expect("sign CRL");
    CrlSource::Pem(x509_cert::der::pem::encode_string("X509 CRL", LineEnding::LF, &der).unwrap())
}

/// Trusts the fresh PKI's root and checks `crls`.
fn policy_with(crls: Vec<CrlSource>) -> Policy {
    Policy::default()
        .with_roots(vec![TrustedRoot::MockPem(fresh_pki().ark_pem())])
        .allow_measurement(default_mock_measurement())
        .with_crls(crls)
}

fn verify(crls: Vec<CrlSource>) -> Result<attest::Verified, VerifyError> {
    Verifier::new().verify(&fresh_evidence(), &expected(), &policy_with(crls))
}

#[test]
fn a_crl_revoking_the_ask_refuses_the_chain() {
    let ask = serial(fresh_pki().ask_der());
    let err = verify(vec![crl(MockCrl::new(MockCa::Ark, vec![ask.clone()]))]).unwrap_err();
    assert!(
        matches!(&err, VerifyError::CertificateRevoked { which: CertRole::Ask, serial, .. } if *serial == hex::encode(ask.as_bytes())),
        "{err:?}"
    );
    assert_eq!(err.reason(), "certificate_revoked");
    assert!(err.to_string().contains("ASK"), "the message names the certificate: {err}");
    // The ARK listing itself is honoured too.
    let ark = serial(fresh_pki().ark_der());
    let err = verify(vec![crl(MockCrl::new(MockCa::Ark, vec![ark]))]).unwrap_err();
    assert!(matches!(err, VerifyError::CertificateRevoked { which: CertRole::Ark, .. }), "{err:?}");
}

#[test]
fn a_crl_revoking_other_serials_accepts_the_chain() {
    let other = SerialNumber::new(&[0x42; 8]).unwrap();
    verify(vec![crl(MockCrl::new(MockCa::Ark, vec![other]))]).expect("another serial revoked");
    verify(vec![crl(MockCrl::new(MockCa::Ark, vec![]))]).expect("nothing revoked");
    // Serial numbers are per issuer: the VCEK's serial on the ARK's list is another certificate.
    let vcek = serial(&fresh_evidence().vcek_der);
    verify(vec![crl(MockCrl::new(MockCa::Ark, vec![vcek]))]).expect("the ARK's list covers what the ARK signed");
    // No CRL in the policy: no revocation check at all.
    verify(vec![]).expect("no CRLs");
}

#[test]
fn a_crl_from_the_ask_revokes_a_vcek() {
    let e = fresh_evidence();
    let vcek = serial(&e.vcek_der);
    let crls = vec![crl(MockCrl::new(MockCa::Ark, vec![])), crl(MockCrl::new(MockCa::Ask, vec![vcek]))];
    let err = Verifier::new().verify(&e, &expected(), &policy_with(crls)).unwrap_err();
    assert!(matches!(err, VerifyError::CertificateRevoked { which: CertRole::Vcek, .. }), "{err:?}");
}

#[test]
fn a_crl_signed_by_another_key_is_refused() {
    // Names the ARK as issuer, signed with the ASK's key.
    let forged = MockCrl { signer: MockCa::Ask, ..MockCrl::new(MockCa::Ark, vec![]) };
    let err = verify(vec![crl(forged)]).unwrap_err();
    assert!(matches!(&err, VerifyError::CrlInvalid(d) if d.contains("not signed by")), "{err:?}");
    assert_eq!(err.reason(), "crl_invalid");
    // A CRL of the shared test PKI (another mock ASK of the same name, another key).
    let other = pki().crl(&MockCrl::new(MockCa::Ask, vec![])).unwrap();
    let other = CrlSource::Pem(x509_cert::der::pem::encode_string("X509 CRL", LineEnding::LF, &other).unwrap());
    let err = verify(vec![crl(MockCrl::new(MockCa::Ark, vec![])), other]).unwrap_err();
    assert!(matches!(err, VerifyError::CrlInvalid(_)), "{err:?}");
}

#[test]
fn a_tampered_crl_is_refused() {
    let der = fresh_pki().crl(&MockCrl::new(MockCa::Ark, vec![SerialNumber::new(&[0x42; 8]).unwrap()])).unwrap();
    // Flip the last byte of the one revoked serial: still parses, no longer signed.
    let at = der.windows(8).position(|w| w == [0x42; 8]).unwrap() + 7;
    let mut tampered = der.clone();
    tampered[at] ^= 1;
    let pem = x509_cert::der::pem::encode_string("X509 CRL", LineEnding::LF, &tampered).unwrap();
    assert!(matches!(verify(vec![CrlSource::Pem(pem)]), Err(VerifyError::CrlInvalid(_))));
}

#[test]
fn a_stale_crl_is_refused() {
    let now = SystemTime::now();
    let stale =
        MockCrl { this_update: now - 60 * DAY, next_update: Some(now - DAY), ..MockCrl::new(MockCa::Ark, vec![]) };
    let err = verify(vec![crl(stale)]).unwrap_err();
    assert!(matches!(err, VerifyError::CrlExpired { .. }), "{err:?}");
    assert_eq!(err.reason(), "crl_expired");
    // A CRL current now goes stale once its nextUpdate passes.
    let short = policy_with(vec![crl(MockCrl { next_update: Some(now + DAY), ..MockCrl::new(MockCa::Ark, vec![]) })]);
    Verifier::new().verify(&fresh_evidence(), &expected(), &short).expect("current now");
    let in_two_days = Verifier::at(now + 2 * DAY);
    assert!(matches!(in_two_days.verify(&fresh_evidence(), &expected(), &short), Err(VerifyError::CrlExpired { .. })));
    // With dates unchecked (check_certificate_validity: false), the CRL's are not checked either.
    let mut lax = short.clone();
    lax.check_certificate_validity = false;
    in_two_days.verify(&fresh_evidence(), &expected(), &lax).expect("dates not checked");
    // No nextUpdate: nothing bounds its age.
    let open_ended = MockCrl { next_update: None, ..MockCrl::new(MockCa::Ark, vec![]) };
    assert!(matches!(verify(vec![crl(open_ended)]), Err(VerifyError::CrlInvalid(d)) if d.contains("nextUpdate")));
    // Not yet issued.
    let future =
        MockCrl { this_update: now + DAY, next_update: Some(now + 30 * DAY), ..MockCrl::new(MockCa::Ark, vec![]) };
    assert!(matches!(verify(vec![crl(future)]), Err(VerifyError::CrlInvalid(d)) if d.contains("thisUpdate")));
}

#[test]
fn crls_that_skip_the_chains_ark_are_crl_missing() {
    // Only the ASK's CRL: nothing says whether the ASK itself is revoked.
    let err = verify(vec![crl(MockCrl::new(MockCa::Ask, vec![]))]).unwrap_err();
    assert!(matches!(err, VerifyError::CrlMissing(_)), "{err:?}");
    assert_eq!(err.reason(), "crl_missing");
}

#[test]
fn policy_files_name_crl_files_relative_to_themselves() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ark.pem"), fresh_pki().ark_pem()).unwrap();
    let ask = serial(fresh_pki().ask_der());
    // DER, as AMD's KDS serves it.
    std::fs::write(dir.path().join("genoa.crl"), fresh_pki().crl(&MockCrl::new(MockCa::Ark, vec![ask])).unwrap())
        .unwrap();
    let yaml = format!(
        "trusted_roots:\n  - mock_file: ark.pem\nmeasurements:\n  - {}\ncrls:\n  - file: genoa.crl\n",
        hex::encode(default_mock_measurement())
    );
    std::fs::write(dir.path().join("policy.yaml"), yaml).unwrap();
    let policy = Policy::from_file(dir.path().join("policy.yaml")).unwrap();
    let err = Verifier::new().verify(&fresh_evidence(), &expected(), &policy).unwrap_err();
    assert!(
        matches!(&err, VerifyError::CertificateRevoked { which: CertRole::Ask, crl, .. } if crl.ends_with("genoa.crl")),
        "{err:?}"
    );
    // A CRL that does not parse fails the policy at load, not at the first connection.
    std::fs::write(dir.path().join("genoa.crl"), b"not a CRL").unwrap();
    assert!(matches!(Policy::from_file(dir.path().join("policy.yaml")), Err(attest::AttestError::Policy { .. })));
}

#[test]
fn revocation_reasons_are_listed() {
    for r in ["crl_missing", "crl_invalid", "crl_expired", "certificate_revoked", "vcek_hwid_missing"] {
        assert!(REASONS.contains(&r), "{r}");
    }
}
