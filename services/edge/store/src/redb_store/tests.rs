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
            .map(|c| Chunk {
                text: format!("{id} chunk {c}"),
                embedding: vec![1.0 + salt, c as f32, 0.5, -(c as f32) - salt],
            })
            .collect(),
    }
}

/// A closed store with documents a (3 chunks: seqs 0..3) and b (2 chunks: seqs 3..5).
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
    store.upsert(&[doc("a", 3, 0.0), doc("b", 2, 1.0)]).unwrap();
    drop(store);
    (dir, path)
}

struct Raw<'a, 't> {
    meta: &'a mut redb::Table<'t, &'static str, &'static [u8]>,
    docs: &'a mut redb::Table<'t, &'static [u8; 32], &'static [u8]>,
    vectors: &'a mut SeqTable<'t>,
    texts: &'a mut SeqTable<'t>,
}

/// Rewrites the raw tables with redb directly, as a host with write access to the file could.
fn with_raw_tables(path: &Path, f: impl FnOnce(Raw<'_, '_>)) {
    let db = Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        let mut docs = txn.open_table(DOCUMENTS).unwrap();
        let mut vectors = txn.open_table(VECTORS).unwrap();
        let mut texts = txn.open_table(TEXTS).unwrap();
        f(Raw { meta: &mut meta, docs: &mut docs, vectors: &mut vectors, texts: &mut texts });
    }
    txn.commit().unwrap();
}

fn hash(id: &str) -> DocHash {
    Sealer::new(&key()).doc_hash(id)
}

fn raw(table: &SeqTable<'_>, seq: u64) -> Vec<u8> {
    table.get(seq).unwrap().unwrap().value().to_vec()
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
    assert_eq!(store.get("b").unwrap().unwrap().chunks[1].text, "b chunk 1");
}

#[test]
fn swapped_vector_records_fail_the_open() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let (v0, v1) = (raw(t.vectors, 0), raw(t.vectors, 1));
        t.vectors.insert(0, v1.as_slice()).unwrap();
        t.vectors.insert(1, v0.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::ChunkVector);
}

#[test]
fn a_vector_moved_to_another_document_fails_the_open() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let v = raw(t.vectors, 0);
        t.vectors.insert(3, v.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::ChunkVector);
}

/// Texts are authenticated when read: swapped texts fail `get` and the search that meets them.
#[test]
fn swapped_text_records_fail_the_reads_that_meet_them() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let (t0, t3) = (raw(t.texts, 0), raw(t.texts, 3));
        t.texts.insert(0, t3.as_slice()).unwrap();
        t.texts.insert(3, t0.as_slice()).unwrap();
    });
    let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
    for id in ["a", "b"] {
        assert!(matches!(store.get(id), Err(StoreError::Corrupt { kind: RecordKind::ChunkText, .. })), "{id}");
    }
    let a0 = doc("a", 1, 0.0).chunks[0].embedding.clone();
    assert!(matches!(store.search(&a0, 1), Err(StoreError::Corrupt { kind: RecordKind::ChunkText, .. })));
    // A search whose hits avoid the altered records still works.
    let a2 = doc("a", 3, 0.0).chunks[2].embedding.clone();
    assert_eq!(store.search(&a2, 1).unwrap()[0].text, "a chunk 2");
}

