//! Where the operator decides whether a pod may be routed to.
//!
//! [`PodAttestor`] is the seam: the reconciler hands it a ready pod's endpoint, the identity
//! the pod must attest to and the pipeline's policy, and gets back either a
//! [`VerifiedEndpoint`] or a [`Rejection`] with a stable reason. [`RaTlsAttestor`] is the
//! real one (RA-TLS handshake + fresh-nonce challenge, gelo-attest's verifier); tests
//! script results with [`ScriptedAttestor`].
//!
//! Outside this module a `VerifiedEndpoint` can only be made from gelo-attest's `Verified`
//! (which only its verifier makes) or through [`danger::assume_verified`], named so that a
//! reviewer sees every place that skips the check.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attest::{AttestError, ExpectedPeer, Policy, Verified};
use futures::future::BoxFuture;

use crate::crd::Component;

/// A ready pod, as the attestation loop found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEndpoint {
    pub component: Component,
    pub pod: String,
    pub ip: IpAddr,
    pub port: u16,
}

impl PodEndpoint {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// What this pod must prove beyond the pipeline-wide policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub component: Component,
    pub model_identity: [u8; 32],
}

/// A pod whose fresh evidence was verified: what goes into the routing table.
/// `non_exhaustive` keeps other crates from building one with a struct literal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedEndpoint {
    pub component: Component,
    pub pod: String,
    pub ip: IpAddr,
    pub port: u16,
    pub tls_spki_sha256: [u8; 32],
    pub model_identity: [u8; 32],
    pub scheme_identity: [u8; 32],
    pub measurement: [u8; 48],
}

impl VerifiedEndpoint {
    pub fn from_verified(endpoint: &PodEndpoint, v: &Verified) -> Self {
        Self {
            component: endpoint.component,
            pod: endpoint.pod.clone(),
            ip: endpoint.ip,
            port: endpoint.port,
            tls_spki_sha256: *v.tls_spki_sha256(),
            model_identity: *v.model_identity(),
            scheme_identity: *v.scheme_identity(),
            measurement: *v.measurement(),
        }
    }
}

/// Why a pod is not routed to. `reason` is a stable snake_case name (gelo-attest's
/// `VerifyError::reason()` for rejected evidence; `unreachable`, `tls_failed`, `rpc_failed`,
/// `timeout` or `trusted_root_unavailable` otherwise): it labels metrics and Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub detail: String,
}

impl Rejection {
    pub fn new(reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { reason: reason.into(), detail: detail.into() }
    }

    pub fn from_attest(e: &AttestError) -> Self {
        let reason = match e {
            AttestError::PeerRejected(v) => v.reason(),
            AttestError::Transport(_) | AttestError::Io { .. } => "unreachable",
            AttestError::Tls(_) => "tls_failed",
            AttestError::Rpc(_) => "rpc_failed",
            _ => "attestation_error",
        };
        Self::new(reason, e.to_string())
    }

    /// The reason in PascalCase, as Kubernetes Events spell reasons.
    pub fn event_reason(&self) -> String {
        self.reason
            .split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
            })
            .collect()
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

/// Challenges one pod. Implementations must use a fresh nonce on every call: a verdict is
/// about the pod now, not about a past answer.
pub trait PodAttestor: Send + Sync {
    fn attest<'a>(
        &'a self,
        endpoint: &'a PodEndpoint,
        expected: &'a Expected,
        policy: &'a Arc<Policy>,
    ) -> BoxFuture<'a, Result<VerifiedEndpoint, Rejection>>;
}

/// The real attestor: RA-TLS to the pod (its certificate's evidence is verified during the
/// handshake against the policy and the expected model identity), then
/// `Attestation.GetEvidence` with a fresh random nonce, which must be bound to the same TLS
/// key and identities.
#[derive(Clone, Debug)]
pub struct RaTlsAttestor {
    timeout: Duration,
}

