//! The reconciler. One pass over a pipeline:
//!
//! 1. validate the spec (an invalid one becomes a condition, an Event and an empty routing
//!    table; nothing is created);
//! 2. resolve the attestation policy (AMD roots, or a mock root read from the named Secret);
//! 3. server-side apply the owned objects: per component a models PVC and `gelo model fetch`
//!    Job, then, once the pinned revision is fetched, the Deployment serving it, and a
//!    Service; the gateway's ServiceAccount and Role;
//! 4. the attestation round: every ready pod is challenged with a fresh nonce over RA-TLS and
//!    verified against the policy and the component's pinned model identity; verified pods
//!    are labelled `gelo.dev/attested=true`, the rest lose the label and an Event names why;
//! 5. write the routing ConfigMap and the status (server-side apply of the status
//!    subresource), and requeue after the attestation period: that requeue is the
//!    attestation loop.
//!
//! Wrapped in kube's `finalizer`: on delete, the routing table is removed before the owned
//! workloads are garbage-collected, so no gateway keeps routing to a pipeline being torn down.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Resource, ResourceExt};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::Serialize;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::attestor::{Expected, PodAttestor, PodEndpoint, Rejection, VerifiedEndpoint};
use crate::crd::{Component, PrivateRAGPipeline, PrivateRAGPipelineStatus};
use crate::metrics::Metrics;
use crate::resources::{self, ATTESTED_LABEL, GRPC_PORT, GRPC_PORT_NAME, MANAGER, Names, Owner, PIPELINE_LABEL};
use crate::routes::RoutingTable;
use crate::validate::{ModelPin, RootRef, ValidSpec, parse_hex, validate};
use crate::{Error, Result};

mod status;
use status::{condition_true, endpoint_status, patch_status, status_from_round, status_invalid};

pub const FINALIZER: &str = "gelo.dev/routes-cleanup";
/// Requeue while models are fetched or pods start: short, since the owned-object watches
/// usually wake us first.
const PROGRESS_REQUEUE: Duration = Duration::from_secs(10);

/// Shared state of every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub attestor: Arc<dyn PodAttestor>,
    /// Whether pipelines may trust a mock root. Off by default: on a production cluster a
    /// pipeline naming a mock root is refused (a condition), whatever its author intended.
    pub allow_mock_roots: bool,
    /// A hub mirror the fetch Jobs download from (`HF_ENDPOINT`); huggingface.co when `None`.
    pub hub_endpoint: Option<String>,
    /// Consecutive failures per pipeline, for the error policy's backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Server-side apply conflicts met in reconciles and not yet reported.
    conflicts: Mutex<Vec<Conflict>>,
}

/// A field another manager owns, met while applying a pipeline's object.
struct Conflict {
    ns: String,
    pipeline: String,
    /// `<Kind> <name>`.
    what: String,
    /// What the API server said (the fields and the other manager).
    message: String,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        attestor: Arc<dyn PodAttestor>,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter { controller: MANAGER.into(), instance };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            attestor,
            allow_mock_roots: false,
            hub_endpoint: None,
            failures: Mutex::default(),
            conflicts: Mutex::default(),
        }
    }

    pub fn with_mock_roots(mut self, allow: bool) -> Self {
        self.allow_mock_roots = allow;
        self
    }

    pub fn with_hub_endpoint(mut self, endpoint: Option<String>) -> Self {
        self.hub_endpoint = endpoint;
        self
    }

    fn failures(&self, key: &str, bump: bool) -> u32 {
        let Ok(mut f) = self.failures.lock() else { return 0 };
        if bump {
            let n = f.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        } else {
            f.remove(key);
            0
        }
    }
}

