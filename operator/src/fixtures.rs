//! Small builders of pipelines for tests, examples and `gelo-operator manifests`, in the
//! style of controller-rs's `Document::test()`: `PrivateRAGPipeline::test().finalized()`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::controller::FINALIZER;
use crate::crd::*;

/// Model identities of the test pipeline, one per component.
pub const EMBEDDER_IDENTITY: &str = "1111111111111111111111111111111111111111111111111111111111111111";
pub const RERANKER_IDENTITY: &str = "2222222222222222222222222222222222222222222222222222222222222222";
pub const GENERATOR_IDENTITY: &str = "3333333333333333333333333333333333333333333333333333333333333333";
pub const GATEWAY_IDENTITY: &str = "4444444444444444444444444444444444444444444444444444444444444444";
pub const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";
pub const MOCK_SECRET: &str = "gelo-mock-root";

pub fn identity(c: Component) -> &'static str {
    match c {
        Component::Embedder => EMBEDDER_IDENTITY,
        Component::Reranker => RERANKER_IDENTITY,
        Component::Generator => GENERATOR_IDENTITY,
        Component::Gateway => GATEWAY_IDENTITY,
    }
}

pub fn identity_bytes(c: Component) -> [u8; 32] {
    crate::validate::parse_hex::<32>(identity(c)).unwrap_or([0; 32])
}

fn hub(repo: &str, id: &str) -> ModelSource {
    ModelSource {
        hub: Some(HubSource { repo: repo.into(), revision: REVISION.into() }),
        volume: None,
        model_identity: Some(id.into()),
    }
}

fn component(model: ModelSource) -> ComponentSpec {
    ComponentSpec {
        model,
        replicas: 1,
        engine: Engine::Cpu,
        protection: Default::default(),
        verify_probes: 2,
        gpu: None,
        runtime_class_name: None,
        resources: None,
    }
}

impl PrivateRAGPipelineSpec {
    /// Hub models for the three model roles, a volume for the gateway's tokenizer, and a
    /// mock root from a Secret: every kind of source and root the operator handles.
    pub fn test() -> Self {
        Self {
            image: "ghcr.io/gelo-dev/gelo:test".into(),
            image_pull_policy: Some(PullPolicy::IfNotPresent),
            embedder: component(hub("sentence-transformers/all-MiniLM-L6-v2", EMBEDDER_IDENTITY)),
            reranker: component(hub("cross-encoder/ms-marco-MiniLM-L-6-v2", RERANKER_IDENTITY)),
            generator: ComponentSpec {
                gpu: Some(GpuSpec { resource_name: "amd.com/gpu".into(), count: 1 }),
                engine: Engine::Vulkan,
                runtime_class_name: Some("kata-qemu-snp".into()),
                ..component(hub("HuggingFaceTB/SmolLM2-135M-Instruct", GENERATOR_IDENTITY))
            },
            gateway: GatewaySpec {
                model: ModelSource {
                    hub: None,
                    volume: Some(VolumeSource {
                        claim_name: "gelo-tokenizers".into(),
                        sub_path: Some("minilm".into()),
                    }),
                    model_identity: Some(GATEWAY_IDENTITY.into()),
                },
                replicas: 1,
                runtime_class_name: None,
                resources: None,
                service_type: ServiceType::NodePort,
            },
            attestation: AttestationSpec {
                allowed_measurements: vec![hex::encode([0xab; 48])],
                minimum_tcb: None,
                trusted_roots: vec![TrustedRootSpec {
                    amd: None,
                    mock_secret_ref: Some(SecretKeyRef { name: MOCK_SECRET.into(), key: "ark.pem".into() }),
                }],
                scheme_identities: vec![],
                release_log: None,
                period_seconds: 30,
            },
            storage: None,
        }
    }
}

impl PrivateRAGPipeline {
    /// A stored pipeline `demo` in namespace `rag`, generation 1, without our finalizer yet.
    pub fn test() -> Self {
        let mut p = PrivateRAGPipeline::new("demo", PrivateRAGPipelineSpec::test());
        p.metadata.namespace = Some("rag".into());
        p.metadata.uid = Some("6b1d0f2e-0000-4000-8000-000000000001".into());
        p.metadata.generation = Some(1);
        p.metadata.resource_version = Some("1".into());
        p
    }

    pub fn finalized(mut self) -> Self {
        self.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        self
    }

    pub fn deleting(mut self) -> Self {
        self.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        self
    }

    pub fn with_spec(mut self, f: impl FnOnce(&mut PrivateRAGPipelineSpec)) -> Self {
        f(&mut self.spec);
        self
    }
}
