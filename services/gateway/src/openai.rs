//! The OpenAI-compatible HTTP API, so existing clients work unchanged:
//!
//! | route | shape |
//! |---|---|
//! | `POST /v1/embeddings` | OpenAI embeddings (`encoding_format` `float` or `base64`, as the official client sends by default) |
//! | `POST /v1/chat/completions` | OpenAI chat completions, `stream: true` as server-sent events ending in `data: [DONE]` |
//! | `POST /v1/rerank` | Cohere/Jina rerank: `query`, `documents`, `top_n` → `results[{index, relevance_score}]` |
//! | `GET /v1/models` | the models below |
//! | `GET /openapi.json` | the OpenAPI 3.0 document of these routes (`openapi.json` beside this file) |
//!
//! The same router serves GELO's own routes: `POST /v1/documents` ([`crate::documents`]),
//! `GET /v1/trust` ([`crate::trust`]) and the web console at `/` ([`crate::console`]).
//!
//! Models: `gelo-embedder`, `gelo-reranker`, `gelo-generator` (plain chat) and `gelo-rag`:
//! chat completions answered from the document store — the last user message is the
//! question, the answer cites passage ids, and the response carries the passages
//! (`passages`) and checked citations (`citations`, `unknown_citations`) as extra fields.
//!
//! Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the
//! matching HTTP status. Plain HTTP: bind it to loopback (the default) or put it behind
//! something that terminates TLS inside the same trust boundary.

use std::{
    convert::Infallible,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use api::v1::{ChatMessage, FinishReason, GenerateRequest};
use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, State, rejection::JsonRejection},
    http::StatusCode,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use base64::Engine as _;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use server::Metrics;
use tonic::Code;

use crate::{
    error::GatewayError,
    pipeline::{Hit, Pipeline, QueryEvent, QueryParams},
    roles::Role,
};

pub const EMBEDDER: &str = "gelo-embedder";
pub const RERANKER: &str = "gelo-reranker";
pub const GENERATOR: &str = "gelo-generator";
pub const RAG: &str = "gelo-rag";

/// Largest request body.
const MAX_BODY: usize = 16 << 20;

pub(crate) struct AppState {
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) metrics: Metrics,
}

pub(crate) type St = State<Arc<AppState>>;

pub fn router(pipeline: Arc<Pipeline>, metrics: Metrics) -> Router {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/rerank", post(rerank))
        .route("/v1/models", get(models))
        .route("/openapi.json", get(openapi))
        .route("/v1/documents", post(crate::documents::add))
        .route("/v1/trust", get(crate::trust::report))
        .merge(crate::console::routes())
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", "no such route")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Arc::new(AppState { pipeline, metrics }))
}

// ---------------------------------------------------------------------------------------
// Errors

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, code, message: message.into(), param: None }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request", message)
    }

    pub(crate) fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The same error, its message followed by `context`.
    pub(crate) fn context(mut self, context: impl std::fmt::Display) -> Self {
        self.message = format!("{}; {context}", self.message);
        self
    }

    fn unknown_model(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist"),
        )
        .param("model")
    }

    fn body(&self) -> Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }

    /// The gRPC code this error would be, for the metrics.
    fn grpc_code(&self) -> Code {
        match self.status.as_u16() {
            400 | 404 | 405 | 413 | 415 | 422 => Code::InvalidArgument,
            429 => Code::ResourceExhausted,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        let message = e.to_string();
        match e.code() {
            Code::InvalidArgument | Code::OutOfRange => Self::invalid(message),
            Code::FailedPrecondition => {
                Self::new(StatusCode::CONFLICT, "invalid_request_error", "failed_precondition", message)
            }
            Code::NotFound => Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message),
            Code::ResourceExhausted => {
                Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "overloaded", message)
            }
            Code::Unavailable => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "service_unavailable", message)
            }
            Code::DeadlineExceeded => Self::new(StatusCode::GATEWAY_TIMEOUT, "server_error", "timeout", message),
            Code::DataLoss => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "integrity_failure", message)
            }
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", message),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "unsupported_media_type",
                "send Content-Type: application/json",
            ),
            JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                format!("the request body exceeds {MAX_BODY} bytes"),
            ),
            other => Self::invalid(format!("invalid JSON body: {}", other.body_text())),
        }
    }
}

