//! GELO's document store: the gateway's passages and their embeddings, persisted so that
//! nothing a user ingested leaves the confidential VM in plaintext.
//!
//! Where things are:
//! - [`VectorStore`]: what the gateway needs from a store (upsert, delete, exact top-k search,
//!   stats), so that a shared external vector database can stand in for the embedded one.
//! - [`EncryptedRedbStore`] (`redb_store`): the embedded default, one redb file whose records
//!   are sealed with AES-256-GCM; the trust boundary is `seal`, where every record is
//!   encrypted and authenticated, and the table keys are keyed hashes of the document ids.
//! - [`SealingKey`] (`key`): the 32-byte key (AMD-SP derived on hardware, a key file in mock mode).
//! - `index`, `matrix`, `search`: the decrypted vectors in memory and the exact scan over them;
//!   `ivf`: the approximate index searches use above [`StoreOptions::ann_threshold`] chunks.
//! - [`chunk_text`] (`chunk`): splitting a document into overlapping token windows.
//!
//! The trait is synchronous on purpose: every call does disk I/O or a scan that takes
//! milliseconds, so the async gateway runs it on `tokio::task::spawn_blocking` with an
//! `Arc<dyn VectorStore>`.

mod chunk;
mod codec;
mod error;
mod index;
mod ivf;
mod key;
mod matrix;
mod redb_store;
mod seal;
mod search;

use std::collections::BTreeMap;

pub use chunk::{TextChunk, chunk_by_offsets, chunk_text};
pub use error::{RecordKind, Result, StoreError};
pub use key::SealingKey;
pub use redb_store::{EncryptedRedbStore, StoreOptions};

/// A document to store, or one read back: its chunks in order, each with its embedding.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub metadata: BTreeMap<String, String>,
    pub chunks: Vec<Chunk>,
}

/// One passage of a document and its embedding (any norm on the way in, non-zero; stored and
/// returned unit-normalized).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk {
    pub text: String,
    pub embedding: Vec<f32>,
}

/// A search hit, shaped like `gelo.v1.Passage`.
#[derive(Debug, Clone, PartialEq)]
pub struct Passage {
    /// `"<document id>#<chunk index>"`: the id answers cite.
    pub passage_id: String,
    pub document_id: String,
    pub chunk_index: u32,
    pub title: String,
    pub text: String,
    /// Cosine similarity of the query and the chunk embedding.
    pub score: f32,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub documents: u64,
    pub chunks: u64,
    /// Disk space the store's file takes (allocated blocks on Unix, where the file's length
    /// can be larger: redb extends it ahead of the data).
    pub bytes_on_disk: u64,
}

/// What the gateway needs from a document store. Object-safe; use as `Arc<dyn VectorStore>`.
pub trait VectorStore: Send + Sync {
    /// The embedding dimension, fixed when the store was created.
    fn dimension(&self) -> usize;

    /// Stores `documents`, each replacing any stored document with the same id (its old
    /// chunks are gone in the same transaction). All of them become visible together, durably,
    /// before this returns `Ok`; on `Err` none of them is stored. If an id repeats in the slice,
    /// the last one wins.
    fn upsert(&self, documents: &[Document]) -> Result<()>;

    /// Deletes the documents with these ids, atomically and durably. Returns how many existed.
    fn delete(&self, ids: &[String]) -> Result<u64>;

    /// The stored document with this id, chunks in order.
    fn get(&self, id: &str) -> Result<Option<Document>>;

    /// The `top_k` chunks most similar to `query` by cosine similarity, best first. Exact, or
    /// approximate (with exact scores) where the store is configured for an ANN index above a
    /// size, as [`EncryptedRedbStore`] is beyond [`StoreOptions::ann_threshold`] chunks.
    fn search(&self, query: &[f32], top_k: usize) -> Result<Vec<Passage>>;

    fn stats(&self) -> Result<Stats>;
}

/// Scales `v` to unit length in place; `None` if it has a non-finite value or is zero.
pub(crate) fn normalize(v: &mut [f32]) -> Option<()> {
    if v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return None;
    }
    for x in v.iter_mut() {
        *x = (*x as f64 / norm) as f32;
    }
    Some(())
}

/// A random unit vector, for the crate's unit tests.
#[cfg(test)]
pub(crate) fn random_unit(rng: &mut rand_chacha::ChaCha8Rng, dim: usize) -> Vec<f32> {
    use rand::RngExt;
    let mut v: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
    normalize(&mut v).unwrap();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trait_is_object_safe_and_shareable() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn VectorStore>();
        assert_send_sync::<EncryptedRedbStore>();
        let _: Option<std::sync::Arc<dyn VectorStore>> = None;
    }

    #[test]
    fn normalize_rejects_zero_and_non_finite() {
        let mut v = [3.0f32, 4.0];
        normalize(&mut v).unwrap();
        assert_eq!(v, [0.6, 0.8]);
        assert!(normalize(&mut [0.0f32, 0.0]).is_none());
        assert!(normalize(&mut [f32::NAN, 1.0]).is_none());
        assert!(normalize(&mut [f32::INFINITY, 1.0]).is_none());
        // Large values whose squares overflow f32 still normalize (sums are in f64).
        let mut big = [3.0e30f32, 4.0e30];
        normalize(&mut big).unwrap();
        assert!((big[0] - 0.6).abs() < 1e-6);
    }
}
