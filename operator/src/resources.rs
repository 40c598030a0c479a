//! The Kubernetes objects a pipeline owns, as pure functions of (pipeline, validated spec).
//! Nothing here talks to the API server, so every object can be built, serialized and
//! schema-checked offline (`gelo-operator manifests`).
//!
//! Layout per component `C` of pipeline `P`:
//! - PVC `P-C-models` and Job `P-C-fetch-<rev>`: `gelo model fetch` downloads the pinned
//!   revision and refuses files whose identity differs (hub sources only);
//! - Deployment `P-C`: the role's pods, in the spec's runtime class, model mounted read-only;
//! - Service `P-C`: selects only pods the operator labelled `gelo.dev/attested=true`.
//!
//! Plus ConfigMap `P-routes` (the routing table) and, for the gateway, a ServiceAccount and a
//! Role allowing it to read that one ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use crate::crd::{Component, ComponentView, PrivateRAGPipeline, StorageSpec};
use crate::validate::{ModelPin, PinnedSource, ValidSpec};
use crate::{Error, Result};

/// Field manager of every server-side apply, and the `managed-by` label.
pub const MANAGER: &str = "gelo-operator";
/// Port every role serves gRPC (and `Attestation.GetEvidence`) on, over RA-TLS.
pub const GRPC_PORT: i32 = 50051;
pub const GRPC_PORT_NAME: &str = "grpc";
/// Prometheus metrics of every component (plain HTTP: method names, codes and counts only).
pub const METRICS_PORT: i32 = 9090;
pub const METRICS_PORT_NAME: &str = "metrics";
/// Set to "true" by the attestation loop on verified pods only; Services select on it.
pub const ATTESTED_LABEL: &str = "gelo.dev/attested";
pub const PIPELINE_LABEL: &str = "gelo.dev/pipeline";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const REVISION_ANNOTATION: &str = "gelo.dev/model-revision";
pub const IDENTITY_ANNOTATION: &str = "gelo.dev/model-identity";
/// On the gateway's pod template: the digest of the backend policy the gateway reads at
/// start and attests. A new policy is a new template, so it rolls the gateway (which never
/// takes a policy change while running).
pub const BACKEND_POLICY_ANNOTATION: &str = "gelo.dev/backend-policy-sha256";
/// Key of the routing table inside the routes ConfigMap.
pub const ROUTES_KEY: &str = "routes.json";
/// Key of the pipeline's attestation policy (gelo-attest format) inside the routes ConfigMap.
pub const POLICY_KEY: &str = "policy.json";
/// Where pods find the model: `/models/<component>`.
pub const MODELS_ROOT: &str = "/models";
const MOCK_PKI_DIR: &str = "/etc/gelo/mock-pki";
/// Non-root uid/gid of the images (distroless `nonroot`).
const RUN_AS: i64 = 65532;

/// Names of everything a pipeline owns, in one place so tests and cleanup agree.
pub struct Names<'a> {
    pub pipeline: &'a str,
}

impl Names<'_> {
    pub fn workload(&self, c: Component) -> String {
        bounded(&format!("{}-{}", self.pipeline, c))
    }
    pub fn models_pvc(&self, c: Component) -> String {
        bounded(&format!("{}-{}-models", self.pipeline, c))
    }
    /// One Job per pinned revision: Jobs are immutable, and a new name is what makes a
    /// revision change start a new download.
    pub fn fetch_job(&self, c: Component, revision: &str) -> String {
        bounded(&format!("{}-{}-fetch-{}", self.pipeline, c, &revision[..revision.len().min(12)]))
    }
    pub fn routes(&self) -> String {
        bounded(&format!("{}-routes", self.pipeline))
    }
    pub fn gateway_account(&self) -> String {
        bounded(&format!("{}-gateway", self.pipeline))
    }
}

/// Keeps a name within 63 characters (a DNS label, also a label value) by replacing the tail
/// with a hash of the whole, so two long names stay distinct.
pub fn bounded(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let digest = hex::encode(&Sha256::digest(name.as_bytes())[..4]);
    let mut head: String = name.chars().take(54).collect();
    while head.ends_with('-') || head.ends_with('.') {
        head.pop();
    }
    format!("{head}-{digest}")
}

pub fn selector_labels(pipeline: &str, c: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "gelo".to_string()),
        ("app.kubernetes.io/instance".to_string(), pipeline.to_string()),
        (COMPONENT_LABEL.to_string(), c.as_str().to_string()),
    ])
}

