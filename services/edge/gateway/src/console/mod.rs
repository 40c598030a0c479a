//! The web console: one page that adds documents (`POST /v1/documents`), asks the store a
//! question and streams the cited answer (`POST /v1/chat/completions`, model `gelo-rag`), and
//! shows whom the gateway trusts (`GET /v1/trust`). Its three files are built into the
//! binary; the page loads nothing from anywhere else, and its Content-Security-Policy tells
//! the browser to refuse anything but this gateway.

use axum::{
    Router,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// Same-origin only: no inline script, no other host, no framing, no form posts elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset(INDEX, "text/html; charset=utf-8") }))
        .route("/console/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // A new binary may bring a new page: revalidate rather than run a stale script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}
