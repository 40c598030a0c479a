//! One backend's verifier task: connect and verify, then keep verifying.
//!
//! A verification is, in order: the RA-TLS handshake (evidence in the certificate checked
//! against the role-restricted policy and the expected model identity, bound to the
//! certificate's key — `attest::ratls::connect`), the pinned TLS key if the routing table
//! names one (inside the handshake, for reconnects too), a fresh-nonce `GetEvidence` challenge over the same connection (evidence from
//! now, for the same key and identities), and a gRPC health check. Any failure moves the
//! backend out of rotation with the reason; the task then retries every `retry`.

use std::{sync::Arc, time::Instant};

use attest::{AttestError, ExpectedPeer, Verified, ratls::AttestedChannel};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

use super::{Backend, BackendRef, Facts, Failure, State};

pub(super) async fn run(backend: BackendRef) {
    loop {
        let Some(b) = backend.upgrade() else { return };
        let ok = verify_once(&b).await;
        let wait = if ok { b.timing.interval } else { b.timing.retry };
        // A request that finds the backend broken wakes us early (`Backend::fail`). Holding
        // `b` while waiting is fine: removing a backend aborts this task.
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = b.wake.notified() => {}
        }
    }
}

async fn verify_once(b: &Arc<Backend>) -> bool {
    let existing = match &*b.state.lock().expect("backend state") {
        State::Verified { channel, .. } => Some(AttestedChannel::clone(channel)),
        _ => None,
    };
    let was_verified = existing.is_some();
    let result = match existing {
        Some(channel) => recheck(b, &channel).await.map(|v| (channel, v)),
        None => connect(b).await,
    };
    let spec = &b.spec;
    let mut state = b.state.lock().expect("backend state");
    match result {
        Ok((channel, verified)) => {
            if !was_verified {
                tracing::info!(
                    role = %spec.role,
                    endpoint = %spec.endpoint,
                    measurement = %hex::encode(verified.measurement()),
                    model = %hex::encode(verified.model_identity()),
                    tls_key = %hex::encode(verified.tls_spki_sha256()),
                    "backend verified"
                );
            }
            *state = State::Verified {
                channel: Box::new(channel),
                facts: Box::new(Facts::of(&verified)),
                at: Instant::now(),
            };
            true
        }
        Err(failure) => {
            let changed = match &*state {
                State::Failed(old) => old.reason != failure.reason,
                _ => true,
            };
            if changed {
                tracing::warn!(role = %spec.role, endpoint = %spec.endpoint, reason = %failure.reason, "backend not verified");
            }
            *state = State::Failed(failure);
            false
        }
    }
}

async fn connect(b: &Backend) -> Result<(AttestedChannel, Verified), Failure> {
    let spec = &b.spec;
    let expected = ExpectedPeer {
        model_identity: spec.model_identity,
        scheme_identity: spec.scheme_identity,
        tls_spki_sha256: spec.tls_spki_sha256,
    };
    let connecting = attest::ratls::connect(&spec.endpoint, b.policy.clone(), expected, b.identity.clone());
    let channel = tokio::time::timeout(b.timing.timeout, connecting)
        .await
        .map_err(|_| {
            Failure::unavailable("timeout", format!("timeout: no RA-TLS handshake within {:?}", b.timing.timeout))
        })?
        .map_err(|e| describe("", &e))?;
    check(b, channel.peer())?;
    let verified = recheck(b, &channel).await?;
    Ok((channel, verified))
}

/// Freshness and health over an established connection.
async fn recheck(b: &Backend, channel: &AttestedChannel) -> Result<Verified, Failure> {
    let t = b.timing.timeout;
    let verified = tokio::time::timeout(t, channel.challenge())
        .await
        .map_err(|_| Failure::unavailable("timeout", format!("timeout: no fresh evidence within {t:?}")))?
        .map_err(|e| describe("fresh-nonce challenge failed: ", &e))?;
    check(b, &verified)?;
    let mut client = HealthClient::new(channel.channel());
    let health = client.check(HealthCheckRequest { service: String::new() });
    let reply = tokio::time::timeout(t, health)
        .await
        .map_err(|_| Failure::unavailable("timeout", format!("timeout: no health answer within {t:?}")))?
        .map_err(|s| Failure::unavailable("health_check_failed", format!("health check failed: {}", s.message())))?;
    if reply.get_ref().status != ServingStatus::Serving as i32 {
        return Err(Failure::unavailable("not_serving", "health check: not serving".into()));
    }
    Ok(verified)
}

/// What the policy cannot say: this backend's role, and the key the routing table pinned.
fn check(b: &Backend, v: &Verified) -> Result<(), Failure> {
    let spec = &b.spec;
    if v.role() != spec.role.as_str() {
        return Err(Failure::refused("role_mismatch", format!("role_mismatch: the peer proved role `{}`", v.role())));
    }
    if let Some(pin) = spec.tls_spki_sha256
        && *v.tls_spki_sha256() != pin
    {
        return Err(Failure::refused(
            "tls_key_not_pinned",
            format!(
                "tls_key_not_pinned: the peer's TLS key {} is not the one the routing table names ({})",
                hex::encode(v.tls_spki_sha256()),
                hex::encode(pin)
            ),
        ));
    }
    Ok(())
}

/// A rejection as refused, `<reason>: <detail>` (the verifier's stable reason first);
/// anything else as unavailable, `unreachable: ...`. `context` goes in front of either.
fn describe(context: &str, e: &AttestError) -> Failure {
    match e.rejection() {
        Some(r) => Failure::refused(r.reason(), format!("{context}{}: {r}", r.reason())),
        None => Failure::unavailable("unreachable", format!("{context}unreachable: {e}")),
    }
}
