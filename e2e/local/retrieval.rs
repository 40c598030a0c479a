//! SciFact through the gateway: every corpus document ingested as one passage embedded like
//! the embedder's own BEIR evaluation (`title + " " + text`, truncated to 256 tokens), the
//! test queries through `Search`, and nDCG@10 / Recall@100 compared with
//! `models::beir::evaluate` on the same documents, in process, masked.
//!
//! CI runs a deterministic subset — every judged document plus the first
//! `GELO_E2E_SCIFACT_OTHERS` (default 100) others, with all 300 test queries — because
//! embedding 5,183 abstracts twice takes many minutes on two cores. That subset is in the
//! repository, `e2e/data/scifact` (379 documents; README there: source, CC BY-NC 2.0 license,
//! and `scripts/scifact_subset.py`, which cuts it from the full BEIR folder), and is read by
//! default. `GELO_SCIFACT=DIR` reads another BEIR SciFact folder instead: the full one is
//! needed for `GELO_E2E_SCIFACT_FULL=1` (the whole corpus) and for `GELO_E2E_SCIFACT_OTHERS`
//! above 100. `gelo rag eval` is the same measurement as a command (docs/BENCHMARKS.md).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    io::BufRead,
    path::PathBuf,
    sync::Arc,
};

use api::v1::{Chunking, Document, SearchRequest, rag_client::RagClient};
use futures::StreamExt;
use kernels::CpuEngine;
use models::{LoadOptions, beir, load_embedder};
use protocol::{MaskedConfig, MaskedExecutor};
use tonic::transport::Channel;

use crate::stack::*;

