//! The `PrivateRAGPipeline` custom resource: what a user asks for (spec) and what the operator
//! has verified (status). `crds/` holds the YAML generated from these types
//! (`gelo-operator crdgen`); a test keeps the two equal.
//!
//! The schema checks formats early (hex lengths, enums) so `kubectl apply` refuses obvious
//! mistakes, but the reconciler validates again ([`crate::validate`]) and reports a condition:
//! a stored object may predate a schema change, and the reconciler must never trust input.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every GELO resource.
pub const GROUP: &str = "gelo.dev";

// Several `printcolumn(...)` entries are kube's syntax, not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gelo.dev",
    version = "v1alpha1",
    kind = "PrivateRAGPipeline",
    plural = "privateragpipelines",
    singular = "privateragpipeline",
    shortname = "prp",
    namespaced,
    status = "PrivateRAGPipelineStatus",
    derive = "PartialEq",
    doc = "A private RAG pipeline: embedder, reranker, generator and gateway in attested confidential VMs, routed only after their evidence is verified.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(
        name = "Models",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ModelsReady\")].status"
    ),
    printcolumn(name = "Attested", type_ = "string", json_path = ".status.conditions[?(@.type==\"Attested\")].status"),
    printcolumn(
        name = "Verified",
        type_ = "string",
        json_path = ".status.verified",
        description = "verified pods / desired pods"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PrivateRAGPipelineSpec {
    /// Container image holding the `gelo` binary; every component runs it with its role.
    pub image: String,
    /// Image pull policy of every component (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    pub embedder: ComponentSpec,
    pub reranker: ComponentSpec,
    pub generator: ComponentSpec,
    pub gateway: GatewaySpec,
    pub attestation: AttestationSpec,
    /// Volumes the model distribution Jobs download into (one per component with a hub source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// One model-serving component (embedder, reranker, generator).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    pub model: ModelSource,
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 64))]
    pub replicas: i32,
    /// Where the untrusted matrix products run.
    #[serde(default)]
    pub engine: Engine,
    /// How requests are protected from the engine: `sealed` (default: every product on the
    /// pod's CPU inside the CVM, the engine sees nothing), `masked` (products on the
    /// engine under GELO masks: weaker, see docs/SECURITY.md) or `dual-lpn` (int8 products
    /// on the engine under dual-LPN masks: hidden under that assumption, see
    /// docs/SECURITY.md). Recorded in the attested scheme; the pipeline's policy then
    /// accepts that protection for its pods.
    #[serde(default)]
    pub protection: Protection,
    /// U-Verify probes per weight under `masked` (each misses a wrong product with
    /// probability at most 1/6); recorded in the attested scheme. Below the default, the
    /// pipeline's policy accepts the lower count for this pipeline's pods only because the
    /// spec names it.
    #[serde(default = "default_verify_probes")]
    #[schemars(range(min = 0, max = 16))]
    pub verify_probes: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
    /// RuntimeClass of the pods, e.g. a Kata SEV-SNP class (`kata-qemu-snp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// The services' default (`gelo serve --verify-probes`).
fn default_verify_probes() -> i32 {
    2
}

/// The gateway: runs the RAG flow, routes to verified pods, and is what clients reach.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The gateway's own files (tokenizer for chunking), pinned like any model.
    pub model: ModelSource,
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 64))]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Type of the client-facing Service.
    #[serde(default)]
    pub service_type: ServiceType,
}

fn one() -> i32 {
    1
}

/// Where a component's model files come from. Exactly one of `hub` and `volume`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeSource>,
    /// SHA-256 (64 hex) of the canonical model manifest the pods must load and attest to.
    /// Required: the operator never serves an unpinned model (checked by the reconciler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub model_identity: Option<String>,
}

/// A model repository on a hub, pinned to one commit.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HubSource {
    /// Repository id, e.g. `sentence-transformers/all-MiniLM-L6-v2`.
    #[schemars(length(min = 1, max = 256))]
    pub repo: String,
    /// Full 40-hex commit id; branch and tag names move and are refused.
    #[schemars(regex(pattern = r"^[0-9a-f]{40}$"))]
    pub revision: String,
}