/// Records the outcome of one HTTP call in the gateway's metrics.
pub(crate) fn observe<T>(m: &Metrics, method: &str, t: Instant, r: &Result<T, ApiError>) {
    let code = r.as_ref().map_or_else(ApiError::grpc_code, |_| Code::Ok);
    m.observe(method, code, t.elapsed().as_secs_f64());
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", hex::encode(&attest::random_nonce()[..12]))
}

// ---------------------------------------------------------------------------------------
// /openapi.json

/// The OpenAPI document of this router; CI fuzzes the running gateway against it.
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

// ---------------------------------------------------------------------------------------
// /v1/models

async fn models(State(s): St) -> Json<Value> {
    let pool = &s.pipeline.pool;
    let mut ids = Vec::new();
    if pool.configured(Role::Embedder) {
        ids.push(EMBEDDER);
    }
    if pool.configured(Role::Reranker) {
        ids.push(RERANKER);
    }
    if pool.configured(Role::Generator) {
        ids.push(GENERATOR);
        if pool.configured(Role::Embedder) {
            ids.push(RAG);
        }
    }
    let data: Vec<Value> =
        ids.iter().map(|id| json!({ "id": id, "object": "model", "created": 0, "owned_by": "gelo" })).collect();
    Json(json!({ "object": "list", "data": data }))
}

// ---------------------------------------------------------------------------------------
// /v1/embeddings

#[derive(Deserialize)]
struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

async fn embeddings(
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

// ---------------------------------------------------------------------------------------
// /v1/rerank

#[derive(Deserialize)]
struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<u32>,
    #[serde(default)]
    return_documents: bool,
}

async fn rerank(State(s): St, body: Result<Json<RerankRequest>, JsonRejection>) -> Result<Json<Value>, ApiError> {
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

// ---------------------------------------------------------------------------------------
// /v1/chat/completions

#[derive(Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<InMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    tools: Option<Value>,
    // gelo-rag only.
    #[serde(default)]
    top_k: Option<u32>,
    #[serde(default)]
    rerank: Option<bool>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

/// Text of a message: a string, or the text parts of a content array.
fn content_text(i: usize, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(format!("messages[{i}].content: only text parts are supported"))
                            .param("messages"));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid(format!("messages[{i}].content must be a string or an array of text parts"))
            .param("messages")),
    }
}

fn finish_reason(code: i32) -> &'static str {
    if code == FinishReason::Length as i32 { "length" } else { "stop" }
}

fn passages_json(hits: &[Hit]) -> Value {
    Value::Array(
        hits.iter()
            .map(|h| {
                json!({
                    "id": h.passage.passage_id,
                    "document_id": h.passage.document_id,
                    "title": h.passage.title,
                    "text": h.passage.text,
                    "score": h.passage.score,
                    "rerank_score": h.rerank_score,
                })
            })
            .collect(),
    )
}

