//! The verifier against mock evidence, real AMD data, and every kind of tampering.

mod common;

#[path = "verify/hostile.rs"]
mod hostile;
#[path = "verify/release_log.rs"]
mod release_log;

use std::time::{Duration, SystemTime};

use attest::amd::AmdGeneration;
use attest::report::{FIELDS, REPORT_LEN, SIGNATURE_OFFSET};
use attest::verify::{CertRole, REASONS};
use attest::{
    CertChain, Evidence, ExpectedBinding, Hex, IssuerKind, MockSettings, Policy, ServiceClaims, Tcb, TrustedRoot,
    Verifier, VerifyError, issue_evidence, issuer::default_mock_measurement,
};
use common::*;

fn reject(evidence: &Evidence) -> VerifyError {
    Verifier::new().verify(evidence, &expected(), &policy()).expect_err("must be rejected")
}

// --- the happy path -------------------------------------------------------------------

#[test]
fn mock_evidence_verifies() {
    let e = evidence();
    let v = Verifier::new().verify(&e, &expected(), &policy()).expect("verifies");
    assert_eq!(v.issuer(), IssuerKind::Mock);
    assert!(v.root().starts_with("mock:"), "{}", v.root());
    assert_eq!(v.measurement(), &default_mock_measurement());
    assert_eq!(v.model_identity(), &MODEL);
    assert_eq!(v.tls_spki_sha256(), &TLS_KEY);
    assert_eq!(v.nonce(), NONCE);
    assert_eq!(v.role(), "embedder");
    assert_eq!(v.chip_id(), &pki().chip_id());
    assert_eq!(v.reported_tcb(), issuer().tcb());
    assert_eq!(v.report_version(), 3);
    assert_eq!(v.product_name(), Some("Genoa"));
    // And through the byte form that travels in RA-TLS certificates and RPCs.
    assert_eq!(Verifier::new().verify_bytes(&e.to_bytes(), &expected(), &policy()).unwrap(), v);
}

#[test]
fn policy_files_load_and_accept_mock_evidence() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ark.pem"), pki().ark_pem()).unwrap();
    let yaml = format!(
        "trusted_roots:\n  - mock_file: ark.pem\nmeasurements:\n  - {}\nmin_tcb: {{ snp: 1 }}\nroles: [embedder]\n",
        hex::encode(default_mock_measurement())
    );
    std::fs::write(dir.path().join("policy.yaml"), yaml).unwrap();
    let policy = Policy::from_file(dir.path().join("policy.yaml")).unwrap();
    Verifier::new().verify(&evidence(), &expected(), &policy).expect("verifies with a file policy");
}

// --- real AMD data through the same path ------------------------------------------------

/// Public data from the virtee `sev` crate's test suite (see testdata/amd/README.md): a
/// Milan VCEK from AMD's KDS and a report it signed.
const MILAN_VCEK: &[u8] = include_bytes!("../testdata/amd/milan-vcek.der");
const MILAN_REPORT_HEX: &str = include_str!("../testdata/amd/milan-report.hex");
const TURIN_VCEK: &[u8] = include_bytes!("../testdata/amd/turin-vcek.der");

fn milan_chain() -> CertChain {
    CertChain {
        ark_der: AmdGeneration::Milan.ark_der().to_vec(),
        ask_der: AmdGeneration::Milan.ask_der(),
        vcek_der: MILAN_VCEK.to_vec(),
    }
}

fn milan_report() -> Vec<u8> {
    hex::decode(MILAN_REPORT_HEX.trim()).unwrap()
}

/// A time inside the Milan VCEK's validity (2023-04-03 .. 2030-04-03).
fn in_2025() -> Verifier {
    Verifier::at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_689_600))
}

fn milan_policy() -> Policy {
    let report = milan_report();
    let measurement: [u8; 48] = report[0x90..0xC0].try_into().unwrap();
    Policy::default().with_roots(vec![TrustedRoot::Amd(AmdGeneration::Milan)]).allow_measurement(measurement)
}