/// Model files already present on an existing PersistentVolumeClaim.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSource {
    pub claim_name: String,
    /// Folder inside the claim that holds the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// CPU engine (`gelo --engine cpu`); for development and small models.
    #[default]
    Cpu,
    /// The Vulkan GPU engine (`gelo --engine vulkan`): the GPU does the masked products when
    /// the component's `protection` is `masked` (sealed components leave it unused).
    Vulkan,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Vulkan => "vulkan",
        }
    }
}

/// A component's protection scheme (`gelo serve --protection`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protection {
    /// Every product on the CVM's CPU; the engine receives nothing from a request.
    #[default]
    Sealed,
    /// Products on the engine as GELO-masked operands: the engine can read prompt tokens
    /// from their row space and Gram (docs/SECURITY.md).
    Masked,
    /// Every linear on the engine as an int8 product over `Z_{2^32}` under a dual-LPN mask:
    /// computationally hidden from the engine under the dual-LPN assumption, with the
    /// policy's `dual_lpn` requirements on the attested settings (docs/SECURITY.md).
    #[serde(rename = "dual-lpn")]
    DualLpn,
}

impl Protection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sealed => "sealed",
            Self::Masked => "masked",
            Self::DualLpn => "dual-lpn",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// Extended resource name of the device plugin, e.g. `amd.com/gpu` or `nvidia.com/gpu`.
    pub resource_name: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub count: i32,
}

/// Container resources as Kubernetes quantities (`"2"`, `"500m"`, `"8Gi"`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIP => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// What a pod's evidence must show before the pod is routed to.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttestationSpec {
    /// Allowed SEV-SNP launch measurements (48 bytes, 96 hex). Empty accepts none.
    #[serde(default)]
    #[schemars(inner(regex(pattern = r"^[0-9a-f]{96}$")))]
    pub allowed_measurements: Vec<String>,
    /// Minimum reported TCB, component by component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_tcb: Option<TcbSpec>,
    /// Roots of trust for the ARK of a pod's certificate chain.
    #[schemars(length(min = 1))]
    pub trusted_roots: Vec<TrustedRootSpec>,
    /// Allowed protocol settings (scheme identities, 64 hex). Empty accepts any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[0-9a-f]{64}$")))]
    pub scheme_identities: Vec<String>,
    /// The release log every allowed measurement must be proven in (docs/RELEASES.md):
    /// a pod is routed only if a logged release manifest names its measurement. Absent: the
    /// measurements are taken as listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_log: Option<ReleaseLogSpec>,
    /// How often every ready pod is challenged again with a fresh nonce.
    #[serde(default = "default_period")]
    #[schemars(range(min = 2, max = 3600), extend("format" = "int32"))]
    pub period_seconds: u32,
}

/// A release log as a policy requires it, the texts inline (from the release's files).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseLogSpec {
    /// The log's signed-note verifier key, `origin+keyid+base64`.
    pub public_key: String,
    /// Release bundles as `scripts/release/log.sh` writes them (JSON text, one a release).
    #[schemars(length(min = 1))]
    pub releases: Vec<String>,
    /// The newest checkpoint this cluster saw (a signed note): every bundle must extend it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered_checkpoint: Option<String>,
}

fn default_period() -> u32 {
    30
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcbSpec {
    #[serde(default)]
    #[schemars(extend("format" = "int32"), range(max = 255))]
    pub bootloader: u8,
    #[serde(default)]
    #[schemars(extend("format" = "int32"), range(max = 255))]
    pub tee: u8,
    #[serde(default)]
    #[schemars(extend("format" = "int32"), range(max = 255))]
    pub snp: u8,
    #[serde(default)]
    #[schemars(extend("format" = "int32"), range(max = 255))]
    pub microcode: u8,
}

/// One trusted root: an AMD built-in ARK by generation, or a mock ARK from a Secret that the
/// spec must name (never implied). Exactly one field is set.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustedRootSpec {
    /// `milan`, `genoa` or `turin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd: Option<String>,
    /// A mock ARK (PEM) in a Secret of the pipeline's namespace. For tests and development
    /// clusters without SEV-SNP hardware; pods then issue mock evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_secret_ref: Option<SecretKeyRef>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    /// Key of the ARK certificate (PEM) inside the Secret.
    #[serde(default = "default_ark_key")]
    pub key: String,
}

