//! Where reports come from: the AMD-SP through `/dev/sev-guest` ([`HardwareIssuer`]) or a
//! software stand-in with an AMD-shaped test PKI ([`MockIssuer`]). Both produce the same
//! bytes and certificates, so everything downstream is one code path.

mod hardware;
mod mock;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use hardware::{HardwareIssuer, SEV_GUEST_DEVICE};
pub use mock::{
    FILE_MEASUREMENT as MOCK_MEASUREMENT_FILE, MockCa, MockCrl, MockIssuer, MockPki, MockSettings,
    default_mock_measurement,
};

use crate::binding::{Binding, MAX_NONCE_LEN, report_data};
use crate::error::{AttestError, Result};
use crate::evidence::{CertChain, Evidence, IssuerKind, ServiceClaims};

/// A report and the chain that certifies its signing key.
#[derive(Clone, Debug)]
pub struct IssuedReport {
    pub report: Vec<u8>,
    pub chain: CertChain,
}

/// Produces SEV-SNP attestation reports with caller-chosen REPORT_DATA.
pub trait ReportIssuer: Send + Sync {
    fn kind(&self) -> IssuerKind;
    fn issue(&self, report_data: [u8; 64]) -> Result<IssuedReport>;
}

/// Evidence for `claims`, bound to a TLS key and a nonce.
pub fn issue_evidence(
    issuer: &dyn ReportIssuer,
    claims: &ServiceClaims,
    tls_spki_sha256: [u8; 32],
    nonce: &[u8],
) -> Result<Evidence> {
    if nonce.len() > MAX_NONCE_LEN {
        return Err(AttestError::Nonce(format!("{} bytes, at most {MAX_NONCE_LEN}", nonce.len())));
    }
    let binding = Binding {
        model_identity: claims.model_identity,
        scheme_identity: claims.scheme_identity()?,
        tls_spki_sha256,
        nonce: nonce.to_vec(),
    };
    let issued = issuer.issue(report_data(&binding))?;
    Ok(Evidence {
        report: issued.report,
        ark_der: issued.chain.ark_der,
        ask_der: issued.chain.ask_der,
        vcek_der: issued.chain.vcek_der,
        model_identity: binding.model_identity,
        scheme_identity: binding.scheme_identity,
        tls_spki_sha256,
        nonce: binding.nonce,
        issuer: issuer.kind(),
        role: claims.role.clone(),
        scheme_json: claims.scheme_json.clone(),
    })
}

/// Environment variables read by [`issuer_from_env_or_default`].
pub mod env {
    /// `auto` (default), `hardware` or `mock`.
    pub const ISSUER: &str = "GELO_ATTEST_ISSUER";
    /// Folder of the persisted mock PKI (default `$GELO_CACHE/mock-pki`, `GELO_CACHE`
    /// defaulting to `~/.cache/gelo`).
    pub const MOCK_PKI_DIR: &str = "GELO_MOCK_PKI_DIR";
    /// Launch digest (48 bytes hex) the mock reports as MEASUREMENT.
    pub const MOCK_MEASUREMENT: &str = "GELO_MOCK_MEASUREMENT";
    /// Folder with a cached `vcek.{der,pem}` (and optionally ark/ask) for hardware guests
    /// whose host does not serve certificates in the extended report.
    pub const VCEK_CACHE: &str = "GELO_VCEK_CACHE";
    /// VMPL to request hardware reports at (default 0).
    pub const VMPL: &str = "GELO_SNP_VMPL";
}

/// The default mock PKI folder: `$GELO_MOCK_PKI_DIR`, else `$GELO_CACHE/mock-pki`, else
/// `~/.cache/gelo/mock-pki`.
pub fn default_mock_pki_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(env::MOCK_PKI_DIR) {
        return dir.into();
    }
    let cache = std::env::var_os("GELO_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".cache/gelo")
    });
    cache.join("mock-pki")
}

/// The issuer a service should use: the AMD-SP when `/dev/sev-guest` exists, otherwise the
/// mock, with a loud warning, since mock evidence proves nothing about the host.
/// `GELO_ATTEST_ISSUER=hardware|mock` forces a choice (`hardware` fails without the device).
pub fn issuer_from_env_or_default() -> Result<Arc<dyn ReportIssuer>> {
    let choice = std::env::var(env::ISSUER).unwrap_or_else(|_| "auto".into());
    let hardware = || -> Result<Arc<dyn ReportIssuer>> {
        let mut issuer = HardwareIssuer::open()?;
        if let Some(dir) = std::env::var_os(env::VCEK_CACHE) {
            issuer = issuer.with_vcek_cache(dir);
        }
        if let Ok(vmpl) = std::env::var(env::VMPL) {
            let vmpl =
                vmpl.parse().map_err(|_| AttestError::Config(format!("{}={vmpl:?} is not a number", env::VMPL)))?;
            issuer = issuer.with_vmpl(vmpl);
        }
        Ok(Arc::new(issuer))
    };
    let mock = || -> Result<Arc<dyn ReportIssuer>> {
        let dir = default_mock_pki_dir();
        let mut issuer = MockIssuer::load_or_create(&dir)?;
        if let Ok(m) = std::env::var(env::MOCK_MEASUREMENT) {
            issuer = issuer.with_measurement(parse_hex::<48>("GELO_MOCK_MEASUREMENT", &m)?);
        }
        tracing::warn!(
            pki = %dir.display(),
            "MOCK ATTESTATION: no SEV-SNP device; evidence is signed by a software test PKI and proves nothing about this host"
        );
        Ok(Arc::new(issuer))
    };
    match choice.as_str() {
        "hardware" => hardware(),
        "mock" => mock(),
        "auto" if Path::new(SEV_GUEST_DEVICE).exists() => hardware(),
        "auto" => mock(),
        other => Err(AttestError::Config(format!("{}={other:?}: expected auto, hardware or mock", env::ISSUER))),
    }
}

/// Parses fixed-width hex, for flags and environment variables.
pub fn parse_hex<const N: usize>(what: &'static str, s: &str) -> Result<[u8; N]> {
    s.parse::<crate::policy::Hex<N>>().map(|h| h.0).map_err(|detail| AttestError::Hex { what, detail })
}
