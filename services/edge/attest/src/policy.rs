//! What a verifier accepts. A policy file (JSON or YAML) names the roots it trusts, the
//! launch measurements it allows, a minimum TCB and the rest; see docs/ATTESTATION.md.
//!
//! Secure by default: AMD's roots only, no measurement allowed, debug and migration agents
//! forbidden, VMPL 0 only, a VCEK must name its chip. A mock root is trusted only when the
//! policy names it. Revocation is checked offline, against the CRLs the policy lists.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use x509_cert::der::{Decode, DecodePem, Encode};

use crate::amd::AmdGeneration;
use crate::error::{AttestError, Result};
use crate::evidence::IssuerKind;
use crate::report::Tcb;
use crate::role::Role;

pub use crate::fixed_hex::Hex;

/// A root of trust a policy accepts for the ARK position of a chain.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustedRoot {
    /// AMD's ARK of one EPYC generation (built in).
    Amd(AmdGeneration),
    /// A mock ARK, inline PEM (e.g. from a Kubernetes Secret).
    MockPem(String),
    /// A mock ARK in a PEM or DER file; relative paths are relative to the policy file.
    MockFile(PathBuf),
}

/// A certificate revocation list, as AMD's KDS publishes one per product
/// (`https://kdsintf.amd.com/vcek/v1/{Milan,Genoa,Turin}/crl`, DER, signed by the ARK).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrlSource {
    /// Inline PEM (`-----BEGIN X509 CRL-----`), e.g. from a Kubernetes Secret.
    Pem(String),
    /// A DER or PEM file; relative paths are relative to the policy file. Read when the
    /// policy loads: a fresh CRL takes effect when the policy is loaded again.
    File(PathBuf),
}

/// A CRL after loading: parsed, not yet checked against any chain.
#[derive(Clone, Debug)]
pub struct LoadedCrl {
    /// The file it came from, or `crls[i]` for inline PEM; for messages.
    pub name: String,
    pub list: x509_cert::crl::CertificateList,
}

/// A trusted root after loading: what the verifier compares an evidence's ARK against.
#[derive(Clone, Debug)]
pub struct RootCert {
    /// `amd-milan`, `amd-genoa`, `amd-turin` or `mock:<first 8 bytes of SHA-256(SPKI)>`.
    pub name: String,
    pub kind: IssuerKind,
    pub spki_der: Vec<u8>,
}

fn default_roots() -> Vec<TrustedRoot> {
    AmdGeneration::ALL.into_iter().map(TrustedRoot::Amd).collect()
}
fn default_vmpls() -> Vec<u32> {
    vec![0]
}
fn default_min_report_version() -> u32 {
    2
}
fn yes() -> bool {
    true
}
fn default_protections() -> Vec<String> {
    vec![SEALED.to_owned()]
}

/// What a model service running `masked` must have in its attested scheme
/// (`protocol.masked`), checked only when `protections` lists `masked`. The defaults are
/// the project's defaults: a scheme weaker in any of these is refused unless the policy
/// names it (`scheme_setting_not_allowed`, naming the field).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaskedRequirements {
    /// Mask families accepted (`protocol.masked.mask`).
    #[serde(default = "default_mask_families")]
    pub mask_families: Vec<String>,
    /// Fewest shield rows per sequence (`protocol.masked.shield.rows`).
    #[serde(default = "default_min_shield_rows")]
    pub min_shield_rows: u64,
    /// Fewest U-Verify probes per weight (`protocol.masked.verify.probes`; off counts 0).
    #[serde(default = "default_min_verify_probes")]
    pub min_verify_probes: u64,
}

/// What a model service running `dual-lpn` must have in its attested scheme
/// (`protocol.lpn`), checked only when `protections` lists `dual-lpn`. The defaults are the
/// project's defaults; the hiding estimate of docs/SECURITY.md holds for at most
/// `max_rows_per_code` masked rows under one set of codes, so a scheme that reuses its codes
/// longer is refused (`scheme_setting_not_allowed`, naming the field).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DualLpnRequirements {
    /// Fewest integrity probes per weight (`protocol.lpn.probes`).
    #[serde(default = "default_min_lpn_probes")]
    pub min_probes: u64,
    /// Most masked rows under one set of codes before they are redrawn
    /// (`protocol.lpn.rows_per_code`).
    #[serde(default = "default_max_rows_per_code")]
    pub max_rows_per_code: u64,
}

