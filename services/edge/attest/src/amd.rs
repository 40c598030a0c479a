//! AMD's side of the chain: the built-in ARKs of each EPYC generation and the custom VCEK
//! extensions (VCEK spec 57230, "VCEK Certificate Extensions") that tie a VCEK to one
//! chip (hwID) and one TCB.

use std::sync::OnceLock;

use x509_cert::der::asn1::{Ia5StringRef, OctetStringRef};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode, DecodePem, Encode};

/// VCEK extension OIDs under AMD's arc 1.3.6.1.4.1.3704.
pub mod oid {
    use super::ObjectIdentifier;
    pub const STRUCT_VERSION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.1");
    pub const PRODUCT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.2");
    pub const BOOTLOADER_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.1");
    pub const TEE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.2");
    pub const SNP_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.3");
    pub const SPL_4: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.4");
    pub const SPL_5: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.5");
    pub const SPL_6: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.6");
    pub const SPL_7: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.7");
    pub const UCODE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.8");
    pub const HW_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.4");
}

/// EPYC generations whose ARK is built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AmdGeneration {
    Milan,
    Genoa,
    Turin,
}

impl AmdGeneration {
    pub const ALL: [AmdGeneration; 3] = [Self::Milan, Self::Genoa, Self::Turin];

    pub fn name(self) -> &'static str {
        match self {
            Self::Milan => "milan",
            Self::Genoa => "genoa",
            Self::Turin => "turin",
        }
    }

    /// The ARK as published by AMD's KDS (`/vcek/v1/{Milan,Genoa,Turin}/cert_chain`), taken
    /// from the `sev` crate so there is one copy of AMD's roots in the build.
    pub fn ark_pem(self) -> &'static [u8] {
        use sev::certs::snp::builtin;
        match self {
            Self::Milan => builtin::milan::ARK,
            Self::Genoa => builtin::genoa::ARK,
            Self::Turin => builtin::turin::ARK,
        }
    }

    /// The generation's ASK (PEM), for a hardware guest whose cached chain holds only a VCEK.
    pub fn ask_pem(self) -> &'static [u8] {
        use sev::certs::snp::builtin;
        match self {
            Self::Milan => builtin::milan::ASK,
            Self::Genoa => builtin::genoa::ASK,
            Self::Turin => builtin::turin::ASK,
        }
    }

    /// DER of the built-in ARK, parsed once.
    pub fn ark_der(self) -> &'static [u8] {
        static DER: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
        let all = DER.get_or_init(|| {
            Self::ALL.map(|g| {
                // Built-in constants; a failure here is a broken build, caught by tests.
                x509_cert::Certificate::from_pem(g.ark_pem()).and_then(|c| c.to_der()).unwrap_or_default()
            })
        });
        &all[self as usize]
    }

    pub fn ask_der(self) -> Vec<u8> {
        x509_cert::Certificate::from_pem(self.ask_pem()).and_then(|c| c.to_der()).unwrap_or_default()
    }

    /// Generation from a report's CPUID family and model (report version 3 and later).
    pub fn from_cpuid(family: u8, model: u8) -> Option<Self> {
        match sev::Generation::identify_cpu(family, model).ok()? {
            sev::Generation::Milan => Some(Self::Milan),
            sev::Generation::Genoa => Some(Self::Genoa),
            sev::Generation::Turin => Some(Self::Turin),
            _ => None,
        }
    }
}

impl std::str::FromStr for AmdGeneration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "milan" => Ok(Self::Milan),
            "genoa" => Ok(Self::Genoa),
            "turin" => Ok(Self::Turin),
            other => Err(format!("unknown AMD generation {other:?} (milan, genoa, turin)")),
        }
    }
}

/// What a VCEK's AMD extensions say. Absent extensions stay `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcekExtensions {
    pub bootloader: Option<u8>,
    pub tee: Option<u8>,
    pub snp: Option<u8>,
    pub microcode: Option<u8>,
    /// hwID: the CHIP_ID this VCEK belongs to (64 bytes, or 8 on Turin).
    pub hw_id: Option<Vec<u8>>,
    pub product_name: Option<String>,
}

impl VcekExtensions {
    /// Whether this VCEK belongs to the chip a report names. A short (Turin) hwID matches a
    /// CHIP_ID that starts with it and is zero after. A VCEK without hwID names no chip, so
    /// it matches none: whether to accept one anyway is the policy's `require_vcek_hwid`.
    pub fn matches_chip(&self, chip_id: &[u8; 64]) -> bool {
        match &self.hw_id {
            None => false,
            Some(id) => chip_id.starts_with(id) && chip_id[id.len()..].iter().all(|&b| b == 0),
        }
    }
}

/// Reads the AMD extensions of a VCEK. Malformed values are errors, never panics.
pub fn vcek_extensions(cert: &x509_cert::Certificate) -> Result<VcekExtensions, String> {
    let mut out = VcekExtensions::default();
    for ext in cert.tbs_certificate.extensions.iter().flatten() {
        let value = ext.extn_value.as_bytes();
        let spl = || u8::from_der(value).map_err(|e| format!("extension {}: {e}", ext.extn_id));
        match ext.extn_id {
            oid::BOOTLOADER_SPL => out.bootloader = Some(spl()?),
            oid::TEE_SPL => out.tee = Some(spl()?),
            oid::SNP_SPL => out.snp = Some(spl()?),
            oid::UCODE_SPL => out.microcode = Some(spl()?),
            oid::HW_ID => {
                // Current VCEKs wrap the 64 bytes in an OCTET STRING; early ones held them raw.
                let bytes = match OctetStringRef::from_der(value) {
                    Ok(os) => os.as_bytes().to_vec(),
                    Err(_) => value.to_vec(),
                };
                // 64 bytes up to Genoa; Turin's chip IDs are 8 bytes (the report zero-pads).
                if bytes.len() != 64 && bytes.len() != 8 {
                    return Err(format!("hwID is {} bytes, not 64 or 8", bytes.len()));
                }
                out.hw_id = Some(bytes);
            }
            oid::PRODUCT_NAME => {
                out.product_name = Ia5StringRef::from_der(value).ok().map(|s| s.as_str().to_owned());
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_arks_parse() {
        for g in AmdGeneration::ALL {
            assert!(!g.ark_der().is_empty(), "{g:?}");
            assert!(!g.ask_der().is_empty(), "{g:?}");
        }
        assert_ne!(AmdGeneration::Milan.ark_der(), AmdGeneration::Genoa.ark_der());
    }

    #[test]
    fn cpuid_maps_to_generations() {
        assert_eq!(AmdGeneration::from_cpuid(0x19, 0x01), Some(AmdGeneration::Milan));
        assert_eq!(AmdGeneration::from_cpuid(0x19, 0x11), Some(AmdGeneration::Genoa));
        assert_eq!(AmdGeneration::from_cpuid(0x1A, 0x02), Some(AmdGeneration::Turin));
        assert_eq!(AmdGeneration::from_cpuid(0x17, 0x31), None);
    }
}
