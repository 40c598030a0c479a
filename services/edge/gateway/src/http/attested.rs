//! The HTTP API on the gateway's RA-TLS port, beside gRPC: how a client on another machine
//! (`gelo proxy`) reaches the OpenAI-compatible routes, the documents, the trust report and
//! the console over a connection it verified, rather than over the plain-HTTP port.
//!
//! One port, one TLS key, one piece of evidence: the client verifies the gateway exactly as
//! `gelo rag` does (evidence in the handshake, role, the attested backend policy, a fresh
//! nonce over `Attestation.GetEvidence`), then sends HTTP/2 requests over the same channel.
//! gRPC calls keep their paths (`/gelo.v1.Rag/...`); every other request goes to the HTTP
//! router, whose access checks ([`super::Access::attested`]) still ask for an API key.

use std::convert::Infallible;

use axum::{Router, extract::Request, http::header, response::IntoResponse};
use tonic::service::Routes;

/// `grpc` with `http` answering every request that no gRPC service claims. A gRPC call to a
/// service this port does not serve still gets gRPC's `UNIMPLEMENTED`, not an HTTP error.
pub fn alongside_grpc(grpc: Routes, http: Router) -> Routes {
    let dispatch = tower::service_fn(move |req: Request| {
        let http = http.clone();
        async move {
            if is_grpc(&req) {
                let (parts, ()) = tonic::Status::unimplemented("").into_http::<()>().into_parts();
                return Ok::<_, Infallible>(axum::response::Response::from_parts(parts, axum::body::Body::empty()));
            }
            Ok(tower::ServiceExt::oneshot(http, req).await.into_response())
        }
    });
    Routes::from(grpc.into_axum_router().fallback_service(dispatch))
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}
