//! `POST /v1/embeddings`: OpenAI embeddings, `encoding_format` `float` or `base64` (as the
//! official client sends by default).

use std::time::Instant;

use axum::{
    Json,
    extract::{State, rejection::JsonRejection},
};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, EMBEDDER, St, observe};

#[derive(Deserialize)]
pub(super) struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

pub(super) async fn embeddings(
    State(s): St,
    body: Result<Json<EmbeddingsRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let t = Instant::now();
    let r = embeddings_inner(&s, body).await;
    observe(&s.metrics, "openai.Embeddings", t, &r);
    r.map(Json)
}

async fn embeddings_inner(
    s: &AppState,
    body: Result<Json<EmbeddingsRequest>, JsonRejection>,
) -> Result<Value, ApiError> {
    let Json(req) = body?;
    if req.model != EMBEDDER {
        return Err(ApiError::unknown_model(&req.model));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(
                ApiError::invalid(format!("encoding_format `{other}`: use float or base64")).param("encoding_format")
            );
        }
    };
    let texts: Vec<String> = match req.input {
        Value::String(s) => vec![s],
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            items.into_iter().map(|v| v.as_str().unwrap_or_default().to_string()).collect()
        }
        Value::Array(items) if items.is_empty() => return Err(ApiError::invalid("input is empty").param("input")),
        Value::Array(_) => {
            return Err(ApiError::invalid(
                "input must be a string or an array of strings (token arrays are not supported)",
            )
            .param("input"));
        }
        _ => return Err(ApiError::invalid("input must be a string or an array of strings").param("input")),
    };
    if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
        return Err(ApiError::invalid(format!("input[{i}] is empty")).param("input"));
    }
    // Inputs longer than the model's maximum are refused, as OpenAI does.
    let (vectors, tokens) = s.pipeline.embed(&texts, false).await?;
    if let (Some(want), Some(v)) = (req.dimensions, vectors.first())
        && want != v.len()
    {
        return Err(ApiError::invalid(format!("dimensions {want}: this model returns {} dimensions", v.len()))
            .param("dimensions"));
    }
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({ "object": "embedding", "index": i, "embedding": embedding })
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": EMBEDDER,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    }))
}
