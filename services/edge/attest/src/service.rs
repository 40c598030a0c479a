//! `gelo.v1.Attestation`: fresh evidence on demand. The server binds every answer to its
//! own TLS key, so a client checks freshness and the connection in one step.

use std::sync::Arc;

use api::v1::attestation_client::AttestationClient;
use api::v1::attestation_server::{Attestation, AttestationServer};
use api::v1::{GetEvidenceRequest, GetEvidenceResponse};
use rsa::rand_core::{OsRng, RngCore};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::error::{AttestError, Result};
use crate::evidence::Evidence;
use crate::policy::Policy;
use crate::ratls::ServerIdentity;
use crate::verify::{ExpectedBinding, Verified, Verifier, VerifyError};

/// Accepted challenge nonce lengths (see `GetEvidenceRequest`).
pub const NONCE_LEN: std::ops::RangeInclusive<usize> = 32..=64;

/// A fresh 32-byte nonce from the OS.
pub fn random_nonce() -> [u8; 32] {
    let mut nonce = [0u8; 32];
    OsRng.fill_bytes(&mut nonce);
    nonce
}

/// Serves `Attestation.GetEvidence` for a [`ServerIdentity`].
#[derive(Clone, Debug)]
pub struct AttestationService {
    identity: Arc<ServerIdentity>,
}

impl AttestationService {
    pub fn new(identity: Arc<ServerIdentity>) -> Self {
        Self { identity }
    }

    /// The tonic service to add to a `Server`.
    pub fn into_server(self) -> AttestationServer<Self> {
        AttestationServer::new(self)
    }
}

#[tonic::async_trait]
impl Attestation for AttestationService {
    async fn get_evidence(
        &self,
        request: Request<GetEvidenceRequest>,
    ) -> Result<Response<GetEvidenceResponse>, Status> {
        let nonce = request.into_inner().nonce;
        if !NONCE_LEN.contains(&nonce.len()) {
            return Err(Status::invalid_argument(format!("nonce must be 32 to 64 bytes, got {}", nonce.len())));
        }
        let identity = self.identity.clone();
        // A hardware report is an ioctl that blocks for milliseconds.
        let evidence = tokio::task::spawn_blocking(move || identity.fresh_evidence(&nonce))
            .await
            .map_err(|e| Status::internal(format!("evidence task: {e}")))?
            .map_err(|e| {
                tracing::error!(error = %e, "issuing evidence failed");
                Status::unavailable(format!("cannot issue evidence: {e}"))
            })?;
        Ok(Response::new(GetEvidenceResponse { evidence: Some(evidence.into()) }))
    }
}

/// Asks the peer behind `channel` for evidence bound to `nonce` and verifies it against
/// `expected` (whose `nonce` field is replaced by `nonce`) and `policy`. Set
/// `expected.tls_spki_sha256` to the connection's peer key ([`Verified::tls_spki_sha256`]
/// of the handshake) so the answer must come from the same TLS endpoint.
pub async fn challenge(
    channel: Channel,
    nonce: &[u8],
    expected: &ExpectedBinding,
    policy: &Policy,
) -> Result<Verified> {
    if !NONCE_LEN.contains(&nonce.len()) {
        return Err(AttestError::Nonce(format!("32 to 64 bytes, got {}", nonce.len())));
    }
    let response = AttestationClient::new(channel)
        .get_evidence(GetEvidenceRequest { nonce: nonce.to_vec() })
        .await
        .map_err(|s| AttestError::Rpc(format!("{}: {}", s.code(), s.message())))?;
    let proto = response
        .into_inner()
        .evidence
        .ok_or_else(|| AttestError::PeerRejected(VerifyError::EvidenceMalformed("response without evidence".into())))?;
    let evidence = Evidence::try_from(proto)
        .map_err(|e| AttestError::PeerRejected(VerifyError::EvidenceMalformed(e.to_string())))?;
    let expected = ExpectedBinding { nonce: nonce.to_vec(), ..expected.clone() };
    Ok(Verifier::new().verify(&evidence, &expected, policy)?)
}
