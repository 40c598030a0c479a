//! `gelo.v1.Attestation`: fresh evidence on demand. The server binds every answer to its
//! own TLS key, so a client ([`crate::challenge`]) checks freshness and the connection in
//! one step.

use std::sync::Arc;

use api::v1::attestation_server::{Attestation, AttestationServer};
use api::v1::{GetEvidenceRequest, GetEvidenceResponse};
use tonic::{Request, Response, Status};

use crate::challenge::NONCE_LEN;
use crate::ratls::ServerIdentity;

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
