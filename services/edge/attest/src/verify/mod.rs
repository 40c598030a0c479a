//! Where evidence is verified. One code path for AMD hardware evidence and mock evidence:
//! only the trusted root differs, and a mock root counts only when the policy names it.
//!
//! Order of checks: the chain (ARK trusted and self-signed, ASK by ARK, VCEK by ASK,
//! validity, revocation when the policy lists CRLs), the report signature over the raw
//! signed bytes, the VCEK's TCB and hwID (required by default) against the report, the report-level policy (version, debug, migration agent, VMPL,
//! TCB, measurement, chip ID); then GELO's claims: issuer kind, scheme JSON and role, the
//! expected binding, REPORT_DATA, and the claim-level policy (model, scheme, role
//! allowlists, and the protection a model service runs). The first failure is returned.

mod revocation;

use std::time::{Duration, SystemTime};

use sev::certs::snp::Verifiable;
use x509_cert::der::{Decode, Encode};

pub use crate::rejection::{CertRole, REASONS, VerifyError};

use crate::amd::{self, VcekExtensions};
use crate::binding::{report_data, scheme_identity};
use crate::evidence::{CertChain, Evidence, IssuerKind};
use crate::policy::{MODEL_ROLES, Policy, RootCert};
use crate::report::{self, SIG_ALGO_ECDSA_P384_SHA384, Tcb};

/// Marks the subject of every mock certificate, so a rejected mock chain gets its own reason.
pub const MOCK_ORGANIZATION: &str = "GELO mock AMD-SP (not Advanced Micro Devices)";

/// What the verifier expects the evidence to be bound to. `None` leaves a field open (the
/// policy's allowlists still apply); the nonce is always checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedBinding {
    pub model_identity: Option<[u8; 32]>,
    pub scheme_identity: Option<[u8; 32]>,
    /// SHA-256 of the DER SPKI of the TLS key the peer used on this connection. `None`
    /// only for offline checks: without it, evidence can be replayed by anyone holding it.
    pub tls_spki_sha256: Option<[u8; 32]>,
    pub nonce: Vec<u8>,
}

/// A report and chain that passed [`Verifier::verify_report`]: the AMD-SP (or a trusted
/// mock) signed this report, and the report satisfies the policy's report-level rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedReport {
    issuer: IssuerKind,
    root: String,
    measurement: [u8; 48],
    report_data: [u8; 64],
    chip_id: [u8; 64],
    reported_tcb: Tcb,
    report_version: u32,
    vmpl: u32,
    guest_policy: u64,
    host_data: [u8; 32],
    product_name: Option<String>,
}

impl VerifiedReport {
    /// Hardware or mock, as proven by the root the chain ends at.
    pub fn issuer(&self) -> IssuerKind {
        self.issuer
    }
    /// Name of the trusted root that matched (`amd-genoa`, `mock:…`).
    pub fn root(&self) -> &str {
        &self.root
    }
    pub fn measurement(&self) -> &[u8; 48] {
        &self.measurement
    }
    pub fn report_data(&self) -> &[u8; 64] {
        &self.report_data
    }
    pub fn chip_id(&self) -> &[u8; 64] {
        &self.chip_id
    }
    pub fn reported_tcb(&self) -> Tcb {
        self.reported_tcb
    }
    pub fn report_version(&self) -> u32 {
        self.report_version
    }
    pub fn vmpl(&self) -> u32 {
        self.vmpl
    }
    pub fn guest_policy(&self) -> u64 {
        self.guest_policy
    }
    pub fn host_data(&self) -> &[u8; 32] {
        &self.host_data
    }
    /// The VCEK's product name extension (`Milan-B0`, `Genoa`, ...).
    pub fn product_name(&self) -> Option<&str> {
        self.product_name.as_deref()
    }
}

