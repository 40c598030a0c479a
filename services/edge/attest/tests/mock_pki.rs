//! The mock PKI is shaped like AMD's and survives a round trip through disk.

mod common;

use attest::amd::{self, AmdGeneration};
use attest::{MockCa, MockCrl, MockIssuer, MockPki, Verifier};
use common::*;
use x509_cert::der::{Decode, Encode};

const MILAN_VCEK: &[u8] = include_bytes!("../testdata/amd/milan-vcek.der");

fn cert(der: &[u8]) -> x509_cert::Certificate {
    x509_cert::Certificate::from_der(der).unwrap()
}

fn extension_oids(c: &x509_cert::Certificate) -> Vec<String> {
    c.tbs_certificate.extensions.iter().flatten().map(|e| e.extn_id.to_string()).collect()
}

#[test]
fn mock_vcek_carries_amds_extensions_in_amds_order() {
    let mock = cert(pki().vcek_der());
    let real = cert(MILAN_VCEK);
    assert_eq!(extension_oids(&mock), extension_oids(&real));
    for ext in mock.tbs_certificate.extensions.iter().flatten() {
        assert!(!ext.critical, "{} must not be critical, like AMD's", ext.extn_id);
    }
    let ext = amd::vcek_extensions(&mock).unwrap();
    assert_eq!(ext.hw_id.as_deref(), Some(&pki().chip_id()[..]));
    // P-384 key, like AMD's VCEKs.
    let spki = &mock.tbs_certificate.subject_public_key_info;
    assert_eq!(spki.algorithm, real.tbs_certificate.subject_public_key_info.algorithm);
}

#[test]
fn mock_ca_signs_like_amds_ca() {
    let (ark, ask, vcek) = (cert(pki().ark_der()), cert(pki().ask_der()), cert(pki().vcek_der()));
    let amd_ark = cert(AmdGeneration::Genoa.ark_der());
    let amd_vcek = cert(MILAN_VCEK);
    // RSASSA-PSS with SHA-384, MGF1-SHA-384 and a 48-byte salt: the same parameters AMD uses.
    let pss = |c: &x509_cert::Certificate| {
        assert_eq!(c.signature_algorithm.oid, amd_vcek.signature_algorithm.oid, "RSASSA-PSS");
        let der = c.signature_algorithm.parameters.as_ref().unwrap().to_der().unwrap();
        let p = rsa::pkcs1::RsaPssParams::from_der(&der).unwrap();
        let mgf_hash = p.mask_gen.parameters.map(|h| h.oid);
        (p.hash.oid, p.mask_gen.oid, mgf_hash, p.salt_len, p.trailer_field)
    };
    let amd = pss(&amd_vcek);
    assert_eq!(pss(&cert(AmdGeneration::Genoa.ask_der().as_slice())), amd);
    assert_eq!(amd.3, 48);
    for c in [&ark, &ask, &vcek] {
        assert_eq!(pss(c), amd);
    }
    assert_eq!(amd_ark.signature_algorithm.oid, ark.signature_algorithm.oid);
    // RSA-4096 ARK and ASK.
    for c in [&ark, &ask] {
        let key = c.tbs_certificate.subject_public_key_info.subject_public_key.raw_bytes();
        assert!(key.len() > 512, "4096-bit modulus, got a {}-byte key", key.len());
    }
    // Subjects keep AMD's layout but say they are not AMD's.
    let subject = vcek.tbs_certificate.subject.to_string();
    assert!(subject.contains("CN=SEV-VCEK") && subject.contains("(not Advanced Micro Devices)"), "{subject}");
}

#[test]
fn saved_pki_loads_back_and_keeps_signing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pki");
    pki().save(&path).unwrap();
    let loaded = MockPki::load(&path).unwrap();
    assert_eq!(loaded.root_fingerprint(), pki().root_fingerprint());
    assert_eq!(loaded.chip_id(), pki().chip_id());
    assert_eq!(loaded.vcek_der(), pki().vcek_der());
    // load_or_create finds it instead of generating.
    let again = MockPki::load_or_create(&path).unwrap();
    assert_eq!(again.root_fingerprint(), pki().root_fingerprint());
    let issuer = MockIssuer::new(std::sync::Arc::new(loaded));
    Verifier::new().verify(&evidence_from(&issuer), &expected(), &policy()).expect("a reloaded PKI still verifies");

    // Private keys are not world-readable.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for key in ["ask-key.pem", "vcek-key.pem"] {
            let mode = std::fs::metadata(path.join(key)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{key} mode {mode:o}");
        }
    }
}

#[test]
fn mock_crls_are_signed_like_amds_certificates_and_the_ark_key_is_never_saved() {
    let dir = tempfile::tempdir().unwrap();
    pki().save(dir.path()).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().contains("ark-key")), "{names:?}");
    let loaded = MockPki::load(dir.path()).unwrap();
    assert!(
        matches!(loaded.crl(&MockCrl::new(MockCa::Ark, vec![])), Err(attest::AttestError::MockPki { .. })),
        "a loaded PKI cannot sign as the ARK"
    );
    let der = loaded.crl(&MockCrl::new(MockCa::Ask, vec![])).unwrap();
    let crl = x509_cert::crl::CertificateList::from_der(&der).unwrap();
    assert_eq!(crl.tbs_cert_list.issuer, cert(pki().ask_der()).tbs_certificate.subject);
    // The same RSASSA-PSS parameters as the certificates, hence as AMD's.
    assert_eq!(crl.signature_algorithm, cert(pki().vcek_der()).signature_algorithm);
    assert_eq!(crl.tbs_cert_list.version, x509_cert::Version::V2);
}

#[test]
fn broken_pki_folders_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pki");
    pki().save(&path).unwrap();
    // A VCEK key that does not belong to the VCEK certificate.
    let other = MockIssuer::new(pki()).with_tcb(attest::Tcb { snp: 1, ..issuer().tcb() }).unwrap();
    std::fs::write(path.join("vcek.pem"), attest::evidence::certificate_pem(&other.chain().vcek_der).unwrap()).unwrap();
    assert!(matches!(MockPki::load(&path), Err(attest::AttestError::MockPki { .. })));
    // A missing file.
    std::fs::remove_file(path.join("ask.pem")).unwrap();
    assert!(matches!(MockPki::load(&path), Err(attest::AttestError::Io { .. })));
}

#[test]
fn measurement_file_sets_the_launch_digest() {
    let dir = tempfile::tempdir().unwrap();
    pki().save(dir.path()).unwrap();
    std::fs::write(dir.path().join(attest::issuer::MOCK_MEASUREMENT_FILE), format!("{}\n", "ab".repeat(48))).unwrap();
    let issuer = MockIssuer::load_or_create(dir.path()).unwrap();
    assert_eq!(issuer.settings().measurement, [0xab; 48]);
    std::fs::write(dir.path().join(attest::issuer::MOCK_MEASUREMENT_FILE), "not hex").unwrap();
    assert!(matches!(MockIssuer::load_or_create(dir.path()), Err(attest::AttestError::Hex { .. })));
}