/// Entry point of one reconcile, as `Controller::run` calls it.
pub async fn reconcile(p: Arc<PrivateRAGPipeline>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let ns = p.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let key = format!("{ns}/{}", p.name_any());
    let span = info_span!("reconcile", pipeline = %key, generation = p.metadata.generation.unwrap_or(0));
    let api: Api<PrivateRAGPipeline> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, p, |event| async {
        match event {
            Finalizer::Apply(p) => apply(&p, &ctx).await,
            Finalizer::Cleanup(p) => cleanup(&p, &ctx).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if result.is_ok() {
        ctx.failures(&key, false);
    }
    result
}

/// Requeue with exponential backoff per pipeline: 5 s, 10 s, ... capped at 5 min.
pub fn error_policy(p: Arc<PrivateRAGPipeline>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
    let n = ctx.failures(&key, true);
    let delay = backoff(n);
    warn!(pipeline = %key, error = %error, attempt = n, retry_in_s = delay.as_secs(), "reconcile failed");
    ctx.metrics.reconcile_failed(error);
    Action::requeue(delay)
}

pub fn backoff(attempt: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << attempt.saturating_sub(1).min(6));
    Duration::from_secs(secs.min(300))
}

/// Outcome of a component's model distribution.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fetch {
    Done,
    Running,
    Failed(String),
}

/// Everything one apply pass learned about a component.
struct ComponentRound {
    component: Component,
    desired: i32,
    fetch: Fetch,
    /// The pin the component's Deployment serves (None: nothing deployed yet).
    serving: Option<(String, [u8; 32])>,
    ready: Vec<PodEndpoint>,
}