/// Evidence that passed [`Verifier::verify`]. Only the verifier can make one, so holding a
/// `Verified` is proof that every check ran. Report facts are reachable through `Deref`
/// to [`VerifiedReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    report: VerifiedReport,
    model_identity: [u8; 32],
    scheme_identity: [u8; 32],
    scheme_json: String,
    role: String,
    tls_spki_sha256: [u8; 32],
    nonce: Vec<u8>,
}

impl std::ops::Deref for Verified {
    type Target = VerifiedReport;
    fn deref(&self) -> &VerifiedReport {
        &self.report
    }
}

impl Verified {
    pub fn model_identity(&self) -> &[u8; 32] {
        &self.model_identity
    }
    pub fn scheme_identity(&self) -> &[u8; 32] {
        &self.scheme_identity
    }
    pub fn scheme_json(&self) -> &str {
        &self.scheme_json
    }
    pub fn role(&self) -> &str {
        &self.role
    }
    pub fn tls_spki_sha256(&self) -> &[u8; 32] {
        &self.tls_spki_sha256
    }
    pub fn nonce(&self) -> &[u8] {
        &self.nonce
    }

    /// A plain record of what was proven, for logs, CLI output and a CRD status.
    pub fn summary(&self) -> VerifiedSummary {
        let r = &self.report;
        VerifiedSummary {
            issuer: r.issuer,
            root: r.root.clone(),
            measurement: hex::encode(r.measurement),
            model_identity: hex::encode(self.model_identity),
            scheme_identity: hex::encode(self.scheme_identity),
            role: self.role.clone(),
            tls_spki_sha256: hex::encode(self.tls_spki_sha256),
            chip_id: hex::encode(r.chip_id),
            reported_tcb: r.reported_tcb,
            report_version: r.report_version,
            vmpl: r.vmpl,
            guest_policy: format!("{:#x}", r.guest_policy),
            product_name: r.product_name.clone(),
        }
    }
}

/// Serializable copy of a [`Verified`]'s facts. Not itself proof of anything.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifiedSummary {
    pub issuer: IssuerKind,
    pub root: String,
    pub measurement: String,
    pub model_identity: String,
    pub scheme_identity: String,
    pub role: String,
    pub tls_spki_sha256: String,
    pub chip_id: String,
    pub reported_tcb: Tcb,
    pub report_version: u32,
    pub vmpl: u32,
    pub guest_policy: String,
    pub product_name: Option<String>,
}

/// The verifier. Stateless apart from an optional fixed clock for tests and replays.
#[derive(Clone, Copy, Debug, Default)]
pub struct Verifier {
    now: Option<SystemTime>,
}

/// Shortcut for `Verifier::new().verify(..)`.
pub fn verify(evidence: &Evidence, expected: &ExpectedBinding, policy: &Policy) -> Result<Verified, VerifyError> {
    Verifier::new().verify(evidence, expected, policy)
}

impl Verifier {
    pub fn new() -> Self {
        Self { now: None }
    }

    /// Checks certificate validity at `time` instead of now.
    pub fn at(time: SystemTime) -> Self {
        Self { now: Some(time) }
    }

    /// Decodes `gelo.v1.Evidence` bytes, then [`Self::verify`]s them.
    pub fn verify_bytes(
        &self,
        bytes: &[u8],
        expected: &ExpectedBinding,
        policy: &Policy,
    ) -> Result<Verified, VerifyError> {
        let evidence = Evidence::from_bytes(bytes).map_err(|e| VerifyError::EvidenceMalformed(e.to_string()))?;
        self.verify(&evidence, expected, policy)
    }

