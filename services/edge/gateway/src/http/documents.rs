//! `POST /v1/documents`: documents into the sealed store over HTTP, through the same
//! [`Ingest`](crate::pipeline::Ingest) as the gRPC `Ingest` stream — the same chunking, limits
//! and skips. A document is `{"name", "text"}` (optional `title`); the name is its id, as a
//! file's path is for `gelo ingest`, and re-adding a name replaces that document.
//!
//! ```json
//! {"documents": [{"id": "bees.txt", "chunks": 1}], "chunks": 1,
//!  "skipped": [{"id": "empty.md", "reason": "no text"}]}
//! ```

use std::time::Instant;

use api::v1::Chunking;
use axum::{Json, extract::rejection::JsonRejection};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, St, observe};
use crate::pipeline::IngestDocument;

const METHOD: &str = "http.AddDocuments";

#[derive(Deserialize)]
pub(crate) struct AddRequest {
    documents: Vec<NewDocument>,
}

#[derive(Deserialize)]
struct NewDocument {
    name: String,
    text: String,
    #[serde(default)]
    title: Option<String>,
}

pub(crate) async fn add(
    axum::extract::State(s): St,
    body: Result<Json<AddRequest>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let t = Instant::now();
    let r = add_inner(&s, body).await;
    observe(&s.metrics, METHOD, t, &r);
    if let Err(e) = &r {
        tracing::info!(method = METHOD, status = e.status().as_u16(), "request refused or failed");
    }
    r.map(Json)
}

async fn add_inner(s: &AppState, body: Result<Json<AddRequest>, JsonRejection>) -> Result<Value, ApiError> {
    let Json(req) = body?;
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents is empty").param("documents"));
    }
    let mut ingest = s.pipeline.ingest().listing();
    let stored_before = |n: u32| format!("{n} documents were stored before this");
    for d in req.documents {
        let title = d.title.unwrap_or_else(|| title_of(&d.name, &d.text));
        let doc = IngestDocument {
            id: d.name,
            title,
            text: d.text,
            metadata: Default::default(),
            chunking: Chunking::Tokens,
        };
        if let Err(e) = ingest.add(doc).await {
            return Err(ApiError::from(e).context(stored_before(ingest.documents)));
        }
    }
    if let Err(e) = ingest.flush().await {
        return Err(ApiError::from(e).context(stored_before(ingest.documents)));
    }
    let documents: Vec<Value> =
        ingest.stored().iter().map(|(id, chunks)| json!({ "id": id, "chunks": chunks })).collect();
    let skipped: Vec<Value> = ingest.skipped.iter().map(|k| json!({ "id": k.id, "reason": k.reason })).collect();
    Ok(json!({ "documents": documents, "chunks": ingest.chunks, "skipped": skipped }))
}

/// A Markdown document's first `# ` heading, else the name without its folder and extension
/// (what `gelo ingest` uses for a file).
fn title_of(name: &str, text: &str) -> String {
    if let Some(h) = text.lines().find_map(|l| l.strip_prefix("# ")) {
        return h.trim().to_string();
    }
    let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
    match file.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem.to_string(),
        _ => file.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::title_of;

    #[test]
    fn the_title_is_the_first_heading_else_the_file_stem() {
        assert_eq!(title_of("notes/bees.md", "intro\n# Honey bees \nbody"), "Honey bees");
        assert_eq!(title_of("notes/bees.md", "no heading"), "bees");
        assert_eq!(title_of(".profile", "x"), ".profile");
        assert_eq!(title_of("plain", "x"), "plain");
    }
}
