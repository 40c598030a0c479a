//! Where records are sealed: AES-256-GCM with a random 96-bit nonce per record, and the record's
//! table key bound as associated data.
//!
//! Three keys are derived from the one sealing key with HMAC-SHA256 under fixed labels, so a
//! key used for one purpose is never used for another:
//! - the record encryption key (AES-256-GCM),
//! - the document-id key: table keys are HMAC(id), so ids never reach the file in plaintext
//!   while a lookup by id stays a point read,
//! - a key fingerprint, stored in plaintext, that tells "wrong key" from "corrupt config".
//!
//! What the associated data buys: a record moved under another table key, into another table,
//! or (for chunks) into another version of its document fails authentication instead of being
//! served as someone else's text. What it does not buy: rollback of the whole file to an older
//! copy, which needs a monotonic counter outside the host's reach (not available here).
//!
//! Nonces are random, not counters, because records are written by many transactions over the
//! store's life and a counter would itself need crash-safe state. At 2^32 records sealed under
//! one key the collision probability reaches NIST's 2^-32 bound; a store that large should be
//! re-keyed (or moved to an external database).

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce, Tag};
use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;
use zeroize::Zeroize;

use crate::error::{RecordKind, Result, StoreError};
use crate::key::SealingKey;

type HmacSha256 = Hmac<Sha256>;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Bytes a sealed record adds to its plaintext.
pub(crate) const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// The table key of a document: HMAC-SHA256 of its id.
pub(crate) type DocHash = [u8; 32];
/// A random value per stored version of a document, bound into its chunks' associated data so
/// that a chunk of an earlier version cannot be replayed into the current one.
pub(crate) type Generation = [u8; 16];

/// Where a chunk record belongs: its own table key (a sequence number), and the document,
/// position and version it is part of.
#[derive(Clone, Copy)]
pub(crate) struct ChunkBinding<'a> {
    pub(crate) seq: u64,
    pub(crate) doc: &'a DocHash,
    pub(crate) index: u32,
    pub(crate) generation: &'a Generation,
}

