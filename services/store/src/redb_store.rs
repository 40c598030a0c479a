//! The embedded store: one redb file, every record sealed (see `seal`), the vectors decrypted
//! once at open into the in-memory index.
//!
//! Tables:
//! - `meta`: `format` (plaintext u32), `key_id` (plaintext key fingerprint), `config` (sealed
//!   dimension, the key check);
//! - `documents`: HMAC(id) → sealed {id, title, metadata, generation, chunk count};
//! - `chunks`: HMAC(id) ‖ index (big-endian) → sealed {text, embedding}.
//!
//! What the file still reveals: how many documents and chunks there are and their sizes,
//! and when they were written; not which ids, nor any text, title, metadata or vector.
//!
//! Crash safety is redb's: each upsert or delete is one write transaction, committed with
//! `Durability::Immediate` (fsync) before the call returns. Two-phase commit is on, so that
//! after any crash the file's root is either the last acknowledged commit or, on a torn write,
//! a clean "corrupt" error: redb then refuses to silently fall back to the previous commit,
//! which would drop an acknowledged document.
//!
//! Opening a store runs redb's full integrity check (every page checksum) before anything is
//! read: a plain open trusts the file and may panic on one altered by the host, which is
//! untrusted here. The check costs one read of the file, which the index load does anyway.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use rayon::prelude::*;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::codec::{self, DocRecord};
use crate::error::{RecordKind, Result, StoreError};
use crate::index::{DocEntry, Index};
use crate::key::SealingKey;
use crate::seal::{Aad, ChunkKey, DocHash, Generation, Sealer, chunk_key, split_chunk_key};
use crate::{Chunk, Document, Passage, Stats, VectorStore, normalize};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const DOCUMENTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("documents");
const CHUNKS: TableDefinition<&[u8; 36], &[u8]> = TableDefinition::new("chunks");

const FORMAT_VERSION: u32 = 1;
/// Large enough for any embedding model in use (the largest common ones are 4096).
const MAX_DIMENSION: usize = 65_536;
/// redb's page cache. The vectors live in the index, so the cache only serves tree pages and
/// the text of top-k hits; redb's 1 GiB default would double the memory of a large store.
const CACHE_BYTES: usize = 128 << 20;
/// Chunk records decrypted per parallel batch while loading.
const LOAD_BATCH: usize = 4096;

/// The embedded [`VectorStore`]: persistent, crash-safe, sealed at rest.
pub struct EncryptedRedbStore {
    db: Database,
    path: PathBuf,
    sealer: Sealer,
    dim: usize,
    index: RwLock<Index>,
}

impl EncryptedRedbStore {
    /// Opens the store at `path`, creating it (with this dimension) if the file does not exist.
    ///
    /// Fails with [`StoreError::WrongKey`] if the store was created under another key, with
    /// [`StoreError::DimensionMismatch`] if it was created with another dimension, and with
    /// [`StoreError::Corrupt`] if the file or any record fails its checks.
    pub fn open(path: impl AsRef<Path>, key: &SealingKey, dimension: usize) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if dimension == 0 || dimension > MAX_DIMENSION {
            return Err(StoreError::invalid(format!("dimension must be between 1 and {MAX_DIMENSION}")));
        }
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .set_cache_size(CACHE_BYTES)
            .create(&path)?;
        let sealer = Sealer::new(key);
        check_or_init_meta(&db, &sealer, dimension)?;
        let index = load_index(&db, &sealer, dimension)?;
        tracing::debug!(documents = index.documents(), chunks = index.chunks(), "document store opened");
        Ok(EncryptedRedbStore { db, path, sealer, dim: dimension, index: RwLock::new(index) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read_index(&self) -> Result<RwLockReadGuard<'_, Index>> {
        self.index.read().map_err(|_| StoreError::Poisoned)
    }

    fn write_index(&self) -> Result<RwLockWriteGuard<'_, Index>> {
        self.index.write().map_err(|_| StoreError::Poisoned)
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write()?;
        txn.set_two_phase_commit(true);
        Ok(txn)
    }
}

/// A document validated, normalized and sealed, ready to be written in a transaction.
struct Prepared {
    hash: DocHash,
    generation: Generation,
    doc: Document,
    sealed_doc: Vec<u8>,
    sealed_chunks: Vec<Vec<u8>>,
}

