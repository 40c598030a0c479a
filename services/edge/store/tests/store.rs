//! The store through its public API: round trips, replacement, deletion, persistence, keys,
//! dimensions, and exact search against a brute-force reference.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::unit;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use store::{Chunk, Document, EncryptedRedbStore, SealingKey, StoreError, VectorStore};

const DIM: usize = 16;

fn key() -> SealingKey {
    SealingKey::from_bytes([7; 32])
}

fn doc(id: &str, texts: &[&str], rng: &mut ChaCha8Rng) -> Document {
    Document {
        id: id.into(),
        title: format!("Title {id}"),
        metadata: BTreeMap::from([("path".to_string(), format!("/docs/{id}.md"))]),
        chunks: texts.iter().map(|t| Chunk { text: t.to_string(), embedding: unit(rng, DIM) }).collect(),
    }
}

fn open(path: &Path) -> EncryptedRedbStore {
    EncryptedRedbStore::open(path, &key(), DIM).unwrap()
}

#[test]
fn upsert_search_get_delete_stats() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let a = doc("a", &["alpha one", "alpha two", "alpha three"], &mut rng);
    let b = doc("b", &["beta one"], &mut rng);
    store.upsert(&[a.clone(), b.clone()]).unwrap();

    let stats = store.stats().unwrap();
    assert_eq!((stats.documents, stats.chunks), (2, 4));
    assert!(stats.bytes_on_disk > 0);

    // A chunk's own embedding finds it first, with cosine 1, fully described.
    let hits = store.search(&a.chunks[1].embedding, 2).unwrap();
    assert_eq!(hits.len(), 2);
    let top = &hits[0];
    assert_eq!(top.passage_id, "a#1");
    assert_eq!((top.document_id.as_str(), top.chunk_index, top.text.as_str()), ("a", 1, "alpha two"));
    assert_eq!(top.title, "Title a");
    assert_eq!(top.metadata, a.metadata);
    assert!((top.score - 1.0).abs() < 1e-5, "{}", top.score);
    assert!(hits[1].score <= top.score);

    // Scaling the query does not change cosine scores.
    let scaled: Vec<f32> = a.chunks[1].embedding.iter().map(|x| x * 40.0).collect();
    assert!((store.search(&scaled, 1).unwrap()[0].score - 1.0).abs() < 1e-5);

    // top_k larger than the store returns everything, sorted.
    let all = store.search(&b.chunks[0].embedding, 100).unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].score >= w[1].score));
    assert!(store.search(&b.chunks[0].embedding, 0).unwrap().is_empty());

    let got = store.get("a").unwrap().unwrap();
    assert_eq!((got.id.as_str(), got.title.as_str()), ("a", "Title a"));
    assert_eq!(got.chunks.len(), 3);
    for (g, want) in got.chunks.iter().zip(&a.chunks) {
        assert_eq!(g.text, want.text);
        for (x, y) in g.embedding.iter().zip(&want.embedding) {
            assert!((x - y).abs() < 1e-6);
        }
    }
    assert!(store.get("missing").unwrap().is_none());

    assert_eq!(store.delete(&["a".to_string(), "nope".to_string()]).unwrap(), 1);
    assert_eq!(store.delete(&["a".to_string()]).unwrap(), 0);
    assert!(store.get("a").unwrap().is_none());
    let rest = store.search(&a.chunks[1].embedding, 10).unwrap();
    assert_eq!(rest.iter().map(|p| p.passage_id.as_str()).collect::<Vec<_>>(), ["b#0"]);
    let stats = store.stats().unwrap();
    assert_eq!((stats.documents, stats.chunks), (1, 1));
}

#[test]
fn re_upserting_an_id_replaces_all_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let old = doc("x", &["old 0", "old 1", "old 2", "old 3"], &mut rng);
    let other = doc("y", &["y 0", "y 1"], &mut rng);
    store.upsert(&[old.clone(), other]).unwrap();
    assert_eq!(store.stats().unwrap().chunks, 6);

    let mut new = doc("x", &["new 0", "new 1"], &mut rng);
    new.title = "Replaced".into();
    new.metadata.clear();
    store.upsert(std::slice::from_ref(&new)).unwrap();

    let stats = store.stats().unwrap();
    assert_eq!((stats.documents, stats.chunks), (2, 4));
    let got = store.get("x").unwrap().unwrap();
    assert_eq!(got.chunks.iter().map(|c| c.text.as_str()).collect::<Vec<_>>(), ["new 0", "new 1"]);
    assert_eq!(got.title, "Replaced");
    assert!(got.metadata.is_empty());
    // Searching with each old chunk's own vector never brings back old text.
    for c in &old.chunks {
        for hit in store.search(&c.embedding, 10).unwrap() {
            assert!(!hit.text.starts_with("old"), "{}", hit.passage_id);
            if hit.document_id == "x" {
                assert_eq!(hit.title, "Replaced");
                assert!(hit.chunk_index < 2);
            }
        }
    }
    // And the replacement survives a reopen the same way.
    drop(store);
    let store = open(&dir.path().join("s.redb"));
    assert_eq!(store.stats().unwrap().chunks, 4);
    assert_eq!(store.get("x").unwrap().unwrap().chunks.len(), 2);
}

