//! `POST /v1/chat/completions`: OpenAI chat completions for `gelo-generator` (plain chat)
//! and `gelo-rag` (answered from the document store, with passages and checked citations
//! as extra fields), whole or streamed as server-sent events ending in `data: [DONE]`.

use std::{sync::Arc, time::Instant};

use api::v1::{ChatMessage, FinishReason, GenerateRequest};
use axum::{
    Extension, Json,
    extract::{State, rejection::JsonRejection},
    http::StatusCode,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, GENERATOR, RAG, St, new_id, now, observe};
use attest::Role;

use crate::{
    admission::{DEFAULT_SEND_TIMEOUT, Place},
    outbox::{Closed, outbox},
    pipeline::{Hit, QueryEvent, QueryParams},
};

#[derive(Deserialize)]
pub(super) struct ChatRequest {
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

pub(super) async fn chat(
    State(s): St,
    place: Option<Extension<Place>>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Response {
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
        let answer = Answer { id, created, model, include_usage, t };
        sse(s.clone(), pieces, answer, place.map(|Extension(p)| p)).into_response()
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

/// A streamed answer's identity and options.
struct Answer {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    t: Instant,
}

/// A streamed chat completion: OpenAI's `chat.completion.chunk` events, then `[DONE]`. An
/// error after the stream started is sent as an `{"error": ...}` event and ends the stream.
/// The events go out through an [`outbox`]: a client that reads none of them for the send
/// timeout has its answer cancelled (the generation with it) and its `place` released; the
/// response then ends in an error (the connection or HTTP/2 stream reset), not `[DONE]`.
fn sse(
    s: Arc<AppState>,
    mut pieces: tokio::sync::mpsc::Receiver<Result<Piece, ApiError>>,
    answer: Answer,
    place: Option<Place>,
) -> Sse<impl futures::Stream<Item = Result<Event, std::io::Error>>> {
    let send_timeout = place.as_ref().map_or(DEFAULT_SEND_TIMEOUT, Place::send_timeout);
    let stalled =
        move || Err(std::io::Error::new(std::io::ErrorKind::TimedOut, Closed::Stalled(send_timeout).message()));
    let (tx, rx) = outbox(send_timeout, stalled);
    let Answer { id, created, model, include_usage, t } = answer;
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
            if let Err(closed) = tx.send(Ok(event)).await {
                outcome = Err(match closed {
                    Closed::Gone => ApiError::new(StatusCode::OK, "client_closed", "cancelled", ""),
                    Closed::Stalled(_) => {
                        ApiError::new(StatusCode::GATEWAY_TIMEOUT, "client_timeout", "client_stalled", closed.message())
                    }
                });
                tracing::info!(route = "chat", "{}", closed.message());
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
        // Whether the answer ended or was cancelled, its model work is over: the place is
        // free even while the last events wait on the client.
        drop(pieces);
        if let Some(p) = place {
            p.release();
        }
    });
    Sse::new(rx).keep_alive(KeepAlive::default())
}
