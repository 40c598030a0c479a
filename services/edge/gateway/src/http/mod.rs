//! The HTTP port. First the OpenAI-compatible API, so existing clients work unchanged:
//!
//! | route | shape |
//! |---|---|
//! | `POST /v1/embeddings` | OpenAI embeddings (`encoding_format` `float` or `base64`, as the official client sends by default) |
//! | `POST /v1/chat/completions` | OpenAI chat completions, `stream: true` as server-sent events ending in `data: [DONE]` |
//! | `POST /v1/rerank` | Cohere/Jina rerank: `query`, `documents`, `top_n` → `results[{index, relevance_score}]` |
//! | `GET /v1/models` | the models below |
//! | `GET /openapi.json` | the OpenAPI 3.0 document of these routes (`src/openapi.json`) |
//!
//! The same router serves GELO's own routes: `POST /v1/documents` ([`documents`]),
//! `GET /v1/trust` ([`trust`]) and the web console at `/` ([`crate::console`]).
//!
//! Models: `gelo-embedder`, `gelo-reranker`, `gelo-generator` (plain chat) and `gelo-rag`:
//! chat completions answered from the document store — the last user message is the
//! question, the answer cites passage ids, and the response carries the passages
//! (`passages`) and checked citations (`citations`, `unknown_citations`) as extra fields.
//!
//! Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the
//! matching HTTP status. Plain HTTP: bind it to loopback (the default) or put it behind
//! something that terminates TLS inside the same trust boundary.
//!
//! Every request passes [`access`] first: its `Host` and `Origin` must be this gateway's,
//! and every route but the console's files and `/openapi.json` needs an API key
//! ([`keys`]), within its rate ([`ratelimit`]).
//!
//! This module holds the router, the shared state, the error type and the small routes
//! (`/v1/models`, `/openapi.json`); the model routes live in `embeddings`, `rerank` and
//! `chat` (plain and `gelo-rag` chat completions, whole or streamed).

