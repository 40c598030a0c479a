//! The gateway SIGKILLed in the middle of an ingest: after a restart the store holds every
//! acknowledged document, whole, and no document in part; its index agrees with its records;
//! re-sending the cut-off ingest stores each document once; and the store's files hold none
//! of the ingested text nor any stored vector in the clear.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use api::v1::{Chunking, SearchRequest};

use store::{EncryptedRedbStore, SealingKey, VectorStore};

use crate::stack::*;

const DOCS_PER_CALL: usize = 24;

fn id_of(call: usize, i: usize) -> String {
    format!("crash-doc-{call}-{i}")
}

fn text_of(call: usize, i: usize) -> String {
    // ~500 tokens: three passages of 200 tokens with overlap, so a document is several records.
    paragraph(&format!("subject {call}-{i} zebrafish regeneration study"), 22)
}

/// The index agrees with the records: as many documents and chunks as the records hold, and
/// each document's first passage found by its own vector.
fn index_agrees_with_records(store: &EncryptedRedbStore, in_flight: usize, documents: usize, chunks: usize) {
    let st = store.stats().unwrap();
    assert_eq!((st.documents as usize, st.chunks as usize), (documents, chunks), "index and records disagree");
    for call in 0..=in_flight {
        for i in (0..DOCS_PER_CALL).step_by(5) {
            let id = id_of(call, i);
            if let Some(d) = store.get(&id).unwrap() {
                let hit = &store.search(&d.chunks[0].embedding, 1).unwrap()[0];
                assert_eq!((hit.document_id.as_str(), hit.chunk_index), (id.as_str(), 0), "{id}: the index lost it");
            }
        }
    }
}