fn default_min_lpn_probes() -> u64 {
    4
}
fn default_max_rows_per_code() -> u64 {
    1 << 20
}

impl Default for DualLpnRequirements {
    fn default() -> Self {
        Self { min_probes: default_min_lpn_probes(), max_rows_per_code: default_max_rows_per_code() }
    }
}

fn default_mask_families() -> Vec<String> {
    vec!["auto".to_owned()]
}
fn default_min_shield_rows() -> u64 {
    8
}
fn default_min_verify_probes() -> u64 {
    2
}

impl Default for MaskedRequirements {
    fn default() -> Self {
        Self {
            mask_families: default_mask_families(),
            min_shield_rows: default_min_shield_rows(),
            min_verify_probes: default_min_verify_probes(),
        }
    }
}

/// The protection every model service must run unless a policy names another: the one
/// whose engine receives nothing (docs/SECURITY.md).
pub const SEALED: &str = "sealed";
/// Roles that compute on request content; their scheme's `protocol.executor` is checked.
pub const MODEL_ROLES: [&str; 3] = [Role::Embedder.as_str(), Role::Reranker.as_str(), Role::Generator.as_str()];

/// Verification policy; see the module docs for defaults.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Written `- amd: genoa`, `- mock_file: ark.pem` (a one-key map per root, in YAML too).
    #[serde(default = "default_roots", with = "serde_yaml::with::singleton_map_recursive")]
    pub trusted_roots: Vec<TrustedRoot>,
    /// Allowed launch measurements (48 bytes, hex).
    #[serde(default)]
    pub measurements: Vec<Hex<48>>,
    /// Accept any measurement. For development only; a log line says so at load.
    #[serde(default)]
    pub allow_any_measurement: bool,
    /// Minimum reported TCB, component by component.
    #[serde(default)]
    pub min_tcb: Tcb,
    #[serde(default)]
    pub allow_debug: bool,
    #[serde(default)]
    pub allow_migration_agent: bool,
    #[serde(default = "default_vmpls")]
    pub allowed_vmpls: Vec<u32>,
    #[serde(default = "default_min_report_version")]
    pub min_report_version: u32,
    /// When set, only these chips (64-byte CHIP_ID, hex) are accepted: pins evidence to
    /// known hosts, which also defeats relaying evidence from another machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip_ids: Option<Vec<Hex<64>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_identities: Option<Vec<Hex<32>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme_identities: Option<Vec<Hex<32>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<String>>,
    /// Protections a model service (embedder, reranker, generator) may run, by the
    /// executor its attested scheme names (`protocol.executor`): `sealed` unless the policy
    /// lists a weaker one (`masked`, `plaintext`). A scheme without one is refused.
    #[serde(default = "default_protections")]
    pub protections: Vec<String>,
    /// What `masked` must include when `protections` lists it.
    #[serde(default)]
    pub masked: MaskedRequirements,
    /// What `dual-lpn` must include when `protections` lists it.
    #[serde(default)]
    pub dual_lpn: DualLpnRequirements,
    /// Check the certificates' notBefore/notAfter against the clock.
    #[serde(default = "yes")]
    pub check_certificate_validity: bool,
    /// Refuse a VCEK without AMD's hwID extension (`vcek_hwid_missing`): without it nothing
    /// ties the VCEK to the report's CHIP_ID, so it would vouch for any chip. Turn off only
    /// for keys that carry no hwID by design (a VLEK).
    #[serde(default = "yes")]
    pub require_vcek_hwid: bool,
    /// Revocation lists to check the chain against, offline (written `- file: milan.crl` or
    /// `- pem: ...`). Empty (the default): no revocation check. Otherwise the chain's ARK
    /// must have issued one of them (`crl_missing`); see docs/ATTESTATION.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "serde_yaml::with::singleton_map_recursive")]
    pub crls: Vec<CrlSource>,
    /// When set, a launch measurement is accepted only if a release manifest naming it is
    /// proven to be in the release log (and the log consistent with the remembered
    /// checkpoint); see docs/RELEASES.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_log: Option<crate::release::ReleaseLogPolicy>,
    #[serde(skip)]
    resolved: OnceLock<std::result::Result<Arc<Vec<RootCert>>, String>>,
    #[serde(skip)]
    resolved_release_log:
        OnceLock<std::result::Result<Arc<crate::release::ReleaseLogState>, crate::release::ReleaseLogError>>,
    #[serde(skip)]
    resolved_crls: OnceLock<std::result::Result<Arc<Vec<LoadedCrl>>, String>>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            trusted_roots: default_roots(),
            measurements: Vec::new(),
            allow_any_measurement: false,
            min_tcb: Tcb::default(),
            allow_debug: false,
            allow_migration_agent: false,
            allowed_vmpls: default_vmpls(),
            min_report_version: default_min_report_version(),
            chip_ids: None,
            model_identities: None,
            scheme_identities: None,
            roles: None,
            protections: default_protections(),
            masked: MaskedRequirements::default(),
            dual_lpn: DualLpnRequirements::default(),
            check_certificate_validity: true,
            require_vcek_hwid: true,
            crls: Vec::new(),
            release_log: None,
            resolved: OnceLock::new(),
            resolved_crls: OnceLock::new(),
            resolved_release_log: OnceLock::new(),
        }
    }
}