#[test]
fn real_amd_milan_report_and_chain_verify() {
    let v =
        in_2025().verify_report(&milan_report(), &milan_chain(), &milan_policy()).expect("real AMD evidence verifies");
    assert_eq!(v.issuer(), IssuerKind::SevSnp);
    assert_eq!(v.root(), "amd-milan");
    assert_eq!(v.report_version(), 2);
    assert_eq!(v.reported_tcb(), Tcb { bootloader: 3, tee: 0, snp: 8, microcode: 115 });
    assert_eq!(v.product_name(), Some("Milan-B0"));
}

#[test]
fn real_amd_evidence_takes_the_same_path_as_mock() {
    // Wrapped as GELO evidence, the real report passes the chain, signature, VCEK binding and
    // report policy, and is refused only because its REPORT_DATA is not a GELO binding.
    let chain = milan_chain();
    let e = Evidence {
        report: milan_report(),
        ark_der: chain.ark_der,
        ask_der: chain.ask_der,
        vcek_der: chain.vcek_der,
        model_identity: MODEL,
        scheme_identity: attest::scheme_identity(SCHEME).unwrap(),
        tls_spki_sha256: TLS_KEY,
        nonce: NONCE.to_vec(),
        issuer: IssuerKind::SevSnp,
        role: "embedder".into(),
        scheme_json: SCHEME.into(),
    };
    assert_eq!(in_2025().verify(&e, &expected(), &milan_policy()), Err(VerifyError::ReportDataMismatch));
}

#[test]
fn real_amd_data_is_rejected_for_the_right_reasons() {
    let v = in_2025();
    let (report, chain) = (milan_report(), milan_chain());
    let genoa_only = milan_policy().with_roots(vec![TrustedRoot::Amd(AmdGeneration::Genoa)]);
    assert_eq!(v.verify_report(&report, &chain, &genoa_only), Err(VerifyError::RootNotTrusted));
    let mut pinned = milan_policy();
    pinned.chip_ids = Some(vec![Hex([0xab; 64])]);
    assert!(matches!(v.verify_report(&report, &chain, &pinned), Err(VerifyError::ChipIdNotAllowed(_))));
    let mut strict = milan_policy();
    strict.min_report_version = 3;
    assert_eq!(v.verify_report(&report, &chain, &strict), Err(VerifyError::ReportVersionTooOld { got: 2, min: 3 }));
    let mut tampered = report.clone();
    tampered[0x90] ^= 1; // measurement
    assert_eq!(v.verify_report(&tampered, &chain, &milan_policy()), Err(VerifyError::ReportSignatureInvalid));
    let in_2031 = Verifier::at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_956_528_000));
    assert_eq!(
        in_2031.verify_report(&report, &chain, &milan_policy()),
        Err(VerifyError::CertificateExpired { which: CertRole::Vcek })
    );
    // A Milan VCEK under the Genoa ASK is not signed by it.
    let mut crossed = chain.clone();
    crossed.ark_der = AmdGeneration::Genoa.ark_der().to_vec();
    crossed.ask_der = AmdGeneration::Genoa.ask_der();
    let both = milan_policy().with_roots(vec![TrustedRoot::Amd(AmdGeneration::Genoa)]);
    assert!(matches!(v.verify_report(&report, &crossed, &both), Err(VerifyError::VcekSignatureInvalid(_))));
}

#[test]
fn real_amd_turin_and_genoa_chains_parse() {
    // No public Turin/Genoa report is committed; their chains still parse and the VCEK's
    // AMD extensions read.
    let turin = x509_parse(TURIN_VCEK);
    let ext = attest::amd::vcek_extensions(&turin).unwrap();
    assert!(ext.bootloader.is_some() && ext.snp.is_some() && ext.microcode.is_some());
    assert_eq!(ext.hw_id.as_ref().map(Vec::len), Some(8), "Turin chip IDs are 8 bytes");
    for g in [AmdGeneration::Genoa, AmdGeneration::Turin] {
        x509_parse(g.ark_der());
        x509_parse(&g.ask_der());
    }
}

