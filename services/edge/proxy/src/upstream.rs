//! The proxy's one upstream: a gateway verified by [`verify_gateway`], made when first
//! needed and made again, with every check, after one of its connections was refused or
//! failed.
//!
//! Within a session tonic may reconnect by itself; the RA-TLS connector then requires the
//! same TLS key and evidence for a fresh nonce before it hands the connection over. A
//! gateway restarted with a new key is refused there (`tls_key_not_pinned`), the session is
//! dropped, and the request goes once more to the gateway verified from scratch: nothing
//! crossed the refused connection, so sending it again sends it once.

use std::sync::Arc;

use attest::{AttestError, ratls::error_chain};
use bytes::Bytes;
use http::request::Parts;

use crate::{
    forward,
    verify::{GatewayTarget, Refusal, VerifiedGateway, verify_gateway},
};

pub struct Upstream {
    target: GatewayTarget,
    current: tokio::sync::Mutex<Option<Arc<VerifiedGateway>>>,
}

/// Why a request got no answer from the gateway.
#[derive(Debug)]
pub enum Failure {
    /// The gateway was refused (or not reached) before the request was sent.
    Refused(Refusal),
    /// The request may have reached the gateway, but its answer did not come back.
    Broken(String),
}

impl Upstream {
    pub fn new(target: GatewayTarget) -> Self {
        Upstream { target, current: tokio::sync::Mutex::new(None) }
    }

    pub fn target(&self) -> &GatewayTarget {
        &self.target
    }

    /// The verified gateway, verifying it now when there is none. Concurrent callers wait
    /// for one verification.
    pub async fn session(&self) -> Result<Arc<VerifiedGateway>, Refusal> {
        let mut current = self.current.lock().await;
        if let Some(s) = current.as_ref() {
            return Ok(s.clone());
        }
        let verified = Arc::new(verify_gateway(&self.target).await.inspect_err(|r| {
            tracing::warn!(gateway = %self.target.address, reason = r.reason(), error = %r, "gateway refused");
        })?);
        tracing::info!(
            gateway = %self.target.address,
            measurement = %hex::encode(verified.fresh.measurement()),
            backend_policy = %hex::encode(verified.backend_policy),
            "gateway verified (evidence, backend policy, fresh nonce)"
        );
        *current = Some(verified.clone());
        Ok(verified)
    }

    /// Drops `session` if it is still the current one, so the next request verifies anew.
    async fn forget(&self, session: &Arc<VerifiedGateway>) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, session)) {
            *current = None;
        }
    }

    /// Sends one request (its head and whole body) to the verified gateway.
    pub async fn send(&self, head: &Parts, body: Bytes) -> Result<http::Response<tonic::body::Body>, Failure> {
        let mut retried = false;
        loop {
            let session = self.session().await.map_err(Failure::Refused)?;
            let sent = forward::send(session.channel.channel(), forward::request(head, body.clone())).await;
            let error = match sent {
                Ok(response) => return Ok(response),
                Err(e) => e,
            };
            self.forget(&session).await;
            match refused_connection(&error) {
                // Refused in the handshake or its challenge: the request never left.
                Some(rejection) if !retried => {
                    tracing::warn!(
                        gateway = %self.target.address, reason = rejection.reason(),
                        "a new connection to the gateway was refused; verifying it from scratch"
                    );
                    retried = true;
                }
                Some(rejection) => return Err(Failure::Refused(Refusal::Evidence(rejection))),
                None => return Err(Failure::Broken(error_chain(&error))),
            }
        }
    }
}

/// The verifier's rejection behind a failed call, when the call failed because the RA-TLS
/// connector refused the connection it was to use.
fn refused_connection(e: &(dyn std::error::Error + 'static)) -> Option<attest::VerifyError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(AttestError::PeerRejected(v)) = err.downcast_ref::<AttestError>() {
            return Some(v.clone());
        }
        cur = err.source();
    }
    None
}