/// The BEIR SciFact folder: `GELO_SCIFACT`, else the subset in the repository.
fn scifact() -> PathBuf {
    let dir = std::env::var_os("GELO_SCIFACT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into()))
            .join("../../../e2e/data/scifact")
    });
    assert!(
        dir.join("corpus.jsonl").exists(),
        "SciFact is missing at {} (the subset is e2e/data/scifact; set GELO_SCIFACT to a BEIR SciFact folder)",
        dir.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scifact_search_through_the_gateway_ranks_like_the_embedders_own_evaluation() {
    let dir = scifact();
    let mut data = beir::BeirData::load(&dir).unwrap();
    let full = std::env::var("GELO_E2E_SCIFACT_FULL").is_ok_and(|v| v == "1");
    let others: usize = std::env::var("GELO_E2E_SCIFACT_OTHERS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let judged: HashSet<String> = data.qrels.values().flat_map(|m| m.keys().cloned()).collect();
    assert!(
        !full || data.corpus.len() >= 5_000,
        "GELO_E2E_SCIFACT_FULL=1 needs the whole SciFact corpus (5,183 documents), but {} holds {}: \
         set GELO_SCIFACT to a full BEIR SciFact folder",
        dir.display(),
        data.corpus.len()
    );
    assert!(
        others <= 100 || data.corpus.len() >= 5_000,
        "GELO_E2E_SCIFACT_OTHERS={others} needs more of the corpus than the subset in {} holds: \
         set GELO_SCIFACT to a full BEIR SciFact folder",
        dir.display()
    );

    // The corpus with title and text apart (the gateway joins them as BEIR does).
    let mut corpus: Vec<(String, String, String)> = Vec::new();
    let f = std::fs::File::open(dir.join("corpus.jsonl")).unwrap();
    for line in std::io::BufReader::new(f).lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let id = v["_id"].as_str().unwrap().to_string();
        let (title, text) = (v["title"].as_str().unwrap_or("").to_string(), v["text"].as_str().unwrap().to_string());
        if full || corpus.len() < others || judged.contains(&id) {
            corpus.push((id, title, text));
        }
    }
    let keep: HashSet<&str> = corpus.iter().map(|(id, _, _)| id.as_str()).collect();
    data.corpus.retain(|(id, _)| keep.contains(id.as_str()));
    assert_eq!(data.corpus.len(), corpus.len());
    assert_eq!(data.queries.len(), 300, "SciFact's test queries");

    let e = service("retrieval-embedder", "embedder", &minilm(), &[], &[]);
    let id = hex_identity(&minilm());
    let data_dir = tempfile::tempdir().unwrap();
    let gw = gateway("retrieval-gateway", data_dir.path(), &["--embedder", &e.target(), "--embedder-identity", &id]);
    let mut client = rag(&gw).await;

    // Ingest: one passage per document, as BEIR embeds it.
    let docs: Vec<Document> = corpus
        .iter()
        .map(|(id, title, text)| Document { chunking: Chunking::Whole as i32, ..doc(id, title, text) })
        .collect();
    let t = std::time::Instant::now();
    let summary = ingest(&mut client, docs).await.expect("ingest");
    eprintln!("ingest through the gateway: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(summary.documents as usize, corpus.len(), "skipped: {:?}", summary.skipped);
    assert_eq!(summary.chunks as usize, corpus.len(), "one passage per document");

    // Every test query through Search, 100 deep, no reranking.
    let results = search_all(&client, &data.queries).await;
    let ranked: BTreeMap<String, Vec<String>> = results.iter().map(|(q, ids, _)| (q.clone(), ids.clone())).collect();
    let (ndcg, recall) = beir::metrics(&ranked, &data.qrels);

    // The embedder's own evaluation of the same documents, in process, masked: the steps of
    // `beir::evaluate` (embed_all, search 100 deep, metrics), kept apart to compare rankings too.
    let t = std::time::Instant::now();
    let exec = Arc::new(MaskedExecutor::new(Arc::new(CpuEngine::new()), MaskedConfig::default()).unwrap());
    let local = load_embedder(&minilm(), exec, &LoadOptions::default()).unwrap();
    let docs_text: Vec<&str> = data.corpus.iter().map(|(_, t)| t.as_str()).collect();
    let qs: Vec<&str> = data.queries.iter().map(|(_, t)| t.as_str()).collect();
    let corpus_vecs = beir::embed_all(local.as_ref(), &docs_text, 32, |_| {}).unwrap();
    let query_vecs = beir::embed_all(local.as_ref(), &qs, 32, |_| {}).unwrap();
    let hits = beir::search(&query_vecs, &corpus_vecs, 100);
    let reference: BTreeMap<String, Vec<String>> = data
        .queries
        .iter()
        .zip(&hits)
        .map(|((qid, _), h)| (qid.clone(), h.iter().map(|(i, _)| data.corpus[*i].0.clone()).collect()))
        .collect();
    let (ref_ndcg, ref_recall) = beir::metrics(&reference, &data.qrels);
    eprintln!("in-process evaluation: {:.1} s", t.elapsed().as_secs_f64());
    eprintln!(
        "SciFact ({} documents, {} queries): gateway nDCG@10 {ndcg:.4} Recall@100 {recall:.4}; in process {ref_ndcg:.4} / {ref_recall:.4}",
        corpus.len(),
        data.queries.len(),
    );
    // Masks are fresh random matrices per forward pass, so the two runs differ in the last
    // float bits: only near-ties can swap. The metrics must agree to that noise.
    assert!((ndcg - ref_ndcg).abs() < 2e-3, "nDCG@10: gateway {ndcg} vs in-process {ref_ndcg}");
    assert!((recall - ref_recall).abs() < 2e-3, "Recall@100: gateway {recall} vs in-process {ref_recall}");
    assert!(ndcg > 0.5, "MiniLM on SciFact scores about 0.65 nDCG@10, got {ndcg}");

    // The rankings themselves. Each masked run perturbs cosines by up to a few 1e-3, so two
    // documents closer than that may swap; anything more is a real difference. Position by
    // position, the gateway's document must score (in process) within that noise of the
    // in-process document at the same rank.
    const NOISE: f32 = 5e-3;
    let by_q: HashMap<&str, &(String, Vec<String>, Vec<f32>)> = results.iter().map(|r| (r.0.as_str(), r)).collect();
    let row: HashMap<&str, usize> = data.corpus.iter().enumerate().map(|(i, (id, _))| (id.as_str(), i)).collect();
    let dot = |q: &[f32], d: &[f32]| q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>();
    let mut same = 0;
    for (qi, ((qid, _), h)) in data.queries.iter().zip(&hits).enumerate() {
        let (_, got, scores) = by_q[qid.as_str()];
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "query {qid}: scores not sorted");
        assert_eq!(got.len(), 100);
        if got.iter().take(10).eq(reference[qid].iter().take(10)) {
            same += 1;
        }
        for (rank, id) in got.iter().take(10).enumerate() {
            let theirs = dot(&query_vecs[qi], &corpus_vecs[row[id.as_str()]]);
            let ours = h[rank].1;
            assert!(
                (theirs - ours).abs() < NOISE,
                "query {qid} rank {rank}: gateway has {id} ({theirs}), in process {} ({ours})",
                data.corpus[h[rank].0].0
            );
        }
    }
    eprintln!("identical top-10 lists: {same} of {}", data.queries.len());
    assert!(
        same * 100 >= data.queries.len() * 80,
        "identical top-10 for only {same} of {} queries",
        data.queries.len()
    );
    drop(gw);
}

/// Every query through the gateway's Search, 100 deep, not reranked, 4 at a time: per query
/// its id, the document ids and their scores.
async fn search_all(client: &RagClient<Channel>, queries: &[(String, String)]) -> Vec<(String, Vec<String>, Vec<f32>)> {
    futures::stream::iter(queries.to_vec())
        .map(|(qid, text)| {
            let mut c = client.clone();
            async move {
                let r = c
                    .search(SearchRequest { query: text, top_k: 100, rerank: Some(false) })
                    .await
                    .expect("search")
                    .into_inner();
                assert!(r.passages.iter().all(|p| p.rerank_score.is_none()));
                (
                    qid,
                    r.passages.iter().map(|p| p.document_id.clone()).collect(),
                    r.passages.iter().map(|p| p.score).collect(),
                )
            }
        })
        .buffered(4)
        .collect()
        .await
}
