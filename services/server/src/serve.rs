//! Serving a set of gRPC services: RA-TLS (or, explicitly, plaintext), the standard health
//! service, server reflection, `Attestation.GetEvidence`, and Prometheus metrics on a
//! separate HTTP port.

use std::{future::Future, net::SocketAddr, sync::Arc};

use attest::{ratls::danger::AttestedClientVerifier, AttestationService, ServerIdentity};
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic_health::server::HealthReporter;

use crate::metrics::Metrics;

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
    /// Where `/metrics` (and `/healthz`) are served over plain HTTP, if anywhere.
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

/// A health reporter whose overall status starts NOT_SERVING until `serve` flips it.
pub fn health() -> (HealthReporter, tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>) {
    tonic_health::server::health_reporter()
}

/// Serves `routes` until `shutdown` resolves.
pub async fn serve(
    opts: ServeOptions,
    routes: Routes,
    health: (HealthReporter, tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (reporter, health_service) = health;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let mut routes = routes.add_service(health_service).add_service(reflection);
    if let Transport::RaTls { identity, .. } = &opts.transport {
        routes = routes.add_service(AttestationService::new(identity.clone()).into_server());
    }
    if let Some(listener) = opts.metrics_listener {
        let metrics = opts.metrics.clone();
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(move || {
                let m = metrics.clone();
                async move { ([("content-type", "text/plain; version=0.0.4")], m.encode()) }
            }))
            .route("/healthz", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
    }
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
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

/// The line a started service prints on stdout, so supervisors and tests know where it is.
pub fn ready_line(role: &str, grpc: SocketAddr, metrics: Option<SocketAddr>, identity: Option<&ServerIdentity>) -> String {
    let tls = identity.map_or("insecure".to_string(), |i| format!("ratls spki={}", hex_encode(&i.tls_spki_sha256())));
    let metrics = metrics.map_or(String::new(), |m| format!(" metrics={m}"));
    format!("GELO_READY role={role} grpc={grpc}{metrics} {tls}")
}

fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
