//! Serving a set of gRPC services: RA-TLS (or, explicitly, plaintext), the standard health
//! service, server reflection, `Attestation.GetEvidence`, and Prometheus metrics and the
//! HTTP probes on a separate port.

use std::{future::Future, net::SocketAddr, sync::Arc};

use attest::{AttestationService, ServerIdentity, ratls::verifier::AttestedClientVerifier};
use axum::http::StatusCode;
use tokio::net::TcpListener;
use tonic::service::Routes;

use crate::{
    health::{Health, State},
    metrics::Metrics,
};

/// How the gRPC port is exposed.
pub enum Transport {
    /// RA-TLS with this identity; with `clients`, peers must present attested certificates.
    RaTls { identity: Arc<ServerIdentity>, clients: Option<Arc<AttestedClientVerifier>> },
    /// Plaintext TCP. Only with an explicit insecure flag: nothing is attested.
    Insecure,
}

pub struct ServeOptions {
    pub listener: TcpListener,
    pub transport: Transport,
    /// Where `/metrics`, `/healthz` and `/readyz` are served over plain HTTP, if anywhere.
    pub metrics_listener: Option<TcpListener>,
    pub metrics: Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("RA-TLS: {0}")]
    Attest(#[from] attest::AttestError),
    #[error("server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection: {0}")]
    Reflection(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// A fresh health state, NOT_SERVING until `serve` opens the port. Hand clones to the
/// services so an engine failure shows in the health service and the probes.
pub fn health() -> Health {
    Health::new()
}

/// Serves `routes` until `shutdown` resolves.
pub async fn serve(
    opts: ServeOptions,
    routes: Routes,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let identity = match &opts.transport {
        Transport::RaTls { identity, .. } => Some(identity.clone()),
        Transport::Insecure => None,
    };
    let (routes, _stop_following) = prepare(routes, &health, opts.metrics_listener, opts.metrics, identity).await?;
    let server = tonic::transport::Server::builder().layer(crate::remap::ClientErrorsLayer).add_routes(routes);
    match opts.transport {
        Transport::RaTls { identity, clients } => {
            let config = match clients {
                Some(verifier) => identity.server_config_mutual(verifier)?,
                None => identity.server_config()?,
            };
            let incoming = attest::ratls::serve_incoming(opts.listener, config);
            server.serve_with_incoming_shutdown(incoming, shutdown).await?;
        }
        Transport::Insecure => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(opts.listener);
            server.serve_with_incoming_shutdown(incoming, shutdown).await?;
        }
    }
    Ok(())
}

/// Connections a caller accepted itself, for [`serve_incoming`]: e.g. counted, and closed
/// when they send no request in time (the gateway's front door).
pub struct Incoming<S> {
    /// The connections, their TLS handshakes done.
    pub connections: S,
    /// Serve `Attestation.GetEvidence` with this identity (the connections' RA-TLS one).
    pub identity: Option<Arc<ServerIdentity>>,
    /// The largest request head (HTTP/2 header list, bytes) a client may send; `None`:
    /// hyper's default (16 KiB).
    pub max_header_list_size: Option<u32>,
}

/// [`serve`] over `incoming` instead of a listener of its own; the same services, metrics
/// and probes.
pub async fn serve_incoming<S, IO, E>(
    incoming: Incoming<S>,
    metrics_listener: Option<TcpListener>,
    metrics: Metrics,
    routes: Routes,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError>
where
    S: tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (routes, _stop_following) = prepare(routes, &health, metrics_listener, metrics, incoming.identity).await?;
    let server = tonic::transport::Server::builder()
        .http2_max_header_list_size(incoming.max_header_list_size)
        .layer(crate::remap::ClientErrorsLayer)
        .add_routes(routes);
    server.serve_with_incoming_shutdown(incoming.connections, shutdown).await?;
    Ok(())
}

/// `routes` with health, reflection and (with an identity) `Attestation.GetEvidence`; the
/// metrics port started; the health state set to serving and followed while the returned
/// guard lives.
async fn prepare(
    routes: Routes,
    health: &Health,
    metrics_listener: Option<TcpListener>,
    metrics: Metrics,
    identity: Option<Arc<ServerIdentity>>,
) -> Result<(Routes, AbortOnDrop), ServeError> {
    let health_service = health.grpc_service();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let mut routes = routes.add_service(health_service).add_service(reflection);
    if let Some(identity) = identity {
        routes = routes.add_service(AttestationService::new(identity).into_server());
    }
    health.set_serving();
    if let Some(listener) = metrics_listener {
        let app = http_app(metrics, health.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
    }
    // The gRPC statuses are set before the first request can arrive, then follow the state.
    health.apply(&health.state()).await;
    let follow = tokio::spawn(health.clone().follow());
    Ok((routes, AbortOnDrop(follow)))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `/metrics`, and the probes: `/healthz` fails once the engine has failed (restarting
/// the process is what may bring the device back), `/readyz` also while not yet serving.
/// Both say why.
fn http_app(metrics: Metrics, health: Health) -> axum::Router {
    let probe = |ready: bool| {
        let health = health.clone();
        move || {
            let state = health.state();
            async move {
                match state {
                    State::Serving => (StatusCode::OK, "ok\n".to_string()),
                    State::Starting if !ready => (StatusCode::OK, "starting\n".to_string()),
                    State::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting\n".to_string()),
                    State::Failed(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not serving: {reason}\n")),
                }
            }
        }
    };
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let m = metrics.clone();
                async move { ([("content-type", "text/plain; version=0.0.4")], m.encode()) }
            }),
        )
        .route("/healthz", axum::routing::get(probe(false)))
        .route("/readyz", axum::routing::get(probe(true)))
}

/// The line a started service prints on stdout, so supervisors and tests know where it is.
pub fn ready_line(
    role: &str,
    grpc: SocketAddr,
    metrics: Option<SocketAddr>,
    identity: Option<&ServerIdentity>,
) -> String {
    let tls = identity.map_or("insecure".to_string(), |i| format!("ratls spki={}", hex_encode(&i.tls_spki_sha256())));
    let metrics = metrics.map_or(String::new(), |m| format!(" metrics={m}"));
    format!("GELO_READY role={role} grpc={grpc}{metrics} {tls}")
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
