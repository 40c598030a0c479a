//! What a host with the disk sees: no plaintext text, titles, metadata, ids or vectors in any
//! file the store writes; and what a host that alters the file gets: a typed error, never a
//! panic, never different data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use store::{Chunk, Document, EncryptedRedbStore, Passage, SealingKey, StoreError, VectorStore};

const DIM: usize = 32;

fn key() -> SealingKey {
    SealingKey::from_bytes([0x5a; 32])
}

/// Distinctive, well-spread unit vectors: no byte pattern a page header or counter would
/// produce by chance, and no near-ties between chunks.
fn vector(doc: usize, chunk: usize) -> Vec<f32> {
    let seed = (doc * 7 + chunk + 1) as f32;
    let v: Vec<f32> = (0..DIM).map(|j| (seed * (j as f32 + 1.0) * 0.377_1).sin() + 0.011_3).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

fn corpus() -> Vec<Document> {
    (0..12)
        .map(|d| Document {
            id: format!("CONFIDENTIAL-ID-{d:03}"),
            title: format!("Quarterly Zanzibar Report {d}"),
            metadata: BTreeMap::from([("author".to_string(), format!("Xylophone Quixote {d}"))]),
            chunks: (0..5)
                .map(|c| Chunk {
                    text: format!(
                        "The merger password is hunter2-{d}-{c}; the zebra crossing at dawn. {}",
                        "filler ".repeat(40)
                    ),
                    embedding: vector(d, c),
                })
                .collect(),
        })
        .collect()
}

fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(all_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(|u| u.to_le_bytes()).collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn store_files_hold_no_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let docs = corpus();
    {
        let store = EncryptedRedbStore::open(dir.path().join("docs.redb"), &key(), DIM).unwrap();
        store.upsert(&docs[..6]).unwrap();
        store.upsert(&docs[6..]).unwrap();
        // Replace and delete too, so freed pages are part of what is scanned.
        store.upsert(&docs[2..4]).unwrap();
        store.delete(&[docs[5].id.clone()]).unwrap();
        assert_eq!(store.stats().unwrap().documents, 11);
    }

    let mut needles: Vec<(String, Vec<u8>)> = Vec::new();
    let mut text_needle = |label: String, s: &str| {
        for variant in [s.to_string(), s.to_lowercase(), s.to_uppercase()] {
            needles.push((label.clone(), variant.as_bytes().to_vec()));
            needles.push((format!("{label} (UTF-16)"), utf16le(&variant)));
        }
    };
    text_needle("marker".into(), "Zanzibar");
    text_needle("marker".into(), "Xylophone");
    text_needle("marker".into(), "hunter2");
    text_needle("marker".into(), "zebra crossing");
    text_needle("marker".into(), "filler filler");
    text_needle("key name".into(), "author");
    for d in &docs {
        text_needle(format!("id {}", d.id), &d.id);
    }
    for d in &docs {
        for c in &d.chunks {
            // Every 16-byte window of the vector's little-endian bytes, as given and as the
            // store normalizes it.
            let raw: Vec<u8> = c.embedding.iter().flat_map(|x| x.to_le_bytes()).collect();
            let n = c.embedding.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            let normalized: Vec<u8> = c.embedding.iter().flat_map(|&x| ((x as f64 / n) as f32).to_le_bytes()).collect();
            for bytes in [raw, normalized] {
                for w in bytes.chunks(4).collect::<Vec<_>>().windows(4) {
                    needles.push(("vector window".into(), w.concat()));
                }
            }
        }
    }

    let files = all_files(dir.path());
    assert!(!files.is_empty());
    let mut scanned = 0;
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        scanned += bytes.len();
        for (label, needle) in &needles {
            assert!(!contains(&bytes, needle), "{label} found in {}", file.display());
        }
    }
    // The chunk text alone is over 20 KB: a file this size does hold the (sealed) data.
    assert!(scanned > 12 * 5 * 300, "scanned only {scanned} bytes");
}

/// Every piece of content the store answers with, for comparing before and after tampering.
type Snapshot = (Vec<Option<Document>>, Vec<Vec<Passage>>);

fn snapshot(store: &EncryptedRedbStore, docs: &[Document]) -> Result<Snapshot, StoreError> {
    let got = docs.iter().map(|d| store.get(&d.id)).collect::<Result<Vec<_>, _>>()?;
    let hits = (0..4).map(|q| store.search(&vector(q * 3, 1), 6)).collect::<Result<Vec<_>, _>>()?;
    Ok((got, hits))
}

