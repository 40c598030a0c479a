//! The release log a policy can require: a measurement is accepted only when a release
//! manifest naming it is proven to be in the log, under a signed checkpoint consistent with
//! the one the verifier remembers. The fixtures are what scripts/release/e2e.sh read from a
//! real Tessera log (GELO_RELEASE_FIXTURES points these tests at a fresh run's).

use std::path::PathBuf;

use attest::release::{LogKey, ReleaseLogError, ReleaseLogPolicy, ReleaseManifest, ReleaseSource, check_bundle};
use attest::verify::REASONS;
use attest::{Verifier, VerifyError, issuer::default_mock_measurement};

use super::common::*;

fn dir() -> PathBuf {
    std::env::var_os("GELO_RELEASE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/release"))
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn manifest(name: &str) -> ReleaseManifest {
    ReleaseManifest::parse(&read(name)).expect("manifest")
}

fn log_policy(releases: &[&str], remembered: Option<&str>) -> ReleaseLogPolicy {
    ReleaseLogPolicy {
        public_key: read("log.pub"),
        releases: releases.iter().map(|r| ReleaseSource::File(dir().join(r))).collect(),
        remembered_checkpoint: remembered.map(|c| ReleaseSource::File(dir().join(c))),
    }
}

/// Evidence from a mock AMD-SP told to report `measurement`, checked by a policy that pins
/// `measurement` and requires `log`.
fn verify_with(measurement: [u8; 48], log: ReleaseLogPolicy) -> Result<attest::Verified, VerifyError> {
    let evidence = evidence_from(&issuer().with_measurement(measurement));
    let policy = policy().allow_measurement(measurement).with_release_log(log);
    Verifier::new().verify(&evidence, &expected(), &policy)
}

fn reason(result: Result<attest::Verified, VerifyError>) -> &'static str {
    let err = result.expect_err("must be refused");
    assert!(REASONS.contains(&err.reason()), "{err:?}");
    err.reason()
}

#[test]
fn the_measurement_derived_from_the_parts_is_the_one_the_log_holds_and_the_mock_reports() {
    let launch: serde_json::Value = serde_json::from_str(&read("launch.json")).unwrap();
    let derived: attest::Hex<48> = launch["measurement"].as_str().unwrap().parse().unwrap();
    let m = manifest("gelo-2vcpu.manifest.json");
    assert_eq!(m.launch.measurement, derived, "the manifest carries measure.sh's result");
    assert_eq!(serde_json::to_value(&m.launch).unwrap(), launch, "and every part of it");
    assert_eq!(m.launch.initrd.gelo_sha256, m.binary.sha256, "the initrd holds the release binary");
    assert_ne!(derived.0, default_mock_measurement(), "not the mock's placeholder");

    let v = verify_with(derived.0, log_policy(&["gelo-2vcpu.bundle.json"], Some("remembered.checkpoint")))
        .expect("a logged measurement, consistent log");
    assert_eq!(v.measurement(), &derived.0);

    let state = log_policy(&["gelo-2vcpu.bundle.json", "gelo-4vcpu.bundle.json"], Some("remembered.checkpoint"))
        .check()
        .expect("both releases");
    let four = manifest("gelo-4vcpu.manifest.json").launch.measurement.0;
    assert_ne!(four, derived.0, "the vCPU count is part of the measurement");
    assert_eq!(state.release_for(&four).unwrap().index, 1);
    assert_eq!(state.release_for(&derived.0).unwrap().index, 0);
    assert_eq!(state.newest_checkpoint().unwrap().note(), read("latest.checkpoint"), "what to remember next");
}

#[test]
fn a_measurement_missing_from_the_log_is_refused() {
    // Pinned by the policy, reported by the (trusted) mock, but in no logged release.
    let r =
        verify_with(default_mock_measurement(), log_policy(&["gelo-2vcpu.bundle.json"], Some("remembered.checkpoint")));
    assert_eq!(reason(r), "measurement_not_in_release_log");
    // A policy that does not require the log accepts the same evidence.
    let evidence = evidence_from(&issuer());
    Verifier::new().verify(&evidence, &expected(), &policy()).expect("without the log requirement");
    // No bundle at all.
    let logged = manifest("gelo-2vcpu.manifest.json").launch.measurement.0;
    assert_eq!(
        reason(verify_with(logged, log_policy(&[], Some("remembered.checkpoint")))),
        "measurement_not_in_release_log"
    );
}