#[test]
fn a_batch_is_all_or_nothing_and_the_last_duplicate_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let good = doc("good", &["fine"], &mut rng);
    let mut bad = doc("bad", &["zero vector"], &mut rng);
    bad.chunks[0].embedding = vec![0.0; DIM];
    assert!(matches!(store.upsert(&[good.clone(), bad]), Err(StoreError::InvalidInput(_))));
    let mut nan = doc("nan", &["nan"], &mut rng);
    nan.chunks[0].embedding[3] = f32::NAN;
    assert!(matches!(store.upsert(&[good.clone(), nan]), Err(StoreError::InvalidInput(_))));
    let short = Document { chunks: vec![Chunk { text: "t".into(), embedding: vec![1.0; DIM - 1] }], ..good.clone() };
    assert!(matches!(
        store.upsert(&[good.clone(), short]),
        Err(StoreError::DimensionMismatch { expected: DIM, got: 15 })
    ));
    let empty_id = Document { id: String::new(), ..good.clone() };
    assert!(matches!(store.upsert(&[empty_id]), Err(StoreError::InvalidInput(_))));
    assert_eq!(store.stats().unwrap().documents, 0, "no document of a failed batch is stored");

    let first = doc("dup", &["first"], &mut rng);
    let second = doc("dup", &["second a", "second b"], &mut rng);
    store.upsert(&[first, good, second]).unwrap();
    let got = store.get("dup").unwrap().unwrap();
    assert_eq!(got.chunks.iter().map(|c| c.text.as_str()).collect::<Vec<_>>(), ["second a", "second b"]);
    assert_eq!(store.stats().unwrap().chunks, 3);

    // A document without chunks is stored (and found by id, never by search).
    store.upsert(&[Document { id: "empty".into(), ..Default::default() }]).unwrap();
    assert_eq!(store.get("empty").unwrap().unwrap().chunks.len(), 0);
    assert_eq!(store.stats().unwrap().documents, 3);
}

#[test]
fn persists_across_reopen_and_checks_key_and_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let docs: Vec<Document> =
        (0..20).map(|i| doc(&format!("d{i}"), &["one", "two", "three"][..1 + i % 3], &mut rng)).collect();
    let query = unit(&mut rng, DIM);
    let (before, stats) = {
        let store = open(&path);
        store.upsert(&docs[..10]).unwrap();
        store.upsert(&docs[10..]).unwrap();
        store.delete(&["d3".to_string()]).unwrap();
        (store.search(&query, 8).unwrap(), store.stats().unwrap())
    };
    let store = open(&path);
    let after = store.search(&query, 8).unwrap();
    assert_eq!(before, after);
    let reopened = store.stats().unwrap();
    assert_eq!((reopened.documents, reopened.chunks), (stats.documents, stats.chunks));
    assert_eq!(reopened.documents, 19);
    assert_eq!(store.get("d7").unwrap().unwrap().chunks.len(), docs[7].chunks.len());
    assert!(store.get("d3").unwrap().is_none());
    drop(store);

    match EncryptedRedbStore::open(&path, &SealingKey::from_bytes([8; 32]), DIM) {
        Err(StoreError::WrongKey) => {}
        other => panic!("expected WrongKey, got {:?}", other.err()),
    }
    match EncryptedRedbStore::open(&path, &key(), DIM + 1) {
        Err(StoreError::DimensionMismatch { expected: DIM, got }) => assert_eq!(got, DIM + 1),
        other => panic!("expected DimensionMismatch, got {:?}", other.err()),
    }
    // The failed opens changed nothing.
    assert_eq!(open(&path).stats().unwrap().documents, 19);
}

#[test]
fn queries_of_the_wrong_dimension_or_norm_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    assert!(matches!(store.search(&[1.0; 3], 5), Err(StoreError::DimensionMismatch { expected: DIM, got: 3 })));
    assert!(matches!(store.search(&[0.0; DIM], 5), Err(StoreError::InvalidInput(_))));
    assert!(matches!(EncryptedRedbStore::open(dir.path().join("t.redb"), &key(), 0), Err(StoreError::InvalidInput(_))));
}

