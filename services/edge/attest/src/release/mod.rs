//! Verifiable releases: every GELO release manifest (binary digest, expected launch
//! measurement and the parts it follows from, model identities, scheme) is an entry of an
//! append-only Merkle log (RFC 9162 style; run with Tessera's POSIX log by
//! scripts/release/log.sh). A policy with a [`ReleaseLogPolicy`] accepts a launch
//! measurement only when a release manifest naming it is proven to be in the log under a
//! checkpoint signed by the log's key, and, when the verifier remembers an earlier
//! checkpoint, only when the new one provably extends it. See docs/RELEASES.md.

pub mod log;
pub mod manifest;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;

pub use log::{LogKey, SignedCheckpoint};
pub use manifest::ReleaseManifest;

/// Why a release log's evidence was refused. Each variant has a stable machine name
/// ([`ReleaseLogError::reason`]), also the [`crate::VerifyError`] reason it surfaces as.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseLogError {
    #[error("release log key is unusable: {0}")]
    KeyInvalid(String),
    #[error("release bundle {name} does not decode: {detail}")]
    BundleMalformed { name: String, detail: String },
    #[error("release manifest does not decode: {0}")]
    ManifestMalformed(String),
    #[error("release log checkpoint does not decode: {0}")]
    CheckpointMalformed(String),
    #[error("release log checkpoint is not signed by the log's key: {0}")]
    CheckpointSignatureInvalid(String),
    #[error("release log checkpoint is for log {got:?}, not {expected:?}")]
    CheckpointOriginMismatch { expected: String, got: String },
    #[error("release log proof is malformed: {0}")]
    ProofMalformed(String),
    #[error("the release manifest is not in the log under the checkpoint it came with: {0}")]
    InclusionProofInvalid(String),
    #[error("launch measurement {0} is in no release manifest proven to be in the release log")]
    MeasurementNotLogged(String),
    #[error("release log checkpoint of size {presented} is older than the remembered one of size {remembered}")]
    CheckpointRolledBack { remembered: u64, presented: u64 },
    #[error(
        "release log forked: the checkpoint of size {presented} does not provably extend the remembered one of size {remembered}"
    )]
    LogForked { remembered: u64, presented: u64 },
    #[error("release bundle has no consistency proof from the remembered checkpoint (size {remembered})")]
    ConsistencyProofMissing { remembered: u64 },
}

impl ReleaseLogError {
    /// Stable machine name: `snake_case`, never renamed once shipped.
    pub fn reason(&self) -> &'static str {
        use ReleaseLogError::*;
        match self {
            KeyInvalid(_) => "release_log_key_invalid",
            BundleMalformed { .. } => "release_bundle_malformed",
            ManifestMalformed(_) => "release_manifest_malformed",
            CheckpointMalformed(_) => "release_checkpoint_malformed",
            CheckpointSignatureInvalid(_) => "release_checkpoint_signature_invalid",
            CheckpointOriginMismatch { .. } => "release_checkpoint_origin_mismatch",
            ProofMalformed(_) => "release_proof_malformed",
            InclusionProofInvalid(_) => "release_inclusion_proof_invalid",
            MeasurementNotLogged(_) => "measurement_not_in_release_log",
            CheckpointRolledBack { .. } => "release_log_rolled_back",
            LogForked { .. } => "release_log_forked",
            ConsistencyProofMissing { .. } => "release_consistency_proof_missing",
        }
    }
}

/// Where a policy reads a bundle or a checkpoint from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseSource {
    /// A file; relative paths are relative to the policy file.
    File(PathBuf),
    /// The text itself (e.g. from a Kubernetes Secret or ConfigMap).
    Inline(String),
}

impl ReleaseSource {
    fn read(&self) -> Result<(String, String), ReleaseLogError> {
        match self {
            Self::Inline(text) => Ok(("inline".to_owned(), text.clone())),
            Self::File(path) => {
                let name = path.display().to_string();
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ReleaseLogError::BundleMalformed { name: name.clone(), detail: e.to_string() })?;
                Ok((name, text))
            }
        }
    }

    pub(crate) fn rebase(&mut self, base: &Path) {
        if let Self::File(p) = self
            && p.is_relative()
        {
            *p = base.join(&*p);
        }
    }
}

/// What a policy requires of the release log (`release_log:` in a policy file).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseLogPolicy {
    /// The log's signed-note verifier key, `origin+keyid+base64`.
    pub public_key: String,
    /// Release bundles (scripts/release/log.sh writes them): a manifest and its proof.
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    pub releases: Vec<ReleaseSource>,
    /// The newest checkpoint this verifier saw before (a signed note): every bundle's
    /// checkpoint must provably extend it. Without one, each bundle is checked on its own
    /// and a split view (one history shown to this verifier, another to the rest) goes
    /// unnoticed.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "serde_yaml::with::singleton_map_recursive")]
    pub remembered_checkpoint: Option<ReleaseSource>,
}

/// A bundle as written by scripts/release/log.sh.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Bundle {
    /// The manifest exactly as appended to the log.
    manifest: String,
    proof: Proof,
}