async fn apply(p: &PrivateRAGPipeline, ctx: &Context) -> Result<Action> {
    let owner = Owner::of(p)?;
    let ns = owner.namespace.clone();
    let generation = p.metadata.generation.unwrap_or(0);
    let previous = p.status.clone().unwrap_or_default();

    // 1. Validate.
    let checked = validate(&p.spec).and_then(|v| match v.uses_mock_root() {
        Some(s) if !ctx.allow_mock_roots => Err(vec![format!(
            "attestation.trustedRoots names mock root Secret {:?}, but this operator does not allow mock roots (--allow-mock-roots)",
            s.name
        )]),
        _ => Ok(v),
    });
    let valid = match checked {
        Ok(v) => v,
        Err(problems) => {
            ctx.metrics.invalid_specs.inc();
            let message = problems.join("; ");
            warn!(%message, "invalid spec");
            publish(ctx, p, EventType::Warning, "InvalidSpec", "Validate", message.clone(), None).await;
            apply_object(
                ctx,
                &ns,
                &resources::routes_configmap(
                    &owner,
                    RoutingTable::empty(&owner.name, &ns, generation).to_json(),
                    "{}".into(),
                ),
                Fields::Force,
            )
            .await?;
            gate_pods(ctx, &ns, &owner.name, &[]).await?;
            let status = status_invalid(p, &previous, &message);
            patch_status(ctx, p, &previous, status).await?;
            // Only a spec change can fix it.
            return Ok(Action::await_change());
        }
    };

    // 2. Policy.
    let policy = resolve_policy(ctx, &ns, &valid).await?;

    // The gateway attests the policy it reads at start: a new policy must roll it.
    let policy_digest = policy.as_ref().ok().and_then(|p| p.digest().ok()).map(hex::encode);

    // 3. Owned objects.
    apply_object(ctx, &ns, &resources::gateway_account(&owner), Fields::Yield).await?;
    apply_object(ctx, &ns, &resources::gateway_role(&owner), Fields::Yield).await?;
    apply_object(ctx, &ns, &resources::gateway_role_binding(&owner), Fields::Yield).await?;
    let pull = p.spec.image_pull_policy.map(|x| x.as_str());
    let storage = p.spec.storage.clone().unwrap_or_default();
    let mut rounds = Vec::new();
    for view in p.spec.components() {
        let c = view.component;
        let pin = valid.model(c);
        let fetch = match resources::fetch_job(&owner, c, pin, &p.spec.image, pull, ctx.hub_endpoint.as_deref()) {
            Some(job) => {
                apply_object(ctx, &ns, &resources::models_pvc(&owner, c, &storage), Fields::Yield).await?;
                let applied: Job = apply_object(ctx, &ns, &job, Fields::Yield).await?;
                job_state(&applied)
            }
            None => Fetch::Done,
        };
        let serving = if fetch == Fetch::Done {
            let d = resources::deployment(&owner, view, pin, &valid, &p.spec.image, pull, policy_digest.as_deref());
            let _: Deployment = apply_object(ctx, &ns, &d, Fields::Yield).await?;
            prune_old_jobs(ctx, &ns, &owner.name, c, pin).await?;
            Some((pin.revision_label(), pin.identity))
        } else {
            // The new revision is not on the volume yet: leave the Deployment on the pin it
            // serves (recorded in our status), so a revision change never drops service.
            previous_pin(&previous, c)
        };
        let ty = if c == Component::Gateway { p.spec.gateway.service_type.as_str() } else { "ClusterIP" };
        let _: Service = apply_object(ctx, &ns, &resources::service(&owner, c, ty), Fields::Yield).await?;
        let ready = if serving.is_some() { ready_pods(ctx, &ns, &owner.name, c).await? } else { Vec::new() };
        rounds.push(ComponentRound { component: c, desired: view.replicas, fetch, serving, ready });
    }

    report_conflicts(ctx, p, &ns).await;

    // 4. Attestation round.
    let (verified, rejected) = match &policy {
        Ok(policy) => attest_all(ctx, &rounds, policy).await,
        Err(msg) => {
            let r = Rejection::new("trusted_root_unavailable", msg.clone());
            let rejected: Vec<_> =
                rounds.iter().flat_map(|r| r.ready.iter().cloned()).map(|e| (e, r.clone())).collect();
            (Vec::new(), rejected)
        }
    };
    for (endpoint, why) in &rejected {
        ctx.metrics.attestation(endpoint.component.as_str(), "rejected", &why.reason);
        warn!(pod = %endpoint.pod, component = %endpoint.component, reason = %why.reason, detail = %why.detail, "pod excluded from routing");
        let pod_ref = pod_reference(&ns, &endpoint.pod);
        let note = format!("pod {} ({}) excluded from routing: {}", endpoint.pod, endpoint.addr(), why);
        publish(ctx, p, EventType::Warning, &why.event_reason(), "Attest", note, Some(pod_ref)).await;
    }
    for v in &verified {
        ctx.metrics.attestation(v.component.as_str(), "verified", "ok");
    }
    let verified_names: Vec<&str> = verified.iter().map(|v| v.pod.as_str()).collect();
    gate_pods(ctx, &ns, &owner.name, &verified_names).await?;

    // 5. Routes and status.
    let table = RoutingTable::from_verified(&owner.name, &ns, generation, &verified);
    let policy_json = match &policy {
        Ok(pol) => {
            serde_json::to_string_pretty(pol.as_ref()).map_err(|source| Error::Serialize { what: "policy", source })?
        }
        Err(_) => "{}".into(),
    };
    apply_object(ctx, &ns, &resources::routes_configmap(&owner, table.to_json(), policy_json), Fields::Force).await?;
    let endpoints = endpoint_status(&verified);
    if endpoints != previous.verified_endpoints {
        let summary = Component::ALL
            .iter()
            .map(|c| format!("{c}={}", table.components.get(c.as_str()).map_or(0, Vec::len)))
            .collect::<Vec<_>>()
            .join(", ");
        publish(ctx, p, EventType::Normal, "RoutesUpdated", "Route", format!("verified routes: {summary}"), None).await;
    }
    let status = status_from_round(p, &previous, &rounds, &verified, &rejected, policy.as_ref().err(), endpoints);
    let ready = condition_true(&status, "Ready");
    patch_status(ctx, p, &previous, status).await?;

    let pending = rounds.iter().any(|r| r.fetch == Fetch::Running || r.serving.is_none());
    let period = if pending || !ready { valid.period.min(PROGRESS_REQUEUE) } else { valid.period };
    Ok(Action::requeue(period))
}

async fn cleanup(p: &PrivateRAGPipeline, ctx: &Context) -> Result<Action> {
    let ns = p.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let names = Names { pipeline: &p.name_any() };
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    // Routing first: the gateway stops sending traffic before anything it routes to goes.
    match cms.delete(&names.routes(), &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(Error::Kube(e)),
    }
    info!("routing table deleted; owned workloads follow by garbage collection");
    publish(
        ctx,
        p,
        EventType::Normal,
        "Deleting",
        "Cleanup",
        "routing table removed; owned workloads are garbage-collected".into(),
        None,
    )
    .await;
    Ok(Action::await_change())
}