impl RaTlsAttestor {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl PodAttestor for RaTlsAttestor {
    fn attest<'a>(
        &'a self,
        endpoint: &'a PodEndpoint,
        expected: &'a Expected,
        policy: &'a Arc<Policy>,
    ) -> BoxFuture<'a, Result<VerifiedEndpoint, Rejection>> {
        Box::pin(async move {
            let peer = ExpectedPeer { model_identity: Some(expected.model_identity), ..Default::default() };
            let target = endpoint.addr().to_string();
            let round = async {
                let channel = attest::ratls::connect(&target, policy.clone(), peer, None).await?;
                channel.challenge().await
            };
            let verified = match tokio::time::timeout(self.timeout, round).await {
                Err(_) => {
                    return Err(Rejection::new(
                        "timeout",
                        format!("no verdict from {target} within {:?}", self.timeout),
                    ));
                }
                Ok(Err(e)) => return Err(Rejection::from_attest(&e)),
                Ok(Ok(v)) => v,
            };
            // The policy's role allowlist already holds only this component; checked again
            // here because routing a generator's evidence as an embedder would be silent.
            if verified.role() != expected.component.as_str() {
                return Err(Rejection::new(
                    "role_mismatch",
                    format!("pod claims role {:?}, expected {}", verified.role(), expected.component),
                ));
            }
            if verified.model_identity() != &expected.model_identity {
                return Err(Rejection::new("model_identity_mismatch", "verified identity differs from the pinned one"));
            }
            Ok(VerifiedEndpoint::from_verified(endpoint, &verified))
        })
    }
}

/// Constructors that skip verification. For tests and for nothing else.
pub mod danger {
    use super::*;

    /// A `VerifiedEndpoint` for `endpoint` with the given claims, without any evidence.
    pub fn assume_verified(
        endpoint: &PodEndpoint,
        tls_spki_sha256: [u8; 32],
        model_identity: [u8; 32],
        scheme_identity: [u8; 32],
        measurement: [u8; 48],
    ) -> VerifiedEndpoint {
        VerifiedEndpoint {
            component: endpoint.component,
            pod: endpoint.pod.clone(),
            ip: endpoint.ip,
            port: endpoint.port,
            tls_spki_sha256,
            model_identity,
            scheme_identity,
            measurement,
        }
    }
}

/// What a scripted pod presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Script {
    /// Evidence for this model identity (verified only if it equals the expected one).
    Presents { model_identity: [u8; 32] },
    /// Evidence rejected for this reason.
    Rejected(Rejection),
}

/// A test attestor: each pod (by name) presents what the test scripted; an unscripted pod is
/// unreachable. Records every call so tests can check what was expected of whom.
#[derive(Default)]
pub struct ScriptedAttestor {
    scripts: Mutex<HashMap<String, Script>>,
    calls: Mutex<Vec<(String, Expected)>>,
}

impl ScriptedAttestor {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, pod: &str, script: Script) {
        if let Ok(mut s) = self.scripts.lock() {
            s.insert(pod.to_string(), script);
        }
    }

    pub fn calls(&self) -> Vec<(String, Expected)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl PodAttestor for ScriptedAttestor {
    fn attest<'a>(
        &'a self,
        endpoint: &'a PodEndpoint,
        expected: &'a Expected,
        _policy: &'a Arc<Policy>,
    ) -> BoxFuture<'a, Result<VerifiedEndpoint, Rejection>> {
        Box::pin(async move {
            if let Ok(mut c) = self.calls.lock() {
                c.push((endpoint.pod.clone(), expected.clone()));
            }
            let script = self.scripts.lock().ok().and_then(|s| s.get(&endpoint.pod).cloned());
            match script {
                None => Err(Rejection::new("unreachable", format!("{} is not scripted", endpoint.pod))),
                Some(Script::Rejected(r)) => Err(r),
                Some(Script::Presents { model_identity }) if model_identity != expected.model_identity => {
                    Err(Rejection::new("model_identity_mismatch", "model identity differs from the expected one"))
                }
                Some(Script::Presents { model_identity }) => {
                    let key: [u8; 32] = sha2::Digest::finalize(sha2::Digest::chain_update(
                        <sha2::Sha256 as sha2::Digest>::new(),
                        endpoint.pod.as_bytes(),
                    ))
                    .into();
                    Ok(danger::assume_verified(endpoint, key, model_identity, [7; 32], [9; 48]))
                }
            }
        })
    }
}