impl Policy {
    /// Loads a policy file: `.json` as JSON, anything else as YAML. Relative `mock_file`
    /// paths are taken relative to the file's folder. Roots are loaded now, so a broken
    /// policy fails at start rather than at the first connection.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| AttestError::io(path, e))?;
        let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let mut policy = if is_json { Self::from_json(&text) } else { Self::from_yaml(&text) }
            .map_err(|e| AttestError::Policy { path: path.to_owned(), detail: e })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for root in &mut policy.trusted_roots {
            if let TrustedRoot::MockFile(p) = root
                && p.is_relative()
            {
                *p = base.join(&*p);
            }
        }
        for crl in &mut policy.crls {
            if let CrlSource::File(p) = crl
                && p.is_relative()
            {
                *p = base.join(&*p);
            }
        }
        if let Some(log) = &mut policy.release_log {
            log.releases.iter_mut().for_each(|r| r.rebase(base));
            if let Some(c) = &mut log.remembered_checkpoint {
                c.rebase(base);
            }
        }
        let invalid = |e: crate::VerifyError| AttestError::Policy { path: path.to_owned(), detail: e.to_string() };
        policy.roots().map_err(invalid)?;
        policy.loaded_crls().map_err(invalid)?;
        Ok(policy)
    }

    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let p: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        p.warn_if_permissive();
        Ok(p)
    }

    pub fn from_yaml(text: &str) -> std::result::Result<Self, String> {
        let p: Self = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        p.warn_if_permissive();
        Ok(p)
    }

    fn warn_if_permissive(&self) {
        if self.allow_any_measurement {
            tracing::warn!("attestation policy accepts ANY launch measurement: development only");
        }
        if self.allow_debug {
            tracing::warn!("attestation policy accepts debug-enabled guests: their memory is readable by the host");
        }
        for p in self.protections.iter().filter(|p| *p != SEALED) {
            tracing::warn!(protection = %p, "attestation policy accepts model services whose engine sees request content");
        }
    }

    /// Also accepts model services running `protection` (beside `sealed`).
    pub fn allow_protection(mut self, protection: &str) -> Self {
        if !self.protections.iter().any(|p| p == protection) {
            self.protections.push(protection.to_owned());
        }
        self
    }

    /// Trusts a mock ARK (PEM), e.g. the one `MockIssuer` persisted.
    pub fn trust_mock_root_pem(mut self, ark_pem: impl Into<String>) -> Self {
        self.trusted_roots.push(TrustedRoot::MockPem(ark_pem.into()));
        self.resolved = OnceLock::new();
        self
    }

    /// Replaces the trusted roots.
    pub fn with_roots(mut self, roots: Vec<TrustedRoot>) -> Self {
        self.trusted_roots = roots;
        self.resolved = OnceLock::new();
        self
    }

    /// Replaces the revocation lists.
    pub fn with_crls(mut self, crls: Vec<CrlSource>) -> Self {
        self.crls = crls;
        self.resolved_crls = OnceLock::new();
        self
    }

    pub fn allow_measurement(mut self, measurement: [u8; 48]) -> Self {
        self.measurements.push(Hex(measurement));
        self
    }

    /// Requires the release log for every accepted measurement.
    pub fn with_release_log(mut self, log: crate::release::ReleaseLogPolicy) -> Self {
        self.release_log = Some(log);
        self.resolved_release_log = OnceLock::new();
        self
    }

    /// The release log's state, checked once (bundles, signatures, inclusion, consistency);
    /// `None` when the policy does not require the log. A log that fails any check refuses
    /// every measurement, with the failure's own reason.
    pub fn release_log_state(
        &self,
    ) -> std::result::Result<Option<Arc<crate::release::ReleaseLogState>>, crate::release::ReleaseLogError> {
        let Some(log) = &self.release_log else { return Ok(None) };
        self.resolved_release_log.get_or_init(|| log.check().map(Arc::new)).clone().map(Some)
    }

    /// The trusted roots, loaded and parsed once.
    pub fn roots(&self) -> std::result::Result<Arc<Vec<RootCert>>, crate::VerifyError> {
        self.resolved
            .get_or_init(|| load_roots(&self.trusted_roots).map(Arc::new))
            .clone()
            .map_err(crate::VerifyError::PolicyInvalid)
    }

    /// The revocation lists, loaded and parsed once.
    pub fn loaded_crls(&self) -> std::result::Result<Arc<Vec<LoadedCrl>>, crate::VerifyError> {
        self.resolved_crls
            .get_or_init(|| load_crls(&self.crls).map(Arc::new))
            .clone()
            .map_err(crate::VerifyError::PolicyInvalid)
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).unwrap_or_default()
    }

    /// SHA-256 of what this policy accepts, its roots and CRLs taken by content (not by the
    /// paths they were read from), over JSON with sorted keys: two copies of one policy have
    /// one digest wherever they live. A gateway attests its backend policy's digest; clients
    /// compare it with the policy they expect.
    pub fn digest(&self) -> std::result::Result<[u8; 32], crate::VerifyError> {
        use sha2::{Digest, Sha256};
        let invalid = |e: serde_json::Error| crate::VerifyError::PolicyInvalid(e.to_string());
        let roots: Vec<serde_json::Value> = self
            .roots()?
            .iter()
            .map(|r| serde_json::json!({ "name": r.name, "spki_sha256": hex::encode(Sha256::digest(&r.spki_der)) }))
            .collect();
        let mut crls = Vec::new();
        for crl in self.loaded_crls()?.iter() {
            let der =
                crl.list.to_der().map_err(|e| crate::VerifyError::PolicyInvalid(format!("CRL {}: {e}", crl.name)))?;
            crls.push(hex::encode(Sha256::digest(der)));
        }
        let mut value = serde_json::to_value(self).map_err(invalid)?;
        let fields =
            value.as_object_mut().ok_or_else(|| crate::VerifyError::PolicyInvalid("policy is not an object".into()))?;
        fields.insert("trusted_roots".into(), roots.into());
        fields.insert("crls".into(), crls.into());
        if let Some(log) = &self.release_log {
            fields.insert("release_log".into(), log.digest_value().map_err(crate::VerifyError::PolicyInvalid)?);
        }
        Ok(Sha256::digest(canonical_json(&value)).into())
    }
}

