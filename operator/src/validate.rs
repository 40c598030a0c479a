//! Checks a pipeline spec before anything is created from it. An invalid spec is reported
//! as a condition (and an Event), never as a reconcile error: retrying cannot fix it, only
//! the user can.
//!
//! The output holds parsed values (bytes, not hex strings), so the rest of the operator
//! cannot act on a spec that skipped this check.

use crate::crd::{AttestationSpec, Component, ComponentView, PrivateRAGPipelineSpec, SecretKeyRef, TcbSpec};

/// AMD EPYC generations with a built-in ARK in gelo-attest.
pub const AMD_GENERATIONS: [&str; 3] = ["milan", "genoa", "turin"];

/// A pinned model after validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPin {
    pub source: PinnedSource,
    pub identity: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinnedSource {
    /// Downloaded by a distribution Job into the component's volume.
    Hub { repo: String, revision: String },
    /// Already on a claim the user manages.
    Volume { claim_name: String, sub_path: Option<String> },
}

impl ModelPin {
    /// The revision as shown in status: the commit id, or `volume:<claim>` for volumes.
    pub fn revision_label(&self) -> String {
        match &self.source {
            PinnedSource::Hub { revision, .. } => revision.clone(),
            PinnedSource::Volume { claim_name, .. } => format!("volume:{claim_name}"),
        }
    }

    pub fn identity_hex(&self) -> String {
        hex::encode(self.identity)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootRef {
    Amd(String),
    MockSecret(SecretKeyRef),
}

/// A spec that passed every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidSpec {
    /// Indexed like [`Component::ALL`].
    pub models: [ModelPin; 4],
    pub measurements: Vec<[u8; 48]>,
    pub min_tcb: TcbSpec,
    pub roots: Vec<RootRef>,
    pub scheme_identities: Vec<[u8; 32]>,
    /// The protections the spec's components run (`sealed` first): what the attestation
    /// policy accepts from model services, and nothing weaker.
    pub protections: Vec<String>,
    /// The fewest U-Verify probes a masked component of the spec runs (the policy's
    /// `masked.min_verify_probes`); `None` without masked components.
    pub masked_min_probes: Option<u32>,
    pub period: std::time::Duration,
    /// The release log the measurements must be proven in, its bundles checked here.
    pub release_log: Option<attest::release::ReleaseLogPolicy>,
}

impl ValidSpec {
    pub fn model(&self, c: Component) -> &ModelPin {
        &self.models[c as usize]
    }

