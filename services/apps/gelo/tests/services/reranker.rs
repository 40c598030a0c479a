use std::sync::Arc;

use api::v1::{RerankRequest, reranker_client::RerankerClient};
use models::{LoadOptions, load_reranker};
use protocol::SealedExecutor;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reranker_process_ranks_like_in_process() {
    let path = model("smollm2-135m-instruct.gguf");
    let p = Proc::start("reranker", &["reranker", "--model", path.to_str().unwrap()], &[]);
    let mut client = RerankerClient::new(connect(&p, Some(identity(&path))).await.channel());
    let query = "What is the capital of France?";
    let docs = [
        "Paris is the capital and largest city of France.",
        "Bananas are rich in potassium.",
        "The Eiffel Tower is in Paris, France's capital.",
    ];
    let got = client
        .rerank(RerankRequest {
            query: query.into(),
            documents: docs.iter().map(|d| d.to_string()).collect(),
            top_n: 2,
            truncate: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.results.len(), 2, "top_n");
    // The service runs the default protection (sealed: int8 products of the quantized
    // weights); in process, the same executor must give the same scores.
    let exec = Arc::new(SealedExecutor::new());
    let local = load_reranker(&path, exec, &LoadOptions::default()).unwrap();
    let want = local.score(query, &docs).unwrap();
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
    for (r, &i) in got.results.iter().zip(&order) {
        assert_eq!(r.index as usize, i);
        assert!((r.score - want[i]).abs() < 1e-3, "score {} vs {}", r.score, want[i]);
    }
    assert!(got.results[0].score >= got.results[1].score);
}