    pub fn verify(
        &self,
        evidence: &Evidence,
        expected: &ExpectedBinding,
        policy: &Policy,
    ) -> Result<Verified, VerifyError> {
        // 1-3 and the report-level policy: the same path hardware and mock evidence take.
        let report = self.verify_report_inner(&evidence.report, &evidence.chain(), Some(evidence.issuer), policy)?;

        // 4. The claims, the expected binding, and REPORT_DATA.
        if evidence.issuer != report.issuer {
            return Err(VerifyError::IssuerKindMismatch {
                claimed: evidence.issuer.to_string(),
                proven: report.issuer.to_string(),
            });
        }
        check_scheme(evidence)?;
        if expected.model_identity.is_some_and(|m| m != evidence.model_identity) {
            return Err(VerifyError::ModelIdentityMismatch);
        }
        if expected.scheme_identity.is_some_and(|s| s != evidence.scheme_identity) {
            return Err(VerifyError::SchemeIdentityMismatch);
        }
        if expected.tls_spki_sha256.is_some_and(|t| t != evidence.tls_spki_sha256) {
            return Err(VerifyError::TlsKeyMismatch);
        }
        if expected.nonce != evidence.nonce {
            return Err(VerifyError::NonceMismatch);
        }
        if report_data(&evidence.binding()) != report.report_data {
            return Err(VerifyError::ReportDataMismatch);
        }

        // 5. Claim-level policy.
        if let Some(models) = &policy.model_identities
            && !models.iter().any(|m| m.0 == evidence.model_identity)
        {
            return Err(VerifyError::ModelIdentityNotAllowed(hex::encode(evidence.model_identity)));
        }
        if let Some(schemes) = &policy.scheme_identities
            && !schemes.iter().any(|s| s.0 == evidence.scheme_identity)
        {
            return Err(VerifyError::SchemeIdentityNotAllowed(hex::encode(evidence.scheme_identity)));
        }
        if let Some(roles) = &policy.roles
            && !roles.contains(&evidence.role)
        {
            return Err(VerifyError::RoleNotAllowed(evidence.role.clone()));
        }
        if MODEL_ROLES.contains(&evidence.role.as_str()) {
            // The scheme JSON hashed into REPORT_DATA (checked above) names the executor.
            let scheme: serde_json::Value =
                serde_json::from_str(&evidence.scheme_json).map_err(|_| VerifyError::SchemeJsonMismatch)?;
            let protection = scheme.pointer("/protocol/executor").and_then(|e| e.as_str()).unwrap_or("none");
            if !policy.protections.iter().any(|p| p == protection) {
                return Err(VerifyError::ProtectionNotAllowed {
                    role: evidence.role.clone(),
                    protection: protection.to_owned(),
                    allowed: policy.protections.clone(),
                });
            }
            match protection {
                "masked" => check_masked(&evidence.role, &scheme, &policy.masked)?,
                "dual-lpn" => check_dual_lpn(&evidence.role, &scheme, &policy.dual_lpn)?,
                _ => {}
            }
        }

        Ok(Verified {
            report,
            model_identity: evidence.model_identity,
            scheme_identity: evidence.scheme_identity,
            scheme_json: evidence.scheme_json.clone(),
            role: evidence.role.clone(),
            tls_spki_sha256: evidence.tls_spki_sha256,
            nonce: evidence.nonce.clone(),
        })
    }

    /// Verifies a bare report and its chain, and the policy's report-level rules (version,
    /// debug, migration agent, VMPL, TCB, measurement, chip ID), without GELO's claims.
    /// This is the part [`Self::verify`] shares with any SEV-SNP evidence, e.g. a report
    /// from another tool.
    pub fn verify_report(
        &self,
        report: &[u8],
        chain: &CertChain,
        policy: &Policy,
    ) -> Result<VerifiedReport, VerifyError> {
        self.verify_report_inner(report, chain, None, policy)
    }

