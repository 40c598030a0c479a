use super::*;
use crate::crd::{HubSource, PrivateRAGPipelineSpec, TrustedRootSpec, VolumeSource};

fn problems(f: impl FnOnce(&mut PrivateRAGPipelineSpec)) -> Vec<String> {
    let mut spec = PrivateRAGPipelineSpec::test();
    f(&mut spec);
    validate(&spec).expect_err("spec should be invalid")
}

#[test]
fn the_test_spec_is_valid_and_parsed() {
    let v = validate(&PrivateRAGPipelineSpec::test()).expect("valid");
    assert_eq!(v.model(Component::Embedder).identity, [0x11; 32]);
    assert_eq!(v.model(Component::Gateway).identity, [0x44; 32]);
    assert!(matches!(v.model(Component::Gateway).source, PinnedSource::Volume { .. }));
    assert_eq!(v.measurements, vec![[0xab; 48]]);
    assert_eq!(v.uses_mock_root().map(|s| s.name.as_str()), Some("gelo-mock-root"));
    assert_eq!(v.period, std::time::Duration::from_secs(30));
}

#[test]
fn a_revision_must_be_a_full_commit_id() {
    for bad in ["main", "v1.0", "0123456789abcdef", &"A".repeat(40), &"0".repeat(41)] {
        let p = problems(|s| s.embedder.model.hub = Some(HubSource { repo: "r/m".into(), revision: bad.to_string() }));
        assert_eq!(p.len(), 1, "{bad}: {p:?}");
        assert!(p[0].contains("embedder.model.hub.revision"), "{p:?}");
    }
}

#[test]
fn a_missing_or_malformed_identity_is_named() {
    let p = problems(|s| s.reranker.model.model_identity = None);
    assert!(p[0].contains("reranker.model.modelIdentity is missing"), "{p:?}");
    let p = problems(|s| s.generator.model.model_identity = Some("ABCD".into()));
    assert!(p[0].contains("generator.model.modelIdentity must be 64"), "{p:?}");
    // Uppercase is refused: one identity, one spelling.
    let p = problems(|s| s.generator.model.model_identity = Some("AB".repeat(32)));
    assert_eq!(p.len(), 1);
}

#[test]
fn roots_must_be_known_and_mock_roots_named() {
    let p = problems(|s| {
        s.attestation.trusted_roots = vec![TrustedRootSpec { amd: Some("rome".into()), mock_secret_ref: None }]
    });
    assert!(p[0].contains("not a known AMD generation"), "{p:?}");
    let p = problems(|s| s.attestation.trusted_roots = vec![TrustedRootSpec { amd: None, mock_secret_ref: None }]);
    assert!(p[0].contains("not a known root"), "{p:?}");
    let p = problems(|s| s.attestation.trusted_roots.clear());
    assert!(p[0].contains("trustedRoots is empty"), "{p:?}");
    let ok = {
        let mut s = PrivateRAGPipelineSpec::test();
        s.attestation.trusted_roots = vec![TrustedRootSpec { amd: Some("genoa".into()), mock_secret_ref: None }];
        validate(&s).expect("amd root is valid")
    };
    assert!(ok.uses_mock_root().is_none(), "AMD-only roots never enable the mock issuer");
}

#[test]
fn exactly_one_model_source() {
    let p = problems(|s| s.embedder.model.volume = Some(VolumeSource { claim_name: "c".into(), sub_path: None }));
    assert!(p[0].contains("exactly one of hub and volume"), "{p:?}");
    let p = problems(|s| s.embedder.model.hub = None);
    assert!(p[0].contains("set one of hub and volume"), "{p:?}");
    let p = problems(|s| {
        s.gateway.model.volume = Some(VolumeSource { claim_name: "c".into(), sub_path: Some("../etc".into()) })
    });
    assert!(p[0].contains("subPath"), "{p:?}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let p = problems(|s| {
        s.embedder.model.model_identity = None;
        s.reranker.model.hub = Some(HubSource { repo: "r".into(), revision: "main".into() });
        s.attestation.allowed_measurements = vec!["00".into()];
    });
    assert_eq!(p.len(), 3, "{p:?}");
}

#[test]
fn hex_parsing_is_exact() {
    assert_eq!(parse_hex::<2>("0aff"), Some([0x0a, 0xff]));
    assert_eq!(parse_hex::<2>("0aFF"), None);
    assert_eq!(parse_hex::<2>("0aff00"), None);
    assert_eq!(parse_hex::<2>("0g00"), None);
}

#[test]
fn the_protections_a_spec_names_reach_its_policy() {
    let v = validate(&PrivateRAGPipelineSpec::test()).expect("valid");
    assert_eq!(v.protections, vec!["sealed".to_string()]);
    let mut spec = PrivateRAGPipelineSpec::test();
    spec.generator.protection = crate::crd::Protection::DualLpn;
    spec.embedder.protection = crate::crd::Protection::Masked;
    let v = validate(&spec).expect("valid");
    assert_eq!(v.protections, vec!["sealed".to_string(), "masked".to_string(), "dual-lpn".to_string()]);
    // The CRD spelling is the one `gelo serve --protection` and the attested scheme use.
    let parsed: crate::crd::Protection = serde_json::from_str("\"dual-lpn\"").expect("parses");
    assert_eq!(parsed, crate::crd::Protection::DualLpn);
    assert_eq!(parsed.as_str(), "dual-lpn");
}

/// The release fixtures a real Tessera log wrote (scripts/release/e2e.sh), as the attest
/// crate's tests read them.
fn release_file(name: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../services/edge/attest/testdata/release");
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn release_log(releases: &[&str], remembered: Option<&str>) -> crate::crd::ReleaseLogSpec {
    crate::crd::ReleaseLogSpec {
        public_key: release_file("log.pub"),
        releases: releases.iter().map(|r| release_file(r)).collect(),
        remembered_checkpoint: remembered.map(release_file),
    }
}

#[test]
fn a_release_log_reaches_the_policy_checked() {
    let mut spec = PrivateRAGPipelineSpec::test();
    spec.attestation.release_log = Some(release_log(&["gelo-2vcpu.bundle.json"], Some("remembered.checkpoint")));
    let v = validate(&spec).expect("a genuine log is valid");
    let log = v.release_log.expect("carried to the policy");
    let policy = attest::Policy::default().with_release_log(log);
    assert!(policy.release_log_state().expect("checks").is_some());

    // A forged bundle (another history under the same key) is a problem of the spec, named
    // by its reason, not a pod refused later for a confusing one.
    let p = problems(|s| {
        s.attestation.release_log = Some(release_log(&["forged.bundle.json"], Some("remembered.checkpoint")))
    });
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("attestation.releaseLog refused (release_log_"), "{p:?}");
}