/// What a chat completion streams, whichever backend path produced it.
enum Piece {
    Passages(Value),
    Text(String),
    Finish(&'static str),
    Usage { prompt: u32, completion: u32 },
    Citations { cited: Vec<String>, unknown: Vec<String> },
}

async fn chat(State(s): St, body: Result<Json<ChatRequest>, JsonRejection>) -> Response {
    let t = Instant::now();
    let prepared = prepare_chat(&s, body);
    let (req, rag) = match prepared {
        Ok(p) => p,
        Err(e) => {
            s.metrics.observe("openai.ChatCompletions", e.grpc_code(), t.elapsed().as_secs_f64());
            return e.into_response();
        }
    };
    let model = req.model.clone();
    let stream_mode = req.stream;
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let pieces = start_chat(&s, req, rag);
    let (id, created) = (new_id("chatcmpl"), now());
    if stream_mode {
        sse(s.clone(), pieces, id, created, model, include_usage, t).into_response()
    } else {
        let r = collect(pieces, &id, created, &model).await;
        observe(&s.metrics, "openai.ChatCompletions", t, &r);
        match r {
            Ok(v) => Json(v).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// Validates a chat request; `true` when it is a RAG question.
fn prepare_chat(s: &AppState, body: Result<Json<ChatRequest>, JsonRejection>) -> Result<(ChatRequest, bool), ApiError> {
    let Json(req) = body?;
    let rag = match req.model.as_str() {
        RAG => true,
        GENERATOR => false,
        other => return Err(ApiError::unknown_model(other)),
    };
    if rag && !s.pipeline.pool.configured(Role::Embedder) {
        return Err(ApiError::unknown_model(RAG));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported").param("n"));
    }
    if req.tools.as_ref().is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(ApiError::invalid("tools are not supported").param("tools"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages is empty").param("messages"));
    }
    for (i, m) in req.messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant") {
            return Err(ApiError::invalid(format!(
                "messages[{i}].role `{}` is not supported (system, developer, user, assistant)",
                m.role
            ))
            .param("messages"));
        }
        content_text(i, &m.content)?;
    }
    if let Some(t) = req.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(ApiError::invalid("temperature must be between 0 and 2").param("temperature"));
    }
    if let Some(p) = req.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(ApiError::invalid("top_p must be in (0, 1]").param("top_p"));
    }
    if let Some(stop) = &req.stop
        && !(stop.is_null() || stop.is_string() || stop.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
    {
        return Err(ApiError::invalid("stop must be a string or an array of strings").param("stop"));
    }
    if rag && !req.messages.iter().any(|m| m.role == "user") {
        return Err(ApiError::invalid("gelo-rag needs a user message: the question").param("messages"));
    }
    Ok((req, rag))
}

/// Starts the generation (plain or RAG) and streams its pieces; errors end the stream.
fn start_chat(s: &Arc<AppState>, req: ChatRequest, rag: bool) -> tokio::sync::mpsc::Receiver<Result<Piece, ApiError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let pipeline = s.pipeline.clone();
    let max_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(0);
    // OpenAI's default temperature is 1.
    let temperature = req.temperature.unwrap_or(1.0);
    let messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| ChatMessage {
            role: if m.role == "developer" { "system".into() } else { m.role.clone() },
            content: content_text(i, &m.content).unwrap_or_default(),
        })
        .collect();
    tokio::spawn(async move {
        let send = |p: Result<Piece, ApiError>| {
            let tx = tx.clone();
            async move { tx.send(p).await.is_ok() }
        };
        if rag {
            let question =
                messages.iter().rev().find(|m| m.role == "user").map(|m| m.content.clone()).unwrap_or_default();
            let params = QueryParams {
                question,
                top_k: req.top_k.unwrap_or(0),
                max_tokens,
                temperature,
                seed: req.seed.unwrap_or(0),
                rerank: req.rerank,
            };
            let mut events = pipeline.query(params);
            let mut finish = "stop";
            while let Some(e) = events.next().await {
                let piece = match e {
                    Ok(QueryEvent::Passages(hits)) => Piece::Passages(passages_json(&hits)),
                    Ok(QueryEvent::Text(t)) => Piece::Text(t),
                    Ok(QueryEvent::Usage(u, cut)) => {
                        if cut {
                            finish = "length";
                        }
                        Piece::Usage { prompt: u.prompt_tokens, completion: u.completion_tokens }
                    }
                    Ok(QueryEvent::Citations { cited, unknown }) => Piece::Citations { cited, unknown },
                    Ok(QueryEvent::Timings(_)) => continue,
                    Err(e) => {
                        let _ = send(Err(e.into())).await;
                        return;
                    }
                };
                if !send(Ok(piece)).await {
                    return;
                }
            }
            let _ = send(Ok(Piece::Finish(finish))).await;
            return;
        }
        let stop: Vec<String> = match req.stop {
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(a)) => a.into_iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        };
        let greq = GenerateRequest {
            messages,
            max_tokens,
            temperature,
            top_p: req.top_p.unwrap_or(0.0),
            seed: req.seed.unwrap_or(0),
            stop,
            ..Default::default()
        };
        let (routed, first, mut stream) = match pipeline.generate(greq).await {
            Ok(x) => x,
            Err(e) => {
                let _ = send(Err(e.into())).await;
                return;
            }
        };
        let mut next = first;
        while let Some(msg) = next {
            if !msg.text.is_empty() && !send(Ok(Piece::Text(msg.text))).await {
                return;
            }
            if msg.finish_reason != FinishReason::Unspecified as i32 {
                let u = msg.usage.unwrap_or_default();
                let _ = send(Ok(Piece::Usage { prompt: u.prompt_tokens, completion: u.completion_tokens })).await;
                let _ = send(Ok(Piece::Finish(finish_reason(msg.finish_reason)))).await;
            }
            next = match stream.message().await {
                Ok(m) => m,
                Err(status) => {
                    let _ = send(Err(routed.broken(status).into())).await;
                    return;
                }
            };
        }
    });
    rx
}