    fn verify_report_inner(
        &self,
        report: &[u8],
        chain: &CertChain,
        claimed: Option<IssuerKind>,
        policy: &Policy,
    ) -> Result<VerifiedReport, VerifyError> {
        let roots = policy.roots()?;

        // 1. The chain.
        let ark = parse_cert(&chain.ark_der, CertRole::Ark)?;
        let ask = parse_cert(&chain.ask_der, CertRole::Ask)?;
        let vcek = parse_cert(&chain.vcek_der, CertRole::Vcek)?;
        let (root, ask_s) = check_ark_ask(&roots, &ark, &ask, claimed)?;
        let vcek_s = check_vcek(&ask_s, &vcek)?;
        let now = policy.check_certificate_validity.then(|| self.now.unwrap_or_else(SystemTime::now));
        if let Some(now) = now {
            for (cert, which) in [(&ark, CertRole::Ark), (&ask, CertRole::Ask), (&vcek, CertRole::Vcek)] {
                check_validity(cert, which, now)?;
            }
        }
        revocation::check(&policy.loaded_crls()?, &ark, &ask, &vcek, now)?;

        // 2. The report's signature, over the bytes as received.
        let parsed = report::parse(report)?;
        let fields = &parsed.fields;
        if fields.sig_algo != SIG_ALGO_ECDSA_P384_SHA384 {
            return Err(VerifyError::SignatureAlgorithmUnsupported(fields.sig_algo));
        }
        let vcek_key = p384::ecdsa::VerifyingKey::from_sec1_bytes(vcek_s.public_key_sec1())
            .map_err(|e| VerifyError::VcekKeyInvalid(e.to_string()))?;
        let signature = parsed.signature()?;
        use p384::ecdsa::signature::Verifier as _;
        vcek_key.verify(parsed.signed_bytes(), &signature).map_err(|_| VerifyError::ReportSignatureInvalid)?;

        // 3. The VCEK must be the one for this chip at this TCB.
        let ext = amd::vcek_extensions(&vcek)
            .map_err(|detail| VerifyError::CertificateMalformed { which: CertRole::Vcek, detail })?;
        let reported_tcb = parsed.reported_tcb();
        check_vcek_binding(&ext, reported_tcb, &fields.chip_id, policy.require_vcek_hwid)?;

        // Report-level policy.
        if fields.version < policy.min_report_version {
            return Err(VerifyError::ReportVersionTooOld { got: fields.version, min: policy.min_report_version });
        }
        if fields.policy.debug_allowed() && !policy.allow_debug {
            return Err(VerifyError::DebugNotAllowed);
        }
        if fields.policy.migrate_ma_allowed() && !policy.allow_migration_agent {
            return Err(VerifyError::MigrationAgentNotAllowed);
        }
        if !policy.allowed_vmpls.contains(&fields.vmpl) {
            return Err(VerifyError::VmplNotAllowed(fields.vmpl));
        }
        check_min_tcb(reported_tcb, policy.min_tcb)?;
        if !policy.allow_any_measurement && !policy.measurements.iter().any(|m| m.0 == fields.measurement) {
            return Err(VerifyError::MeasurementNotAllowed(hex::encode(fields.measurement)));
        }
        if let Some(log) = policy.release_log_state()? {
            log.release_for(&fields.measurement)?;
        }
        if let Some(chips) = &policy.chip_ids
            && !chips.iter().any(|c| c.0 == fields.chip_id)
        {
            return Err(VerifyError::ChipIdNotAllowed(hex::encode(fields.chip_id)));
        }

        Ok(VerifiedReport {
            issuer: root.kind,
            root: root.name.clone(),
            measurement: fields.measurement,
            report_data: fields.report_data,
            chip_id: fields.chip_id,
            reported_tcb,
            report_version: fields.version,
            vmpl: fields.vmpl,
            guest_policy: u64::from(fields.policy),
            host_data: fields.host_data,
            product_name: ext.product_name,
        })
    }
}