/// Associated data of each record kind. The leading label keeps kinds apart even where the
/// remaining bytes would coincide.
pub(crate) enum Aad<'a> {
    Config,
    Document(&'a DocHash),
    Vector(ChunkBinding<'a>),
    Text(ChunkBinding<'a>),
}

impl Aad<'_> {
    fn kind(&self) -> RecordKind {
        match self {
            Aad::Config => RecordKind::Config,
            Aad::Document(_) => RecordKind::Document,
            Aad::Vector(_) => RecordKind::ChunkVector,
            Aad::Text(_) => RecordKind::ChunkText,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        let chunk = |out: &mut Vec<u8>, label: &[u8], b: &ChunkBinding<'_>| {
            out.extend_from_slice(label);
            out.extend_from_slice(&b.seq.to_be_bytes());
            out.extend_from_slice(&b.doc[..]);
            out.extend_from_slice(&b.index.to_be_bytes());
            out.extend_from_slice(&b.generation[..]);
        };
        match self {
            Aad::Config => out.extend_from_slice(b"gelo-store/v1/config"),
            Aad::Document(doc) => {
                out.extend_from_slice(b"gelo-store/v1/document");
                out.extend_from_slice(&doc[..]);
            }
            Aad::Vector(b) => chunk(&mut out, b"gelo-store/v1/vector", b),
            Aad::Text(b) => chunk(&mut out, b"gelo-store/v1/text", b),
        }
        out
    }
}

/// The keys derived from a [`SealingKey`], ready to use.
pub(crate) struct Sealer {
    cipher: Aes256Gcm,
    id_mac: HmacSha256,
    key_id: [u8; 16],
}

impl Sealer {
    pub(crate) fn new(key: &SealingKey) -> Self {
        let mut enc = derive(key, b"gelo-store v1 record encryption");
        let mut ids = derive(key, b"gelo-store v1 document id");
        let fingerprint = derive(key, b"gelo-store v1 key fingerprint");
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&enc));
        let id_mac = <HmacSha256 as Mac>::new_from_slice(&ids).expect("HMAC accepts any key length");
        enc.zeroize();
        ids.zeroize();
        let mut key_id = [0u8; 16];
        key_id.copy_from_slice(&fingerprint[..16]);
        Sealer { cipher, id_mac, key_id }
    }

    /// A public fingerprint of the key (16 bytes of a PRF output: reveals nothing about it).
    pub(crate) fn key_id(&self) -> &[u8; 16] {
        &self.key_id
    }

    pub(crate) fn doc_hash(&self, id: &str) -> DocHash {
        let mut mac = self.id_mac.clone();
        mac.update(id.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// `nonce || ciphertext || tag`. Consumes the plaintext buffer and zeroes it.
    pub(crate) fn seal(&self, aad: Aad<'_>, mut plaintext: Vec<u8>) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let mut out = Vec::with_capacity(plaintext.len() + SEAL_OVERHEAD);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&plaintext);
        plaintext.zeroize();
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &aad.bytes(), &mut out[NONCE_LEN..])
            .map_err(|_| StoreError::invalid("record too large to seal"))?;
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Authenticates and decrypts a sealed record; any failure is `Corrupt` naming the kind.
    pub(crate) fn open(&self, aad: Aad<'_>, sealed: &[u8]) -> Result<Vec<u8>> {
        let kind = aad.kind();
        if sealed.len() < SEAL_OVERHEAD {
            return Err(StoreError::corrupt(kind, "sealed record shorter than nonce and tag"));
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let mut plaintext = ciphertext.to_vec();
        self.cipher
            .decrypt_in_place_detached(Nonce::from_slice(nonce), &aad.bytes(), &mut plaintext, Tag::from_slice(tag))
            .map_err(|_| StoreError::corrupt(kind, "authentication failed (tampered, moved or truncated)"))?;
        Ok(plaintext)
    }
}

fn derive(key: &SealingKey, label: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key.expose()).expect("HMAC accepts any key length");
    mac.update(label);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(byte: u8) -> Sealer {
        Sealer::new(&SealingKey::from_bytes([byte; 32]))
    }

    #[test]
    fn roundtrip_and_binding() {
        let s = sealer(1);
        let doc = s.doc_hash("a");
        let other = s.doc_hash("b");
        let generation = [9u8; 16];
        let at = ChunkBinding { seq: 40, doc: &doc, index: 3, generation: &generation };
        let sealed = s.seal(Aad::Text(at), b"secret text".to_vec()).unwrap();
        assert_eq!(sealed.len(), 11 + SEAL_OVERHEAD);
        assert_eq!(s.open(Aad::Text(at), &sealed).unwrap(), b"secret text");

        // Any change of the binding fails, naming the record kind.
        let older = [8u8; 16];
        for moved in [
            ChunkBinding { seq: 41, ..at },
            ChunkBinding { doc: &other, ..at },
            ChunkBinding { index: 4, ..at },
            ChunkBinding { generation: &older, ..at },
        ] {
            match s.open(Aad::Text(moved), &sealed) {
                Err(StoreError::Corrupt { kind: RecordKind::ChunkText, .. }) => {}
                other => panic!("expected a corrupt chunk text, got {other:?}"),
            }
        }
        // A text record is not a vector record, nor a document.
        assert!(matches!(
            s.open(Aad::Vector(at), &sealed),
            Err(StoreError::Corrupt { kind: RecordKind::ChunkVector, .. })
        ));
        assert!(matches!(
            s.open(Aad::Document(&doc), &sealed),
            Err(StoreError::Corrupt { kind: RecordKind::Document, .. })
        ));
        // Another key fails too.
        assert!(sealer(2).open(Aad::Text(at), &sealed).is_err());
        // Truncated records fail cleanly.
        for len in 0..sealed.len() {
            assert!(s.open(Aad::Text(at), &sealed[..len]).is_err());
        }
    }

    #[test]
    fn nonces_differ_and_ids_are_keyed() {
        let s = sealer(1);
        let a = s.seal(Aad::Config, b"same".to_vec()).unwrap();
        let b = s.seal(Aad::Config, b"same".to_vec()).unwrap();
        assert_ne!(a[..NONCE_LEN], b[..NONCE_LEN]);
        assert_ne!(a, b);
        assert_ne!(s.doc_hash("x"), sealer(2).doc_hash("x"));
        assert_eq!(s.doc_hash("x"), sealer(1).doc_hash("x"));
        assert_ne!(s.key_id(), sealer(2).key_id());
    }
}