fn x509_parse(der: &[u8]) -> x509_cert::Certificate {
    use x509_cert::der::Decode;
    x509_cert::Certificate::from_der(der).unwrap()
}

// --- tampering with the report ----------------------------------------------------------

#[test]
fn every_report_field_flipped_is_rejected() {
    let good = evidence();
    for (name, range) in FIELDS {
        let mut e = good.clone();
        let at = range.start + (range.end - range.start) / 2;
        e.report[at] ^= 0x01;
        let err = reject(&e);
        // Signed bytes: the signature no longer matches, unless the decoder refuses first
        // (reserved bytes must be zero; a version 3 report has no mitigation vectors) or the
        // flip names another algorithm. Signature bytes: the scalars no longer verify, and
        // padding and reserved bytes must be zero.
        let expected = match *name {
            "signature_algo" => "signature_algorithm_unsupported",
            "signature_reserved" => "report_signature_malformed",
            n if n.starts_with("reserved") || n == "mit_vectors" => "report_malformed",
            _ => "report_signature_invalid",
        };
        assert_eq!(err.reason(), expected, "{name} @ {at:#x}: {err}");
    }
}

#[test]
fn every_signature_byte_flipped_is_rejected() {
    let good = evidence();
    let mut invalid = 0;
    for at in SIGNATURE_OFFSET..REPORT_LEN {
        let mut e = good.clone();
        e.report[at] ^= 0x80;
        let err = reject(&e);
        let scalar_byte = (at - SIGNATURE_OFFSET) % 72 < 48 && at < SIGNATURE_OFFSET + 144;
        if scalar_byte {
            // A changed scalar fails verification, or (if pushed out of range) decoding.
            assert!(
                matches!(err, VerifyError::ReportSignatureInvalid | VerifyError::ReportSignatureMalformed(_)),
                "{at:#x}: {err}"
            );
            invalid += matches!(err, VerifyError::ReportSignatureInvalid) as usize;
        } else {
            assert!(matches!(err, VerifyError::ReportSignatureMalformed(_)), "padding/reserved {at:#x}: {err}");
        }
    }
    assert!(invalid >= 90, "most scalar flips should be plain invalid signatures, got {invalid}/96");
}

#[test]
fn truncated_and_oversized_inputs_are_rejected() {
    let good = evidence();
    for len in [0, 1, 0x2A0, REPORT_LEN - 1] {
        let mut e = good.clone();
        e.report.truncate(len);
        assert_eq!(reject(&e), VerifyError::ReportLength { got: len });
    }
    let mut e = good.clone();
    e.report.push(0);
    assert_eq!(reject(&e), VerifyError::ReportLength { got: REPORT_LEN + 1 });

    for which in [CertRole::Ark, CertRole::Ask, CertRole::Vcek] {
        for cut in [0usize, 1, 100] {
            let mut e = good.clone();
            let der = match which {
                CertRole::Ark => &mut e.ark_der,
                CertRole::Ask => &mut e.ask_der,
                CertRole::Vcek => &mut e.vcek_der,
            };
            let keep = if cut == 0 { 0 } else { der.len() - cut };
            der.truncate(keep);
            assert!(
                matches!(reject(&e), VerifyError::CertificateMalformed { which: w, .. } if w == which),
                "{which} -{cut}"
            );
        }
    }

    let bytes = good.to_bytes();
    let v = Verifier::new();
    for cut in [1, 10, bytes.len() / 2, bytes.len() - 1] {
        let err = v.verify_bytes(&bytes[..bytes.len() - cut], &expected(), &policy()).unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::EvidenceMalformed(_)
                    | VerifyError::ReportLength { .. }
                    | VerifyError::CertificateMalformed { .. }
            ),
            "cut {cut}: {err}"
        );
    }
    let huge = vec![0u8; attest::evidence::MAX_EVIDENCE_BYTES + 1];
    assert!(matches!(v.verify_bytes(&huge, &expected(), &policy()), Err(VerifyError::EvidenceMalformed(_))));
}