fn parse_cert(der: &[u8], which: CertRole) -> Result<x509_cert::Certificate, VerifyError> {
    if der.is_empty() {
        return Err(VerifyError::CertificateMalformed { which, detail: "missing".into() });
    }
    let cert = x509_cert::Certificate::from_der(der)
        .map_err(|e| VerifyError::CertificateMalformed { which, detail: e.to_string() })?;
    // RFC 5280 4.1.1.2: the unsigned outer algorithm must equal the signed inner one. The
    // signature check reads neither's parameters, so without this the outer one could be
    // altered freely.
    if cert.signature_algorithm != cert.tbs_certificate.signature {
        return Err(VerifyError::CertificateMalformed {
            which,
            detail: "signatureAlgorithm differs from tbsCertificate.signature".into(),
        });
    }
    Ok(cert)
}

fn sev_cert(cert: &x509_cert::Certificate) -> sev::certs::snp::Certificate {
    sev::certs::snp::Certificate::from(cert.clone())
}

/// The chain up to the ASK: the ARK is a trusted root and signed itself, and signed the
/// ASK. Returns the root and the ASK in the form that checks the VCEK.
fn check_ark_ask<'a>(
    roots: &'a [RootCert],
    ark: &x509_cert::Certificate,
    ask: &x509_cert::Certificate,
    claimed: Option<IssuerKind>,
) -> Result<(&'a RootCert, sev::certs::snp::Certificate), VerifyError> {
    let root = trusted_root(roots, ark, claimed)?;
    let (ark_s, ask_s) = (sev_cert(ark), sev_cert(ask));
    (&ark_s, &ark_s).verify().map_err(|e| VerifyError::ArkSelfSignatureInvalid(e.to_string()))?;
    (&ark_s, &ask_s).verify().map_err(|e| VerifyError::AskSignatureInvalid(e.to_string()))?;
    Ok((root, ask_s))
}

/// The last link: the ASK signed the VCEK. Returns the VCEK that checks the report.
fn check_vcek(
    ask: &sev::certs::snp::Certificate,
    vcek: &x509_cert::Certificate,
) -> Result<sev::certs::snp::Certificate, VerifyError> {
    let vcek_s = sev_cert(vcek);
    (ask, &vcek_s).verify().map_err(|e| VerifyError::VcekSignatureInvalid(e.to_string()))?;
    Ok(vcek_s)
}

fn trusted_root<'a>(
    roots: &'a [RootCert],
    ark: &x509_cert::Certificate,
    claimed: Option<IssuerKind>,
) -> Result<&'a RootCert, VerifyError> {
    let spki = ark
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| VerifyError::CertificateMalformed { which: CertRole::Ark, detail: e.to_string() })?;
    if let Some(root) = roots.iter().find(|r| r.spki_der == spki) {
        return Ok(root);
    }
    let looks_mock = ark.tbs_certificate.subject.to_string().contains(MOCK_ORGANIZATION);
    Err(if looks_mock || claimed == Some(IssuerKind::Mock) {
        VerifyError::MockRootNotTrusted
    } else {
        VerifyError::RootNotTrusted
    })
}

fn check_validity(cert: &x509_cert::Certificate, which: CertRole, now: SystemTime) -> Result<(), VerifyError> {
    let now = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let v = &cert.tbs_certificate.validity;
    if now < v.not_before.to_unix_duration() {
        return Err(VerifyError::CertificateNotYetValid { which });
    }
    if now > v.not_after.to_unix_duration() {
        return Err(VerifyError::CertificateExpired { which });
    }
    Ok(())
}

fn check_vcek_binding(
    ext: &VcekExtensions,
    report_tcb: Tcb,
    chip_id: &[u8; 64],
    require_hwid: bool,
) -> Result<(), VerifyError> {
    let (Some(bootloader), Some(tee), Some(snp), Some(microcode)) = (ext.bootloader, ext.tee, ext.snp, ext.microcode)
    else {
        return Err(VerifyError::CertificateMalformed {
            which: CertRole::Vcek,
            detail: "missing AMD TCB extensions (1.3.6.1.4.1.3704.1.3.*)".into(),
        });
    };
    let vcek_tcb = Tcb { bootloader, tee, snp, microcode };
    if vcek_tcb != report_tcb {
        return Err(VerifyError::tcb_mismatch(vcek_tcb, report_tcb));
    }
    match ext.hw_id {
        None if require_hwid => Err(VerifyError::VcekHwidMissing),
        // The policy opted out: only the chain vouches for this key, not for a chip.
        None => Ok(()),
        Some(_) if !ext.matches_chip(chip_id) => Err(VerifyError::VcekChipIdMismatch),
        Some(_) => Ok(()),
    }
}