/// How an apply treats fields another field manager owns.
#[derive(Clone, Copy)]
enum Fields {
    /// Leave them as they are and report the conflict (`FieldConflict` on the pipeline).
    Yield,
    /// Take them: for what only the operator may write (the routing table).
    Force,
}

/// Server-side apply of an owned object. On a conflict under [`Fields::Yield`] the object
/// stays as the other manager left it; the conflict is kept for [`report_conflicts`].
async fn apply_object<K>(ctx: &Context, ns: &str, obj: &K, fields: Fields) -> Result<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let name = obj.meta().name.clone().ok_or(Error::MissingField("metadata.name"))?;
    let params = match fields {
        Fields::Yield => PatchParams::apply(MANAGER),
        Fields::Force => PatchParams::apply(MANAGER).force(),
    };
    match api.patch(&name, &params, &Patch::Apply(obj)).await {
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let what = format!("{} {name}", K::kind(&()));
            warn!(object = %what, conflict = %e.message, "field conflict: left as it is");
            let pipeline =
                obj.meta().labels.as_ref().and_then(|l| l.get(resources::PIPELINE_LABEL)).cloned().unwrap_or_default();
            ctx.conflicts.lock().expect("conflicts").push(Conflict {
                ns: ns.to_string(),
                pipeline,
                what,
                message: e.message,
            });
            api.get(&name).await.map_err(Error::Kube)
        }
        applied => applied.map_err(Error::Kube),
    }
}

/// Reports (a Warning event on the pipeline) the apply conflicts met on its objects.
async fn report_conflicts(ctx: &Context, p: &PrivateRAGPipeline, ns: &str) {
    let name = p.name_any();
    let mine: Vec<Conflict> = {
        let mut all = ctx.conflicts.lock().expect("conflicts");
        let (mine, rest) = all.drain(..).partition(|c| c.ns == ns && c.pipeline == name);
        *all = rest;
        mine
    };
    for c in mine {
        let note =
            format!("{}: another field manager owns a field the operator sets; left as it is: {}", c.what, c.message);
        publish(ctx, p, EventType::Warning, "FieldConflict", "Apply", note, None).await;
    }
}

fn job_state(job: &Job) -> Fetch {
    let Some(status) = &job.status else { return Fetch::Running };
    if status.succeeded.unwrap_or(0) > 0 {
        return Fetch::Done;
    }
    let failed = status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Failed" || c.type_ == "FailureTarget") && c.status == "True");
    match failed {
        Some(c) => Fetch::Failed(format!(
            "job {} failed: {}",
            job.name_any(),
            c.message.clone().or_else(|| c.reason.clone()).unwrap_or_default()
        )),
        None => Fetch::Running,
    }
}

/// Deletes a component's fetch Jobs of superseded revisions, once the current one serves.
async fn prune_old_jobs(ctx: &Context, ns: &str, pipeline: &str, c: Component, pin: &ModelPin) -> Result<()> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let current = match &pin.source {
        crate::validate::PinnedSource::Hub { revision, .. } => Some(Names { pipeline }.fetch_job(c, revision)),
        crate::validate::PinnedSource::Volume { .. } => None,
    };
    let lp = ListParams::default().labels(&format!("{PIPELINE_LABEL}={pipeline},{}={c}", resources::COMPONENT_LABEL));
    for job in jobs.list(&lp).await.map_err(Error::Kube)? {
        let name = job.name_any();
        if Some(&name) != current.as_ref() {
            debug!(job = %name, "deleting superseded fetch job");
            match jobs.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(Error::Kube(e)),
            }
        }
    }
    Ok(())
}

fn previous_pin(previous: &PrivateRAGPipelineStatus, c: Component) -> Option<(String, [u8; 32])> {
    let s = previous.components.iter().find(|s| s.name == c.as_str())?;
    Some((s.model_revision.clone()?, parse_hex::<32>(s.model_identity.as_deref()?)?))
}