// --- the chain --------------------------------------------------------------------------

#[test]
fn mock_root_is_trusted_only_when_named() {
    let e = evidence();
    // Default policy: AMD roots only.
    let amd_only = Policy::default().allow_measurement(default_mock_measurement());
    assert_eq!(Verifier::new().verify(&e, &expected(), &amd_only), Err(VerifyError::MockRootNotTrusted));
    // A real AMD root is "unknown" to a policy that trusts only the mock.
    let chain = milan_chain();
    assert_eq!(in_2025().verify_report(&milan_report(), &chain, &policy()), Err(VerifyError::RootNotTrusted));
}

#[test]
fn chain_substitutions_are_rejected() {
    let good = evidence();
    // ARK with a broken self-signature (same key, so it still matches the trusted root).
    let mut e = good.clone();
    let last = e.ark_der.len() - 1;
    e.ark_der[last] ^= 1;
    assert!(matches!(reject(&e), VerifyError::ArkSelfSignatureInvalid(_)));
    // AMD's Milan ASK under our mock ARK.
    let mut e = good.clone();
    e.ask_der = AmdGeneration::Milan.ask_der();
    assert!(matches!(reject(&e), VerifyError::AskSignatureInvalid(_)));
    // AMD's Milan VCEK under our mock ASK.
    let mut e = good.clone();
    e.vcek_der = MILAN_VCEK.to_vec();
    assert!(matches!(reject(&e), VerifyError::VcekSignatureInvalid(_)));
    // A VCEK of the same PKI but for another TCB: valid chain, wrong signer for this report.
    let mut e = good.clone();
    e.vcek_der = issuer().with_tcb(Tcb { snp: 1, ..issuer().tcb() }).unwrap().chain().vcek_der;
    assert_eq!(reject(&e), VerifyError::ReportSignatureInvalid);
    // The unsigned outer algorithm identifier must equal the signed one.
    let mut e = good.clone();
    let pss_salt = e.vcek_der.len() - 512 - 10; // inside the outer AlgorithmIdentifier
    let outer = e.vcek_der[..].windows(3).rposition(|w| w == [0x02, 0x01, 0x30]).unwrap();
    assert!(outer > pss_salt - 40, "found the outer salt length");
    e.vcek_der[outer + 2] = 0x20;
    assert!(matches!(reject(&e), VerifyError::CertificateMalformed { which: CertRole::Vcek, .. }));
}

#[test]
fn a_vcek_without_hwid_is_refused_unless_the_policy_opts_out() {
    let no_hwid = issuer().with_vcek_without_hwid().unwrap();
    let vcek = x509_parse(&no_hwid.chain().vcek_der);
    assert_eq!(attest::amd::vcek_extensions(&vcek).unwrap().hw_id, None, "the mock VCEK lacks hwID");
    let e = evidence_from(&no_hwid);
    // By default: refused, since such a VCEK would vouch for a report from any chip.
    let err = reject(&e);
    assert_eq!(err, VerifyError::VcekHwidMissing);
    assert_eq!(err.reason(), "vcek_hwid_missing");
    // With the option off (in code or in a policy file): accepted.
    let mut lax = policy();
    lax.require_vcek_hwid = false;
    let v = Verifier::new().verify(&e, &expected(), &lax).expect("accepted with require_vcek_hwid off");
    assert_eq!(v.chip_id(), &pki().chip_id());
    assert!(!Policy::from_yaml("require_vcek_hwid: false").unwrap().require_vcek_hwid);
    // The option does not relax a VCEK that has a hwID.
    assert!(Verifier::new().verify(&evidence(), &expected(), &lax).is_ok());
}