fn check_scheme(evidence: &Evidence) -> Result<(), VerifyError> {
    if scheme_identity(&evidence.scheme_json).ok() != Some(evidence.scheme_identity) {
        return Err(VerifyError::SchemeJsonMismatch);
    }
    // The role string travels outside REPORT_DATA; it counts only when the hashed settings
    // name the same role. An empty role claims nothing.
    let scheme: serde_json::Value =
        serde_json::from_str(&evidence.scheme_json).map_err(|_| VerifyError::SchemeJsonMismatch)?;
    let in_scheme = scheme.get("role").and_then(|r| r.as_str()).unwrap_or("");
    if in_scheme != evidence.role {
        return Err(VerifyError::RoleMismatch { claimed: evidence.role.clone(), in_scheme: in_scheme.to_owned() });
    }
    Ok(())
}

fn check_min_tcb(got: Tcb, min: Tcb) -> Result<(), VerifyError> {
    for (component, got, min) in [
        ("bootloader", got.bootloader, min.bootloader),
        ("tee", got.tee, min.tee),
        ("snp", got.snp, min.snp),
        ("microcode", got.microcode, min.microcode),
    ] {
        if got < min {
            return Err(VerifyError::TcbTooLow { component, got, min });
        }
    }
    Ok(())
}

/// A dual-LPN scheme's settings against what the policy requires of them; a scheme that
/// omits them is refused as if it had none.
fn check_dual_lpn(
    role: &str,
    scheme: &serde_json::Value,
    required: &crate::policy::DualLpnRequirements,
) -> Result<(), VerifyError> {
    let refuse = |field: &'static str, value: String, allowed: String| {
        Err(VerifyError::SchemeSettingNotAllowed { role: role.to_owned(), field, value, allowed })
    };
    let probes = scheme.pointer("/protocol/lpn/probes").and_then(|p| p.as_u64()).unwrap_or(0);
    if probes < required.min_probes {
        return refuse("protocol.lpn.probes", probes.to_string(), format!(">= {}", required.min_probes));
    }
    match scheme.pointer("/protocol/lpn/rows_per_code").and_then(|r| r.as_u64()) {
        Some(rows) if rows <= required.max_rows_per_code => Ok(()),
        got => refuse(
            "protocol.lpn.rows_per_code",
            got.map_or_else(|| "none".to_owned(), |r| r.to_string()),
            format!("<= {}", required.max_rows_per_code),
        ),
    }
}

