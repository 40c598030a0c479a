//! What a client checks before it sends a gateway anything, shared by `gelo proxy` and the
//! `gelo rag` commands: the RA-TLS handshake's evidence against the user's policy narrowed
//! to the role `gateway` (launch measurement, TCB, root, debug, VMPL, model identity, all
//! in [`attest::Verifier`]), the backend policy the gateway attests in its scheme, and
//! evidence for a fresh nonce from the same TLS key. Every refusal is a [`Refusal`] with a
//! stable reason.

use std::sync::Arc;

use attest::{
    AttestError, ExpectedPeer, Policy, Verified, VerifyError,
    ratls::{self, AttestedChannel},
};
use serde_json::{Value, json};

/// The role a gateway's evidence names (its scheme's `role`).
pub const GATEWAY_ROLE: &str = "gateway";

/// The gateway a client will talk to, and what it must prove.
#[derive(Clone, Debug)]
pub struct GatewayTarget {
    /// `host:port` of the gateway's RA-TLS (gRPC) port.
    pub address: String,
    /// The policy its evidence must satisfy.
    pub policy: Arc<Policy>,
    /// The model identity it must prove (its tokenizer's), if pinned.
    pub model_identity: Option<[u8; 32]>,
    /// SHA-256 ([`Policy::digest`]) of the policy the gateway must attest it verifies its
    /// backends with.
    pub backend_policy: [u8; 32],
    /// Where that policy came from, for messages.
    pub backend_policy_name: String,
}

/// Why a gateway was not used. Nothing but the handshake (and, for [`Refusal::Stale`], the
/// nonce challenge) was sent to it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Refusal {
    /// The evidence in its certificate failed the policy or the expected identities.
    #[error("{reason}: {0}", reason = .0.reason())]
    Evidence(VerifyError),
    /// The evidence it gave for a fresh nonce did not verify: stale or replayed evidence,
    /// or evidence for another key.
    #[error(
        "{reason}: the evidence it gave for a fresh nonce does not verify (stale or replayed evidence): {0}",
        reason = .0.reason()
    )]
    Stale(VerifyError),
    /// It attests another backend policy, or none.
    #[error(
        "gateway_policy_mismatch: it attests backend policy {got}, not {want} ({name}): it trusts other backends than this client expects"
    )]
    BackendPolicy { got: String, want: String, name: String },
    /// Not reached, or no verdict (a refused TCP connection, a timeout, a failed call).
    #[error("gateway_unreachable: {0}")]
    Unreachable(String),
}

impl Refusal {
    /// The stable machine name: the verifier's reason, `gateway_policy_mismatch` or
    /// `gateway_unreachable`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Evidence(e) | Refusal::Stale(e) => e.reason(),
            Refusal::BackendPolicy { .. } => "gateway_policy_mismatch",
            Refusal::Unreachable(_) => "gateway_unreachable",
        }
    }

    /// Whether the gateway itself was judged (rather than not reached).
    pub fn is_verdict(&self) -> bool {
        !matches!(self, Refusal::Unreachable(_))
    }

    fn from_attest(e: AttestError, stale: bool) -> Refusal {
        match e {
            AttestError::PeerRejected(v) if stale => Refusal::Stale(v),
            AttestError::PeerRejected(v) => Refusal::Evidence(v),
            other => Refusal::Unreachable(other.to_string()),
        }
    }
}

/// A gateway that passed every check, and what it proved.
#[derive(Clone)]
pub struct VerifiedGateway {
    /// The channel to it. Every later connection of this channel (tonic reconnects) must
    /// present the same TLS key and answer a fresh nonce before a request crosses it.
    pub channel: AttestedChannel,
    /// What its evidence for the fresh nonce proved.
    pub fresh: Verified,
    /// The backend policy digest it attests (equal to the target's).
    pub backend_policy: [u8; 32],
}