/// Re-sends the call that was cut off, twice, through a gateway restarted once more: every
/// document of every call is then stored once, whole, and the second sending changes
/// nothing (an id is a document's identity; re-ingesting replaces it).
async fn resend_is_idempotent(data: &std::path::Path, backend: &[&str], in_flight: usize) {
    let gw = gateway("crash-gateway-resend", data, backend);
    let mut client = rag(&gw).await;
    let resend = |call: usize| -> Vec<api::v1::Document> {
        (0..DOCS_PER_CALL).map(|i| doc(&id_of(call, i), &format!("Study {call}-{i}"), &text_of(call, i))).collect()
    };
    let mut counts = Vec::new();
    for _ in 0..2 {
        let s = ingest(&mut client, resend(in_flight)).await.expect("the re-sent ingest");
        assert_eq!(s.documents as usize, DOCS_PER_CALL, "{:?}", s.skipped);
        let st = stats(&mut client).await;
        counts.push((st.documents, st.chunks));
    }
    assert_eq!(counts[0], counts[1], "a second identical ingest changed the store");
    assert_eq!(counts[0].0 as usize, (in_flight + 1) * DOCS_PER_CALL, "every call's documents, each once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_during_ingest_keeps_every_acknowledged_document_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let e = service("crash-embedder", "embedder", &minilm(), &[], &[]);
    let backend = ["--embedder", &e.target(), "--embedder-identity", &hex_identity(&minilm())];
    let mut gw = gateway("crash-gateway", &data, &backend);
    let client = rag(&gw).await;

    // Ingest calls back to back, each acknowledged on its own; SIGKILL lands in one of them.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (mut client, acked, calls) = (client.clone(), acked.clone(), calls.clone());
        tokio::spawn(async move {
            let mut call = 0;
            loop {
                calls.store(call + 1, Ordering::SeqCst);
                let docs = (0..DOCS_PER_CALL)
                    .map(|i| doc(&id_of(call, i), &format!("Study {call}-{i}"), &text_of(call, i)))
                    .collect();
                match ingest(&mut client, docs).await {
                    Ok(s) => {
                        assert_eq!(s.documents as usize, DOCS_PER_CALL, "{:?}", s.skipped);
                        acked.lock().unwrap().extend((0..DOCS_PER_CALL).map(|i| id_of(call, i)));
                    }
                    Err(status) => return (call, status),
                }
                call += 1;
            }
        })
    };
    eventually(Duration::from_secs(300), "two ingest calls acknowledged", || {
        let n = acked.lock().unwrap().len();
        async move { n >= 2 * DOCS_PER_CALL }
    })
    .await;
    // Kill inside a call, after it committed its first transaction (a call is three batches
    // of whole documents) and before it is acknowledged: the hardest moment for "no partial".
    let watcher = client.clone();
    eventually(Duration::from_secs(300), "a call has committed part of its documents", || {
        let n = acked.lock().unwrap().len();
        let mut w = watcher.clone();
        async move { stats(&mut w).await.documents as usize > n }
    })
    .await;
    gw.kill();
    let (in_flight, status) = writer.await.unwrap();
    assert_ne!(status.code(), tonic::Code::Ok);
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), in_flight * DOCS_PER_CALL);

    // Restart on the same data: everything acknowledged is served.
    let gw = gateway("crash-gateway-restarted", &data, &backend);
    let mut client = rag(&gw).await;
    let st = stats(&mut client).await;
    assert!(st.documents as usize >= acked.len(), "{} stored, {} acknowledged", st.documents, acked.len());
    let hit = client
        .search(SearchRequest { query: "subject 0-3 zebrafish regeneration study".into(), top_k: 1, rerank: None })
        .await
        .unwrap();
    assert_eq!(hit.into_inner().passages[0].document_id, id_of(0, 3));
    let stored_documents = st.documents as usize;
    drop(client);
    drop(gw); // SIGKILL again; the store must open cleanly below as well

    // Open the store directly (same key file) and check every document record.
    let key = SealingKey::from_file(data.join("sealing.key")).unwrap();
    let store = EncryptedRedbStore::open(data.join("store.redb"), &key, 384).unwrap();
    let chunker = gateway::chunker::Chunker::load(&minilm(), 200, 40).unwrap();
    let mut present = 0;
    let mut vectors: Vec<Vec<f32>> = Vec::new();
    for call in 0..=in_flight {
        for i in 0..DOCS_PER_CALL {
            let id = id_of(call, i);
            let want = chunker.plan(&format!("Study {call}-{i}"), &text_of(call, i), Chunking::Tokens).unwrap();
            assert!(want.len() >= 3, "test documents span several passages");
            match store.get(&id).unwrap() {
                Some(d) => {
                    present += 1;
                    let texts: Vec<&str> = d.chunks.iter().map(|c| c.text.as_str()).collect();
                    let expected: Vec<&str> = want.iter().map(|p| p.text.as_str()).collect();
                    assert_eq!(texts, expected, "{id} is stored in part or altered");
                    vectors.extend(d.chunks.iter().map(|c| c.embedding.clone()));
                }
                None => assert!(!acked.contains(&id), "acknowledged {id} is missing"),
            }
        }
    }
    assert_eq!(present, stored_documents, "the store holds documents this test did not write");
    index_agrees_with_records(&store, in_flight, present, vectors.len());
    eprintln!(
        "crash: {} acknowledged, {} stored, {} of the {} in the killed call",
        acked.len(),
        present,
        present - acked.len(),
        DOCS_PER_CALL
    );
    drop(store);

    resend_is_idempotent(&data, &backend, in_flight).await;

    // At rest: no ingested text and no stored vector appears in any file of the data dir.
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(&data).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() != "sealing.key" {
            bytes.extend(std::fs::read(&p).unwrap());
        }
    }
    assert!(bytes.len() > present * 3 * 384 * 4, "the store is smaller than its vectors: {} bytes", bytes.len());
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    for call in [0, in_flight.saturating_sub(1)] {
        for i in [0, DOCS_PER_CALL - 1] {
            let text = text_of(call, i);
            for probe in [&text[..40], &text[200..240], &format!("Study {call}-{i}")[..]] {
                assert!(!contains(probe.as_bytes()), "plaintext {probe:?} found in the store files");
            }
            assert!(!contains(id_of(call, i).as_bytes()), "a document id in the clear");
        }
    }
    for v in vectors.iter().step_by(7) {
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        for window in [&raw[..16], &raw[raw.len() / 2..raw.len() / 2 + 16]] {
            assert!(!contains(window), "a stored vector's bytes appear in the clear");
        }
    }
}
