//! The routing table: the verified endpoint set the operator writes to ConfigMap
//! `<pipeline>-routes` (key `routes.json`) and the gateway watches. Its format is a contract
//! with the gateway, documented in docs/KUBERNETES.md; change both together and bump
//! [`ROUTES_VERSION`].
//!
//! It is deterministic (sorted, no timestamps): an unchanged verified set writes identical
//! bytes, so the API server keeps the same resourceVersion and the gateway sees no event.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::attestor::VerifiedEndpoint;
use crate::crd::Component;

pub const ROUTES_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RoutingTable {
    pub version: u32,
    pub pipeline: String,
    pub namespace: String,
    /// `metadata.generation` of the pipeline these routes were verified against.
    pub generation: i64,
    /// Every component, always present (an empty list means: nothing to route to).
    pub components: BTreeMap<String, Vec<Route>>,
}

/// One verified pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub pod: String,
    pub ip: String,
    pub port: u16,
    /// SHA-256 (hex) of the DER SubjectPublicKeyInfo of the pod's TLS key. A client pins
    /// the connection to this key: the evidence was bound to it.
    pub tls_spki_sha256: String,
    pub model_identity: String,
    pub scheme_identity: String,
    /// SEV-SNP launch measurement (96 hex) the pod reported.
    pub measurement: String,
}

impl RoutingTable {
    /// An empty table: what a pipeline with an invalid spec or no trusted root routes to.
    pub fn empty(pipeline: &str, namespace: &str, generation: i64) -> Self {
        Self {
            version: ROUTES_VERSION,
            pipeline: pipeline.into(),
            namespace: namespace.into(),
            generation,
            components: Component::ALL.iter().map(|c| (c.as_str().to_string(), Vec::new())).collect(),
        }
    }

    pub fn from_verified(pipeline: &str, namespace: &str, generation: i64, verified: &[VerifiedEndpoint]) -> Self {
        let mut table = Self::empty(pipeline, namespace, generation);
        for v in verified {
            table.components.entry(v.component.as_str().to_string()).or_default().push(Route {
                pod: v.pod.clone(),
                ip: v.ip.to_string(),
                port: v.port,
                tls_spki_sha256: hex::encode(v.tls_spki_sha256),
                model_identity: hex::encode(v.model_identity),
                scheme_identity: hex::encode(v.scheme_identity),
                measurement: hex::encode(v.measurement),
            });
        }
        for routes in table.components.values_mut() {
            routes.sort();
        }
        table
    }

    /// Pretty JSON with sorted keys (BTreeMap and struct order are fixed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }

    pub fn pods(&self) -> impl Iterator<Item = &str> {
        self.components.values().flatten().map(|r| r.pod.as_str())
    }
}