/// Sequence numbers are never reused, unless the host lowers the counter; the generation then
/// still tells a new version's chunk from an old one at the same place.
#[test]
fn a_chunk_of_an_earlier_version_is_not_accepted_at_a_reused_place() {
    let (_dir, path) = fixture();
    let mut old = Vec::new();
    with_raw_tables(&path, |t| old = raw(t.vectors, 0));
    {
        let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
        assert_eq!(store.delete(&["a".to_string(), "b".to_string()]).unwrap(), 2);
    }
    with_raw_tables(&path, |t| {
        t.meta.insert("next_seq", 0u64.to_le_bytes().as_slice()).unwrap();
    });
    {
        let store = EncryptedRedbStore::open(&path, &key(), DIM).unwrap();
        // Same id, same chunk index, same sequence number as the old record: only the
        // generation differs.
        store.upsert(&[doc("a", 1, 0.0)]).unwrap();
    }
    with_raw_tables(&path, |t| {
        t.vectors.insert(0, old.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::ChunkVector);
}

#[test]
fn document_records_cannot_be_swapped_or_altered() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let a = t.docs.get(&hash("a")).unwrap().unwrap().value().to_vec();
        let b = t.docs.get(&hash("b")).unwrap().unwrap().value().to_vec();
        t.docs.insert(&hash("a"), b.as_slice()).unwrap();
        t.docs.insert(&hash("b"), a.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);

    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let mut a = t.docs.get(&hash("a")).unwrap().unwrap().value().to_vec();
        let mid = a.len() / 2;
        a[mid] ^= 0x01;
        t.docs.insert(&hash("a"), a.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);
}

#[test]
fn missing_and_orphan_chunk_records_fail_the_open() {
    type Alter = fn(Raw<'_, '_>);
    let cases: [(&str, Alter, RecordKind); 5] = [
        ("last vector of a removed", |t| drop(t.vectors.remove(2).unwrap()), RecordKind::ChunkVector),
        ("middle text of a removed", |t| drop(t.texts.remove(1).unwrap()), RecordKind::ChunkText),
        ("document b removed", |t| drop(t.docs.remove(&hash("b")).unwrap()), RecordKind::ChunkVector),
        (
            "vector beyond every document",
            |t| {
                let v = raw(t.vectors, 4);
                t.vectors.insert(5, v.as_slice()).unwrap();
            },
            RecordKind::ChunkVector,
        ),
        (
            "text beyond every document",
            |t| {
                let v = raw(t.texts, 4);
                t.texts.insert(9, v.as_slice()).unwrap();
            },
            RecordKind::ChunkText,
        ),
    ];
    for (what, alter, kind) in cases {
        let (_dir, path) = fixture();
        with_raw_tables(&path, alter);
        match EncryptedRedbStore::open(&path, &key(), DIM) {
            Err(StoreError::Corrupt { kind: got, .. }) => assert_eq!(got, kind, "{what}"),
            other => panic!("{what}: expected corrupt {kind}, got {:?}", other.err()),
        }
    }
}

/// Defence in depth against a bug (the key holder is the only one who can seal): two documents
/// claiming the same chunks, or a counter behind the chunks, are refused.
#[test]
fn overlapping_ranges_and_a_lagging_counter_fail_the_open() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let sealer = Sealer::new(&key());
        let b = open_doc(&sealer, &hash("b"), t.docs.get(&hash("b")).unwrap().unwrap().value()).unwrap();
        let forged = DocRecord { first_seq: 1, ..b };
        let sealed = sealer.seal(Aad::Document(&hash("b")), codec::encode_doc(&forged)).unwrap();
        t.docs.insert(&hash("b"), sealed.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Document);

    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        t.meta.insert("next_seq", 4u64.to_le_bytes().as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Config);
}

#[test]
fn config_and_format_are_checked() {
    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        let mut config = t.meta.get("config").unwrap().unwrap().value().to_vec();
        config[14] ^= 0x04;
        t.meta.insert("config", config.as_slice()).unwrap();
    });
    expect_corrupt(&path, RecordKind::Config);

    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        t.meta.insert("format", 2u32.to_le_bytes().as_slice()).unwrap();
    });
    assert!(matches!(EncryptedRedbStore::open(&path, &key(), DIM), Err(StoreError::UnsupportedFormat(2))));

    let (_dir, path) = fixture();
    with_raw_tables(&path, |t| {
        t.meta.insert("key_id", [0u8; 16].as_slice()).unwrap();
    });
    assert!(matches!(EncryptedRedbStore::open(&path, &key(), DIM), Err(StoreError::WrongKey)));
}

/// A byte flipped in the file where a sealed record lies: redb's page checksum catches it at
/// open, as a typed error.
#[test]
fn a_flipped_byte_in_a_record_fails_the_open() {
    for table in [VECTORS, TEXTS] {
        let (_dir, path) = fixture();
        let sealed = {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_read().unwrap();
            let t = txn.open_table(table).unwrap();
            t.get(4).unwrap().unwrap().value().to_vec()
        };
        let mut bytes = std::fs::read(&path).unwrap();
        let at =
            bytes.windows(sealed.len()).position(|w| w == sealed.as_slice()).expect("sealed record is in the file");
        bytes[at + sealed.len() / 2] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        match EncryptedRedbStore::open(&path, &key(), DIM) {
            Err(StoreError::Corrupt { kind: RecordKind::File, .. }) => {}
            Err(other) => panic!("expected a corrupt file, got {other}"),
            Ok(_) => panic!("a flipped byte in a live record went unnoticed"),
        }
    }
}