/// The component's pods that are ready, not terminating and have an IP.
async fn ready_pods(ctx: &Context, ns: &str, pipeline: &str, c: Component) -> Result<Vec<PodEndpoint>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().labels(&resources::pod_selector(pipeline, c));
    let mut out = Vec::new();
    for pod in pods.list(&lp).await.map_err(Error::Kube)? {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let ip = status.and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse::<IpAddr>().ok());
        let (true, Some(ip)) = (ready, ip) else { continue };
        out.push(PodEndpoint { component: c, pod: pod.name_any(), ip, port: grpc_port(&pod) });
    }
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(out)
}

/// The pod's own `grpc` container port (a pod spec is what the kubelet serves), falling
/// back to the default port.
fn grpc_port(pod: &Pod) -> u16 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(GRPC_PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(GRPC_PORT as u16)
}

/// Challenges every ready pod of every deployed component, concurrently.
async fn attest_all(
    ctx: &Context,
    rounds: &[ComponentRound],
    policy: &Arc<attest::Policy>,
) -> (Vec<VerifiedEndpoint>, Vec<(PodEndpoint, Rejection)>) {
    let mut jobs = Vec::new();
    for r in rounds {
        let Some((_, identity)) = r.serving else { continue };
        // The role allowlist is per component: a generator's evidence is no embedder's.
        let mut pol = policy.as_ref().clone();
        pol.roles = Some(vec![r.component.as_str().to_string()]);
        let pol = Arc::new(pol);
        let expected = Expected { component: r.component, model_identity: identity };
        for endpoint in &r.ready {
            let (pol, expected) = (pol.clone(), expected.clone());
            jobs.push(async move {
                let result = ctx.attestor.attest(endpoint, &expected, &pol).await;
                (endpoint.clone(), result)
            });
        }
    }
    let mut verified = Vec::new();
    let mut rejected = Vec::new();
    // Bounded concurrency: a pipeline with many pods must not open hundreds of handshakes.
    let mut results = futures::stream::iter(jobs).buffer_unordered(16);
    while let Some((endpoint, result)) = results.next().await {
        match result {
            Ok(v) => verified.push(v),
            Err(r) => rejected.push((endpoint, r)),
        }
    }
    verified.sort_by(|a, b| a.pod.cmp(&b.pod));
    rejected.sort_by(|a, b| a.0.pod.cmp(&b.0.pod));
    (verified, rejected)
}

/// Builds the gelo-attest policy of a pipeline. `Err(message)` when a named mock root cannot
/// be read: reported as a condition, and every pod is rejected until it can.
async fn resolve_policy(ctx: &Context, ns: &str, valid: &ValidSpec) -> Result<Result<Arc<attest::Policy>, String>> {
    let mut roots = Vec::new();
    for root in &valid.roots {
        match root {
            RootRef::Amd(generation) => {
                // Deserialize the generation name so the operator never hard-codes the enum.
                let r: attest::TrustedRoot = match serde_json::from_value(serde_json::json!({ "amd": generation })) {
                    Ok(r) => r,
                    Err(e) => return Ok(Err(format!("AMD root {generation:?}: {e}"))),
                };
                roots.push(r);
            }
            RootRef::MockSecret(sel) => {
                let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
                let secret = match secrets.get_opt(&sel.name).await {
                    Ok(Some(s)) => s,
                    Ok(None) => return Ok(Err(format!("mock root Secret {ns}/{} not found", sel.name))),
                    Err(kube::Error::Api(s)) if s.is_forbidden() => {
                        return Ok(Err(format!("mock root Secret {ns}/{}: forbidden", sel.name)));
                    }
                    Err(e) => return Err(Error::Kube(e)),
                };
                let pem = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&sel.key))
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&sel.key)).cloned());
                let Some(pem) = pem else {
                    return Ok(Err(format!("mock root Secret {ns}/{} has no key {:?}", sel.name, sel.key)));
                };
                roots.push(attest::TrustedRoot::MockPem(pem));
            }
        }
    }
    let mut policy = attest::Policy::default().with_roots(roots);
    policy.measurements = valid.measurements.iter().map(|m| attest::Hex(*m)).collect();
    let t = valid.min_tcb;
    policy.min_tcb = attest::Tcb { bootloader: t.bootloader, tee: t.tee, snp: t.snp, microcode: t.microcode };
    policy.protections = valid.protections.clone();
    if let Some(log) = &valid.release_log {
        policy = policy.with_release_log(log.clone());
    }
    if let Some(probes) = valid.masked_min_probes {
        // The spec names its masked pods' probe count; never more lenient than it says.
        policy.masked.min_verify_probes = probes.into();
    }
    if !valid.scheme_identities.is_empty() {
        policy.scheme_identities = Some(valid.scheme_identities.iter().map(|s| attest::Hex(*s)).collect());
    }
    // Parse the roots now: a Secret holding something that is not a certificate is a
    // condition, not a rejection of every pod with a confusing reason.
    if let Err(e) = policy.roots() {
        return Ok(Err(format!("trusted roots unusable: {e}")));
    }
    Ok(Ok(Arc::new(policy)))
}