impl EncryptedRedbStore {
    fn prepare(&self, position: usize, mut doc: Document) -> Result<Prepared> {
        if doc.id.is_empty() {
            return Err(StoreError::invalid(format!("document {position}: empty id")));
        }
        let chunks = u32::try_from(doc.chunks.len())
            .map_err(|_| StoreError::invalid(format!("document {position}: too many chunks")))?;
        for (c, chunk) in doc.chunks.iter_mut().enumerate() {
            if chunk.embedding.len() != self.dim {
                return Err(StoreError::DimensionMismatch { expected: self.dim, got: chunk.embedding.len() });
            }
            normalize(&mut chunk.embedding).ok_or_else(|| {
                StoreError::invalid(format!("document {position}, chunk {c}: embedding is zero or not finite"))
            })?;
        }
        let hash = self.sealer.doc_hash(&doc.id);
        let mut generation = [0u8; 16];
        rand::Rng::fill_bytes(&mut rand::rng(), &mut generation);
        let record = DocRecord {
            generation,
            chunks,
            id: std::mem::take(&mut doc.id),
            title: std::mem::take(&mut doc.title),
            metadata: std::mem::take(&mut doc.metadata),
        };
        let sealed_doc = self.sealer.seal(Aad::Document(&hash), codec::encode_doc(&record))?;
        (doc.id, doc.title, doc.metadata) = (record.id, record.title, record.metadata);
        let sealed_chunks = doc
            .chunks
            .par_iter()
            .enumerate()
            .map(|(i, c)| {
                let aad = Aad::Chunk { doc: &hash, index: i as u32, generation: &generation };
                self.sealer.seal(aad, codec::encode_chunk(&c.text, &c.embedding))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Prepared { hash, generation, doc, sealed_doc, sealed_chunks })
    }
}

impl VectorStore for EncryptedRedbStore {
    fn dimension(&self) -> usize {
        self.dim
    }

    fn upsert(&self, documents: &[Document]) -> Result<()> {
        // The last occurrence of an id wins; earlier ones would be replaced in the same
        // transaction anyway, so they are not written at all.
        let mut last: HashMap<&str, usize> = HashMap::with_capacity(documents.len());
        for (i, d) in documents.iter().enumerate() {
            last.insert(d.id.as_str(), i);
        }
        let prepared = documents
            .iter()
            .enumerate()
            .filter(|(i, d)| last.get(d.id.as_str()) == Some(i))
            .map(|(i, d)| self.prepare(i, d.clone()))
            .collect::<Result<Vec<_>>>()?;
        if prepared.is_empty() {
            return Ok(());
        }

        let txn = self.begin_write()?;
        {
            let mut docs = txn.open_table(DOCUMENTS)?;
            let mut chunks = txn.open_table(CHUNKS)?;
            for p in &prepared {
                // Old chunks go in the same transaction as the new ones arrive.
                remove_chunks(&mut chunks, &p.hash)?;
                docs.insert(&p.hash, p.sealed_doc.as_slice())?;
                for (i, sealed) in p.sealed_chunks.iter().enumerate() {
                    chunks.insert(&chunk_key(&p.hash, i as u32), sealed.as_slice())?;
                }
            }
        }
        // Commit under the index lock: a search then never sees the file and the index
        // disagree (a hit whose chunk record was just replaced would fail to authenticate).
        let mut index = self.write_index()?;
        txn.commit()?;
        for p in prepared {
            let slot = index.insert_doc(DocEntry {
                hash: p.hash,
                id: p.doc.id,
                title: p.doc.title,
                metadata: p.doc.metadata,
                generation: p.generation,
                rows: Vec::new(),
            });
            for c in &p.doc.chunks {
                index.push_chunk(slot, &c.embedding);
            }
        }
        Ok(())
    }

    fn delete(&self, ids: &[String]) -> Result<u64> {
        let hashes: Vec<DocHash> = ids.iter().map(|id| self.sealer.doc_hash(id)).collect();
        let mut deleted = Vec::new();
        let txn = self.begin_write()?;
        {
            let mut docs = txn.open_table(DOCUMENTS)?;
            let mut chunks = txn.open_table(CHUNKS)?;
            for hash in &hashes {
                if docs.remove(hash)?.is_some() {
                    remove_chunks(&mut chunks, hash)?;
                    deleted.push(*hash);
                }
            }
        }
        if deleted.is_empty() {
            txn.abort()?;
            return Ok(0);
        }
        let mut index = self.write_index()?;
        txn.commit()?;
        for hash in &deleted {
            index.remove_doc(hash);
        }
        Ok(deleted.len() as u64)
    }

