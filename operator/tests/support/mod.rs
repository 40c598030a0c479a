//! Shared test fixtures: the fake API server and builders of the objects other controllers
//! (kubelet, Job controller) would create.

#![allow(dead_code)]

pub mod apiserver;

use gelo_operator::crd::{Component, PrivateRAGPipeline};
use gelo_operator::resources;
use serde_json::{Value, json};

pub use apiserver::FakeApiServer;

pub const PIPELINES: &str = "gelo.dev/v1alpha1/privateragpipelines";
pub const PODS: &str = "core/v1/pods";
pub const JOBS: &str = "batch/v1/jobs";
pub const DEPLOYMENTS: &str = "apps/v1/deployments";
pub const SERVICES: &str = "core/v1/services";
pub const CONFIGMAPS: &str = "core/v1/configmaps";
pub const PVCS: &str = "core/v1/persistentvolumeclaims";
pub const EVENTS: &str = "events.k8s.io/v1/events";
pub const SECRETS: &str = "core/v1/secrets";
pub const LEASES: &str = "coordination.k8s.io/v1/leases";

/// A running pod of `c`, ready, serving gRPC on `ip:port`, labelled as its ReplicaSet
/// would label it.
pub fn ready_pod(ns: &str, pipeline: &str, c: Component, name: &str, ip: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": resources::labels(pipeline, Some(c)),
        },
        "spec": { "containers": [{
            "name": "gelo",
            "image": "gelo:test",
            "ports": [{ "name": "grpc", "containerPort": port }],
        }]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{ "type": "Ready", "status": "True" }],
        },
    })
}

/// Marks a Job succeeded, as the Job controller would once its pod exited 0.
pub fn complete_job(api: &FakeApiServer, ns: &str, name: &str) {
    api.update(JOBS, ns, name, |j| {
        j["status"] = json!({ "succeeded": 1, "conditions": [{ "type": "Complete", "status": "True" }] });
    });
}

/// Completes every fetch Job of the pipeline.
pub fn complete_all_jobs(api: &FakeApiServer, ns: &str) {
    for name in api.names(JOBS) {
        complete_job(api, ns, &name);
    }
}

pub fn mock_root_secret(ns: &str, name: &str, ark_pem: &str) -> Value {
    use base64_free::encode;
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": ns },
        "data": { "ark.pem": encode(ark_pem.as_bytes()) },
    })
}

/// The pipeline as the API server stores it now.
pub fn stored_pipeline(api: &FakeApiServer, ns: &str, name: &str) -> PrivateRAGPipeline {
    serde_json::from_value(api.get(PIPELINES, ns, name).expect("pipeline stored")).expect("pipeline decodes")
}

pub fn condition<'a>(p: &'a PrivateRAGPipeline, type_: &str) -> Option<&'a gelo_operator::crd::Condition> {
    p.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// A self-signed certificate in PEM: parses as a root, signs nothing we check. For tests
/// whose attestor is scripted.
pub fn throwaway_root_pem() -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["mock-ark".to_string()]).expect("params");
    params.self_signed(&key).expect("self-signed").pem()
}

/// Standard base64 without a dependency: Secrets carry `data` base64-encoded.
mod base64_free {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}