#[test]
fn a_forked_log_is_refused() {
    let forged = manifest("forged.manifest.json").launch.measurement.0;
    let r = verify_with(forged, log_policy(&["forged.bundle.json"], Some("remembered.checkpoint")));
    assert_eq!(reason(r), "release_log_forked");
    // One forked bundle refuses the log for every release, the genuine ones too.
    let genuine = manifest("gelo-2vcpu.manifest.json").launch.measurement.0;
    let both = log_policy(&["gelo-2vcpu.bundle.json", "forged.bundle.json"], Some("remembered.checkpoint"));
    assert_eq!(reason(verify_with(genuine, both)), "release_log_forked");
    // Its checkpoint is validly signed: without a remembered checkpoint the split view
    // passes, which is why a verifier keeps one.
    verify_with(forged, log_policy(&["forged.bundle.json"], None)).expect("alone, the fork looks like a log");
}

#[test]
fn a_checkpoint_older_than_the_remembered_one_is_refused() {
    let genuine = manifest("gelo-2vcpu.manifest.json").launch.measurement.0;
    let r = verify_with(genuine, log_policy(&["gelo-2vcpu.at1.bundle.json"], Some("latest.checkpoint")));
    assert_eq!(reason(r), "release_log_rolled_back");
    // The same bundle at the size it was taken, remembered, is fine.
    verify_with(genuine, log_policy(&["gelo-2vcpu.at1.bundle.json"], Some("remembered.checkpoint"))).unwrap();
}

fn bundle_check(text: &str, remembered: Option<&str>) -> Result<(), ReleaseLogError> {
    let key = LogKey::new(&read("log.pub"))?;
    let remembered = remembered.map(|c| key.open(&read(c))).transpose()?;
    check_bundle(&key, "test", text, remembered.as_ref()).map(|_| ())
}

fn edit(name: &str, f: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&read(name)).unwrap();
    f(&mut v);
    v.to_string()
}

#[test]
fn tampered_bundles_get_their_own_reasons() {
    let ok = read("gelo-2vcpu.bundle.json");
    bundle_check(&ok, Some("remembered.checkpoint")).expect("untouched");
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        (
            "release_inclusion_proof_invalid",
            edit("gelo-2vcpu.bundle.json", |v| {
                let m = v["manifest"].as_str().unwrap().replace("\"vcpus\": 2", "\"vcpus\": 3");
                v["manifest"] = m.into();
            }),
            None,
        ),
        ("release_inclusion_proof_invalid", edit("gelo-2vcpu.bundle.json", |v| v["proof"]["index"] = 1.into()), None),
        ("release_inclusion_proof_invalid", edit("gelo-2vcpu.bundle.json", |v| v["proof"]["index"] = 9.into()), None),
        (
            "release_checkpoint_signature_invalid",
            edit("gelo-2vcpu.bundle.json", |v| {
                let c = v["proof"]["checkpoint"].as_str().unwrap().replacen("\n2\n", "\n3\n", 1);
                v["proof"]["checkpoint"] = c.into();
            }),
            None,
        ),
        (
            "release_checkpoint_signature_invalid",
            edit("gelo-2vcpu.bundle.json", |v| {
                let c =
                    v["proof"]["checkpoint"].as_str().unwrap().replace("gelo.example/releases", "other.example/log");
                v["proof"]["checkpoint"] = c.into();
            }),
            None,
        ),
        (
            "release_consistency_proof_missing",
            edit("gelo-2vcpu.bundle.json", |v| {
                v["proof"].as_object_mut().unwrap().remove("consistency").map(|_| ()).unwrap()
            }),
            Some("remembered.checkpoint"),
        ),
        (
            "release_log_forked",
            edit("gelo-2vcpu.bundle.json", |v| v["proof"]["consistency"]["proof"][0] = zero_hash().into()),
            Some("remembered.checkpoint"),
        ),
        (
            "release_proof_malformed",
            edit("gelo-2vcpu.bundle.json", |v| v["proof"]["inclusion"][0] = "AAAA".into()),
            None,
        ),
        ("release_proof_malformed", edit("gelo-2vcpu.bundle.json", |v| v["proof"]["inclusion"][0] = "!!".into()), None),
        (
            "release_proof_malformed",
            edit("gelo-2vcpu.bundle.json", |v| v["proof"]["inclusion"] = vec![zero_hash(); 65].into()),
            None,
        ),
        ("release_bundle_malformed", "{\"manifest\": 1}".into(), None),
        ("release_bundle_malformed", "not json".into(), None),
        (
            "release_checkpoint_malformed",
            edit("gelo-2vcpu.bundle.json", |v| v["proof"]["checkpoint"] = "x".into()),
            None,
        ),
    ];
    for (want, text, remembered) in cases {
        let err = bundle_check(&text, remembered).expect_err(want);
        assert_eq!(err.reason(), want, "{err}");
        assert!(REASONS.contains(&err.reason()), "{}", err.reason());
    }
}

