//! Reports from the AMD Secure Processor through the Linux `sev-guest` driver
//! (`SNP_GET_EXT_REPORT`). The VCEK chain comes from the extended report's certificate
//! table when the host serves one, otherwise from a cached folder (the VCEK fetched once
//! from AMD's KDS; the ARK and ASK default to the built-in ones for the report's
//! generation).

use std::path::{Path, PathBuf};

use super::{IssuedReport, ReportIssuer};
use crate::amd::AmdGeneration;
use crate::error::{AttestError, Result};
use crate::evidence::{CertChain, IssuerKind};
use crate::policy::pem_or_der;

pub const SEV_GUEST_DEVICE: &str = "/dev/sev-guest";

/// The real AMD-SP. Each `issue` is one guest request (a few milliseconds).
#[derive(Debug)]
pub struct HardwareIssuer {
    device: PathBuf,
    vmpl: u32,
    vcek_cache: Option<PathBuf>,
}

impl HardwareIssuer {
    /// Fails plainly when `/dev/sev-guest` is absent, i.e. outside an SEV-SNP guest.
    pub fn open() -> Result<Self> {
        Self::open_device(SEV_GUEST_DEVICE)
    }

    /// The `sev` crate always opens [`SEV_GUEST_DEVICE`]; another path is only for tests.
    fn open_device(device: impl Into<PathBuf>) -> Result<Self> {
        let device = device.into();
        if !device.exists() {
            return Err(AttestError::SevDeviceAbsent(device));
        }
        Ok(Self { device, vmpl: 0, vcek_cache: None })
    }

    /// VMPL to request reports at (the REPORT's VMPL field); 0 unless an SVSM runs below.
    pub fn with_vmpl(mut self, vmpl: u32) -> Self {
        self.vmpl = vmpl;
        self
    }

    /// A folder with `vcek.der` or `vcek.pem` (and optionally `ark.*`, `ask.*`), used when
    /// the host does not put certificates in the extended report.
    pub fn with_vcek_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.vcek_cache = Some(dir.into());
        self
    }

    #[cfg(target_os = "linux")]
    fn request(&self, report_data: [u8; 64]) -> Result<(Vec<u8>, Option<CertChain>)> {
        use sev::firmware::guest::Firmware;
        use sev::firmware::host::CertType;

        let mut fw =
            Firmware::open().map_err(|e| AttestError::Firmware(format!("open {}: {e}", self.device.display())))?;
        let (report, certs) = fw
            .get_ext_report(None, Some(report_data), Some(self.vmpl))
            .map_err(|e| AttestError::Firmware(e.to_string()))?;
        let chain = certs.and_then(|entries| {
            let find = |t: CertType| entries.iter().find(|e| e.cert_type == t).and_then(|e| pem_or_der(&e.data).ok());
            // A VLEK stands in for the VCEK where the cloud provider uses one.
            let vek = find(CertType::VCEK).or_else(|| find(CertType::VLEK))?;
            Some(CertChain { ark_der: find(CertType::ARK)?, ask_der: find(CertType::ASK)?, vcek_der: vek })
        });
        Ok((report, chain))
    }

    #[cfg(not(target_os = "linux"))]
    fn request(&self, _report_data: [u8; 64]) -> Result<(Vec<u8>, Option<CertChain>)> {
        Err(AttestError::SevDeviceAbsent(self.device.clone()))
    }

    fn cached_chain(&self, report: &[u8]) -> Result<CertChain> {
        let dir = self.vcek_cache.as_deref().ok_or_else(|| {
            AttestError::MissingCertificates(format!(
                "the host serves no certificates with the extended report and {} is not set",
                super::env::VCEK_CACHE
            ))
        })?;
        let vcek_der = read_cert(dir, "vcek")?
            .ok_or_else(|| AttestError::MissingCertificates(format!("no vcek.der or vcek.pem in {}", dir.display())))?;
        let generation = generation_of(report).ok_or_else(|| {
            AttestError::MissingCertificates(
                "cannot tell the EPYC generation of this report to pick the ARK/ASK".into(),
            )
        })?;
        let ark_der = read_cert(dir, "ark")?.unwrap_or_else(|| generation.ark_der().to_vec());
        let ask_der = read_cert(dir, "ask")?.unwrap_or_else(|| generation.ask_der());
        Ok(CertChain { ark_der, ask_der, vcek_der })
    }
}

impl ReportIssuer for HardwareIssuer {
    fn kind(&self) -> IssuerKind {
        IssuerKind::SevSnp
    }

    fn issue(&self, report_data: [u8; 64]) -> Result<IssuedReport> {
        let (report, chain) = self.request(report_data)?;
        let chain = match chain {
            Some(chain) => chain,
            None => self.cached_chain(&report)?,
        };
        Ok(IssuedReport { report, chain })
    }
}

/// `Some(der)` if `dir/name.der` or `dir/name.pem` exists.
fn read_cert(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    for ext in ["der", "pem"] {
        let path = dir.join(format!("{name}.{ext}"));
        match std::fs::read(&path) {
            Ok(bytes) => {
                return pem_or_der(&bytes)
                    .map(Some)
                    .map_err(|e| AttestError::MissingCertificates(format!("{}: {e}", path.display())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(AttestError::io(path, e)),
        }
    }
    Ok(None)
}

/// The generation from the report's CPUID bytes (version 3+); version 2 reports do not say.
fn generation_of(report: &[u8]) -> Option<AmdGeneration> {
    let version = u32::from_le_bytes(report.get(0..4)?.try_into().ok()?);
    if version < 3 {
        return None;
    }
    AmdGeneration::from_cpuid(*report.get(0x188)?, *report.get(0x189)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_device_is_a_plain_error() {
        let err = HardwareIssuer::open_device("/nonexistent/sev-guest").unwrap_err();
        assert!(matches!(err, AttestError::SevDeviceAbsent(_)));
        assert!(err.to_string().contains("not running in an SEV-SNP CVM"), "{err}");
    }

    #[test]
    fn cached_chain_falls_back_to_builtin_roots() {
        let dir = tempfile::tempdir().unwrap();
        let vcek = include_bytes!("../../testdata/amd/milan-vcek.der");
        std::fs::write(dir.path().join("vcek.der"), vcek).unwrap();
        let issuer = HardwareIssuer { device: SEV_GUEST_DEVICE.into(), vmpl: 0, vcek_cache: Some(dir.path().into()) };
        let mut report = vec![0u8; 1184];
        report[0] = 3;
        report[0x188] = 0x19; // Milan
        report[0x189] = 0x01;
        let chain = issuer.cached_chain(&report).unwrap();
        assert_eq!(chain.vcek_der, vcek);
        assert_eq!(chain.ark_der, AmdGeneration::Milan.ark_der());
        // Version 2 does not name its generation.
        report[0] = 2;
        assert!(matches!(issuer.cached_chain(&report), Err(AttestError::MissingCertificates(_))));
    }
}