/// A whole (non-streamed) chat completion.
async fn collect(
    mut pieces: tokio::sync::mpsc::Receiver<Result<Piece, ApiError>>,
    id: &str,
    created: u64,
    model: &str,
) -> Result<Value, ApiError> {
    let (mut text, mut finish, mut usage, mut extra) = (String::new(), "stop", (0u32, 0u32), serde_json::Map::new());
    while let Some(p) = pieces.recv().await {
        match p? {
            Piece::Passages(v) => {
                extra.insert("passages".into(), v);
            }
            Piece::Text(t) => text.push_str(&t),
            Piece::Finish(f) => finish = f,
            Piece::Usage { prompt, completion } => usage = (prompt, completion),
            Piece::Citations { cited, unknown } => {
                extra.insert("citations".into(), json!(cited));
                extra.insert("unknown_citations".into(), json!(unknown));
            }
        }
    }
    let mut v = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": finish, "logprobs": null }],
        "usage": { "prompt_tokens": usage.0, "completion_tokens": usage.1, "total_tokens": usage.0 + usage.1 },
    });
    if let Value::Object(o) = &mut v {
        o.extend(extra);
    }
    Ok(v)
}

/// A streamed chat completion: OpenAI's `chat.completion.chunk` events, then `[DONE]`. An
/// error after the stream started is sent as an `{"error": ...}` event and ends the stream.
fn sse(
    s: Arc<AppState>,
    mut pieces: tokio::sync::mpsc::Receiver<Result<Piece, ApiError>>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    t: Instant,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let chunk = |delta: Value, finish: Option<&str>, extra: Option<(&str, Value)>| {
            let mut v = json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }],
            });
            if let (Some((k, x)), Value::Object(o)) = (extra, &mut v) {
                o.insert(k.to_string(), x);
            }
            Event::default().data(v.to_string())
        };
        let mut sent_role = false;
        let mut usage = None;
        let mut outcome: Result<(), ApiError> = Ok(());
        let mut citations = None;
        while let Some(p) = pieces.recv().await {
            let event = match p {
                Ok(Piece::Passages(v)) => {
                    sent_role = true;
                    chunk(json!({ "role": "assistant", "content": "" }), None, Some(("passages", v)))
                }
                Ok(Piece::Text(text)) => {
                    let delta = if sent_role {
                        json!({ "content": text })
                    } else {
                        json!({ "role": "assistant", "content": text })
                    };
                    sent_role = true;
                    chunk(delta, None, None)
                }
                Ok(Piece::Usage { prompt, completion }) => {
                    usage = Some((prompt, completion));
                    continue;
                }
                Ok(Piece::Citations { cited, unknown }) => {
                    citations = Some(json!({ "citations": cited, "unknown_citations": unknown }));
                    continue;
                }
                Ok(Piece::Finish(reason)) => {
                    let extra = citations.take().map(|c| ("citations", c));
                    chunk(json!({}), Some(reason), extra)
                }
                Err(e) => {
                    let body = e.body();
                    outcome = Err(e);
                    let _ = tx.send(Ok(Event::default().data(body.to_string()))).await;
                    break;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                outcome = Err(ApiError::new(StatusCode::OK, "client_closed", "cancelled", ""));
                break;
            }
        }
        if outcome.is_ok() {
            if include_usage {
                let (p, c) = usage.unwrap_or_default();
                let v = json!({
                    "id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                    "usage": { "prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c },
                });
                let _ = tx.send(Ok(Event::default().data(v.to_string()))).await;
            }
            let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
        }
        observe(&s.metrics, "openai.ChatCompletions", t, &outcome);
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document describes exactly the routes the router serves, and parses.
    #[test]
    fn the_openapi_document_lists_the_routes() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("openapi.json parses");
        assert_eq!(doc["openapi"], "3.0.3");
        let mut paths: Vec<&str> = doc["paths"].as_object().expect("paths").keys().map(String::as_str).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                "/",
                "/console/console.css",
                "/console/console.js",
                "/openapi.json",
                "/v1/chat/completions",
                "/v1/documents",
                "/v1/embeddings",
                "/v1/models",
                "/v1/rerank",
                "/v1/trust"
            ]
        );
        // Every $ref resolves.
        fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::String(r)) = o.get("$ref") {
                        out.push(r);
                    }
                    o.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in all {
            let pointer = r.strip_prefix('#').expect("local ref");
            assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
        }
    }
}
