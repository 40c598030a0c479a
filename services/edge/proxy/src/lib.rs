//! `gelo proxy`: the gateway's OpenAI-compatible API (and its console) on the user's own
//! loopback, each request forwarded over RA-TLS to a remote gateway that proved, to the
//! user's policy, what it runs. Any OpenAI client works through it unchanged but for its
//! base URL; nothing leaves the user's machine except inside a connection to a verified
//! gateway.
//!
//! Where things are:
//! - [`verify`]: the checks a client runs on a gateway before sending it anything (evidence,
//!   role, backend policy, fresh nonce), shared with the `gelo rag` commands.
//! - `upstream`: the one verified gateway, verified again from scratch after a refused or
//!   failed connection.
//! - `forward`: one request across the attested channel (HTTP/2 on the gateway's RA-TLS
//!   port, beside its gRPC; `gateway::http::attested` is the other end).
//! - `local`: the proxy's own port: loopback names and same-origin pages only, errors in
//!   OpenAI's shape.

mod forward;
mod local;
mod upstream;
pub mod verify;

use std::{future::Future, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::{Request, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use tokio::net::TcpListener;

pub use upstream::Upstream;
pub use verify::{GatewayTarget, Refusal, VerifiedGateway, check_backend_policy, gateway_policy, verify_gateway};

use local::{ApiError, LocalNames};
use upstream::Failure;

/// Largest request body forwarded (the gateway's own limit).
pub const MAX_BODY: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("--listen {0} is not a loopback address: the proxy's port is plain HTTP, for clients on this machine only")]
    NotLoopback(SocketAddr),
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

struct Proxy {
    upstream: Arc<Upstream>,
    names: LocalNames,
}

/// The proxy's router for a port listening on `local`: every route, every method, sent on.
pub fn router(upstream: Arc<Upstream>, local: SocketAddr) -> Router {
    let state = Arc::new(Proxy { upstream, names: LocalNames::new(local.port()) });
    Router::new().fallback(handle).with_state(state)
}

/// Binds `listen` (loopback only), verifies the gateway once so the log says at start
/// whether it is usable, prints `GELO_READY role=proxy http=ADDR gateway=HOST:PORT
/// verified=BOOL`, and serves until `shutdown`. A refused gateway does not stop the proxy:
/// every request is refused with the reason, and verified afresh, until it passes.
pub async fn run(
    listen: SocketAddr,
    target: GatewayTarget,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ProxyError> {
    if !listen.ip().is_loopback() {
        return Err(ProxyError::NotLoopback(listen));
    }
    let listener = TcpListener::bind(listen).await.map_err(|e| ProxyError::Bind(listen, e))?;
    let local = listener.local_addr().map_err(ProxyError::Serve)?;
    let gateway = target.address.clone();
    let upstream = Arc::new(Upstream::new(target));
    let verified = upstream.session().await.is_ok();
    println!("GELO_READY role=proxy http={local} gateway={gateway} verified={verified}");
    axum::serve(listener, router(upstream, local)).with_graceful_shutdown(shutdown).await.map_err(ProxyError::Serve)
}

async fn handle(State(p): State<Arc<Proxy>>, req: Request) -> Response {
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    if let Err(e) = p.names.check(req.method(), req.uri().path(), req.headers(), authority.as_deref()) {
        tracing::warn!(method = %req.method(), "local request refused: not this port's own page");
        return e.into_response();
    }
    let (head, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            let message = format!("the request body could not be read or exceeds {MAX_BODY} bytes");
            return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large", message)
                .into_response();
        }
    };
    let gateway = &p.upstream.target().address;
    match p.upstream.send(&head, body).await {
        Ok(resp) => forward::response(resp),
        Err(Failure::Refused(r)) => {
            tracing::warn!(%gateway, reason = r.reason(), method = %head.method, "request not forwarded: gateway refused");
            let kind = if r.is_verdict() { "attestation_error" } else { "server_error" };
            let message = format!("gelo proxy sent nothing to the gateway at {gateway}: {r}");
            ApiError::new(StatusCode::BAD_GATEWAY, kind, r.reason(), message).into_response()
        }
        Err(Failure::Broken(e)) => {
            tracing::warn!(%gateway, error = %e, "the gateway's answer did not arrive");
            let message = format!("the gateway at {gateway} did not answer: {e}");
            ApiError::new(StatusCode::BAD_GATEWAY, "server_error", "gateway_unreachable", message).into_response()
        }
    }
}