    /// Whether pods issue mock evidence: only when the spec names a mock root.
    pub fn uses_mock_root(&self) -> Option<&SecretKeyRef> {
        self.roots.iter().find_map(|r| match r {
            RootRef::MockSecret(s) => Some(s),
            RootRef::Amd(_) => None,
        })
    }
}

/// Every problem found, each naming the field, so one status message fixes them all.
pub fn validate(spec: &PrivateRAGPipelineSpec) -> Result<ValidSpec, Vec<String>> {
    let mut problems = Vec::new();
    if spec.image.trim().is_empty() {
        problems.push("image is empty".to_string());
    }
    let mut models = Vec::with_capacity(4);
    for view in spec.components() {
        if view.replicas < 0 {
            problems.push(format!("{}.replicas is negative", view.component));
        }
        let pin = model_pin(&view, &mut problems);
        if let Some(gpu) = view.gpu
            && (gpu.resource_name.trim().is_empty() || gpu.count < 1)
        {
            problems.push(format!("{}.gpu needs a resourceName and a count of at least 1", view.component));
        }
        models.extend(pin);
    }

    let att = &spec.attestation;
    let mut measurements = Vec::new();
    for (i, m) in att.allowed_measurements.iter().enumerate() {
        match parse_hex::<48>(m) {
            Some(b) => measurements.push(b),
            None => problems.push(format!("attestation.allowedMeasurements[{i}] must be 96 hex digits")),
        }
    }
    let mut scheme_identities = Vec::new();
    for (i, s) in att.scheme_identities.iter().enumerate() {
        match parse_hex::<32>(s) {
            Some(b) => scheme_identities.push(b),
            None => problems.push(format!("attestation.schemeIdentities[{i}] must be 64 hex digits")),
        }
    }
    let roots = trusted_roots(att, &mut problems);
    let release_log = att.release_log.as_ref().map(|r| {
        use attest::release::{ReleaseLogPolicy, ReleaseSource};
        ReleaseLogPolicy {
            public_key: r.public_key.clone(),
            releases: r.releases.iter().cloned().map(ReleaseSource::Inline).collect(),
            remembered_checkpoint: r.remembered_checkpoint.clone().map(ReleaseSource::Inline),
        }
    });
    if let Some(log) = &release_log
        && let Err(e) = log.check()
    {
        problems.push(format!("attestation.releaseLog refused ({}): {e}", e.reason()));
    }
    if !(2..=3600).contains(&att.period_seconds) {
        problems.push(format!("attestation.periodSeconds {} is outside 2..=3600", att.period_seconds));
    }

    if !problems.is_empty() {
        return Err(problems);
    }
    let models: [ModelPin; 4] = models.try_into().map_err(|_| vec!["internal: model count".to_string()])?;
    let mut protections = vec![attest::policy::SEALED.to_string()];
    for p in spec.components().filter_map(|v| v.protection).map(|p| p.as_str().to_string()) {
        if !protections.contains(&p) {
            protections.push(p);
        }
    }
    let masked_min_probes = spec
        .components()
        .filter(|v| v.protection.is_some_and(|p| p.as_str() == "masked"))
        .filter_map(|v| v.verify_probes)
        .map(|p| p.max(0) as u32)
        .min();
    Ok(ValidSpec {
        models,
        masked_min_probes,
        measurements,
        min_tcb: att.minimum_tcb.unwrap_or_default(),
        roots,
        scheme_identities,
        protections,
        period: std::time::Duration::from_secs(att.period_seconds.into()),
        release_log,
    })
}

/// The model a component serves, pinned: its identity and its source (a hub revision or a
/// volume); `None` with the problems pushed.
fn model_pin(view: &ComponentView<'_>, problems: &mut Vec<String>) -> Option<ModelPin> {
    let field = format!("{}.model", view.component);
    let identity = match view.model.model_identity.as_deref() {
        None | Some("") => {
            problems.push(format!("{field}.modelIdentity is missing: every model must be pinned by identity"));
            None
        }
        Some(s) => match parse_hex::<32>(s) {
            Some(b) => Some(b),
            None => {
                problems.push(format!("{field}.modelIdentity must be 64 lowercase hex digits, got {s:?}"));
                None
            }
        },
    };
    let source = match (&view.model.hub, &view.model.volume) {
        (Some(hub), None) => {
            let mut ok = true;
            if hub.repo.trim().is_empty() || hub.repo.contains(char::is_whitespace) {
                problems.push(format!("{field}.hub.repo {:?} is not a repository id", hub.repo));
                ok = false;
            }
            if !is_lower_hex(&hub.revision, 40) {
                problems.push(format!("{field}.hub.revision must be a full 40-hex commit id, got {:?}", hub.revision));
                ok = false;
            }
            ok.then(|| PinnedSource::Hub { repo: hub.repo.clone(), revision: hub.revision.clone() })
        }
        (None, Some(vol)) => {
            if vol.claim_name.trim().is_empty() {
                problems.push(format!("{field}.volume.claimName is empty"));
                None
            } else if vol.sub_path.as_deref().is_some_and(|p| p.starts_with('/') || p.split('/').any(|s| s == "..")) {
                problems.push(format!("{field}.volume.subPath must be relative without '..'"));
                None
            } else {
                Some(PinnedSource::Volume { claim_name: vol.claim_name.clone(), sub_path: vol.sub_path.clone() })
            }
        }
        (Some(_), Some(_)) => {
            problems.push(format!("{field}: set exactly one of hub and volume, not both"));
            None
        }
        (None, None) => {
            problems.push(format!("{field}: set one of hub and volume"));
            None
        }
    };
    Some(ModelPin { source: source?, identity: identity? })
}

/// The roots evidence may chain to: AMD generations or a mock PKI's Secret.
fn trusted_roots(att: &AttestationSpec, problems: &mut Vec<String>) -> Vec<RootRef> {
    let mut roots = Vec::new();
    if att.trusted_roots.is_empty() {
        problems.push("attestation.trustedRoots is empty: nothing could ever be verified".into());
    }
    for (i, r) in att.trusted_roots.iter().enumerate() {
        match (&r.amd, &r.mock_secret_ref) {
            (Some(g), None) if AMD_GENERATIONS.contains(&g.as_str()) => roots.push(RootRef::Amd(g.clone())),
            (Some(g), None) => problems.push(format!(
                "attestation.trustedRoots[{i}].amd {g:?} is not a known AMD generation ({})",
                AMD_GENERATIONS.join(", ")
            )),
            (None, Some(s)) if !s.name.trim().is_empty() && !s.key.trim().is_empty() => {
                roots.push(RootRef::MockSecret(s.clone()))
            }
            (None, Some(_)) => {
                problems.push(format!("attestation.trustedRoots[{i}].mockSecretRef needs a name and a key"))
            }
            _ => problems.push(format!(
                "attestation.trustedRoots[{i}] is not a known root: set exactly one of amd and mockSecretRef"
            )),
        }
    }
    roots
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Lowercase hex of exactly `N` bytes (uppercase is refused so one identity has one spelling).
pub fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if !is_lower_hex(s, 2 * N) {
        return None;
    }
    hex::decode(s).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests;