impl VerifiedGateway {
    /// What was verified, as `gelo proxy --check` and `gelo rag verify` print it.
    pub fn report(&self, target: &GatewayTarget) -> Value {
        let mut out = serde_json::to_value(self.fresh.summary()).unwrap_or_else(|_| json!({}));
        let scheme: Value = serde_json::from_str(self.fresh.scheme_json()).unwrap_or(Value::Null);
        out["gateway"] = json!(target.address);
        out["scheme"] = scheme;
        out["backend_policy_sha256"] = json!(hex::encode(self.backend_policy));
        out["policy_sha256"] = json!(target.policy.digest().ok().map(hex::encode));
        out["fresh_nonce"] = json!(hex::encode(self.fresh.nonce()));
        out
    }
}

/// The user's policy, accepting only evidence whose role is `gateway` (a model service
/// answering at the gateway's address is refused in the handshake, `role_not_allowed`).
pub fn gateway_policy(policy: &Policy) -> Policy {
    let mut narrowed = policy.clone();
    let gateway = GATEWAY_ROLE.to_string();
    narrowed.roles = Some(match &policy.roles {
        Some(roles) if !roles.contains(&gateway) => roles.clone(),
        _ => vec![gateway],
    });
    narrowed
}

/// Connects to the gateway over RA-TLS and runs every check, in this order: the evidence in
/// the handshake (policy narrowed to `gateway`, model identity, bound to the TLS key), the
/// attested backend policy, then evidence for a fresh nonce from the same key. The first
/// failure is the refusal; no request but the challenge is sent before all pass.
pub async fn verify_gateway(target: &GatewayTarget) -> Result<VerifiedGateway, Refusal> {
    let policy = Arc::new(gateway_policy(&target.policy));
    let expected = ExpectedPeer { model_identity: target.model_identity, ..Default::default() };
    let channel =
        ratls::connect(&target.address, policy, expected, None).await.map_err(|e| Refusal::from_attest(e, false))?;
    let backend_policy = check_backend_policy(channel.peer(), &target.backend_policy, &target.backend_policy_name)?;
    let fresh = channel.challenge().await.map_err(|e| Refusal::from_attest(e, true))?;
    Ok(VerifiedGateway { channel, fresh, backend_policy })
}

/// The gateway must attest that it verifies backends with `expected` (by digest): otherwise
/// it may route prompts to services this client never agreed to trust.
pub fn check_backend_policy(gateway: &Verified, expected: &[u8; 32], name: &str) -> Result<[u8; 32], Refusal> {
    match gateway::attested_backend_policy(gateway) {
        Some(got) if got == *expected => Ok(got),
        got => Err(Refusal::BackendPolicy {
            got: got.map_or_else(|| "none (its attested scheme names no backend policy)".into(), hex::encode),
            want: hex::encode(expected),
            name: name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_narrowed_to_the_gateway_role_and_never_widened() {
        let open = Policy::default();
        assert_eq!(gateway_policy(&open).roles, Some(vec!["gateway".to_string()]));
        let mut both = Policy::default();
        both.roles = Some(vec!["embedder".into(), "gateway".into()]);
        assert_eq!(gateway_policy(&both).roles, Some(vec!["gateway".to_string()]));
        // A policy that admits no gateway stays so: narrowing must not add a role.
        let mut embedders = Policy::default();
        embedders.roles = Some(vec!["embedder".into()]);
        assert_eq!(gateway_policy(&embedders).roles, Some(vec!["embedder".to_string()]));
    }

    #[test]
    fn refusals_name_stable_reasons() {
        let stale = Refusal::Stale(VerifyError::NonceMismatch);
        assert_eq!(stale.reason(), "nonce_mismatch");
        assert!(stale.to_string().starts_with("nonce_mismatch: ") && stale.to_string().contains("stale"), "{stale}");
        let policy = Refusal::BackendPolicy { got: "aa".into(), want: "bb".into(), name: "p.yaml".into() };
        assert_eq!(policy.reason(), "gateway_policy_mismatch");
        assert!(policy.to_string().contains("aa") && policy.to_string().contains("bb"));
        assert_eq!(Refusal::Unreachable("refused".into()).reason(), "gateway_unreachable");
        assert!(!Refusal::Unreachable("x".into()).is_verdict() && stale.is_verdict());
    }
}