    fn get(&self, id: &str) -> Result<Option<Document>> {
        let hash = self.sealer.doc_hash(id);
        let txn = self.db.begin_read()?;
        let docs = txn.open_table(DOCUMENTS)?;
        let Some(sealed) = docs.get(&hash)? else { return Ok(None) };
        let record = open_doc(&self.sealer, &hash, sealed.value())?;
        let chunks_table = txn.open_table(CHUNKS)?;
        let mut chunks = Vec::with_capacity(record.chunks as usize);
        for i in 0..record.chunks {
            let Some(sealed) = chunks_table.get(&chunk_key(&hash, i))? else {
                return Err(StoreError::corrupt(RecordKind::Chunk, "a chunk of a stored document is missing"));
            };
            let aad = Aad::Chunk { doc: &hash, index: i, generation: &record.generation };
            let plain = self.sealer.open(aad, sealed.value())?;
            let mut embedding = vec![0f32; self.dim];
            let text = codec::decode_chunk(&plain, &mut embedding, true)?.unwrap_or_default();
            chunks.push(Chunk { text, embedding });
        }
        Ok(Some(Document { id: record.id, title: record.title, metadata: record.metadata, chunks }))
    }

    fn search(&self, query: &[f32], top_k: usize) -> Result<Vec<Passage>> {
        if query.len() != self.dim {
            return Err(StoreError::DimensionMismatch { expected: self.dim, got: query.len() });
        }
        let mut query = query.to_vec();
        normalize(&mut query).ok_or_else(|| StoreError::invalid("query embedding is zero or not finite"))?;
        let index = self.read_index()?;
        let hits = index.top_k(&query, top_k);
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        // Begun under the index lock, so it reads the commit the index reflects.
        let txn = self.db.begin_read()?;
        let chunks = txn.open_table(CHUNKS)?;
        let mut scratch = vec![0f32; self.dim];
        hits.into_iter()
            .map(|hit| {
                let doc = hit.doc;
                let Some(sealed) = chunks.get(&chunk_key(&doc.hash, hit.chunk))? else {
                    return Err(StoreError::corrupt(RecordKind::Chunk, "an indexed chunk is missing from the file"));
                };
                let aad = Aad::Chunk { doc: &doc.hash, index: hit.chunk, generation: &doc.generation };
                let plain = self.sealer.open(aad, sealed.value())?;
                let text = codec::decode_chunk(&plain, &mut scratch, true)?.unwrap_or_default();
                Ok(Passage {
                    passage_id: format!("{}#{}", doc.id, hit.chunk),
                    document_id: doc.id.clone(),
                    chunk_index: hit.chunk,
                    title: doc.title.clone(),
                    text,
                    score: hit.score,
                    metadata: doc.metadata.clone(),
                })
            })
            .collect()
    }

