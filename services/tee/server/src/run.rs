//! A model service from its configuration: executor on the given engine, model loaded with
//! its identity checked and its weights provisioned, RA-TLS evidence for exactly that model
//! and protocol, and only then the port.

use std::{future::Future, sync::Arc};

use anyhow::{Context, Result};
use attest::{ExpectedPeer, Policy, ServerIdentity, ServiceClaims, ratls::verifier::AttestedClientVerifier};
use models::{LoadOptions, ModelIdentity};
use protocol::{Engine, Executor};
use tokio::net::TcpListener;

use crate::{
    Health, Metrics,
    config::{Role, ServiceConfig},
    embedder::{EmbedderService, EngineClock},
    generator::GeneratorService,
    reranker::RerankerService,
    serve::{ServeOptions, Transport, health, ready_line, serve},
};

/// The untrusted engine a service runs on, opened by the caller (this crate does not link
/// the GPU engines), and the clock of the time spent in it.
pub struct ServiceEngine {
    pub engine: Arc<dyn Engine>,
    pub clock: EngineClock,
}

/// Runs the `role` service until `shutdown` resolves. Prints the `GELO_READY role=...` line
/// on stdout once its port is open.
pub async fn run(
    role: Role,
    cfg: ServiceConfig,
    engine: ServiceEngine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // 1. Executor on the engine.
    let executor = cfg.executor(engine.engine)?;
    if cfg.plaintext {
        tracing::warn!("PLAINTEXT EXECUTOR: activations reach the engine unmasked");
    }
    // 2. Model: identity checked, weights provisioned, before any port opens.
    let (loaded, identity) = load_model(role, &cfg, executor.clone()).await?;
    tracing::info!(role = role.as_str(), model = %identity, "model loaded and provisioned");
    // The services report engine failures here; the health service and probes show them.
    let health = health();
    let metrics = Metrics::new(role.as_str());
    let (limits, m, h, clock) = (cfg.limits(), metrics.clone(), health.clone(), engine.clock);
    let routes = match loaded {
        Loaded::Embedder(e) => tonic::service::Routes::new(EmbedderService::new(e, limits, m, clock, h).into_server()),
        Loaded::Reranker(r) => tonic::service::Routes::new(RerankerService::new(r, limits, m, clock, h).into_server()),
        Loaded::Generator(g) => {
            tonic::service::Routes::new(GeneratorService::new(g, limits, m, clock, h).into_server())
        }
    };
    // 3. Transport: RA-TLS with evidence for this model and these settings, unless told.
    let transport = transport(role, &cfg, identity, executor.as_ref())?;
    serve_with(role, &cfg, transport, metrics, routes, health, shutdown).await
}

enum Loaded {
    Embedder(Arc<dyn models::Embedder>),
    Reranker(Arc<dyn models::Reranker>),
    Generator(Arc<models::TextGenerator>),
}

/// Loads the role's model on `executor`, refusing files that do not hash to
/// `--expect-identity`.
async fn load_model(role: Role, cfg: &ServiceConfig, exec: Arc<dyn Executor>) -> Result<(Loaded, ModelIdentity)> {
    let expected = cfg.expect_identity.as_deref().map(str::parse::<ModelIdentity>).transpose()?;
    let opts = LoadOptions {
        expected_identity: expected,
        max_seq_length: cfg.max_seq_length,
        instruction: None,
        decode_groups: Some(cfg.decode_groups),
    };
    let path = cfg.model.clone();
    tokio::task::spawn_blocking(move || -> Result<(Loaded, ModelIdentity)> {
        Ok(match role {
            Role::Embedder => {
                let e: Arc<dyn models::Embedder> = models::load_embedder(&path, exec, &opts)?.into();
                let id = e.identity();
                (Loaded::Embedder(e), id)
            }
            Role::Reranker => {
                let r: Arc<dyn models::Reranker> = models::load_reranker(&path, exec, &opts)?.into();
                let id = r.identity();
                (Loaded::Reranker(r), id)
            }
            Role::Generator => {
                let g = Arc::new(models::load_generator(&path, exec, &opts)?);
                let id = g.identity;
                (Loaded::Generator(g), id)
            }
        })
    })
    .await?
}

/// RA-TLS whose evidence claims this model identity, role and protocol scheme (and, with
/// `--client-policy`, mutual RA-TLS); plaintext only when `--insecure`.
fn transport(role: Role, cfg: &ServiceConfig, identity: ModelIdentity, executor: &dyn Executor) -> Result<Transport> {
    if cfg.insecure {
        tracing::warn!("INSECURE: plaintext gRPC, no attestation; for local testing only");
        return Ok(Transport::Insecure);
    }
    let scheme = serde_json::json!({ "role": role.as_str(), "protocol": executor.scheme() });
    let issuer = attest::issuer_from_env_or_default()?;
    let claims =
        ServiceClaims { model_identity: identity.0, scheme_json: scheme.to_string(), role: role.as_str().into() };
    let identity = Arc::new(ServerIdentity::generate(issuer, claims)?);
    let clients = match &cfg.client_policy {
        Some(p) => {
            let policy = Policy::from_file(p).with_context(|| format!("client policy {}", p.display()))?;
            Some(Arc::new(AttestedClientVerifier::new(Arc::new(policy), ExpectedPeer::default())))
        }
        None => None,
    };
    Ok(Transport::RaTls { identity, clients })
}

async fn serve_with(
    role: Role,
    cfg: &ServiceConfig,
    transport: Transport,
    metrics: Metrics,
    routes: tonic::service::Routes,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let listen = cfg.listen;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let metrics_listener = match cfg.metrics_listen {
        Some(a) => Some(TcpListener::bind(a).await.with_context(|| format!("binding {a}"))?),
        None => None,
    };
    let identity = match &transport {
        Transport::RaTls { identity, .. } => Some(identity.clone()),
        Transport::Insecure => None,
    };
    let line = ready_line(
        role.as_str(),
        listener.local_addr()?,
        metrics_listener.as_ref().and_then(|l| l.local_addr().ok()),
        identity.as_deref(),
    );
    println!("{line}");
    let opts = ServeOptions { listener, transport, metrics_listener, metrics };
    serve(opts, routes, health, shutdown).await?;
    tracing::info!(role = role.as_str(), "stopped");
    Ok(())
}
