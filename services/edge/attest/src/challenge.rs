//! The client side of `Attestation.GetEvidence`: a fresh nonce, the call, and the
//! verification of the evidence that comes back. The server side is [`crate::service`].

use api::v1::GetEvidenceRequest;
use api::v1::attestation_client::AttestationClient;
use rsa::rand_core::{OsRng, RngCore};
use tonic::transport::Channel;

use crate::error::{AttestError, Result};
use crate::evidence::Evidence;
use crate::policy::Policy;
use crate::verify::{ExpectedBinding, Verified, Verifier, VerifyError};

/// Accepted challenge nonce lengths (see `GetEvidenceRequest`).
pub const NONCE_LEN: std::ops::RangeInclusive<usize> = 32..=64;

/// A fresh 32-byte nonce from the OS.
pub fn random_nonce() -> [u8; 32] {
    let mut nonce = [0u8; 32];
    OsRng.fill_bytes(&mut nonce);
    nonce
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