fn default_ark_key() -> String {
    "ark.pem".into()
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Size of each model volume.
    #[serde(default = "default_size")]
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// ReadWriteOnce suits one node; use ReadWriteMany when pods spread over nodes.
    #[serde(default = "default_access_mode")]
    pub access_mode: String,
}

fn default_size() -> String {
    "10Gi".into()
}
fn default_access_mode() -> String {
    "ReadWriteOnce".into()
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self { size: default_size(), storage_class_name: None, access_mode: default_access_mode() }
    }
}

/// What the operator observed and verified.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrivateRAGPipelineStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `ModelsReady`, `Attested`, `Ready`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub components: Vec<ComponentStatus>,
    /// Pods whose evidence was verified in the last attestation round: the routing table.
    #[serde(default)]
    pub verified_endpoints: Vec<EndpointStatus>,
    /// `verified/desired` pods over all components, for `kubectl get prp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
}

/// A condition in the shape of `meta/v1 Condition`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339; changes only when `status` changes.
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// embedder, reranker, generator or gateway.
    pub name: String,
    pub desired: i32,
    pub ready: i32,
    pub verified: i32,
    /// The pinned revision the component's Deployment serves (it changes once the new
    /// revision's files are fetched and checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_revision: Option<String>,
    /// The model identity the component's pods must attest to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_identity: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    pub component: String,
    pub pod: String,
    pub ip: String,
    #[schemars(extend("format" = "int32"), range(max = 65535))]
    pub port: u16,
    /// SHA-256 of the pod's TLS SubjectPublicKeyInfo: clients pin it.
    pub tls_spki_sha256: String,
    pub model_identity: String,
    pub scheme_identity: String,
}

/// The four components, in the order a query flows through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    Embedder,
    Reranker,
    Generator,
    Gateway,
}

impl Component {
    pub const ALL: [Component; 4] = [Self::Embedder, Self::Reranker, Self::Generator, Self::Gateway];

    /// The attested model role this component serves (`None` for the gateway).
    pub fn role(self) -> Option<attest::Role> {
        match self {
            Self::Embedder => Some(attest::Role::Embedder),
            Self::Reranker => Some(attest::Role::Reranker),
            Self::Generator => Some(attest::Role::Generator),
            Self::Gateway => None,
        }
    }

    /// The component's name: also the `gelo` subcommand, and for a model component the
    /// evidence's `role` field ([`attest::Role`]).
    pub fn as_str(self) -> &'static str {
        self.role().map_or("gateway", attest::Role::as_str)
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fields every component shares, whatever its spec type.
#[derive(Clone, Copy, Debug)]
pub struct ComponentView<'a> {
    pub component: Component,
    pub model: &'a ModelSource,
    pub replicas: i32,
    pub engine: Option<Engine>,
    pub protection: Option<Protection>,
    pub verify_probes: Option<i32>,
    pub gpu: Option<&'a GpuSpec>,
    pub runtime_class_name: Option<&'a str>,
    pub resources: Option<&'a Resources>,
}

impl PrivateRAGPipelineSpec {
    pub fn component(&self, c: Component) -> ComponentView<'_> {
        match c {
            Component::Embedder => self.embedder.view(c),
            Component::Reranker => self.reranker.view(c),
            Component::Generator => self.generator.view(c),
            Component::Gateway => ComponentView {
                component: c,
                model: &self.gateway.model,
                replicas: self.gateway.replicas,
                engine: None,
                protection: None,
                verify_probes: None,
                gpu: None,
                runtime_class_name: self.gateway.runtime_class_name.as_deref(),
                resources: self.gateway.resources.as_ref(),
            },
        }
    }

    pub fn components(&self) -> impl Iterator<Item = ComponentView<'_>> {
        Component::ALL.into_iter().map(|c| self.component(c))
    }
}

impl ComponentSpec {
    fn view(&self, component: Component) -> ComponentView<'_> {
        ComponentView {
            component,
            model: &self.model,
            replicas: self.replicas,
            engine: Some(self.engine),
            protection: Some(self.protection),
            verify_probes: Some(self.verify_probes),
            gpu: self.gpu.as_ref(),
            runtime_class_name: self.runtime_class_name.as_deref(),
            resources: self.resources.as_ref(),
        }
    }
}
