//! `gelo attest` as a user runs it: the built binary makes a mock PKI, issues evidence to a
//! file and judges it against the policy `mock-pki` printed. Accepted evidence exits 0;
//! every rejection exits 1 and names its reason, in text and in `--json`; input it cannot
//! judge exits 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MODEL: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const OTHER_MODEL: &str = "1111111111111111111111111111111111111111111111111111111111111112";
const TLS: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const OTHER_TLS: &str = "2222222222222222222222222222222222222222222222222222222222222223";
const NONCE: &str = "33333333333333333333333333333333";
const OTHER_NONCE: &str = "33333333333333333333333333333334";
const SCHEME: &str =
    r#"{"role":"embedder","protocol":{"executor":"sealed"},"mask":"haar","shield":{"k":8,"energy":4.0}}"#;

fn gelo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gelo")).args(args).env("RUST_LOG", "warn").output().expect("spawning gelo")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(args: &[&str]) -> String {
    let out = gelo(args);
    assert!(out.status.success(), "gelo {args:?} failed ({}):\n{}{}", out.status, text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// One test's files: the shared mock PKI, this test's policy and evidence.
struct Case {
    dir: tempfile::TempDir,
    pki: PathBuf,
    policy: PathBuf,
    evidence: PathBuf,
    report: Vec<u8>,
}

impl Case {
    /// `mock-pki` (generated once per target folder: RSA-4096 takes seconds; later runs
    /// load it), its printed policy saved as a file, then `issue` with fixed identities.
    fn new() -> Case {
        let pki = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-attest-cli-pki");
        let printed = ok(&["attest", "mock-pki", "--out", path(&pki)]);
        let (_, policy_yaml) = printed
            .split_once("# a policy that trusts this mock root (never trusted by default):\n")
            .unwrap_or_else(|| panic!("mock-pki printed no policy:\n{printed}"));
        assert!(policy_yaml.contains("mock_file:"), "{policy_yaml}");

        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, policy_yaml).unwrap();
        let evidence = dir.path().join("evidence.pb");
        let export = dir.path().join("export");
        let wrote = ok(&args(
            &["attest", "issue"],
            &[
                ("--issuer", "mock"),
                ("--mock-pki", path(&pki)),
                ("--model-identity", MODEL),
                ("--scheme-json", SCHEME),
                ("--tls-spki-sha256", TLS),
                ("--nonce", NONCE),
                ("--out", path(&evidence)),
                ("--export", path(&export)),
            ],
        ));
        assert!(wrote.contains("mock evidence"), "{wrote}");
        let report = std::fs::read(export.join("report.bin")).unwrap();
        assert_eq!(report.len(), 1184);
        Case { dir, pki, policy, evidence, report }
    }

    /// `verify` with the expected binding; `overrides` replace a flag's value.
    fn verify(&self, evidence: &Path, policy: &Path, overrides: &[(&str, &str)], json: bool) -> Output {
        let mut flags = vec![
            ("--evidence", path(evidence)),
            ("--policy", path(policy)),
            ("--nonce", NONCE),
            ("--model-identity", MODEL),
            ("--scheme-json", SCHEME),
            ("--tls-spki-sha256", TLS),
        ];
        for (flag, value) in overrides {
            flags.iter_mut().find(|(f, _)| f == flag).expect("known flag").1 = value;
        }
        let mut args = args(&["attest", "verify"], &flags);
        if json {
            args.push("--json");
        }
        gelo(&args)
    }

    /// Runs `verify` in text and JSON form and requires a rejection for `reason` in both.
    fn rejects(&self, evidence: &Path, policy: &Path, overrides: &[(&str, &str)], reason: &str) {
        let out = self.verify(evidence, policy, overrides, false);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "expected a rejection for {reason} (exit status 1):\n{stdout}");
        assert!(
            stdout.starts_with(&format!("rejected: {reason}: ")),
            "expected {reason}, got:\n{stdout}{}",
            text(&out.stderr)
        );

        let out = self.verify(evidence, policy, overrides, true);
        assert_eq!(out.status.code(), Some(1), "--json: expected a rejection for {reason} (exit status 1)");
        let verdict: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("--json printed no JSON ({e}):\n{}", text(&out.stdout)));
        assert_eq!(verdict["accepted"], false, "{verdict}");
        assert_eq!(verdict["reason"], reason, "{verdict}");
        assert!(verdict["detail"].as_str().is_some_and(|d| !d.is_empty()), "{verdict}");
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

/// A command line: `command` then each flag and its value.
fn args<'a>(command: &[&'a str], flags: &[(&'a str, &'a str)]) -> Vec<&'a str> {
    command.iter().copied().chain(flags.iter().flat_map(|&(flag, value)| [flag, value])).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

