//! A release manifest: what one GELO release is, as appended to the release log. Written by
//! scripts/release/release.sh; the log holds its exact bytes, so a verifier hashes the text
//! it was given, never a re-serialisation.

use crate::fixed_hex::Hex;

use super::ReleaseLogError;

/// The only manifest schema this verifier reads.
pub const SCHEMA: &str = "gelo-release/1";

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseManifest {
    /// [`SCHEMA`].
    pub schema: String,
    /// The commit the binary was built from (scripts/release/build.sh).
    pub commit: String,
    pub binary: Binary,
    /// The CVM the binary runs in and its launch measurement, derived from the parts.
    pub launch: Launch,
    /// Model identities this release serves (SHA-256, as attested in REPORT_DATA).
    pub model_identities: Vec<Hex<32>>,
    pub scheme: Scheme,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binary {
    pub name: String,
    pub sha256: Hex<32>,
}

/// One input of the launch measurement: what it is and its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    pub what: String,
    pub sha256: Hex<32>,
}

/// The initrd, which holds the release binary.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Initrd {
    pub what: String,
    pub sha256: Hex<32>,
    /// SHA-256 of the `gelo` binary inside: must be [`Binary::sha256`].
    pub gelo_sha256: Hex<32>,
}

/// How the launch measurement follows from its parts (scripts/release/measure.sh).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    /// The calculator and its version (`sev-snp-measure==…`).
    pub calculator: String,
    /// Its command line, parts by file name.
    pub command: String,
    pub firmware: Part,
    pub kernel: Part,
    pub initrd: Initrd,
    pub cmdline: String,
    pub vcpus: u32,
    pub vcpu_type: String,
    pub vmm_type: String,
    pub guest_features: String,
    /// The SEV-SNP launch measurement (48 bytes, hex) the calculator derived.
    pub measurement: Hex<48>,
}

/// The protection scheme the release runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scheme {
    /// Protections its model services run (`sealed`, ...; see the policy's `protections`).
    pub protections: Vec<String>,
    /// Scheme identities (SHA-256 of the attested scheme JSON), when pinned.
    pub scheme_identities: Vec<Hex<32>>,
}

impl ReleaseManifest {
    /// Parses and checks a manifest: known schema, and the initrd holds the binary named.
    pub fn parse(text: &str) -> Result<Self, ReleaseLogError> {
        let m: Self = serde_json::from_str(text).map_err(|e| ReleaseLogError::ManifestMalformed(e.to_string()))?;
        if m.schema != SCHEMA {
            return Err(ReleaseLogError::ManifestMalformed(format!("schema {:?}, not {SCHEMA:?}", m.schema)));
        }
        if m.launch.initrd.gelo_sha256 != m.binary.sha256 {
            return Err(ReleaseLogError::ManifestMalformed(format!(
                "the initrd holds gelo {:?}, the manifest names {:?}",
                m.launch.initrd.gelo_sha256, m.binary.sha256
            )));
        }
        Ok(m)
    }
}