/// A masked scheme's settings against what the policy requires of them.
fn check_masked(
    role: &str,
    scheme: &serde_json::Value,
    required: &crate::policy::MaskedRequirements,
) -> Result<(), VerifyError> {
    let refuse = |field: &'static str, value: String, allowed: String| {
        Err(VerifyError::SchemeSettingNotAllowed { role: role.to_owned(), field, value, allowed })
    };
    let mask = scheme.pointer("/protocol/masked/mask").and_then(|m| m.as_str()).unwrap_or("none");
    if !required.mask_families.iter().any(|f| f == mask) {
        return refuse("protocol.masked.mask", mask.to_owned(), format!("{:?}", required.mask_families));
    }
    let rows = scheme.pointer("/protocol/masked/shield/rows").and_then(|r| r.as_u64()).unwrap_or(0);
    if rows < required.min_shield_rows {
        return refuse("protocol.masked.shield.rows", rows.to_string(), format!(">= {}", required.min_shield_rows));
    }
    // U-Verify off is `verify: null`: no probes.
    let probes = scheme.pointer("/protocol/masked/verify/probes").and_then(|p| p.as_u64()).unwrap_or(0);
    if probes < required.min_verify_probes {
        return refuse(
            "protocol.masked.verify.probes",
            probes.to_string(),
            format!(">= {}", required.min_verify_probes),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCB: Tcb = Tcb { bootloader: 3, tee: 0, snp: 8, microcode: 115 };

    fn ext(tcb: Tcb, hw_id: Option<Vec<u8>>) -> VcekExtensions {
        VcekExtensions {
            bootloader: Some(tcb.bootloader),
            tee: Some(tcb.tee),
            snp: Some(tcb.snp),
            microcode: Some(tcb.microcode),
            hw_id,
            product_name: None,
        }
    }

    #[test]
    fn vcek_must_match_the_reported_tcb_and_chip() {
        let check = |ext: &VcekExtensions, tcb, chip: &[u8; 64]| check_vcek_binding(ext, tcb, chip, true);
        assert_eq!(check(&ext(TCB, Some(vec![7; 64])), TCB, &[7; 64]), Ok(()));
        let lower = Tcb { snp: 7, ..TCB };
        assert!(matches!(check(&ext(TCB, None), lower, &[7; 64]), Err(VerifyError::VcekTcbMismatch { .. })));
        assert_eq!(check(&ext(TCB, Some(vec![7; 64])), TCB, &[8; 64]), Err(VerifyError::VcekChipIdMismatch));
        // Turin: 8-byte hwID, zero-padded CHIP_ID.
        let mut turin_chip = [0u8; 64];
        turin_chip[..8].copy_from_slice(&[9; 8]);
        assert_eq!(check(&ext(TCB, Some(vec![9; 8])), TCB, &turin_chip), Ok(()));
        turin_chip[8] = 1;
        assert_eq!(check(&ext(TCB, Some(vec![9; 8])), TCB, &turin_chip), Err(VerifyError::VcekChipIdMismatch));
        let mut missing = ext(TCB, None);
        missing.microcode = None;
        assert!(matches!(check(&missing, TCB, &[7; 64]), Err(VerifyError::CertificateMalformed { .. })));
    }

    #[test]
    fn a_vcek_without_hwid_is_refused_unless_the_policy_opts_out() {
        let no_hwid = ext(TCB, None);
        assert!(!no_hwid.matches_chip(&[7; 64]), "a VCEK without hwID names no chip");
        assert_eq!(check_vcek_binding(&no_hwid, TCB, &[7; 64], true), Err(VerifyError::VcekHwidMissing));
        assert_eq!(check_vcek_binding(&no_hwid, TCB, &[7; 64], false), Ok(()));
        // Opting out does not relax a hwID that is present.
        assert_eq!(
            check_vcek_binding(&ext(TCB, Some(vec![7; 64])), TCB, &[8; 64], false),
            Err(VerifyError::VcekChipIdMismatch)
        );
    }

    #[test]
    fn min_tcb_is_checked_per_component() {
        assert_eq!(check_min_tcb(TCB, TCB), Ok(()));
        assert_eq!(check_min_tcb(TCB, Tcb::default()), Ok(()));
        assert_eq!(
            check_min_tcb(TCB, Tcb { microcode: 116, ..Tcb::default() }),
            Err(VerifyError::TcbTooLow { component: "microcode", got: 115, min: 116 })
        );
        assert_eq!(
            check_min_tcb(TCB, Tcb { bootloader: 4, ..Tcb::default() }),
            Err(VerifyError::TcbTooLow { component: "bootloader", got: 3, min: 4 })
        );
    }

    /// AMD's published chains of every generation through the chain checks that
    /// [`Verifier::verify_report`] runs for Milan: the committed Milan and Genoa ARK/ASK
    /// (Turin's are the `sev` crate's built-in ones: none is committed), and the committed
    /// Milan and Turin VCEKs (no Genoa VCEK is public test data here).
    #[test]
    fn amd_chains_of_every_generation_verify() {
        use crate::amd::AmdGeneration;
        use x509_cert::der::DecodePem;
        let pem = |bytes: &[u8]| x509_cert::Certificate::from_pem(bytes).unwrap();
        let der = |bytes: &[u8]| x509_cert::Certificate::from_der(bytes).unwrap();
        let roots = Policy::default().roots().unwrap();
        let in_2025 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_689_600);
        let milan_vcek = der(include_bytes!("../../testdata/amd/milan-vcek.der"));
        let turin_vcek = der(include_bytes!("../../testdata/amd/turin-vcek.der"));
        let chains = [
            (
                AmdGeneration::Milan,
                pem(include_bytes!("../../testdata/amd/milan-ark.pem")),
                pem(include_bytes!("../../testdata/amd/milan-ask.pem")),
                Some(&milan_vcek),
            ),
            (
                AmdGeneration::Genoa,
                pem(include_bytes!("../../testdata/amd/genoa-ark.pem")),
                pem(include_bytes!("../../testdata/amd/genoa-ask.pem")),
                None,
            ),
            (
                AmdGeneration::Turin,
                pem(AmdGeneration::Turin.ark_pem()),
                pem(AmdGeneration::Turin.ask_pem()),
                Some(&turin_vcek),
            ),
        ];
        let mut asks = Vec::new();
        for (generation, ark, ask, vcek) in &chains {
            // The committed copies are the roots the verifier has built in.
            assert_eq!(ark.to_der().unwrap(), generation.ark_der(), "{generation:?} ARK");
            assert_eq!(ask.to_der().unwrap(), generation.ask_der(), "{generation:?} ASK");
            let (root, ask_s) =
                check_ark_ask(&roots, ark, ask, None).unwrap_or_else(|e| panic!("{generation:?} ARK/ASK: {e}"));
            assert_eq!(root.name, format!("amd-{}", generation.name()));
            assert_eq!(root.kind, IssuerKind::SevSnp);
            check_validity(ark, CertRole::Ark, in_2025).unwrap();
            check_validity(ask, CertRole::Ask, in_2025).unwrap();
            if let Some(vcek) = vcek {
                check_vcek(&ask_s, vcek).unwrap_or_else(|e| panic!("{generation:?} VCEK: {e}"));
                check_validity(vcek, CertRole::Vcek, in_2025).unwrap();
            }
            asks.push(ask_s);
        }
        // The links are real: an ASK under another generation's ARK, or a VCEK under another
        // generation's ASK, fails.
        let (milan, genoa, turin) = (&chains[0], &chains[1], &chains[2]);
        assert!(matches!(check_ark_ask(&roots, &milan.1, &genoa.2, None), Err(VerifyError::AskSignatureInvalid(_))));
        assert!(matches!(check_ark_ask(&roots, &genoa.1, &turin.2, None), Err(VerifyError::AskSignatureInvalid(_))));
        assert!(matches!(check_vcek(&asks[1], &turin_vcek), Err(VerifyError::VcekSignatureInvalid(_))));
        assert!(matches!(check_vcek(&asks[2], &milan_vcek), Err(VerifyError::VcekSignatureInvalid(_))));
        // Only the trusted roots count: a Genoa ARK under a Milan-only policy is refused.
        let milan_only =
            Policy::default().with_roots(vec![crate::TrustedRoot::Amd(AmdGeneration::Milan)]).roots().unwrap();
        assert!(matches!(check_ark_ask(&milan_only, &genoa.1, &genoa.2, None), Err(VerifyError::RootNotTrusted)));
    }

    #[test]
    fn reasons_are_unique_and_listed() {
        let mut seen = std::collections::HashSet::new();
        for r in REASONS {
            assert!(seen.insert(r), "duplicate reason {r}");
            assert!(r.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{r}");
        }
    }
}