pub fn labels(pipeline: &str, c: Option<Component>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "gelo".to_string()),
        ("app.kubernetes.io/instance".to_string(), pipeline.to_string()),
        ("app.kubernetes.io/managed-by".to_string(), MANAGER.to_string()),
        (PIPELINE_LABEL.to_string(), pipeline.to_string()),
    ]);
    if let Some(c) = c {
        l.insert(COMPONENT_LABEL.to_string(), c.as_str().to_string());
    }
    l
}

/// Label selector (string form) of a component's pods.
pub fn pod_selector(pipeline: &str, c: Component) -> String {
    selector_labels(pipeline, c).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Everything the builders need about the owner.
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

impl Owner {
    pub fn of(p: &PrivateRAGPipeline) -> Result<Self> {
        Ok(Self {
            name: p.name_any(),
            namespace: p.namespace().ok_or(Error::MissingField("metadata.namespace"))?,
            // `controller: true` makes the owned objects trigger our reconcile (`Controller::owns`)
            // and lets the garbage collector delete them with the pipeline.
            reference: p.controller_owner_ref(&()).ok_or(Error::MissingField("metadata.uid"))?,
        })
    }

    fn names(&self) -> Names<'_> {
        Names { pipeline: &self.name }
    }

    fn meta(&self, name: String, c: Option<Component>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels(&self.name, c)),
            owner_references: Some(vec![self.reference.clone()]),
            ..Default::default()
        }
    }
}