/// JSON with every object's keys sorted, whatever map type serde_json was built with.
fn canonical_json(v: &serde_json::Value) -> Vec<u8> {
    fn write(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(serde_json::Value::from(k.as_str()).to_string().as_bytes());
                    out.push(b':');
                    write(&map[k], out);
                }
                out.push(b'}');
            }
            serde_json::Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(item, out);
                }
                out.push(b']');
            }
            other => out.extend_from_slice(other.to_string().as_bytes()),
        }
    }
    let mut out = Vec::new();
    write(v, &mut out);
    out
}

fn load_roots(roots: &[TrustedRoot]) -> std::result::Result<Vec<RootCert>, String> {
    if roots.is_empty() {
        return Err("no trusted roots".into());
    }
    roots
        .iter()
        .map(|root| {
            let (kind, der) = match root {
                TrustedRoot::Amd(g) => {
                    let der = g.ark_der();
                    if der.is_empty() {
                        return Err(format!("built-in {} ARK does not parse", g.name()));
                    }
                    (IssuerKind::SevSnp, der.to_vec())
                }
                TrustedRoot::MockPem(pem) => {
                    (IssuerKind::Mock, pem_or_der(pem.as_bytes()).map_err(|e| format!("mock_pem: {e}"))?)
                }
                TrustedRoot::MockFile(path) => {
                    let bytes = std::fs::read(path).map_err(|e| format!("mock_file {}: {e}", path.display()))?;
                    (IssuerKind::Mock, pem_or_der(&bytes).map_err(|e| format!("mock_file {}: {e}", path.display()))?)
                }
            };
            let cert = x509_cert::Certificate::from_der(&der).map_err(|e| e.to_string())?;
            let spki_der = cert.tbs_certificate.subject_public_key_info.to_der().map_err(|e| e.to_string())?;
            let name = match root {
                TrustedRoot::Amd(g) => format!("amd-{}", g.name()),
                _ => format!("mock:{}", hex::encode(&crate::binding::spki_sha256(&spki_der)[..8])),
            };
            Ok(RootCert { name, kind, spki_der })
        })
        .collect()
}

