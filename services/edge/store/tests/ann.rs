//! The IVF index through the public API: used only above `StoreOptions::ann_threshold`,
//! recall against the exact scan, exact scores, and correct hits after deletes and
//! replacements move rows.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::unit;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use store::{Chunk, Document, EncryptedRedbStore, Passage, SealingKey, StoreError, StoreOptions, VectorStore};

fn key() -> SealingKey {
    SealingKey::from_bytes([9; 32])
}

/// A unit vector at cosine about 0.7 from a random one of `centres`.
fn near(rng: &mut ChaCha8Rng, centres: &[Vec<f32>]) -> Vec<f32> {
    let c = &centres[rng.random_range(0..centres.len())];
    let noise = unit(rng, c.len());
    let v: Vec<f32> = c.iter().zip(&noise).map(|(a, b)| a + b).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

fn docs(prefix: &str, n_docs: usize, chunks: usize, mut vector: impl FnMut() -> Vec<f32>) -> Vec<Document> {
    (0..n_docs)
        .map(|d| Document {
            id: format!("{prefix}{d}"),
            title: String::new(),
            metadata: BTreeMap::new(),
            chunks: (0..chunks).map(|c| Chunk { text: format!("{prefix}{d} c{c}"), embedding: vector() }).collect(),
        })
        .collect()
}

fn open(path: &Path, dim: usize, ann_threshold: usize, nprobe: usize) -> EncryptedRedbStore {
    EncryptedRedbStore::open_with(path, &key(), dim, StoreOptions { ann_threshold, nprobe }).unwrap()
}

fn ids_and_scores(hits: &[Passage]) -> Vec<(String, u32)> {
    hits.iter().map(|h| (h.passage_id.clone(), h.score.to_bits())).collect()
}

/// Up to the threshold a store with ANN options answers exactly like one without; one chunk
/// past it (with one list probed, on structureless vectors) it does not, and back at the
/// threshold it does again.
#[test]
fn the_threshold_is_respected() {
    let dim = 32;
    let dir = tempfile::tempdir().unwrap();
    let exact = EncryptedRedbStore::open(dir.path().join("exact.redb"), &key(), dim).unwrap();
    let ann = open(&dir.path().join("ann.redb"), dim, 2000, 1);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let batch = docs("d", 200, 10, || unit(&mut rng, dim));
    for store in [&exact, &ann] {
        store.upsert(&batch).unwrap();
    }
    let queries: Vec<Vec<f32>> = (0..20).map(|_| unit(&mut rng, dim)).collect();
    let same = |a: &EncryptedRedbStore, b: &EncryptedRedbStore| {
        queries.iter().all(|q| ids_and_scores(&a.search(q, 10).unwrap()) == ids_and_scores(&b.search(q, 10).unwrap()))
    };
    assert!(same(&exact, &ann), "at the threshold (2000 chunks) search must be exact");

    let extra = docs("x", 1, 1, || unit(&mut rng, dim));
    for store in [&exact, &ann] {
        store.upsert(&extra).unwrap();
    }
    assert!(!same(&exact, &ann), "2001 chunks, nprobe 1: the index should have been used and missed some");
    // Approximate, but still k hits with exact scores.
    for q in &queries {
        let hits = ann.search(q, 10).unwrap();
        assert_eq!(hits.len(), 10);
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    }

    for store in [&exact, &ann] {
        assert_eq!(store.delete(&["x0".to_string()]).unwrap(), 1);
    }
    assert!(same(&exact, &ann), "back at the threshold search must be exact again");
    // The same across a reopen: no index is built at open below the threshold.
    drop(ann);
    let ann = open(&dir.path().join("ann.redb"), dim, 2000, 1);
    assert!(same(&exact, &ann));
    assert!(matches!(
        EncryptedRedbStore::open_with(
            dir.path().join("z.redb"),
            &key(),
            dim,
            StoreOptions { ann_threshold: 0, nprobe: 0 }
        ),
        Err(StoreError::InvalidInput(_))
    ));
}

/// recall@10 of the index against the exact scan on 20,000 clustered vectors, with the index
/// built during ingest (and 9,000 rows assigned after it) and then rebuilt at open.
#[test]
fn recall_at_10_against_the_exact_scan() {
    let (dim, k) = (64, 10);
    let dir = tempfile::tempdir().unwrap();
    let exact = EncryptedRedbStore::open(dir.path().join("exact.redb"), &key(), dim).unwrap();
    let path = dir.path().join("ann.redb");
    let ann = open(&path, dim, 10_000, 8);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let centres: Vec<Vec<f32>> = (0..200).map(|_| unit(&mut rng, dim)).collect();
    let all = docs("d", 2000, 10, || near(&mut rng, &centres));
    for batch in all.chunks(100) {
        exact.upsert(batch).unwrap();
        ann.upsert(batch).unwrap();
    }
    let queries: Vec<Vec<f32>> = (0..200).map(|_| near(&mut rng, &centres)).collect();
    let want: Vec<Vec<Passage>> = queries.iter().map(|q| exact.search(q, k).unwrap()).collect();
    let recall = |store: &EncryptedRedbStore| {
        let mut found = 0;
        for (q, want) in queries.iter().zip(&want) {
            let got = store.search(q, k).unwrap();
            assert_eq!(got.len(), k);
            for g in &got {
                // A hit the exact scan also found carries exactly its score.
                if let Some(w) = want.iter().find(|w| w.passage_id == g.passage_id) {
                    assert_eq!(g.score.to_bits(), w.score.to_bits());
                    found += 1;
                }
                let chunk = &all[g.document_id[1..].parse::<usize>().unwrap()].chunks[g.chunk_index as usize];
                assert_eq!(g.text, chunk.text);
            }
        }
        found as f64 / (queries.len() * k) as f64
    };
    let during = recall(&ann);
    assert!(during >= 0.95, "recall@10 after ingest {during}");
    drop(ann);
    let ann = open(&path, dim, 10_000, 8);
    let reopened = recall(&ann);
    assert!(reopened >= 0.95, "recall@10 after reopen {reopened}");
}

/// Above the threshold, after deletes and replacements (each moves rows): every live chunk's
/// own vector finds that chunk first, and no deleted or replaced chunk is ever returned.
#[test]
fn deletes_and_moves_keep_hits_correct() {
    let dim = 16;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"), dim, 1000, 2);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut live: BTreeMap<String, Document> = BTreeMap::new();
    let first = docs("d", 300, 8, || unit(&mut rng, dim));
    store.upsert(&first).unwrap();
    live.extend(first.into_iter().map(|d| (d.id.clone(), d)));
    let mut gone: Vec<Vec<f32>> = Vec::new();
    for round in 0..4 {
        let victims: Vec<String> = live.keys().filter(|_| rng.random_bool(0.15)).cloned().collect();
        assert_eq!(store.delete(&victims).unwrap(), victims.len() as u64);
        for v in &victims {
            gone.extend(live.remove(v).unwrap().chunks.into_iter().map(|c| c.embedding));
        }
        // Replacements under old ids and some new documents.
        let mut batch = docs(&format!("n{round}-"), 30, 8, || unit(&mut rng, dim));
        for (i, id) in live.keys().take(20).enumerate() {
            batch.push(Document {
                id: id.clone(),
                ..docs(&format!("r{round}-{i}"), 1, 5, || unit(&mut rng, dim)).remove(0)
            });
        }
        for d in &batch {
            if let Some(old) = live.insert(d.id.clone(), d.clone()) {
                gone.extend(old.chunks.into_iter().map(|c| c.embedding));
            }
        }
        store.upsert(&batch).unwrap();
    }
    let total: usize = live.values().map(|d| d.chunks.len()).sum();
    assert!(total > 1000, "{total} chunks: the test must run above the threshold");
    assert_eq!(store.stats().unwrap().chunks as usize, total);
    for d in live.values() {
        for (i, c) in d.chunks.iter().enumerate() {
            let top = &store.search(&c.embedding, 1).unwrap()[0];
            assert_eq!(
                (top.passage_id.as_str(), top.text.as_str()),
                (format!("{}#{i}", d.id).as_str(), c.text.as_str())
            );
            assert!((top.score - 1.0).abs() < 1e-5);
        }
    }
    for v in &gone {
        for hit in store.search(v, 5).unwrap() {
            let d = live.get(&hit.document_id).expect("a deleted document was returned");
            assert_eq!(hit.text, d.chunks[hit.chunk_index as usize].text, "a replaced chunk was returned");
        }
    }
}