/// A store of [`corpus`] written to a fresh directory: the directory, the documents, what the
/// file answers once reopened, and the file's bytes.
fn written_store() -> (tempfile::TempDir, Vec<Document>, Snapshot, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.redb");
    let docs = corpus();
    EncryptedRedbStore::open(&path, &key(), DIM).unwrap().upsert(&docs).unwrap();
    let want = snapshot(&EncryptedRedbStore::open(&path, &key(), DIM).unwrap(), &docs).unwrap();
    let original = std::fs::read(&path).unwrap();
    (dir, docs, want, original)
}

/// Flips one byte at a time at positions spread over the whole file (header, tree pages,
/// records, free space). Each altered copy must fail to open with a typed error, or open and
/// answer exactly as the original does. A panic fails the test.
#[test]
fn flipped_bytes_give_typed_errors_or_the_original_data() {
    let (dir, docs, want, original) = written_store();
    let copy = dir.path().join("altered.redb");

    // Every 4 KiB page gets a few hits, including the first bytes (redb's header).
    let mut positions: Vec<usize> = vec![0, 1, 9, 16, 32, 64, 100, 200, 300, 512, 1024, 2048];
    let step = (original.len() / 150).max(1);
    positions.extend((0..original.len()).step_by(step).map(|p| p + (p / step) % 61));
    positions.retain(|&p| p < original.len());

    let (mut failed, mut unchanged) = (0, 0);
    let flips: Vec<(usize, u8)> = positions
        .iter()
        .map(|&p| (p, 0x20))
        .chain((9..10).flat_map(|p| [0x01, 0x02, 0x04, 0x08].map(|m| (p, m))))
        .collect();
    for &(at, mask) in &flips {
        let mut bytes = original.clone();
        bytes[at] ^= mask;
        std::fs::write(&copy, &bytes).unwrap();
        let outcome = EncryptedRedbStore::open(&copy, &key(), DIM).and_then(|s| snapshot(&s, &docs));
        match outcome {
            Ok(got) => {
                assert!(got == want, "byte {at} ^ {mask:#x}: the store opened and answered differently");
                unchanged += 1;
            }
            Err(
                StoreError::Corrupt { .. }
                | StoreError::WrongKey
                | StoreError::UnsupportedFormat(_)
                | StoreError::Db(_),
            ) => {
                failed += 1;
            }
            Err(other) => panic!("byte {at} ^ {mask:#x}: unexpected error kind {other:?}"),
        }
    }
    // Live data is most of a small store: most flips must be caught.
    assert!(failed > positions.len() / 3, "only {failed} of {} flips detected ({unchanged} harmless)", positions.len());
}

/// The file cut short at lengths spread over it (nothing left, inside redb's header, at page
/// boundaries, inside the last page): each must fail to open with a typed error or open and
/// answer exactly as the whole file does. A store cut to nothing must not come back as a new,
/// empty store: that would serve "no documents" where there were twelve.
#[test]
fn truncated_files_give_typed_errors_never_fewer_documents() {
    let (dir, docs, want, original) = written_store();
    let copy = dir.path().join("truncated.redb");

    let len = original.len();
    let mut cuts: Vec<usize> = vec![0, 1, 8, 64, 511, 512, 4095, 4096, 4097, 8192, len - 4096, len - 1];
    cuts.extend((1..40).map(|i| len * i / 40));
    cuts.retain(|&c| c < len);
    cuts.sort_unstable();
    cuts.dedup();
    let mut refused = Vec::new();
    for &cut in &cuts {
        std::fs::write(&copy, &original[..cut]).unwrap();
        match EncryptedRedbStore::open(&copy, &key(), DIM).and_then(|s| snapshot(&s, &docs)) {
            // Only a cut in space no commit uses (the file's unused tail) may leave it whole.
            Ok(got) => assert!(got == want, "cut at {cut} of {len} bytes: the store opened and answered differently"),
            Err(StoreError::Corrupt { .. } | StoreError::Db(_) | StoreError::UnsupportedFormat(_)) => refused.push(cut),
            Err(other) => panic!("cut at {cut} of {len} bytes: unexpected error kind {other:?}"),
        }
    }
    eprintln!("truncation: {} cuts of a {len}-byte store, {} refused at open or read", cuts.len(), refused.len());
    assert!(refused.contains(&0), "a store cut to nothing opened (as a new, empty store)");
    assert!(refused.len() * 2 > cuts.len(), "only {} of {} cuts refused: {refused:?}", refused.len(), cuts.len());
}
