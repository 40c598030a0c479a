//! The pipeline's status: conditions (keeping their transition times while unchanged), the
//! status of an invalid spec, the status after an attestation round, and its server-side
//! apply.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, ResourceExt};

use super::{ComponentRound, Context, Fetch};
use crate::attestor::{PodEndpoint, Rejection, VerifiedEndpoint};
use crate::crd::{Component, ComponentStatus, Condition, EndpointStatus, PrivateRAGPipeline, PrivateRAGPipelineStatus};
use crate::resources::MANAGER;
use crate::{Error, Result};

fn now() -> String {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH).to_string()
}

/// A condition, keeping the previous transition time when the status did not change.
fn condition(
    previous: &PrivateRAGPipelineStatus,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: i64,
) -> Condition {
    let status = if ok { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(now);
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: Some(generation),
    }
}

pub(super) fn condition_true(status: &PrivateRAGPipelineStatus, type_: &str) -> bool {
    status.conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

pub(super) fn status_invalid(
    p: &PrivateRAGPipeline,
    previous: &PrivateRAGPipelineStatus,
    message: &str,
) -> PrivateRAGPipelineStatus {
    let g = p.metadata.generation.unwrap_or(0);
    let desired: i32 = p.spec.components().map(|v| v.replicas.max(0)).sum();
    PrivateRAGPipelineStatus {
        observed_generation: Some(g),
        conditions: vec![
            condition(previous, "ModelsReady", false, "InvalidSpec", message.into(), g),
            condition(previous, "Attested", false, "InvalidSpec", message.into(), g),
            condition(previous, "Ready", false, "InvalidSpec", message.into(), g),
        ],
        components: p
            .spec
            .components()
            .map(|v| ComponentStatus { name: v.component.as_str().into(), desired: v.replicas, ..Default::default() })
            .collect(),
        verified_endpoints: Vec::new(),
        verified: Some(format!("0/{desired}")),
    }
}

pub(super) fn endpoint_status(verified: &[VerifiedEndpoint]) -> Vec<EndpointStatus> {
    let mut out: Vec<_> = verified
        .iter()
        .map(|v| EndpointStatus {
            component: v.component.as_str().into(),
            pod: v.pod.clone(),
            ip: v.ip.to_string(),
            port: v.port,
            tls_spki_sha256: hex::encode(v.tls_spki_sha256),
            model_identity: hex::encode(v.model_identity),
            scheme_identity: hex::encode(v.scheme_identity),
        })
        .collect();
    out.sort();
    out
}

pub(super) fn status_from_round(
    p: &PrivateRAGPipeline,
    previous: &PrivateRAGPipelineStatus,
    rounds: &[ComponentRound],
    verified: &[VerifiedEndpoint],
    rejected: &[(PodEndpoint, Rejection)],
    policy_error: Option<&String>,
    endpoints: Vec<EndpointStatus>,
) -> PrivateRAGPipelineStatus {
    let g = p.metadata.generation.unwrap_or(0);
    let mut verified_by: BTreeMap<Component, i32> = BTreeMap::new();
    for v in verified {
        *verified_by.entry(v.component).or_default() += 1;
    }
    let components: Vec<ComponentStatus> = rounds
        .iter()
        .map(|r| ComponentStatus {
            name: r.component.as_str().into(),
            desired: r.desired,
            ready: i32::try_from(r.ready.len()).unwrap_or(i32::MAX),
            verified: verified_by.get(&r.component).copied().unwrap_or(0),
            model_revision: r.serving.as_ref().map(|s| s.0.clone()),
            model_identity: r.serving.as_ref().map(|s| hex::encode(s.1)),
        })
        .collect();

    // ModelsReady: every component's pinned revision is on its volume and served.
    let failed: Vec<String> = rounds
        .iter()
        .filter_map(|r| match &r.fetch {
            Fetch::Failed(m) => Some(format!("{}: {m}", r.component)),
            _ => None,
        })
        .collect();
    let fetching: Vec<&str> =
        rounds.iter().filter(|r| r.fetch == Fetch::Running).map(|r| r.component.as_str()).collect();
    let models = if !failed.is_empty() {
        condition(previous, "ModelsReady", false, "FetchFailed", failed.join("; "), g)
    } else if !fetching.is_empty() {
        condition(
            previous,
            "ModelsReady",
            false,
            "Fetching",
            format!("fetching pinned revisions: {}", fetching.join(", ")),
            g,
        )
    } else {
        condition(previous, "ModelsReady", true, "Fetched", "every pinned model is fetched and checked".into(), g)
    };

    // Attested: every ready pod passed, and every component has at least one.
    let without: Vec<&str> = components.iter().filter(|c| c.verified == 0).map(|c| c.name.as_str()).collect();
    let attested = if let Some(e) = policy_error {
        condition(previous, "Attested", false, "TrustedRootUnavailable", e.clone(), g)
    } else if !rejected.is_empty() {
        let list = rejected.iter().map(|(e, r)| format!("{} ({})", e.pod, r.reason)).collect::<Vec<_>>().join(", ");
        condition(previous, "Attested", false, "EvidenceRejected", format!("excluded from routing: {list}"), g)
    } else if !without.is_empty() {
        condition(
            previous,
            "Attested",
            false,
            "NoVerifiedPods",
            format!("no verified pod yet: {}", without.join(", ")),
            g,
        )
    } else {
        condition(previous, "Attested", true, "Verified", format!("{} pods verified", verified.len()), g)
    };

    // Ready: every component has a verified route. Rejected extra pods do not block it:
    // they are excluded, which is the point.
    let ready = if !without.is_empty() {
        let reason = if !condition_true_in(&models) { "ModelsNotReady" } else { "NotAttested" };
        condition(previous, "Ready", false, reason, format!("no verified route for: {}", without.join(", ")), g)
    } else {
        let msg = if rejected.is_empty() {
            "every component has verified routes".to_string()
        } else {
            format!("every component has verified routes; {} pod(s) excluded", rejected.len())
        };
        condition(previous, "Ready", true, "Routable", msg, g)
    };

    let desired: i32 = components.iter().map(|c| c.desired.max(0)).sum();
    PrivateRAGPipelineStatus {
        observed_generation: Some(g),
        conditions: vec![models, attested, ready],
        components,
        verified_endpoints: endpoints,
        verified: Some(format!("{}/{desired}", verified.len())),
    }
}

fn condition_true_in(c: &Condition) -> bool {
    c.status == "True"
}

/// Server-side apply of the status subresource, skipped when nothing changed.
pub(super) async fn patch_status(
    ctx: &Context,
    p: &PrivateRAGPipeline,
    previous: &PrivateRAGPipelineStatus,
    status: PrivateRAGPipelineStatus,
) -> Result<()> {
    if p.status.is_some() && &status == previous {
        return Ok(());
    }
    let ns = p.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<PrivateRAGPipeline> = Api::namespaced(ctx.client.clone(), &ns);
    let body = serde_json::json!({
        "apiVersion": "gelo.dev/v1alpha1",
        "kind": "PrivateRAGPipeline",
        "status": status,
    });
    api.patch_status(&p.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}