/// The proof part, as written by `gelo-tlog prove` (hashes in standard base64).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Proof {
    checkpoint: String,
    index: u64,
    inclusion: Vec<String>,
    #[serde(default)]
    consistency: Option<Consistency>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Consistency {
    from: u64,
    proof: Vec<String>,
}

fn decode_hashes(list: &[String]) -> Result<Vec<[u8; 32]>, ReleaseLogError> {
    list.iter()
        .map(|h| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(h)
                .map_err(|e| ReleaseLogError::ProofMalformed(format!("hash {h:?}: {e}")))?;
            bytes.try_into().map_err(|b: Vec<u8>| ReleaseLogError::ProofMalformed(format!("hash of {} bytes", b.len())))
        })
        .collect()
}

/// A release manifest proven to be in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRelease {
    pub manifest: ReleaseManifest,
    pub index: u64,
    pub checkpoint: SignedCheckpoint,
}

/// The log's state after a policy's bundles were checked: the releases proven in it, by
/// launch measurement, and the newest checkpoint seen (to remember for next time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseLogState {
    by_measurement: BTreeMap<[u8; 48], LoggedRelease>,
    newest: Option<SignedCheckpoint>,
}

impl ReleaseLogState {
    /// The logged release whose manifest names `measurement`, or why there is none.
    pub fn release_for(&self, measurement: &[u8; 48]) -> Result<&LoggedRelease, ReleaseLogError> {
        self.by_measurement
            .get(measurement)
            .ok_or_else(|| ReleaseLogError::MeasurementNotLogged(hex::encode(measurement)))
    }
    pub fn releases(&self) -> impl Iterator<Item = &LoggedRelease> {
        self.by_measurement.values()
    }
    /// The largest checkpoint among the bundles (or the remembered one): store it and name
    /// it as `remembered_checkpoint` next time.
    pub fn newest_checkpoint(&self) -> Option<&SignedCheckpoint> {
        self.newest.as_ref()
    }
}

impl ReleaseLogPolicy {
    /// What the policy digest covers: the key, and the bundles and remembered checkpoint
    /// by content (SHA-256), not by the paths they are read from.
    pub(crate) fn digest_value(&self) -> Result<serde_json::Value, String> {
        use sha2::{Digest, Sha256};
        let content =
            |s: &ReleaseSource| s.read().map(|(_, t)| hex::encode(Sha256::digest(t))).map_err(|e| e.to_string());
        let releases = self.releases.iter().map(content).collect::<Result<Vec<_>, _>>()?;
        let remembered = self.remembered_checkpoint.as_ref().map(content).transpose()?;
        Ok(
            serde_json::json!({ "public_key": self.public_key, "releases": releases, "remembered_checkpoint": remembered }),
        )
    }

    /// Checks every bundle: the checkpoint's signature and origin, the manifest's inclusion,
    /// and consistency with the remembered checkpoint. Any failure refuses the whole log
    /// state: a forked log is not trusted for any release.
    pub fn check(&self) -> Result<ReleaseLogState, ReleaseLogError> {
        let key = LogKey::new(&self.public_key)?;
        let remembered = match &self.remembered_checkpoint {
            Some(source) => Some(key.open(&source.read()?.1)?),
            None => None,
        };
        let mut state = ReleaseLogState { newest: remembered.clone(), ..Default::default() };
        for source in &self.releases {
            let (name, text) = source.read()?;
            let release = check_bundle(&key, &name, &text, remembered.as_ref())?;
            if state.newest.as_ref().is_none_or(|n| release.checkpoint.size() > n.size()) {
                state.newest = Some(release.checkpoint.clone());
            }
            state.by_measurement.insert(release.manifest.launch.measurement.0, release);
        }
        Ok(state)
    }
}

/// One bundle against the log's key and, when given, the remembered checkpoint.
pub fn check_bundle(
    key: &LogKey,
    name: &str,
    text: &str,
    remembered: Option<&SignedCheckpoint>,
) -> Result<LoggedRelease, ReleaseLogError> {
    let bundle: Bundle = serde_json::from_str(text)
        .map_err(|e| ReleaseLogError::BundleMalformed { name: name.to_owned(), detail: e.to_string() })?;
    let checkpoint = key.open(&bundle.proof.checkpoint)?;
    if let Some(earlier) = remembered {
        let proof = match &bundle.proof.consistency {
            Some(c) if c.from == earlier.size() => decode_hashes(&c.proof)?,
            // Same size: the roots must simply agree, no proof needed.
            _ if checkpoint.size() == earlier.size() => Vec::new(),
            _ if checkpoint.size() < earlier.size() => Vec::new(),
            _ => return Err(ReleaseLogError::ConsistencyProofMissing { remembered: earlier.size() }),
        };
        checkpoint.verify_consistent_with(earlier, &proof)?;
    }
    let inclusion = decode_hashes(&bundle.proof.inclusion)?;
    checkpoint.verify_inclusion(bundle.manifest.as_bytes(), bundle.proof.index, &inclusion)?;
    let manifest = ReleaseManifest::parse(&bundle.manifest)?;
    Ok(LoggedRelease { manifest, index: bundle.proof.index, checkpoint })
}