/// Exact search against a brute-force cosine in f64, after inserts, replacements and deletes.
#[test]
fn search_matches_brute_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut live: BTreeMap<String, Document> = BTreeMap::new();
    for round in 0..6 {
        let batch: Vec<Document> = (0..60)
            .map(|_| {
                let id = format!("doc{}", rng.random_range(0..150));
                let n = rng.random_range(1..8);
                let texts: Vec<String> = (0..n).map(|c| format!("{id} r{round} c{c}")).collect();
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                doc(&id, &refs, &mut rng)
            })
            .collect();
        store.upsert(&batch).unwrap();
        for d in batch {
            live.insert(d.id.clone(), d);
        }
        let victims: Vec<String> = live.keys().filter(|_| rng.random_bool(0.1)).cloned().collect();
        assert_eq!(store.delete(&victims).unwrap(), victims.len() as u64);
        for v in &victims {
            live.remove(v);
        }
    }
    let total: usize = live.values().map(|d| d.chunks.len()).sum();
    assert_eq!(store.stats().unwrap().chunks as usize, total);

    for _ in 0..40 {
        let q = unit(&mut rng, DIM);
        let mut reference: Vec<(f64, String, &str)> = live
            .values()
            .flat_map(|d| {
                let q = &q;
                d.chunks.iter().enumerate().map(move |(i, c)| {
                    let s: f64 = q.iter().zip(&c.embedding).map(|(a, b)| *a as f64 * *b as f64).sum();
                    (s, format!("{}#{i}", d.id), c.text.as_str())
                })
            })
            .collect();
        reference.sort_by(|a, b| b.0.total_cmp(&a.0));
        let k = 10;
        let got = store.search(&q, k).unwrap();
        assert_eq!(got.len(), k);
        for (g, r) in got.iter().zip(&reference) {
            assert!((g.score as f64 - r.0).abs() < 1e-5, "score {} vs {}", g.score, r.0);
        }
        // Ids agree wherever the reference has no near-tie at that rank.
        for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
            let tied = (i > 0 && reference[i - 1].0 - r.0 < 1e-5) || reference[i + 1].0 > r.0 - 1e-5;
            if !tied {
                assert_eq!(g.passage_id, r.1);
                assert_eq!(g.text, r.2);
            }
        }
    }
}

/// Searches running while documents are replaced always see one committed state: no errors,
/// and every hit's text belongs to the version of the document its title names.
#[test]
fn concurrent_searches_during_upserts_see_consistent_documents() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn VectorStore> = Arc::new(open(&dir.path().join("s.redb")));
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let make = |v: usize, rng: &mut ChaCha8Rng| -> Vec<Document> {
        (0..8)
            .map(|i| {
                let texts: Vec<String> = (0..1 + (v + i) % 4).map(|c| format!("v{v} c{c}")).collect();
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let mut d = doc(&format!("d{i}"), &refs, rng);
                d.title = format!("v{v}");
                d
            })
            .collect()
    };
    store.upsert(&make(0, &mut rng)).unwrap();
    let queries: Vec<Vec<f32>> = (0..16).map(|_| unit(&mut rng, DIM)).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (store, stop, queries) = (store.clone(), stop.clone(), queries.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for hit in store.search(&queries[(n + t) % queries.len()], 20).unwrap() {
                        assert!(hit.text.starts_with(&format!("{} ", hit.title)), "{} vs {}", hit.text, hit.title);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    for v in 1..30 {
        store.upsert(&make(v, &mut rng)).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn key_file_is_created_private_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("sealing.key");
    let store_path = dir.path().join("s.redb");
    let k1 = SealingKey::from_file(&key_path).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let text = std::fs::read_to_string(&key_path).unwrap();
    assert_eq!(text.trim().len(), 64);
    {
        let store = EncryptedRedbStore::open(&store_path, &k1, DIM).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        store.upsert(&[doc("k", &["keyed"], &mut rng)]).unwrap();
    }
    // The same file gives the same key: the store opens.
    let k2 = SealingKey::from_file(&key_path).unwrap();
    assert_eq!(EncryptedRedbStore::open(&store_path, &k2, DIM).unwrap().stats().unwrap().documents, 1);
    // A fresh key file is a different key.
    let k3 = SealingKey::from_file(dir.path().join("other.key")).unwrap();
    assert!(matches!(EncryptedRedbStore::open(&store_path, &k3, DIM), Err(StoreError::WrongKey)));
    // Raw 32 bytes are accepted; anything else is a KeyFile error.
    let raw = dir.path().join("raw.key");
    std::fs::write(&raw, [9u8; 32]).unwrap();
    let from_raw = SealingKey::from_file(&raw).unwrap();
    let hexed = dir.path().join("hex.key");
    std::fs::write(&hexed, format!("{}\n", "09".repeat(32))).unwrap();
    let from_hex = SealingKey::from_file(&hexed).unwrap();
    let probe = dir.path().join("probe.redb");
    drop(EncryptedRedbStore::open(&probe, &from_raw, DIM).unwrap());
    assert!(EncryptedRedbStore::open(&probe, &from_hex, DIM).is_ok(), "hex and raw forms of one key agree");
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "not a key").unwrap();
    assert!(matches!(SealingKey::from_file(&bad), Err(StoreError::KeyFile { .. })));
    assert!(!format!("{:?}", k1).contains(&text.trim()[..8]), "Debug never prints the key");
}