    fn stats(&self) -> Result<Stats> {
        let (documents, chunks) = {
            let index = self.read_index()?;
            (index.documents() as u64, index.chunks() as u64)
        };
        let bytes_on_disk = std::fs::metadata(&self.path)?.len();
        Ok(Stats { documents, chunks, bytes_on_disk })
    }
}

/// Removes every chunk record of a document: one key range, whatever its chunk count was.
fn remove_chunks(chunks: &mut redb::Table<'_, &'static [u8; 36], &'static [u8]>, doc: &DocHash) -> Result<()> {
    let (first, last) = (chunk_key(doc, 0), chunk_key(doc, u32::MAX));
    chunks.retain_in::<&[u8; 36], _>(&first..=&last, |_, _| false)?;
    Ok(())
}

fn open_doc(sealer: &Sealer, hash: &DocHash, sealed: &[u8]) -> Result<DocRecord> {
    let record = codec::decode_doc(&sealer.open(Aad::Document(hash), sealed)?)?;
    if sealer.doc_hash(&record.id) != *hash {
        return Err(StoreError::corrupt(RecordKind::Document, "id does not match its table key"));
    }
    Ok(record)
}

/// On a new file: writes the format, key fingerprint and sealed config. On an existing one:
/// checks them, in an order that gives the clearest error (format, then key, then dimension).
fn check_or_init_meta(db: &Database, sealer: &Sealer, dimension: usize) -> Result<()> {
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            // New store (or one whose creation crashed before its first commit).
            drop(txn);
            let txn = db.begin_write()?;
            {
                let mut meta = txn.open_table(META)?;
                meta.insert("format", FORMAT_VERSION.to_le_bytes().as_slice())?;
                meta.insert("key_id", sealer.key_id().as_slice())?;
                let config = sealer.seal(Aad::Config, codec::encode_config(dimension as u32))?;
                meta.insert("config", config.as_slice())?;
                txn.open_table(DOCUMENTS)?;
                txn.open_table(CHUNKS)?;
            }
            txn.commit()?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let missing = |what| StoreError::corrupt(RecordKind::Config, format!("{what} missing from the store"));
    let format = meta.get("format")?.ok_or_else(|| missing("format version"))?;
    let format = <[u8; 4]>::try_from(format.value())
        .map(u32::from_le_bytes)
        .map_err(|_| StoreError::corrupt(RecordKind::Config, "format version is not 4 bytes"))?;
    if format != FORMAT_VERSION {
        return Err(StoreError::UnsupportedFormat(format));
    }
    let key_id = meta.get("key_id")?.ok_or_else(|| missing("key fingerprint"))?;
    if key_id.value() != sealer.key_id().as_slice() {
        return Err(StoreError::WrongKey);
    }
    let config = meta.get("config")?.ok_or_else(|| missing("config"))?;
    let stored = codec::decode_config(&sealer.open(Aad::Config, config.value())?)? as usize;
    if stored != dimension {
        return Err(StoreError::DimensionMismatch { expected: stored, got: dimension });
    }
    Ok(())
}

/// Rebuilds the index from the file, checking that every document has exactly its chunks.
/// Chunk records are decrypted in parallel batches (the bulk of the open time at 1M chunks).
fn load_index(db: &Database, sealer: &Sealer, dim: usize) -> Result<Index> {
    let txn = db.begin_read()?;
    let docs = txn.open_table(DOCUMENTS)?;
    let chunks = txn.open_table(CHUNKS)?;
    let mut index = Index::new(dim);
    let mut expected_chunks: Vec<u32> = Vec::with_capacity(docs.len()? as usize);
    for entry in docs.iter()? {
        let (key, value) = entry?;
        let hash = *key.value();
        let record = open_doc(sealer, &hash, value.value())?;
        let slot = index.insert_doc(DocEntry {
            hash,
            id: record.id,
            title: record.title,
            metadata: record.metadata,
            generation: record.generation,
            rows: Vec::new(),
        }) as usize;
        if expected_chunks.len() <= slot {
            expected_chunks.resize(slot + 1, 0);
        }
        expected_chunks[slot] = record.chunks;
    }

    // Chunks come in key order: by document, then by index, so each must be the next one its
    // document expects; a gap, a surplus or an orphan is corruption.
    let mut batch: Vec<(u32, ChunkKey, Vec<u8>)> = Vec::with_capacity(LOAD_BATCH);
    let flush = |index: &mut Index, batch: &mut Vec<(u32, ChunkKey, Vec<u8>)>| -> Result<()> {
        let shared: &Index = index;
        let vectors = batch
            .par_iter()
            .map(|(slot, key, sealed)| {
                let (hash, i) = split_chunk_key(key);
                let generation = shared.entry(*slot).generation;
                let plain = sealer.open(Aad::Chunk { doc: &hash, index: i, generation: &generation }, sealed)?;
                let mut v = vec![0f32; dim];
                codec::decode_chunk(&plain, &mut v, false)?;
                Ok(v)
            })
            .collect::<Result<Vec<_>>>()?;
        for ((slot, _, _), v) in batch.iter().zip(&vectors) {
            index.push_chunk(*slot, v);
        }
        batch.clear();
        Ok(())
    };
    let mut pending: HashMap<u32, u32> = HashMap::new(); // slot -> chunks queued in `batch`
    for entry in chunks.iter()? {
        let (key, value) = entry?;
        let key = *key.value();
        let (hash, i) = split_chunk_key(&key);
        let slot = index
            .slot_of(&hash)
            .ok_or_else(|| StoreError::corrupt(RecordKind::Chunk, "chunk without a document"))?;
        let have = index.entry(slot).rows.len() as u32 + pending.get(&slot).copied().unwrap_or(0);
        if i != have || i >= expected_chunks[slot as usize] {
            return Err(StoreError::corrupt(RecordKind::Chunk, "chunk out of sequence or beyond its document's count"));
        }
        *pending.entry(slot).or_default() += 1;
        batch.push((slot, key, value.value().to_vec()));
        if batch.len() == LOAD_BATCH {
            flush(&mut index, &mut batch)?;
            pending.clear();
        }
    }
    flush(&mut index, &mut batch)?;
    for (slot, &want) in expected_chunks.iter().enumerate() {
        if index.entry(slot as u32).rows.len() != want as usize {
            return Err(StoreError::corrupt(RecordKind::Document, "document is missing chunks"));
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests;