#[test]
fn certificate_validity_is_checked() {
    let e = evidence();
    let later = Verifier::at(SystemTime::now() + Duration::from_secs(30 * 365 * 86_400));
    assert_eq!(later.verify(&e, &expected(), &policy()), Err(VerifyError::CertificateExpired { which: CertRole::Ark }));
    let eight_years = Verifier::at(SystemTime::now() + Duration::from_secs(8 * 365 * 86_400));
    let err = eight_years.verify(&e, &expected(), &policy()).unwrap_err();
    assert_eq!(err, VerifyError::CertificateExpired { which: CertRole::Vcek });
    let before = Verifier::at(SystemTime::UNIX_EPOCH);
    assert!(matches!(before.verify(&e, &expected(), &policy()), Err(VerifyError::CertificateNotYetValid { .. })));
    let mut lax = policy();
    lax.check_certificate_validity = false;
    assert!(later.verify(&e, &expected(), &lax).is_ok());
}

// --- the binding ------------------------------------------------------------------------

#[test]
fn binding_mismatches_have_their_own_reasons() {
    let e = evidence();
    let v = Verifier::new();
    let p = policy();
    let mut x = expected();
    x.nonce = vec![0x34; 32];
    assert_eq!(v.verify(&e, &x, &p), Err(VerifyError::NonceMismatch));
    let mut x = expected();
    x.model_identity = Some([0x12; 32]);
    assert_eq!(v.verify(&e, &x, &p), Err(VerifyError::ModelIdentityMismatch));
    let mut x = expected();
    x.tls_spki_sha256 = Some([0x23; 32]);
    assert_eq!(v.verify(&e, &x, &p), Err(VerifyError::TlsKeyMismatch));
    let mut x = expected();
    x.scheme_identity = Some([0; 32]);
    assert_eq!(v.verify(&e, &x, &p), Err(VerifyError::SchemeIdentityMismatch));

    // Claims edited after issuing, with the verifier expecting the edited values: the
    // signed REPORT_DATA gives them away.
    let mut forged = e.clone();
    forged.nonce = vec![0x34; 32];
    let mut x = expected();
    x.nonce = forged.nonce.clone();
    assert_eq!(v.verify(&forged, &x, &p), Err(VerifyError::ReportDataMismatch));
    let mut forged = e.clone();
    forged.tls_spki_sha256 = [0x23; 32];
    let mut x = expected();
    x.tls_spki_sha256 = Some(forged.tls_spki_sha256);
    assert_eq!(v.verify(&forged, &x, &p), Err(VerifyError::ReportDataMismatch));

    let mut forged = e.clone();
    forged.scheme_json = SCHEME.replace("haar", "hd3");
    assert_eq!(reject(&forged), VerifyError::SchemeJsonMismatch);
    let mut forged = e.clone();
    forged.role = "gateway".into();
    assert!(matches!(reject(&forged), VerifyError::RoleMismatch { .. }));
    let mut forged = e.clone();
    forged.issuer = IssuerKind::SevSnp;
    assert!(matches!(reject(&forged), VerifyError::IssuerKindMismatch { .. }));
}

// --- policy -----------------------------------------------------------------------------

fn issue_with(settings: MockSettings) -> Evidence {
    evidence_from(&issuer().with_settings(settings))
}