pub fn models_pvc(owner: &Owner, c: Component, storage: &StorageSpec) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: owner.meta(owner.names().models_pvc(c), Some(c)),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![storage.access_mode.clone()]),
            storage_class_name: storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(storage.size.clone()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `gelo model fetch` Job of one hub-pinned component. It exits non-zero, and the Job
/// fails, when the hub answers another commit for the pinned revision or the downloaded
/// files' identity differs from the pinned one. `hub_endpoint`: a mirror with the hub's URL
/// layout instead of huggingface.co (`HF_ENDPOINT` in the Job).
pub fn fetch_job(
    owner: &Owner,
    c: Component,
    pin: &ModelPin,
    image: &str,
    pull: Option<&str>,
    hub_endpoint: Option<&str>,
) -> Option<Job> {
    let PinnedSource::Hub { repo, revision } = &pin.source else {
        return None;
    };
    let out = format!("{MODELS_ROOT}/{c}");
    let container = Container {
        name: "fetch".into(),
        image: Some(image.to_string()),
        image_pull_policy: pull.map(str::to_string),
        args: Some(vec![
            "model".into(),
            "fetch".into(),
            "--repo".into(),
            repo.clone(),
            "--revision".into(),
            revision.clone(),
            "--out".into(),
            out,
            "--expect-identity".into(),
            pin.identity_hex(),
        ]),
        env: Some([env("HOME", "/tmp")].into_iter().chain(hub_endpoint.map(|e| env("HF_ENDPOINT", e))).collect()),
        volume_mounts: Some(vec![
            VolumeMount { name: "models".into(), mount_path: MODELS_ROOT.into(), ..Default::default() },
            VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() },
        ]),
        security_context: Some(container_security()),
        ..Default::default()
    };
    let mut meta = owner.meta(owner.names().fetch_job(c, revision), Some(c));
    meta.annotations = Some(pin_annotations(pin));
    Some(Job {
        metadata: meta,
        spec: Some(JobSpec {
            backoff_limit: Some(3),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels(&owner.name, Some(c))), ..Default::default() }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    security_context: Some(pod_security()),
                    containers: vec![container],
                    volumes: Some(vec![pvc_volume("models", &owner.names().models_pvc(c), false), empty_dir("tmp")]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn pin_annotations(pin: &ModelPin) -> BTreeMap<String, String> {
    BTreeMap::from([
        (REVISION_ANNOTATION.to_string(), pin.revision_label()),
        (IDENTITY_ANNOTATION.to_string(), pin.identity_hex()),
    ])
}

/// A component's Deployment serving `pin`. The pin is in the pod template's annotations, so
/// a new pin is a new template and rolls the pods; so is, for the gateway, the digest of the
/// backend policy (`backend_policy`, hex).
pub fn deployment(
    owner: &Owner,
    view: ComponentView<'_>,
    pin: &ModelPin,
    valid: &ValidSpec,
    image: &str,
    pull: Option<&str>,
    backend_policy: Option<&str>,
) -> Deployment {
    let c = view.component;
    let names = owner.names();
    let model_dir = format!("{MODELS_ROOT}/{c}");
    let args = container_args(view, pin, &model_dir, &names);
    let (env, mounts, volumes) = env_and_volumes(c, pin, valid, model_dir, &names);
    let container = container(view, image, pull, args, env, mounts);

    let is_gateway = c == Component::Gateway;
    Deployment {
        metadata: owner.meta(names.workload(c), Some(c)),
        spec: DeploymentSpec {
            replicas: Some(view.replicas),
            selector: LabelSelector { match_labels: Some(selector_labels(&owner.name, c)), ..Default::default() },
            // Surge, never dip: a new pod must be ready (and then verified) before an old,
            // verified one goes.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(&owner.name, Some(c))),
                    annotations: Some({
                        let mut a = pin_annotations(pin);
                        if let (Component::Gateway, Some(digest)) = (c, backend_policy) {
                            a.insert(BACKEND_POLICY_ANNOTATION.to_string(), digest.to_string());
                        }
                        a
                    }),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    runtime_class_name: view.runtime_class_name.map(str::to_string),
                    // Only the gateway talks to the API server (to watch its routing table).
                    service_account_name: is_gateway.then(|| names.gateway_account()),
                    automount_service_account_token: Some(is_gateway),
                    security_context: Some(pod_security()),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The `gelo` command line of a component's container.
fn container_args(view: ComponentView<'_>, pin: &ModelPin, model_dir: &str, names: &Names<'_>) -> Vec<String> {
    let c = view.component;
    let mut args = vec![
        c.as_str().to_string(),
        "--listen".into(),
        format!("0.0.0.0:{GRPC_PORT}"),
        "--metrics-listen".into(),
        format!("0.0.0.0:{METRICS_PORT}"),
        "--model".into(),
        model_dir.to_string(),
        "--expect-identity".into(),
        pin.identity_hex(),
    ];
    if let Some(engine) = view.engine {
        args.extend(["--engine".into(), engine.as_str().into()]);
    }
    if let Some(protection) = view.protection {
        args.extend(["--protection".into(), protection.as_str().into()]);
    }
    if let Some(probes) = view.verify_probes {
        args.extend(["--verify-probes".into(), probes.to_string()]);
    }
    if c == Component::Gateway {
        args.extend(["--routes-configmap".into(), names.routes()]);
    }

    args
}

/// The container's environment, its volume mounts and the pod's volumes: scratch space, the
/// model (the operator's PVC or the user's volume) and, with the mock issuer, its PKI.
fn env_and_volumes(
    c: Component,
    pin: &ModelPin,
    valid: &ValidSpec,
    model_dir: String,
    names: &Names<'_>,
) -> (Vec<EnvVar>, Vec<VolumeMount>, Vec<Volume>) {
    let mut env = vec![
        env("GELO_ATTEST_ISSUER", if valid.uses_mock_root().is_some() { "mock" } else { "hardware" }),
        env_field("POD_NAME", "metadata.name"),
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env("HOME", "/tmp"),
    ];
    let mut mounts = vec![VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() }];
    let mut volumes = vec![empty_dir("tmp")];
    match &pin.source {
        PinnedSource::Hub { .. } => {
            mounts.push(VolumeMount {
                name: "models".into(),
                mount_path: MODELS_ROOT.into(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(pvc_volume("models", &names.models_pvc(c), true));
        }
        PinnedSource::Volume { claim_name, sub_path } => {
            mounts.push(VolumeMount {
                name: "models".into(),
                mount_path: model_dir,
                sub_path: sub_path.clone(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(pvc_volume("models", claim_name, true));
        }
    }
    if let Some(secret) = valid.uses_mock_root() {
        // The mock issuer signs with this PKI; only the operator's policy decides whether
        // its root is trusted.
        env.push(self::env("GELO_MOCK_PKI_DIR", MOCK_PKI_DIR));
        mounts.push(VolumeMount {
            name: "mock-pki".into(),
            mount_path: MOCK_PKI_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "mock-pki".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        });
    }

    (env, mounts, volumes)
}

/// The `gelo` container: image, command line, ports, readiness probe, resources, mounts.
fn container(
    view: ComponentView<'_>,
    image: &str,
    pull: Option<&str>,
    args: Vec<String>,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: "gelo".into(),
        image: Some(image.to_string()),
        image_pull_policy: pull.map(str::to_string),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some(GRPC_PORT_NAME.into()),
                container_port: GRPC_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some(METRICS_PORT_NAME.into()),
                container_port: METRICS_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        // The probes ask the plain-HTTP metrics port (`/readyz`: serving; `/healthz`: not
        // failed), never the RA-TLS port: kubelet's gRPC probe cannot speak RA-TLS, and a
        // TCP probe there is a handshake cut short that the service logs every period.
        readiness_probe: Some(http_probe("/readyz", 5, 1)),
        liveness_probe: Some(http_probe("/healthz", 10, 3)),
        resources: resources(view),
        volume_mounts: Some(mounts),
        security_context: Some(container_security()),
        ..Default::default()
    }
}

/// An HTTP GET of `path` on the metrics port every `period` seconds, failing after
/// `failures` misses in a row.
fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(METRICS_PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn resources(view: ComponentView<'_>) -> Option<ResourceRequirements> {
    let q = |m: &BTreeMap<String, String>| -> BTreeMap<String, Quantity> {
        m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect()
    };
    let mut requests = view.resources.map(|r| q(&r.requests)).unwrap_or_default();
    let mut limits = view.resources.map(|r| q(&r.limits)).unwrap_or_default();
    if let Some(gpu) = view.gpu {
        // Extended resources must have requests == limits.
        limits.insert(gpu.resource_name.clone(), Quantity(gpu.count.to_string()));
        requests.insert(gpu.resource_name.clone(), Quantity(gpu.count.to_string()));
    }
    if requests.is_empty() && limits.is_empty() {
        return None;
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    })
}

/// A component's Service. It selects only pods labelled attested, so Kubernetes-level
/// traffic (clients of the gateway) also reaches verified pods only.
pub fn service(owner: &Owner, c: Component, service_type: &str) -> Service {
    let mut selector = selector_labels(&owner.name, c);
    selector.insert(ATTESTED_LABEL.into(), "true".into());
    Service {
        metadata: owner.meta(owner.names().workload(c), Some(c)),
        spec: Some(ServiceSpec {
            type_: Some(service_type.to_string()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some(GRPC_PORT_NAME.into()),
                port: GRPC_PORT,
                target_port: Some(IntOrString::String(GRPC_PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The routing ConfigMap with the given table and policy (both JSON).
pub fn routes_configmap(owner: &Owner, routes_json: String, policy_json: String) -> ConfigMap {
    ConfigMap {
        metadata: owner.meta(owner.names().routes(), None),
        data: Some(BTreeMap::from([(ROUTES_KEY.to_string(), routes_json), (POLICY_KEY.to_string(), policy_json)])),
        ..Default::default()
    }
}

pub fn gateway_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount {
        metadata: owner.meta(owner.names().gateway_account(), Some(Component::Gateway)),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

/// Least privilege for the gateway: read and watch its own routing table, nothing else.
pub fn gateway_role(owner: &Owner) -> Role {
    Role {
        metadata: owner.meta(owner.names().gateway_account(), Some(Component::Gateway)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![owner.names().routes()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..Default::default()
        }]),
    }
}

pub fn gateway_role_binding(owner: &Owner) -> RoleBinding {
    let name = owner.names().gateway_account();
    RoleBinding {
        metadata: owner.meta(name.clone(), Some(Component::Gateway)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(owner.namespace.clone()),
            ..Default::default()
        }]),
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pvc_volume(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(read_only),
        }),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.into(), empty_dir: Some(Default::default()), ..Default::default() }
}

fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
        ..Default::default()
    }
}

fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    }
}

/// Every object the reconciler applies for a pipeline whose models are all fetched, in
/// apply order. Used by `gelo-operator manifests` and by the schema validation script.
pub fn all_objects(p: &PrivateRAGPipeline, valid: &ValidSpec) -> Result<Vec<serde_json::Value>> {
    let owner = Owner::of(p)?;
    let spec = &p.spec;
    let pull = spec.image_pull_policy.map(|p| p.as_str());
    let storage = spec.storage.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut push = |v: Result<serde_json::Value, serde_json::Error>| -> Result<()> {
        out.push(v.map_err(|source| Error::Serialize { what: "manifest", source })?);
        Ok(())
    };
    push(serde_json::to_value(gateway_account(&owner)))?;
    push(serde_json::to_value(gateway_role(&owner)))?;
    push(serde_json::to_value(gateway_role_binding(&owner)))?;
    for view in spec.components() {
        let c = view.component;
        let pin = valid.model(c);
        if let Some(job) = fetch_job(&owner, c, pin, &spec.image, pull, None) {
            push(serde_json::to_value(models_pvc(&owner, c, &storage)))?;
            push(serde_json::to_value(job))?;
        }
        push(serde_json::to_value(deployment(&owner, view, pin, valid, &spec.image, pull, None)))?;
        let ty = if c == Component::Gateway { spec.gateway.service_type.as_str() } else { "ClusterIP" };
        push(serde_json::to_value(service(&owner, c, ty)))?;
    }
    push(serde_json::to_value(routes_configmap(&owner, "{}".into(), "{}".into())))?;
    Ok(out)
}
