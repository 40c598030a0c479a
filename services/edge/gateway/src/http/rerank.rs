//! `POST /v1/rerank`: Cohere/Jina rerank, `query`, `documents`, `top_n` →
//! `results[{index, relevance_score}]`.

use std::time::Instant;

use axum::{
    Json,
    extract::{State, rejection::JsonRejection},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, RERANKER, St, new_id, observe};

#[derive(Deserialize)]
pub(super) struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<u32>,
    #[serde(default)]
    return_documents: bool,
}

pub(super) async fn rerank(
    State(s): St,
    body: Result<Json<RerankRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let t = Instant::now();
    let r = rerank_inner(&s, body).await;
    observe(&s.metrics, "openai.Rerank", t, &r);
    r.map(Json)
}

async fn rerank_inner(s: &AppState, body: Result<Json<RerankRequest>, JsonRejection>) -> Result<Value, ApiError> {
    let Json(req) = body?;
    if let Some(m) = req.model.as_deref()
        && m != RERANKER
    {
        return Err(ApiError::unknown_model(m));
    }
    if req.query.trim().is_empty() {
        return Err(ApiError::invalid("query is empty").param("query"));
    }
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents is empty").param("documents"));
    }
    let mut docs = Vec::with_capacity(req.documents.len());
    for (i, d) in req.documents.iter().enumerate() {
        let text = match d {
            Value::String(s) => s.clone(),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(ApiError::invalid(format!("documents[{i}] has no string `text`")).param("documents")),
            },
            _ => {
                return Err(ApiError::invalid(format!("documents[{i}] must be a string or {{\"text\": ...}}"))
                    .param("documents"));
            }
        };
        if text.trim().is_empty() {
            return Err(ApiError::invalid(format!("documents[{i}] is empty")).param("documents"));
        }
        docs.push(text);
    }
    let top_n = req.top_n.unwrap_or(0);
    let (order, tokens) = s.pipeline.rerank(&req.query, docs.clone(), top_n).await?;
    let results: Vec<Value> = order
        .into_iter()
        .map(|(i, score)| {
            let mut r = json!({ "index": i, "relevance_score": score });
            if req.return_documents {
                r["document"] = json!({ "text": docs[i] });
            }
            r
        })
        .collect();
    Ok(json!({
        "id": new_id("rerank"),
        "model": RERANKER,
        "results": results,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    }))
}