#[test]
fn policy_rejections_have_their_own_reasons() {
    let debug = issue_with(MockSettings { debug: true, ..Default::default() });
    assert_eq!(reject(&debug), VerifyError::DebugNotAllowed);
    let mut allow = policy();
    allow.allow_debug = true;
    assert!(Verifier::new().verify(&debug, &expected(), &allow).is_ok());

    let ma = issue_with(MockSettings { migrate_ma: true, ..Default::default() });
    assert_eq!(reject(&ma), VerifyError::MigrationAgentNotAllowed);

    let vmpl = issue_with(MockSettings { vmpl: 2, ..Default::default() });
    assert_eq!(reject(&vmpl), VerifyError::VmplNotAllowed(2));

    let v2 = issue_with(MockSettings { report_version: 2, ..Default::default() });
    assert!(Verifier::new().verify(&v2, &expected(), &policy()).is_ok(), "v2 meets the default minimum");
    let mut strict = policy();
    strict.min_report_version = 3;
    assert_eq!(
        Verifier::new().verify(&v2, &expected(), &strict),
        Err(VerifyError::ReportVersionTooOld { got: 2, min: 3 })
    );
    let v5 = issue_with(MockSettings { report_version: 5, ..Default::default() });
    assert!(Verifier::new().verify(&v5, &expected(), &strict).is_ok());

    let other = issue_with(MockSettings { measurement: [0x5a; 48], ..Default::default() });
    assert!(matches!(reject(&other), VerifyError::MeasurementNotAllowed(_)));
    let mut any = policy();
    any.allow_any_measurement = true;
    assert!(Verifier::new().verify(&other, &expected(), &any).is_ok());
}

#[test]
fn low_tcb_is_rejected() {
    let tcb = issuer().tcb();
    let low = evidence_from(&issuer().with_tcb(Tcb { microcode: tcb.microcode - 1, ..tcb }).unwrap());
    let mut p = policy();
    p.min_tcb = tcb;
    assert_eq!(
        Verifier::new().verify(&low, &expected(), &p),
        Err(VerifyError::TcbTooLow { component: "microcode", got: tcb.microcode - 1, min: tcb.microcode })
    );
    assert!(Verifier::new().verify(&evidence(), &expected(), &p).is_ok(), "the default TCB meets itself");
}

#[test]
fn allowlists_pin_chips_models_schemes_and_roles() {
    let e = evidence();
    let v = Verifier::new();
    let mut p = policy();
    p.chip_ids = Some(vec![Hex([1; 64])]);
    assert!(matches!(v.verify(&e, &expected(), &p), Err(VerifyError::ChipIdNotAllowed(_))));
    p.chip_ids = Some(vec![Hex([1; 64]), Hex(pki().chip_id())]);
    assert!(v.verify(&e, &expected(), &p).is_ok());

    let mut p = policy();
    p.model_identities = Some(vec![Hex([0; 32])]);
    assert!(matches!(v.verify(&e, &expected(), &p), Err(VerifyError::ModelIdentityNotAllowed(_))));
    let mut p = policy();
    p.scheme_identities = Some(vec![Hex([0; 32])]);
    assert!(matches!(v.verify(&e, &expected(), &p), Err(VerifyError::SchemeIdentityNotAllowed(_))));
    let mut p = policy();
    p.roles = Some(vec!["gateway".into()]);
    assert_eq!(v.verify(&e, &expected(), &p), Err(VerifyError::RoleNotAllowed("embedder".into())));
    let mut p = policy();
    p.allowed_vmpls = vec![1];
    assert_eq!(v.verify(&e, &expected(), &p), Err(VerifyError::VmplNotAllowed(0)));
}

/// A masked scheme's `protocol` at the project's defaults, as `protocol::Scheme` writes it.
const MASKED: &str = r#"{"executor":"masked","masked":{"mask":"auto","shield":{"rows":8,"energy":4.0},"verify":{"probes":2,"range":3}}}"#;