fn load_crls(crls: &[CrlSource]) -> std::result::Result<Vec<LoadedCrl>, String> {
    crls.iter()
        .enumerate()
        .map(|(i, source)| {
            let (name, bytes) = match source {
                CrlSource::Pem(pem) => (format!("crls[{i}]"), pem.as_bytes().to_vec()),
                CrlSource::File(path) => {
                    let name = path.display().to_string();
                    let bytes = std::fs::read(path).map_err(|e| format!("crl {name}: {e}"))?;
                    (name, bytes)
                }
            };
            let list = parse_crl(&bytes).map_err(|e| format!("crl {name}: {e}"))?;
            Ok(LoadedCrl { name, list })
        })
        .collect()
}

/// A CRL given as PEM (`X509 CRL`) or DER.
pub(crate) fn parse_crl(bytes: &[u8]) -> std::result::Result<x509_cert::crl::CertificateList, String> {
    let der = if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        let (label, der) = x509_cert::der::pem::decode_vec(bytes).map_err(|e| e.to_string())?;
        if label != "X509 CRL" {
            return Err(format!("PEM label {label:?}, not \"X509 CRL\""));
        }
        der
    } else {
        bytes.to_vec()
    };
    x509_cert::crl::CertificateList::from_der(&der).map_err(|e| e.to_string())
}

