//! Tampering below the store's API: records rewritten through redb itself (so redb's page
//! checksums are valid and only the sealing can notice), and bytes flipped in the file.

use super::*;

const DIM: usize = 4;

fn key() -> SealingKey {
    SealingKey::from_bytes([0x42; 32])
}

fn doc(id: &str, chunks: usize, salt: f32) -> Document {
    Document {
        id: id.into(),
        title: format!("title of {id}"),
        metadata: [("source".to_string(), format!("{id}.txt"))].into(),
        chunks: (0..chunks)
            .map(|c| Chunk { text: format!("{id} chunk {c}"), embedding: vec![1.0 + salt, c as f32, 0.5, -(c as f32) - salt] })
            .collect(),
    }
}

/// A store with documents a (3 chunks) and b (2 chunks), closed.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
    store.upsert(&[doc("a", 3, 0.0), doc("b", 2, 1.0)]).unwrap();
    drop(store);
    (dir, path)
}

/// Rewrites the raw tables with redb directly, as a host with write access to the file could.
fn with_raw_tables(path: &Path, f: impl FnOnce(&mut redb::Table<&[u8; 32], &[u8]>, &mut redb::Table<&[u8; 36], &[u8]>)) {
    let db = Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut docs = txn.open_table(DOCUMENTS).unwrap();
        let mut chunks = txn.open_table(CHUNKS).unwrap();
        f(&mut docs, &mut chunks);
    }
    txn.commit().unwrap();
}

fn hash(id: &str) -> DocHash {
    Sealer::new(&key()).doc_hash(id)
}

fn raw_chunk(chunks: &redb::Table<&[u8; 36], &[u8]>, id: &str, i: u32) -> Vec<u8> {
    chunks.get(&chunk_key(&hash(id), i)).unwrap().unwrap().value().to_vec()
}

fn expect_corrupt(path: &Path, want: RecordKind) {
    match EncryptedRedbStore::open(path, &key(), DIM) {
        Err(StoreError::Corrupt { kind, .. }) => assert_eq!(kind, want),
        Err(other) => panic!("expected a corrupt {want} record, got {other}"),
        Ok(_) => panic!("expected a corrupt {want} record, the store opened"),
    }
}

#[test]
fn the_fixture_opens_intact() {
    let (_dir, path) = fixture();
    let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
    assert_eq!(store.stats().unwrap().chunks, 5);
    assert_eq!(store.get("a").unwrap().unwrap().chunks[2].text, "a chunk 2");
}

#[test]
fn swapping_two_chunks_of_a_document_is_detected() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |_, chunks| {
        let (c0, c1) = (raw_chunk(chunks, "a", 0), raw_chunk(chunks, "a", 1));
        chunks.insert(&chunk_key(&hash("a"), 0), c1.as_slice()).unwrap();
        chunks.insert(&chunk_key(&hash("a"), 1), c0.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);
}

#[test]
fn a_chunk_moved_to_another_document_is_detected() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |_, chunks| {
        let c = raw_chunk(chunks, "a", 0);
        chunks.insert(&chunk_key(&hash("b"), 0), c.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);
}

#[test]
fn a_chunk_of_an_earlier_version_is_not_accepted() {
    let (_dir, path) = fixture();
    let mut old = Vec::new();
    with_raw_tables(&path, |_, chunks| old = raw_chunk(chunks, "a", 1));
    {
        let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
        store.upsert(&[doc("a", 3, 5.0)]).unwrap();
    }
    // Same document, same index, same key: only the generation tells them apart.
    with_raw_tables(&path, |_, chunks| {
        chunks.insert(&chunk_key(&hash("a"), 1), old.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);
}

#[test]
fn document_records_cannot_be_swapped_or_altered() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |docs, _| {
        let a = docs.get(&hash("a")).unwrap().unwrap().value().to_vec();
        let b = docs.get(&hash("b")).unwrap().unwrap().value().to_vec();
        docs.insert(&hash("a"), b.as_slice()).unwrap();
        docs.insert(&hash("b"), a.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);

    let (_dir, path) = fixture();
    with_raw_tables(&path, |docs, _| {
        let mut a = docs.get(&hash("a")).unwrap().unwrap().value().to_vec();
        let mid = a.len() / 2;
        a[mid] ^= 0x01;
        docs.insert(&hash("a"), a.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);
}

#[test]
fn missing_surplus_and_orphan_chunks_are_detected() {
    // A chunk removed: the document is incomplete.
    let (_dir, path) = fixture();
    with_raw_tables(&path, |_, chunks| {
        chunks.remove(&chunk_key(&hash("a"), 2)).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);

    // A chunk removed from the middle: the next one is out of sequence.
    let (_dir, path) = fixture();
    with_raw_tables(&path, |_, chunks| {
        chunks.remove(&chunk_key(&hash("a"), 1)).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);

    // A document record removed: its chunks are orphans.
    let (_dir, path) = fixture();
    with_raw_tables(&path, |docs, _| {
        docs.remove(&hash("b")).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);

    // A chunk beyond the document's count (a copy of a valid record under a new index).
    let (_dir, path) = fixture();
    with_raw_tables(&path, |_, chunks| {
        let c = raw_chunk(chunks, "b", 1);
        chunks.insert(&chunk_key(&hash("b"), 2), c.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Chunk);
}

#[test]
fn config_and_key_fingerprint_are_checked() {
    let (_dir, path) = fixture();
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            let mut config = meta.get("config").unwrap().unwrap().value().to_vec();
            config[14] ^= 0x04;
            meta.insert("config", config.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    expect_corrupt(&path, RecordKind::Config);

    let (_dir, path) = fixture();
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert("format", 2u32.to_le_bytes().as_slice()).unwrap();
        txn.commit().unwrap();
    }
    assert!(matches!(EncryptedRedbStore::open(&path, &key(), DIM), Err(StoreError::UnsupportedFormat(2))));
}

/// A byte flipped in the file where a sealed chunk lies: redb's page checksum catches it at
/// open, as a typed error.
#[test]
fn a_flipped_byte_in_a_chunk_record_fails_the_open() {
    let (_dir, path) = fixture();
    let sealed = {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let chunks = txn.open_table(CHUNKS).unwrap();
        chunks.get(&chunk_key(&hash("b"), 1)).unwrap().unwrap().value().to_vec()
    };
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(sealed.len()).position(|w| w == sealed.as_slice()).expect("sealed record is in the file");
    bytes[at + sealed.len() / 2] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    match EncryptedRedbStore::open(&path, &key(), DIM) {
        Err(StoreError::Corrupt { kind: RecordKind::File | RecordKind::Chunk, .. }) => {}
        Err(other) => panic!("expected a corrupt record, got {other}"),
        Ok(_) => panic!("a flipped byte in a live record went unnoticed"),
    }
}