#[test]
fn model_services_must_run_the_protection_the_policy_names() {
    // Evidence for a model service whose attested scheme names `executor`.
    let with_protocol = |role: &str, protocol: Option<String>| {
        let protocol = protocol.map(|p| format!(r#","protocol":{p}"#)).unwrap_or_default();
        let scheme = format!(r#"{{"role":"{role}"{protocol}}}"#);
        let claims = ServiceClaims { model_identity: MODEL, scheme_json: scheme.clone(), role: role.into() };
        let e = issue_evidence(&issuer(), &claims, TLS_KEY, &NONCE).unwrap();
        let x = ExpectedBinding { scheme_identity: Some(attest::scheme_identity(&scheme).unwrap()), ..expected() };
        (e, x)
    };
    let with = |role: &str, executor: Option<&str>| match executor {
        // masked as a service attests it by default (the `auto` family, 8 shield rows, 2 probes)
        Some("masked") => with_protocol(role, Some(MASKED.to_owned())),
        Some(x) => with_protocol(role, Some(format!(r#"{{"executor":"{x}"}}"#))),
        None => with_protocol(role, None),
    };
    let v = Verifier::new();
    let refused = |role: &str, executor: Option<&str>, p: &Policy| {
        let (e, x) = with(role, executor);
        match v.verify(&e, &x, p) {
            Err(err @ VerifyError::ProtectionNotAllowed { .. }) => {
                assert_eq!(err.reason(), "protection_not_allowed");
                err.to_string()
            }
            other => panic!("{role} {executor:?}: expected protection_not_allowed, got {other:?}"),
        }
    };
    // The default policy: sealed only, for every model role; a weaker or missing one is
    // refused and the refusal names the field and the value.
    let p = policy();
    assert_eq!(p.protections, vec!["sealed".to_string()]);
    for role in ["embedder", "reranker", "generator"] {
        let (e, x) = with(role, Some("sealed"));
        assert!(v.verify(&e, &x, &p).is_ok(), "{role} sealed");
        let msg = refused(role, Some("masked"), &p);
        assert!(msg.contains("protocol.executor") && msg.contains("\"masked\""), "{msg}");
        refused(role, Some("plaintext"), &p);
        assert!(refused(role, Some("dual-lpn"), &p).contains("\"dual-lpn\""));
        assert!(refused(role, None, &p).contains("\"none\""));
    }
    // Naming dual-lpn admits it with the project's settings; fewer probes, codes reused
    // longer than the hiding estimate allows, or no settings at all are refused, naming the
    // field, unless the policy relaxes them.
    const LPN: &str = r#"{"executor":"dual-lpn","lpn":{"probes":4,"rows_per_code":1048576}}"#;
    let lpn_policy = policy().allow_protection("dual-lpn");
    let (e, x) = with_protocol("embedder", Some(LPN.to_owned()));
    assert!(v.verify(&e, &x, &lpn_policy).is_ok());
    for (weaker, field) in [
        (LPN.replace(r#""probes":4"#, r#""probes":2"#), "protocol.lpn.probes"),
        (LPN.replace("1048576", "1048577"), "protocol.lpn.rows_per_code"),
        (r#"{"executor":"dual-lpn","lpn":{"probes":4}}"#.to_owned(), "protocol.lpn.rows_per_code"),
        (r#"{"executor":"dual-lpn"}"#.to_owned(), "protocol.lpn.probes"),
    ] {
        let (e, x) = with_protocol("embedder", Some(weaker.clone()));
        match v.verify(&e, &x, &lpn_policy) {
            Err(err @ VerifyError::SchemeSettingNotAllowed { .. }) => {
                assert!(err.to_string().contains(field), "{weaker}: {err}");
            }
            other => panic!("{weaker}: expected scheme_setting_not_allowed, got {other:?}"),
        }
    }
    let mut lenient = policy().allow_protection("dual-lpn");
    lenient.dual_lpn.min_probes = 2;
    let (e, x) = with_protocol("embedder", Some(LPN.replace(r#""probes":4"#, r#""probes":2"#)));
    assert!(v.verify(&e, &x, &lenient).is_ok(), "what the policy names is accepted");
    // A policy that names masked accepts it, and still refuses plaintext.
    let p = policy().allow_protection("masked");
    let (e, x) = with("generator", Some("masked"));
    assert!(v.verify(&e, &x, &p).is_ok());
    refused("generator", Some("plaintext"), &p);
    // Masked weaker than the policy's masked requirements (the project's defaults unless the
    // policy says otherwise): refused, naming the field.
    for (weaker, field) in [
        (MASKED.replace(r#""rows":8"#, r#""rows":0"#), "protocol.masked.shield.rows"),
        (MASKED.replace(r#"{"probes":2,"range":3}"#, "null"), "protocol.masked.verify.probes"),
        (MASKED.replace(r#""probes":2"#, r#""probes":1"#), "protocol.masked.verify.probes"),
        (MASKED.replace(r#""mask":"auto""#, r#""mask":"haar""#), "protocol.masked.mask"),
        (r#"{"executor":"masked"}"#.to_owned(), "protocol.masked.mask"),
    ] {
        assert_ne!(weaker, MASKED);
        let (e, x) = with_protocol("embedder", Some(weaker.clone()));
        match v.verify(&e, &x, &p) {
            Err(err @ VerifyError::SchemeSettingNotAllowed { .. }) => {
                assert_eq!(err.reason(), "scheme_setting_not_allowed");
                assert!(err.to_string().contains(field), "{weaker}: {err}");
            }
            other => panic!("{weaker}: expected scheme_setting_not_allowed, got {other:?}"),
        }
    }
    let mut lenient = policy().allow_protection("masked");
    lenient.masked.mask_families.push("haar".into());
    lenient.masked.min_shield_rows = 0;
    let (e, x) = with_protocol(
        "embedder",
        Some(MASKED.replace(r#""mask":"auto""#, r#""mask":"haar""#).replace(r#""rows":8"#, r#""rows":0"#)),
    );
    assert!(v.verify(&e, &x, &lenient).is_ok(), "what the policy names is accepted");
    // A YAML policy lists them the same way.
    let yaml: Policy = Policy::from_yaml("protections: [sealed, masked]\nallow_any_measurement: true").unwrap();
    assert_eq!(yaml.protections, vec!["sealed".to_string(), "masked".to_string()]);
    // The gateway computes no products: its scheme has no executor and needs none.
    let (e, x) = with("gateway", None);
    assert!(v.verify(&e, &x, &policy()).is_ok());
}

#[test]
fn every_reason_above_is_a_listed_machine_name() {
    // The reasons used as metric labels and CRD status must all be in REASONS.
    let samples = [
        reject(&issue_with(MockSettings { debug: true, ..Default::default() })),
        VerifyError::RootNotTrusted,
        VerifyError::ReportLength { got: 0 },
    ];
    for s in samples {
        assert!(REASONS.contains(&s.reason()), "{}", s.reason());
    }
}

// --- fuzz-like: deterministic random inputs, no panics ----------------------------------

mod fuzz_like {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    fn runner(cases: u32) -> TestRunner {
        let config = Config { cases, failure_persistence: None, ..Config::default() };
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    }

    #[test]
    fn random_bytes_never_panic_the_parsers() {
        let policy = policy();
        runner(512)
            .run(&prop::collection::vec(any::<u8>(), 0..2048), |bytes| {
                let _ = attest::report::parse(&bytes);
                let _ = Evidence::from_bytes(&bytes);
                let _ = attest::ratls::evidence_from_certificate(&bytes);
                let _ = Verifier::new().verify_bytes(&bytes, &expected(), &policy);
                Ok(())
            })
            .unwrap();
        // Report-sized random input reaches the field decoder, not only the length check.
        runner(256)
            .run(&prop::collection::vec(any::<u8>(), REPORT_LEN..=REPORT_LEN), |bytes| {
                let _ = attest::report::parse(&bytes);
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn any_bit_flip_in_encoded_evidence_is_rejected() {
        let bytes = evidence().to_bytes();
        let policy = policy();
        let len = bytes.len();
        runner(300)
            .run(&(0..len, 0u8..8), |(at, bit)| {
                let mut m = bytes.clone();
                m[at] ^= 1 << bit;
                let verdict = Verifier::new().verify_bytes(&m, &expected(), &policy);
                prop_assert!(verdict.is_err(), "flip at {at} bit {bit} was accepted");
                Ok(())
            })
            .unwrap();
    }
}