/// A certificate given as PEM or DER, returned as DER.
pub(crate) fn pem_or_der(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let cert = if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        x509_cert::Certificate::from_pem(bytes)
    } else {
        x509_cert::Certificate::from_der(bytes)
    }
    .map_err(|e| e.to_string())?;
    cert.to_der().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_strict() {
        let p = Policy::from_yaml("{}").unwrap();
        assert_eq!(p.trusted_roots, default_roots());
        assert!(p.measurements.is_empty() && !p.allow_any_measurement);
        assert!(!p.allow_debug && !p.allow_migration_agent);
        assert_eq!(p.allowed_vmpls, vec![0]);
        assert!(p.check_certificate_validity);
        assert!(p.require_vcek_hwid);
        let names: Vec<_> = p.roots().unwrap().iter().map(|r| r.name.clone()).collect();
        assert_eq!(names, ["amd-milan", "amd-genoa", "amd-turin"]);
    }

    #[test]
    fn yaml_and_json_spell_the_same_policy() {
        let m = "ab".repeat(48);
        let yaml = format!(
            "trusted_roots: [{{amd: genoa}}]\nmeasurements: ['{m}']\nmin_tcb: {{snp: 8, microcode: 115}}\nallowed_vmpls: [0, 1]\nroles: [embedder]\n"
        );
        let json = format!(
            r#"{{"trusted_roots":[{{"amd":"genoa"}}],"measurements":["{m}"],"min_tcb":{{"snp":8,"microcode":115}},"allowed_vmpls":[0,1],"roles":["embedder"]}}"#
        );
        let a = Policy::from_yaml(&yaml).unwrap();
        let b = Policy::from_json(&json).unwrap();
        assert_eq!(a.to_yaml(), b.to_yaml());
        assert_eq!(a.measurements, vec![Hex([0xab; 48])]);
        assert_eq!(a.min_tcb, Tcb { bootloader: 0, tee: 0, snp: 8, microcode: 115 });
    }

    #[test]
    fn the_digest_follows_what_a_policy_accepts_not_where_it_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::MockPki::load_or_create(&dir.path().join("pki")).unwrap();
        std::fs::write(dir.path().join("ark.pem"), pki.ark_pem()).unwrap();
        let m = "ab".repeat(48);
        std::fs::write(
            dir.path().join("p.yaml"),
            format!("trusted_roots: [{{mock_file: ark.pem}}]\nmeasurements: ['{m}']\n"),
        )
        .unwrap();
        let from_file = Policy::from_file(dir.path().join("p.yaml")).unwrap();
        let inline =
            Policy::from_yaml(&format!("trusted_roots: [{{mock_pem: {:?}}}]\nmeasurements: ['{m}']\n", pki.ark_pem()))
                .unwrap();
        assert_eq!(from_file.digest().unwrap(), inline.digest().unwrap(), "the root by content, not by path");
        let json = serde_json::to_string(&inline).unwrap();
        assert_eq!(Policy::from_json(&json).unwrap().digest().unwrap(), inline.digest().unwrap(), "a JSON round trip");

        let mut any = inline.clone();
        any.allow_any_measurement = true;
        assert_ne!(any.digest().unwrap(), inline.digest().unwrap());
        let more = inline
            .clone()
            .trust_mock_root_pem(crate::MockPki::load_or_create(&dir.path().join("other")).unwrap().ark_pem());
        assert_ne!(more.digest().unwrap(), inline.digest().unwrap());
        let masked = inline.clone().allow_protection("masked");
        assert_ne!(masked.digest().unwrap(), inline.digest().unwrap());
        assert!(
            Policy::from_yaml("trusted_roots: [{mock_pem: 'x'}]").unwrap().digest().is_err(),
            "a root that does not load"
        );
    }

    #[test]
    fn bad_policies_are_errors() {
        assert!(Policy::from_yaml("measurements: ['abcd']").is_err(), "short measurement");
        assert!(Policy::from_yaml("measurments: []").is_err(), "misspelled key");
        assert!(Policy::from_yaml("trusted_roots: [{amd: rome}]").is_err(), "unknown generation");
        let p = Policy::from_yaml("trusted_roots: [{mock_pem: 'not a cert'}]").unwrap();
        assert!(matches!(p.roots(), Err(crate::VerifyError::PolicyInvalid(_))));
        let p = Policy::from_yaml("trusted_roots: []").unwrap();
        assert!(matches!(p.roots(), Err(crate::VerifyError::PolicyInvalid(_))));
        let p = Policy::from_yaml("crls: [{pem: 'not a CRL'}]").unwrap();
        assert!(matches!(p.loaded_crls(), Err(crate::VerifyError::PolicyInvalid(_))));
        let p = Policy::from_yaml("crls: [{file: /nonexistent/milan.crl}]").unwrap();
        assert!(matches!(p.loaded_crls(), Err(crate::VerifyError::PolicyInvalid(_))));
        assert!(Policy::from_yaml("crls: [{url: 'https://kdsintf.amd.com'}]").is_err(), "only pem and file");
    }
}
