//! The embedded store: one redb file, every record sealed (see `seal`), the vectors decrypted
//! once at open into the in-memory index.
//!
//! Tables:
//! - `meta`: `format` (plaintext u32), `key_id` (plaintext key fingerprint), `config` (sealed
//!   dimension, the key check), `next_seq` (plaintext u64, the next chunk sequence number);
//! - `documents`: HMAC(id) → sealed {id, title, metadata, generation, first chunk seq, count};
//! - `vectors`: chunk seq → sealed embedding;
//! - `texts`: chunk seq → sealed text.
//!
//! Why chunks are keyed by a sequence number rather than by (document, index): new chunks then
//! always append at the right edge of the trees, so a commit rewrites a few pages instead of
//! one leaf per chunk scattered over the file (keyed hashes are random), and leaves fill up.
//! Vectors and texts are separate records because a chunk's two parts together (about 2.2 KB at
//! dimension 384) fit a 4 KiB page only once while each part packs well on its own; it also
//! lets the open read and decrypt the vectors alone. Both measured in docs/BENCHMARKS.md.
//!
//! What the file still reveals: how many documents and chunks there are and their sizes,
//! and when they were written; not which ids, nor any text, title, metadata or vector.
//!
//! Crash safety is redb's: each upsert or delete is one write transaction, committed with
//! `Durability::Immediate` (fsync) before the call returns, so a crash leaves either the whole
//! transaction or none of it. Two-phase commit is on: a commit becomes the primary root only
//! after the pages it points to are on disk, so recovery never has to judge a torn commit by
//! redb's non-cryptographic checksums, and a primary that fails verification is reported as
//! corruption instead of being replaced by the previous commit (which, for a file altered by
//! the host, would quietly drop acknowledged documents).
//!
//! Opening a store runs redb's full integrity check (every page checksum) before anything is
//! read: a plain open trusts the file and may panic on one altered by the host, which is
//! untrusted here. The check reads the whole file once (about 3 s at 1M chunks).
//!
//! Not prevented: the host replacing the file (or a document's records together) with an older
//! authentic copy. Detecting that rollback needs a monotonic counter outside the host's reach.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use rayon::prelude::*;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};

use crate::codec::{self, DocRecord};
use crate::error::{RecordKind, Result, StoreError};
use crate::index::{DocEntry, Index};
use crate::key::SealingKey;
use crate::seal::{Aad, ChunkBinding, DocHash, Generation, Sealer};
use crate::{Chunk, Document, Passage, Stats, VectorStore, normalize};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const DOCUMENTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("documents");
const VECTORS: TableDefinition<u64, &[u8]> = TableDefinition::new("vectors");
const TEXTS: TableDefinition<u64, &[u8]> = TableDefinition::new("texts");

const FORMAT_VERSION: u32 = 1;
/// Large enough for any embedding model in use (the largest common ones are 4096).
const MAX_DIMENSION: usize = 65_536;
/// redb's page cache. The vectors live in the index, so the cache only serves tree pages and
/// the text of top-k hits; redb's 1 GiB default would add that much to a large store's memory.
const CACHE_BYTES: usize = 128 << 20;
/// Vector records decrypted per parallel batch while loading.
const LOAD_BATCH: usize = 4096;