#[test]
fn issued_evidence_is_accepted() {
    let case = Case::new();
    let out = case.verify(&case.evidence, &case.policy, &[], false);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "rejected:\n{stdout}{}", text(&out.stderr));
    assert!(stdout.starts_with("accepted: mock evidence from root mock:"), "{stdout}");
    assert!(stdout.contains(&format!("model identity  {MODEL}")), "{stdout}");
    assert!(stdout.contains("role            embedder"), "{stdout}");

    let out = case.verify(&case.evidence, &case.policy, &[], true);
    assert!(out.status.success());
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON verdict");
    assert_eq!(verdict["accepted"], true, "{verdict}");
    assert_eq!(verdict["verified"]["model_identity"], MODEL, "{verdict}");
    assert_eq!(verdict["verified"]["issuer"], "mock", "{verdict}");

    // The binding fields are optional on the command line, except the nonce.
    let (evidence, policy) = (path(&case.evidence), path(&case.policy));
    let minimal =
        gelo(&args(&["attest", "verify"], &[("--evidence", evidence), ("--policy", policy), ("--nonce", NONCE)]));
    assert!(minimal.status.success(), "{}", text(&minimal.stdout));
}

#[test]
fn wrong_binding_is_rejected_with_its_reason() {
    let case = Case::new();
    case.rejects(&case.evidence, &case.policy, &[("--nonce", OTHER_NONCE)], "nonce_mismatch");
    case.rejects(&case.evidence, &case.policy, &[("--model-identity", OTHER_MODEL)], "model_identity_mismatch");
    case.rejects(&case.evidence, &case.policy, &[("--tls-spki-sha256", OTHER_TLS)], "tls_key_mismatch");
    case.rejects(
        &case.evidence,
        &case.policy,
        &[("--scheme-json", r#"{"role":"embedder","mask":"haar"}"#)],
        "scheme_identity_mismatch",
    );
}

#[test]
fn policy_without_the_mock_root_is_rejected() {
    let case = Case::new();
    // The defaults: AMD's roots only.
    let amd_only = case.file("amd-only.json", b"{}");
    case.rejects(&case.evidence, &amd_only, &[], "mock_root_not_trusted");
    // Another mock root is no better than none (kept across runs, like the main one).
    let other_pki = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gelo-attest-cli-other-pki");
    let other = case.file(
        "other-root.yaml",
        format!("trusted_roots:\n  - mock_file: {}\n", other_pki.join("ark.pem").display()).as_bytes(),
    );
    ok(&["attest", "mock-pki", "--out", path(&other_pki)]);
    case.rejects(&case.evidence, &other, &[], "mock_root_not_trusted");
    // The right root without an allowed measurement.
    let no_measurement = case.file(
        "no-measurement.yaml",
        format!("trusted_roots:\n  - mock_file: {}\n", case.pki.join("ark.pem").display()).as_bytes(),
    );
    case.rejects(&case.evidence, &no_measurement, &[], "measurement_not_allowed");
}

#[test]
fn tampered_and_truncated_files_are_rejected() {
    let case = Case::new();
    let bytes = std::fs::read(&case.evidence).unwrap();
    // One byte of the signed report (its MEASUREMENT, at 0x90) flipped inside the file.
    let at = bytes.windows(case.report.len()).position(|w| w == case.report).expect("report inside the evidence file");
    let mut flipped = bytes.clone();
    flipped[at + 0x90] ^= 0x01;
    let tampered = case.file("tampered.pb", &flipped);
    case.rejects(&tampered, &case.policy, &[], "report_signature_invalid");

    // One byte of the signature itself (R, at 0x2A0).
    let mut flipped = bytes.clone();
    flipped[at + 0x2A0] ^= 0x80;
    let tampered = case.file("tampered-signature.pb", &flipped);
    case.rejects(&tampered, &case.policy, &[], "report_signature_invalid");

    // Cut in the middle of the report field, and cut to nothing.
    let truncated = case.file("truncated.pb", &bytes[..at + 100]);
    case.rejects(&truncated, &case.policy, &[], "evidence_malformed");
    let empty = case.file("empty.pb", b"");
    case.rejects(&empty, &case.policy, &[], "evidence_malformed");
}

#[test]
fn inputs_it_cannot_judge_exit_2_not_1() {
    // 1 means "rejected" (see `Case::rejects`); a script must be able to tell a missing
    // file or a typo from that.
    let case = Case::new();
    let missing = case.dir.path().join("missing.pb");
    for (evidence, policy, overrides) in [
        (&missing, &case.policy, &[][..]),
        (&case.evidence, &missing, &[][..]),
        (&case.evidence, &case.policy, &[("--nonce", "not-hex")][..]),
    ] {
        let out = case.verify(evidence, policy, overrides, true);
        assert_eq!(out.status.code(), Some(2), "{}{}", text(&out.stdout), text(&out.stderr));
        let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON even for an error");
        assert_eq!(verdict["accepted"], false, "{verdict}");
        assert!(verdict["error"].as_str().is_some_and(|e| !e.is_empty()), "{verdict}");
        assert!(text(&out.stderr).contains("error: "), "{}", text(&out.stderr));
    }
}
