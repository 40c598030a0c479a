//! The release log's three checks, over C2SP formats: a signed checkpoint
//! (c2sp.org/signed-note, c2sp.org/tlog-checkpoint), an inclusion proof of one entry under
//! it, and a consistency proof between two checkpoints (RFC 9162 section 2.1.3 and 2.1.4).
//! Parsing and proof arithmetic are `signed_note` and `tlog_tiles` (a Rust port of Go's
//! sumdb tlog, the same arithmetic the log's Tessera uses); this module only maps their
//! outcomes to typed reasons.

use signed_note::{Note, StandardVerifier, Verifier as _, VerifierList};
use tlog_tiles::{Checkpoint, Hash, check_record, check_tree, record_hash};

use super::ReleaseLogError;

/// Longest proof accepted: a tree of 2^64 leaves needs 64 hashes at most.
const MAX_PROOF_HASHES: usize = 64;

/// The log's public key, a signed-note verifier key (`name+keyid+base64`); its name is the
/// log's origin, the first line of each checkpoint.
#[derive(Clone)]
pub struct LogKey {
    vkey: String,
    verifier: StandardVerifier,
}

impl std::fmt::Debug for LogKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.vkey)
    }
}

impl LogKey {
    pub fn new(vkey: &str) -> Result<Self, ReleaseLogError> {
        let vkey = vkey.trim();
        let verifier = StandardVerifier::new(vkey).map_err(|e| ReleaseLogError::KeyInvalid(e.to_string()))?;
        Ok(Self { vkey: vkey.to_owned(), verifier })
    }

    /// The log's origin (the key's name).
    pub fn origin(&self) -> &str {
        self.verifier.name()
    }

    /// Opens a signed checkpoint: the note must carry a valid signature by this key, and
    /// its text must be a checkpoint of this log's origin.
    pub fn open(&self, note: &str) -> Result<SignedCheckpoint, ReleaseLogError> {
        let parsed =
            Note::from_bytes(note.as_bytes()).map_err(|e| ReleaseLogError::CheckpointMalformed(e.to_string()))?;
        let known = VerifierList::new(vec![Box::new(self.verifier.clone())]);
        parsed.verify(&known).map_err(|e| ReleaseLogError::CheckpointSignatureInvalid(e.to_string()))?;
        let checkpoint =
            Checkpoint::from_bytes(parsed.text()).map_err(|e| ReleaseLogError::CheckpointMalformed(e.to_string()))?;
        if checkpoint.origin() != self.origin() {
            return Err(ReleaseLogError::CheckpointOriginMismatch {
                expected: self.origin().to_owned(),
                got: checkpoint.origin().to_owned(),
            });
        }
        Ok(SignedCheckpoint { note: note.to_owned(), size: checkpoint.size(), root: checkpoint.hash().0 })
    }
}

/// A checkpoint whose signature was verified by [`LogKey::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedCheckpoint {
    note: String,
    size: u64,
    root: [u8; 32],
}

impl SignedCheckpoint {
    /// The signed note, as received: what a verifier stores to remember this state.
    pub fn note(&self) -> &str {
        &self.note
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn root(&self) -> &[u8; 32] {
        &self.root
    }

    /// Checks that `entry` (its bytes, as appended) is leaf `index` of this checkpoint's tree.
    pub fn verify_inclusion(&self, entry: &[u8], index: u64, proof: &[[u8; 32]]) -> Result<(), ReleaseLogError> {
        if index >= self.size {
            return Err(ReleaseLogError::InclusionProofInvalid(format!(
                "index {index} is outside a tree of size {}",
                self.size
            )));
        }
        let proof = hashes(proof)?;
        check_record(&proof, self.size, Hash(self.root), index, record_hash(entry))
            .map_err(|e| ReleaseLogError::InclusionProofInvalid(e.to_string()))
    }

    /// Checks that `earlier`'s tree is a prefix of this one's. A smaller checkpoint than the
    /// remembered one is a rollback; the same size with another root, or a proof that does
    /// not join the two roots, is a fork (two histories signed by one key).
    pub fn verify_consistent_with(
        &self,
        earlier: &SignedCheckpoint,
        proof: &[[u8; 32]],
    ) -> Result<(), ReleaseLogError> {
        if self.size < earlier.size {
            return Err(ReleaseLogError::CheckpointRolledBack { remembered: earlier.size, presented: self.size });
        }
        if self.size == earlier.size {
            return if self.root == earlier.root && proof.is_empty() {
                Ok(())
            } else {
                Err(ReleaseLogError::LogForked { remembered: earlier.size, presented: self.size })
            };
        }
        if earlier.size == 0 {
            // Every tree extends the empty one.
            return Ok(());
        }
        let proof = hashes(proof)?;
        check_tree(&proof, self.size, Hash(self.root), earlier.size, Hash(earlier.root))
            .map_err(|_| ReleaseLogError::LogForked { remembered: earlier.size, presented: self.size })
    }
}

fn hashes(proof: &[[u8; 32]]) -> Result<Vec<Hash>, ReleaseLogError> {
    if proof.len() > MAX_PROOF_HASHES {
        return Err(ReleaseLogError::ProofMalformed(format!("{} hashes, at most {MAX_PROOF_HASHES}", proof.len())));
    }
    Ok(proof.iter().map(|h| Hash(*h)).collect())
}