/// How an [`EncryptedRedbStore`] searches; [`EncryptedRedbStore::open`] uses the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Searches use an approximate IVF index when the store holds more chunks than this;
    /// up to it they are the exact scan. Default 1,000,000: the exact scan answers a top-10 at
    /// 1M chunks in tens of milliseconds on 2 cores (docs/BENCHMARKS.md), and the index
    /// trades recall, memory and build time for speed only beyond that.
    pub ann_threshold: usize,
    /// IVF lists read per query, of about √(chunks) (1,000 at 1M chunks). More lists,
    /// higher recall and slower queries: query time is about proportional to
    /// `nprobe / √chunks` of a full scan. Default 64.
    pub nprobe: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { ann_threshold: 1_000_000, nprobe: 64 }
    }
}

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
    /// [`StoreError::Corrupt`] if the file or any document or vector record fails its checks
    /// (chunk texts are authenticated when they are read).
    pub fn open(path: impl AsRef<Path>, key: &SealingKey, dimension: usize) -> Result<Self> {
        Self::open_with(path, key, dimension, StoreOptions::default())
    }

    /// [`EncryptedRedbStore::open`] with search options. Over the ANN threshold the IVF index
    /// is built here, after the vectors are loaded, so the open takes longer.
    pub fn open_with(
        path: impl AsRef<Path>,
        key: &SealingKey,
        dimension: usize,
        options: StoreOptions,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if dimension == 0 || dimension > MAX_DIMENSION {
            return Err(StoreError::invalid(format!("dimension must be between 1 and {MAX_DIMENSION}")));
        }
        if options.nprobe == 0 {
            return Err(StoreError::invalid("nprobe must be at least 1"));
        }
        let sealer = Sealer::new(key);
        let db = match create_if_missing(&path, &sealer, dimension)? {
            Some(created) => created,
            None => Database::builder().set_check_integrity_on_open(true).set_cache_size(CACHE_BYTES).create(&path)?,
        };
        let next_seq = check_or_init_meta(&db, &sealer, dimension)?;
        let mut index = load_index(&db, &sealer, Index::with_ann(dimension, options), next_seq)?;
        index.refresh_ann();
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

    fn begin_write(&self) -> Result<WriteTransaction> {
        let mut txn = self.db.begin_write()?;
        txn.set_two_phase_commit(true);
        Ok(txn)
    }

    /// Checks a document and returns it with unit-norm embeddings.
    fn validate(&self, position: usize, doc: &Document) -> Result<Document> {
        if doc.id.is_empty() {
            return Err(StoreError::invalid(format!("document {position}: empty id")));
        }
        if u32::try_from(doc.chunks.len()).is_err() {
            return Err(StoreError::invalid(format!("document {position}: too many chunks")));
        }
        let mut doc = doc.clone();
        for (c, chunk) in doc.chunks.iter_mut().enumerate() {
            if chunk.embedding.len() != self.dim {
                return Err(StoreError::DimensionMismatch { expected: self.dim, got: chunk.embedding.len() });
            }
            normalize(&mut chunk.embedding).ok_or_else(|| {
                StoreError::invalid(format!("document {position}, chunk {c}: embedding is zero or not finite"))
            })?;
        }
        Ok(doc)
    }

    /// Seals a document placed at `first_seq`: its record, then each chunk's vector and text.
    fn seal(&self, doc: &Document, hash: &DocHash, generation: &Generation, first_seq: u64) -> Result<Sealed> {
        let record = DocRecord {
            generation: *generation,
            first_seq,
            chunks: doc.chunks.len() as u32,
            id: doc.id.clone(),
            title: doc.title.clone(),
            metadata: doc.metadata.clone(),
        };
        let document = self.sealer.seal(Aad::Document(hash), codec::encode_doc(&record))?;
        let chunks = doc
            .chunks
            .par_iter()
            .enumerate()
            .map(|(i, c)| {
                let at = ChunkBinding { seq: first_seq + i as u64, doc: hash, index: i as u32, generation };
                let vector = self.sealer.seal(Aad::Vector(at), codec::encode_vector(&c.embedding))?;
                let text = self.sealer.seal(Aad::Text(at), c.text.as_bytes().to_vec())?;
                Ok((vector, text))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sealed { document, chunks })
    }
}

struct Sealed {
    document: Vec<u8>,
    /// (vector, text) of each chunk.
    chunks: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A document as the index will hold it after the commit.
struct Placed {
    hash: DocHash,
    generation: Generation,
    first_seq: u64,
    doc: Document,
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
        let docs = documents
            .iter()
            .enumerate()
            .filter(|(i, d)| last.get(d.id.as_str()) == Some(i))
            .map(|(i, d)| self.validate(i, d))
            .collect::<Result<Vec<_>>>()?;
        if docs.is_empty() {
            return Ok(());
        }

        // Sequence numbers are handed out inside the write transaction: redb admits one writer
        // at a time, so no two upserts can take the same ones.
        let txn = self.begin_write()?;
        let mut next_seq = read_next_seq(&txn)?;
        let mut placed = Vec::with_capacity(docs.len());
        for doc in docs {
            let mut generation = [0u8; 16];
            rand::Rng::fill_bytes(&mut rand::rng(), &mut generation);
            let first_seq = next_seq;
            next_seq = next_seq
                .checked_add(doc.chunks.len() as u64)
                .ok_or_else(|| StoreError::corrupt(RecordKind::Config, "chunk sequence exhausted"))?;
            placed.push(Placed { hash: self.sealer.doc_hash(&doc.id), generation, first_seq, doc });
        }
        let sealed = placed
            .par_iter()
            .map(|p| self.seal(&p.doc, &p.hash, &p.generation, p.first_seq))
            .collect::<Result<Vec<_>>>()?;
        {
            let mut docs = txn.open_table(DOCUMENTS)?;
            let mut vectors = txn.open_table(VECTORS)?;
            let mut texts = txn.open_table(TEXTS)?;
            for (p, s) in placed.iter().zip(&sealed) {
                // The old version's chunks go in the same transaction as the new ones arrive.
                let old = docs.insert(&p.hash, s.document.as_slice())?.map(|g| g.value().to_vec());
                if let Some(old) = old {
                    let old = open_doc(&self.sealer, &p.hash, &old)?;
                    remove_chunks(&mut vectors, &mut texts, &old)?;
                }
                for (i, (vector, text)) in s.chunks.iter().enumerate() {
                    vectors.insert(p.first_seq + i as u64, vector.as_slice())?;
                    texts.insert(p.first_seq + i as u64, text.as_slice())?;
                }
            }
            txn.open_table(META)?.insert("next_seq", next_seq.to_le_bytes().as_slice())?;
        }
        // Commit under the index lock: a search then never sees the file and the index
        // disagree (a hit whose chunk was just replaced would find another record, or none).
        let mut index = self.write_index()?;
        txn.commit()?;
        for p in placed {
            let slot = index.insert_doc(DocEntry {
                hash: p.hash,
                id: p.doc.id,
                title: p.doc.title,
                metadata: p.doc.metadata,
                generation: p.generation,
                first_seq: p.first_seq,
                rows: Vec::new(),
            });
            for c in &p.doc.chunks {
                index.push_chunk(slot, &c.embedding);
            }
        }
        index.refresh_ann();
        Ok(())
    }

    fn delete(&self, ids: &[String]) -> Result<u64> {
        let hashes: Vec<DocHash> = ids.iter().map(|id| self.sealer.doc_hash(id)).collect();
        let mut deleted = Vec::new();
        let txn = self.begin_write()?;
        {
            let mut docs = txn.open_table(DOCUMENTS)?;
            let mut vectors = txn.open_table(VECTORS)?;
            let mut texts = txn.open_table(TEXTS)?;
            for hash in &hashes {
                let old = docs.remove(hash)?.map(|g| g.value().to_vec());
                if let Some(old) = old {
                    let old = open_doc(&self.sealer, hash, &old)?;
                    remove_chunks(&mut vectors, &mut texts, &old)?;
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
        index.refresh_ann();
        Ok(deleted.len() as u64)
    }

    fn get(&self, id: &str) -> Result<Option<Document>> {
        let hash = self.sealer.doc_hash(id);
        let txn = self.db.begin_read()?;
        let docs = txn.open_table(DOCUMENTS)?;
        let Some(sealed) = docs.get(&hash)? else { return Ok(None) };
        let record = open_doc(&self.sealer, &hash, sealed.value())?;
        let vectors = txn.open_table(VECTORS)?;
        let texts = txn.open_table(TEXTS)?;
        let mut chunks = Vec::with_capacity(record.chunks as usize);
        for i in 0..record.chunks {
            let at =
                ChunkBinding { seq: record.first_seq + i as u64, doc: &hash, index: i, generation: &record.generation };
            let mut embedding = vec![0f32; self.dim];
            let sealed = vectors.get(at.seq)?.ok_or_else(|| missing(RecordKind::ChunkVector))?;
            codec::decode_vector(&self.sealer.open(Aad::Vector(at), sealed.value())?, &mut embedding)?;
            let sealed = texts.get(at.seq)?.ok_or_else(|| missing(RecordKind::ChunkText))?;
            let text = codec::decode_text(self.sealer.open(Aad::Text(at), sealed.value())?)?;
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
        let texts = txn.open_table(TEXTS)?;
        hits.into_iter()
            .map(|hit| {
                let doc = hit.doc;
                let at = ChunkBinding {
                    seq: doc.first_seq + hit.chunk as u64,
                    doc: &doc.hash,
                    index: hit.chunk,
                    generation: &doc.generation,
                };
                let sealed = texts.get(at.seq)?.ok_or_else(|| missing(RecordKind::ChunkText))?;
                let text = codec::decode_text(self.sealer.open(Aad::Text(at), sealed.value())?)?;
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
        let meta = std::fs::metadata(&self.path)?;
        // redb grows its file ahead of the data by extending it, which leaves the tail sparse:
        // the blocks actually allocated are what the store costs on disk.
        #[cfg(unix)]
        let bytes_on_disk = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        #[cfg(not(unix))]
        let bytes_on_disk = meta.len();
        Ok(Stats { documents, chunks, bytes_on_disk })
    }
}

fn missing(kind: RecordKind) -> StoreError {
    StoreError::corrupt(kind, "a chunk record of a stored document is missing")
}

type SeqTable<'txn> = redb::Table<'txn, u64, &'static [u8]>;

/// Removes a stored version's chunk records: one key range in each table.
fn remove_chunks(vectors: &mut SeqTable<'_>, texts: &mut SeqTable<'_>, old: &DocRecord) -> Result<()> {
    let range = old.first_seq..old.first_seq + old.chunks as u64;
    vectors.retain_in::<u64, _>(range.clone(), |_, _| false)?;
    texts.retain_in::<u64, _>(range, |_, _| false)?;
    Ok(())
}

/// A new store is made whole beside its path and renamed into place, so a file at `path` is
/// always one this crate finished creating. An existing file that is empty is then a store
/// cut to nothing (redb would quietly initialise it as a new, empty database): refused.
/// Returns the new store's database, still open (its handle follows the rename), or `None`
/// when the file exists.
fn create_if_missing(path: &Path, sealer: &Sealer, dimension: usize) -> Result<Option<Database>> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() == 0 => {
            return Err(StoreError::corrupt(RecordKind::File, "the store file is empty (truncated, or not a store)"));
        }
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::Io(e)),
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".creating");
    let tmp = path.with_file_name(name);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::Io(e)),
    }
    let db = Database::builder().set_cache_size(CACHE_BYTES).create(&tmp)?;
    check_or_init_meta(&db, sealer, dimension)?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(Some(db))
}

fn open_doc(sealer: &Sealer, hash: &DocHash, sealed: &[u8]) -> Result<DocRecord> {
    let record = codec::decode_doc(&sealer.open(Aad::Document(hash), sealed)?)?;
    if sealer.doc_hash(&record.id) != *hash {
        return Err(StoreError::corrupt(RecordKind::Document, "id does not match its table key"));
    }
    Ok(record)
}

fn read_next_seq(txn: &WriteTransaction) -> Result<u64> {
    let meta = txn.open_table(META)?;
    let value = meta.get("next_seq")?;
    decode_next_seq(value.as_ref().map(|v| v.value()))
}

fn decode_next_seq(value: Option<&[u8]>) -> Result<u64> {
    match value {
        None => Ok(0),
        Some(bytes) => <[u8; 8]>::try_from(bytes)
            .map(u64::from_le_bytes)
            .map_err(|_| StoreError::corrupt(RecordKind::Config, "chunk sequence counter is not 8 bytes")),
    }
}

/// On a new file: writes the format, key fingerprint and sealed config. On an existing one:
/// checks them, in an order that gives the clearest error (format, then key, then dimension).
/// Returns the next chunk sequence number.
fn check_or_init_meta(db: &Database, sealer: &Sealer, dimension: usize) -> Result<u64> {
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
                txn.open_table(VECTORS)?;
                txn.open_table(TEXTS)?;
            }
            txn.commit()?;
            return Ok(0);
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
    let next_seq = meta.get("next_seq")?;
    decode_next_seq(next_seq.as_ref().map(|v| v.value()))
}

/// Rebuilds the index from the file, checking that the chunk records are exactly those the
/// documents claim: every vector is decrypted (in parallel batches: the bulk of the open time
/// at 1M chunks); texts are checked for presence here and authenticated when read.
fn load_index(db: &Database, sealer: &Sealer, mut index: Index, next_seq: u64) -> Result<Index> {
    let txn = db.begin_read()?;
    let docs = txn.open_table(DOCUMENTS)?;
    let vectors = txn.open_table(VECTORS)?;
    let texts = txn.open_table(TEXTS)?;
    // (first_seq, chunks, slot) of every document.
    let mut ranges: Vec<(u64, u32, u32)> = Vec::with_capacity(docs.len()? as usize);
    for entry in docs.iter()? {
        let (key, value) = entry?;
        let hash = *key.value();
        let record = open_doc(sealer, &hash, value.value())?;
        let (first_seq, chunks) = (record.first_seq, record.chunks);
        let slot = index.insert_doc(DocEntry {
            hash,
            id: record.id,
            title: record.title,
            metadata: record.metadata,
            generation: record.generation,
            first_seq,
            rows: Vec::new(),
        });
        ranges.push((first_seq, chunks, slot));
    }
    ranges.sort_unstable();
    let mut end = 0u64;
    for &(first, chunks, _) in &ranges {
        if first < end {
            return Err(StoreError::corrupt(RecordKind::Document, "two documents claim the same chunks"));
        }
        end = first + chunks as u64;
    }
    if end > next_seq {
        // Upserts would hand out sequence numbers that are in use.
        return Err(StoreError::corrupt(RecordKind::Config, "chunk sequence counter behind the stored chunks"));
    }

    // Both tables must hold exactly the documents' ranges, in order: walk them side by side.
    let mismatch = |kind| StoreError::corrupt(kind, "chunk records do not match their documents");
    let mut vector_entries = vectors.iter()?;
    let mut text_keys = texts.iter()?;
    let mut batch: Vec<(u32, u32, u64, Vec<u8>)> = Vec::with_capacity(LOAD_BATCH);
    for &(first, chunks, slot) in &ranges {
        for i in 0..chunks {
            let seq = first + i as u64;
            let (key, value) = vector_entries.next().ok_or_else(|| mismatch(RecordKind::ChunkVector))??;
            if key.value() != seq {
                return Err(mismatch(RecordKind::ChunkVector));
            }
            let (key, _) = text_keys.next().ok_or_else(|| mismatch(RecordKind::ChunkText))??;
            if key.value() != seq {
                return Err(mismatch(RecordKind::ChunkText));
            }
            batch.push((slot, i, seq, value.value().to_vec()));
            if batch.len() == LOAD_BATCH {
                push_vectors(&mut index, sealer, &mut batch)?;
            }
        }
    }
    push_vectors(&mut index, sealer, &mut batch)?;
    if vector_entries.next().is_some() {
        return Err(StoreError::corrupt(RecordKind::ChunkVector, "a vector record belongs to no document"));
    }
    if text_keys.next().is_some() {
        return Err(StoreError::corrupt(RecordKind::ChunkText, "a text record belongs to no document"));
    }
    Ok(index)
}

/// Decrypts a batch of vector records in parallel and appends them to their documents (the
/// batch is in sequence order, so each document's chunks arrive in index order).
fn push_vectors(index: &mut Index, sealer: &Sealer, batch: &mut Vec<(u32, u32, u64, Vec<u8>)>) -> Result<()> {
    let shared: &Index = index;
    let vectors = batch
        .par_iter()
        .map(|(slot, i, seq, sealed)| {
            let doc = shared.entry(*slot);
            let at = ChunkBinding { seq: *seq, doc: &doc.hash, index: *i, generation: &doc.generation };
            let mut v = vec![0f32; shared.dim()];
            codec::decode_vector(&sealer.open(Aad::Vector(at), sealed)?, &mut v)?;
            Ok(v)
        })
        .collect::<Result<Vec<_>>>()?;
    for ((slot, _, _, _), v) in batch.iter().zip(&vectors) {
        index.push_chunk(*slot, v);
    }
    batch.clear();
    Ok(())
}

#[cfg(test)]
mod tests;