/// A well-formed hash (32 zero bytes, base64) that is in no proof.
fn zero_hash() -> String {
    format!("{}=", "A".repeat(43))
}

#[test]
fn bad_keys_and_manifests_are_typed_errors() {
    assert_eq!(LogKey::new("not a key").unwrap_err().reason(), "release_log_key_invalid");
    assert_eq!(LogKey::new("").unwrap_err().reason(), "release_log_key_invalid");
    let m = read("gelo-2vcpu.manifest.json");
    for bad in [
        m.replace("gelo-release/1", "gelo-release/0"),
        m.replace("\"schema\"", "\"extra\": 1, \"schema\""),
        "[]".into(),
    ] {
        assert_eq!(ReleaseManifest::parse(&bad).unwrap_err().reason(), "release_manifest_malformed");
    }
    let sha = manifest("gelo-2vcpu.manifest.json").binary.sha256;
    let other = m.replacen(&format!("{sha:?}"), &"00".repeat(32), 1);
    assert_eq!(ReleaseManifest::parse(&other).unwrap_err().reason(), "release_manifest_malformed", "initrd ≠ binary");
    // A policy whose log is unusable refuses, with the log's reason, not a panic.
    let mut p = log_policy(&["gelo-2vcpu.bundle.json"], None);
    p.public_key = "x".into();
    let genuine = manifest("gelo-2vcpu.manifest.json").launch.measurement.0;
    assert_eq!(reason(verify_with(genuine, p)), "release_log_key_invalid");
    let p = log_policy(&["no-such-bundle.json"], None);
    assert_eq!(reason(verify_with(genuine, p)), "release_bundle_malformed");
}

#[test]
fn a_policy_file_names_the_log_and_its_digest_follows_content_not_paths() {
    let d = tempfile::tempdir().unwrap();
    for f in ["log.pub", "gelo-2vcpu.bundle.json", "remembered.checkpoint"] {
        std::fs::copy(dir().join(f), d.path().join(f)).unwrap();
    }
    std::fs::write(d.path().join("ark.pem"), pki().ark_pem()).unwrap();
    let genuine = manifest("gelo-2vcpu.manifest.json").launch.measurement;
    let yaml = format!(
        "trusted_roots: [{{mock_file: ark.pem}}]\nmeasurements: ['{genuine:?}']\nrelease_log:\n  public_key: {:?}\n  releases: [{{file: gelo-2vcpu.bundle.json}}]\n  remembered_checkpoint: {{file: remembered.checkpoint}}\n",
        read("log.pub").trim()
    );
    std::fs::write(d.path().join("policy.yaml"), &yaml).unwrap();
    let from_file = attest::Policy::from_file(d.path().join("policy.yaml")).expect("loads");
    let evidence = evidence_from(&issuer().with_measurement(genuine.0));
    Verifier::new().verify(&evidence, &expected(), &from_file).expect("relative paths resolve");
    let inline = from_file.clone().with_release_log(ReleaseLogPolicy {
        public_key: read("log.pub").trim().to_owned(),
        releases: vec![ReleaseSource::Inline(read("gelo-2vcpu.bundle.json"))],
        remembered_checkpoint: Some(ReleaseSource::Inline(read("remembered.checkpoint"))),
    });
    let mut plain = from_file.clone();
    plain.release_log = None;
    assert_eq!(from_file.digest().unwrap(), inline.digest().unwrap(), "the log by content");
    assert_ne!(from_file.digest().unwrap(), plain.digest().unwrap(), "requiring the log changes the digest");
}