/// Labels verified pods `gelo.dev/attested=true` and removes the label from every other pod
/// of the pipeline. Only pods whose label is wrong are patched.
async fn gate_pods(ctx: &Context, ns: &str, pipeline: &str, verified: &[&str]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{PIPELINE_LABEL}={pipeline}"));
    for pod in pods.list(&lp).await.map_err(Error::Kube)? {
        let name = pod.name_any();
        let want = verified.contains(&name.as_str());
        let has = pod.labels().get(ATTESTED_LABEL).is_some_and(|v| v == "true");
        if want == has {
            continue;
        }
        let value = if want { serde_json::Value::from("true") } else { serde_json::Value::Null };
        let patch = serde_json::json!({ "metadata": { "labels": { ATTESTED_LABEL: value } } });
        match pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            // Gone meanwhile: nothing to route to anyway.
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(())
}

fn pod_reference(ns: &str, pod: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    }
}

/// Publishes an Event on the pipeline. Best effort: a failed Event must not fail the
/// reconcile that found the thing worth reporting.
async fn publish(
    ctx: &Context,
    p: &PrivateRAGPipeline,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
    secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    // Event notes are limited to 1 kB.
    let note = if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &note[..end])
    } else {
        note
    };
    let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary };
    if let Err(e) = ctx.recorder.publish(&event, &p.object_ref(&())).await {
        warn!(error = %e, reason, "publishing an event failed");
    }
}

/// How `run` is set up.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub instance: Option<String>,
    pub allow_mock_roots: bool,
    /// See [`Context::hub_endpoint`].
    pub hub_endpoint: Option<String>,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: RunConfig,
    metrics: Arc<Metrics>,
    attestor: Arc<dyn PodAttestor>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = &config.namespace;
    // Only our objects: smaller caches, and no reconcile storms from unrelated workloads.
    let managed = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let ctx = Arc::new(
        Context::new(client.clone(), metrics, attestor, config.instance.clone())
            .with_mock_roots(config.allow_mock_roots)
            .with_hub_endpoint(config.hub_endpoint.clone()),
    );
    Controller::new(api::<PrivateRAGPipeline>(&client, ns), watcher::Config::default().any_semantic())
        .owns(api::<Deployment>(&client, ns), managed.clone())
        .owns(api::<Job>(&client, ns), managed.clone())
        .owns(api::<Service>(&client, ns), managed.clone())
        .owns(api::<ConfigMap>(&client, ns), managed.clone())
        .owns(api::<PersistentVolumeClaim>(&client, ns), managed.clone())
        // Pods belong to ReplicaSets, not to us: map them back by label. A pod turning
        // ready is what starts its first attestation without waiting a period.
        .watches(api::<Pod>(&client, ns), managed, |pod: Pod| {
            let ns = pod.namespace()?;
            let name = pod.labels().get(PIPELINE_LABEL)?.clone();
            Some(ObjectRef::<PrivateRAGPipeline>::new(&name).within(&ns))
        })
        // Coalesce bursts (a rollout touches many objects) into one attestation round.
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(pipeline = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile error (handled by error_policy)"),
            }
        })
        .await;
}