use std::{
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    body::{Body, HttpBody},
    extract::{DefaultBodyLimit, Request, State, rejection::JsonRejection},
    http::{HeaderName, HeaderValue, StatusCode, header},
    middleware::{Next, from_fn_with_state},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures::StreamExt;
use serde_json::{Value, json};
use server::Metrics;
use tonic::Code;

use attest::Role;

use crate::{
    admission::{Admission, Place, RETRY_AFTER_SECONDS, ReleaseOnDrop},
    connections::MAX_HEAD_BYTES,
    error::GatewayError,
    pipeline::Pipeline,
};

pub mod access;
pub mod attested;
mod chat;
pub mod documents;
mod embeddings;
pub mod keys;
mod ratelimit;
mod rerank;
mod serve;
pub mod trust;

pub use crate::connections::{ConnectionLimits, HEADER_READ_TIMEOUT};
pub use access::{Access, AccessConfig};
pub use serve::serve;

use chat::chat;
use embeddings::embeddings;
use rerank::rerank;

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

/// The HTTP port's routes, every one behind `access`, with an admission limit of its own.
pub fn router(pipeline: Arc<Pipeline>, metrics: Metrics, access: Access) -> Router {
    router_with(pipeline, metrics, access, Admission::default())
}

/// [`router`], its model routes (embeddings, chat, rerank, documents) counted in
/// `admission`, which the gRPC port may share: over its limit they answer 429 at once.
pub fn router_with(pipeline: Arc<Pipeline>, metrics: Metrics, access: Access, admission: Admission) -> Router {
    let guard = Arc::new(access::Guard { access, metrics: metrics.clone() });
    let model_routes = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/rerank", post(rerank))
        .route("/v1/documents", post(documents::add))
        .route_layer(from_fn_with_state((admission, metrics.clone()), admit));
    Router::new()
        .merge(model_routes)
        .route("/v1/models", get(models))
        .route("/openapi.json", get(openapi))
        .route("/v1/trust", get(trust::report))
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
        // Outermost but for the head's size: nothing runs, not even the body limit or a
        // fallback, before it.
        .layer(from_fn_with_state(guard, access::guard))
        .layer(axum::middleware::from_fn(head_limit))
        .with_state(Arc::new(AppState { pipeline, metrics }))
}

/// A request head (target and headers) over [`MAX_HEAD_BYTES`] is refused `431` before
/// anything reads it, on either port. HTTP/1.1's parser stops reading a head at about this
/// size ([`crate::connections`]) but may take a larger one that arrived whole; HTTP/2
/// refuses one over it in the protocol.
async fn head_limit(req: Request, next: Next) -> Response {
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let size = req.headers().iter().fold(target, |n, (k, v)| n + k.as_str().len() + v.len() + 4);
    if size > MAX_HEAD_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            "request_header_too_large",
            format!("the request's head is over {MAX_HEAD_BYTES} bytes"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Reads a model request's body, then admits the request or refuses it at once: 429
/// `overloaded` with `Retry-After`. The body comes first, within the admission's body
/// timeout (408 after it) and `MAX_BODY` (413), so a client that sends slowly holds no
/// place. The place is held until the response body is sent, so a streamed answer counts
/// until its `[DONE]` (or until its client goes away and the body is dropped, or stops
/// reading for the send timeout: the answer's task releases the [`Place`] then).
async fn admit(State((admission, metrics)): State<(Admission, Metrics)>, req: Request, next: Next) -> Response {
    let t = Instant::now();
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(admission.body_timeout(), axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) if e.to_string().contains("length limit") => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                format!("the request body exceeds {MAX_BODY} bytes"),
            )
            .into_response();
        }
        Ok(Err(_)) => return ApiError::invalid("the request body could not be read").into_response(),
        Err(_) => {
            metrics.observe("http.Admission", Code::DeadlineExceeded, t.elapsed().as_secs_f64());
            let message = format!("the request body did not arrive within {:?}", admission.body_timeout());
            return ApiError::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", "request_timeout", message)
                .into_response();
        }
    };
    let permit = match admission.try_admit() {
        Ok(p) => p,
        Err(full) => {
            metrics.observe("http.Admission", Code::ResourceExhausted, t.elapsed().as_secs_f64());
            return ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "overloaded", full.message())
                .header(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS))
                .into_response();
        }
    };
    // The handler may release the place itself: a streamed answer whose client stopped reading.
    let place = Place::new(permit, admission.send_timeout());
    let mut req = Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut().insert(place.clone());
    let (parts, body) = next.run(req).await.into_parts();
    if body.size_hint().exact().is_some() {
        // A whole body, already computed: the request is done.
        place.release();
        return Response::from_parts(parts, body);
    }
    let held = ReleaseOnDrop(place);
    let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
        let _held = &held;
        chunk
    }));
    Response::from_parts(parts, body)
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
    /// `WWW-Authenticate` of a 401, `Retry-After` of a 429.
    /// Boxed: errors travel in every handler's `Result`, and a header is rare.
    header: Option<Box<(HeaderName, HeaderValue)>>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, code, message: message.into(), param: None, header: None }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request", message)
    }

    pub(crate) fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    pub(crate) fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.header = Some(Box::new((name, value)));
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
            400 | 404 | 405 | 408 | 413 | 415 | 422 | 431 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 | 421 => Code::PermissionDenied,
            429 => Code::ResourceExhausted,
            503 => Code::Unavailable,
            507 => Code::ResourceExhausted,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(self.body());
        match self.header {
            Some(h) => (self.status, [*h], body).into_response(),
            None => (self.status, body).into_response(),
        }
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        let message = e.to_string();
        if let GatewayError::Store(store::StoreError::DiskFull(_)) = e {
            // Not the client's rate: the gateway's disk. Retrying later may work, 429 would mislead.
            return Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", "disk_full", message);
        }
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
pub const OPENAPI: &str = include_str!("../openapi.json");

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
