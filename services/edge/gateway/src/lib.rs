//! GELO's RAG gateway: what users talk to. It ingests documents into a sealed store,
//! retrieves, reranks and generates — routing only to model services whose attestation
//! evidence it verified itself — and serves the flow as `gelo.v1.Rag` over (RA-)TLS gRPC and
//! as an OpenAI-compatible HTTP API.
//!
//! Where things are:
//! - [`backends`]: attested routing — per-role backend sets, verification (RA-TLS, fresh
//!   nonce, health) and re-verification, round-robin, fail-closed; [`backends::routes`] reads
//!   the operator's routing table.
//! - [`pipeline`]: the RAG flow (ingest, search, query), independent of the transport.
//! - [`chunker`]: documents into passages by the embedder's tokens.
//! - [`docstore`]: the sealed store on disk and its key.
//! - [`prompt`]: the RAG prompt and citation checking.
//! - [`grpc`], [`http`]: the two front doors; the HTTP one is OpenAI-compatible and also
//!   serves `http::documents` (add documents), `http::trust` (the backends' verified
//!   state) and [`console`] (the web page), all behind `http::access` (`Host`, `Origin`,
//!   API keys from `http::keys`, a rate per key).
//! - [`error`]: the one error type and its gRPC mapping.
//! - [`admission`], [`outbox`], [`connections`]: what the gateway takes on at once and for
//!   how long: requests admitted, a streamed answer's client that stops reading, connections
//!   open on each port and the time and size of their request heads.
//!
//! [`run`] puts them together: the `gelo gateway` command is a thin shell around it, reading
//! its [`config::GatewayOptions`] from file, environment and flags.

pub mod admission;
pub mod backends;
pub mod chunker;
pub mod config;
pub mod connections;
pub mod console;
pub mod docstore;
pub mod error;
pub mod focus;
pub mod grpc;
pub mod http;
pub mod outbox;
pub mod pipeline;
pub mod prompt;

use std::{future::Future, net::SocketAddr, path::PathBuf, sync::Arc};

use attest::{
    ExpectedPeer, IssuerKind, Policy, ServerIdentity, ServiceClaims, ratls::verifier::AttestedClientVerifier,
};
use futures::FutureExt;
use server::{
    Metrics,
    serve::{ServeOptions, Transport, health, ready_line, serve},
};
use tokio::net::TcpListener;

pub use attest::Role;
pub use backends::{BackendSpec, BackendStatus, Pool, Trust, VerifyTiming, routes::RoutesSource};
pub use config::GatewayOptions;
pub use error::{GatewayError, Result};
pub use pipeline::{Pipeline, Settings};

/// Everything `gelo gateway` is configured with.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The embedder model's tokenizer files (a folder or a GGUF file): chunking counts its
    /// tokens, and its identity is the gateway's attested model identity.
    pub model: PathBuf,
    pub expect_identity: Option<[u8; 32]>,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// OpenAI-compatible HTTP (plain HTTP).
    pub http_listen: Option<SocketAddr>,
    /// Allow plain HTTP on a non-loopback address.
    pub http_allow_remote: bool,
    /// Who may use the HTTP port: API keys, rate limit, `Host` names.
    pub http_access: http::AccessConfig,
    /// Plain gRPC for clients (nothing attested on the front door).
    pub insecure: bool,
    /// Require RA-TLS clients satisfying this policy (mutual RA-TLS on the front door).
    pub client_policy: Option<PathBuf>,
    /// The policy backends must satisfy. With a routing table it may come from there.
    pub policy: Option<PathBuf>,
    /// Static backends.
    pub backends: Vec<BackendSpec>,
    /// The operator's routing table, followed as it changes.
    pub routes: Option<RoutesSource>,
    pub timing: VerifyTiming,
    /// Embed and rerank calls in flight per backend.
    pub backend_in_flight: usize,
    /// How long one backend call (or a stream's first message) may take before it fails
    /// with `DEADLINE_EXCEEDED` and the backend leaves the rotation.
    pub backend_timeout: std::time::Duration,
    /// Model requests served at once, gRPC and HTTP together; more are refused at once.
    pub max_concurrent_requests: usize,
    /// Connections open at once on each port; more are refused at once.
    pub max_connections: usize,
    pub data_dir: PathBuf,
    /// Sealing key file; `None`: `<data_dir>/sealing.key` with mock attestation, the SEV-SNP
    /// derived key on hardware.
    pub sealing_key_file: Option<PathBuf>,
    pub chunk_tokens: usize,
    pub chunk_overlap: usize,
    pub settings: Settings,
}

impl GatewayConfig {
    /// Each port's connection limits: `max_connections`, the rest the defaults.
    pub fn connection_limits(&self) -> connections::ConnectionLimits {
        connections::ConnectionLimits { max_connections: self.max_connections, ..Default::default() }
    }
}

/// The gateway's protocol settings, hashed into its `scheme_identity`, with the digest of
/// the policy it verifies backends against ([`Policy::digest`]): what a client checks to
/// know whom the gateway trusts.
pub fn scheme_json(cfg: &GatewayConfig, backend_policy: &[u8; 32]) -> serde_json::Value {
    serde_json::json!({
        "role": "gateway",
        "store": "redb/aes-256-gcm",
        "chunk_tokens": cfg.chunk_tokens,
        "chunk_overlap": cfg.chunk_overlap,
        BACKEND_POLICY_FIELD: hex::encode(backend_policy),
    })
}

/// The field of the gateway's attested scheme that holds its backend policy's digest.
pub const BACKEND_POLICY_FIELD: &str = "backend_policy_sha256";

/// The backend policy digest a verified gateway attests, if its scheme names one.
pub fn attested_backend_policy(gateway: &attest::Verified) -> Option<[u8; 32]> {
    let scheme: serde_json::Value = serde_json::from_str(gateway.scheme_json()).ok()?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(scheme.get(BACKEND_POLICY_FIELD)?.as_str()?, &mut out).ok()?;
    Some(out)
}

/// The policy backends must satisfy, read once at start: `--policy`, else the routing
/// table's `policy.json` (the mounted file, or the ConfigMap: waited for until the operator
/// has written one).
async fn backend_policy(cfg: &GatewayConfig) -> Result<Policy> {
    match (&cfg.policy, &cfg.routes) {
        (Some(p), _) => Ok(Policy::from_file(p)?),
        (None, Some(RoutesSource::File { policy: Some(p), .. })) => Ok(Policy::from_file(p)?),
        #[cfg(feature = "kubernetes")]
        (None, Some(RoutesSource::ConfigMap { name, namespace })) => {
            backends::routes::configmap_policy(name, namespace).await
        }
        _ => Err(GatewayError::Config("a policy is required (--policy FILE) to verify backends".into())),
    }
}

fn is_loopback(a: &SocketAddr) -> bool {
    a.ip().is_loopback()
}

/// Runs the gateway until `shutdown` resolves. Prints the `GELO_READY role=gateway ...`
/// line on stdout once every port is open.
pub async fn run(cfg: GatewayConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
    // 1. The tokenizer model: its identity is the gateway's model identity.
    let (identity_bytes, chunker) = load_model(&cfg).await?;

    // 2. The policy backends must satisfy: fixed for the gateway's life and bound into its
    //    evidence, so whoever delivers routes (the operator) cannot change whom it trusts.
    let policy = backend_policy(&cfg).await?;
    let policy_digest = policy.digest().map_err(|e| GatewayError::Config(format!("backend policy: {e}")))?;
    tracing::info!(backend_policy = %hex::encode(policy_digest), "backend policy fixed and attested");

    // 3. The gateway's own attested identity: served to clients, presented to backends that
    //    require an attested client.
    let scheme = scheme_json(&cfg, &policy_digest).to_string();
    let claims = ServiceClaims { model_identity: identity_bytes, scheme_json: scheme, role: "gateway".into() };
    let (identity, issuer_kind) = tokio::task::spawn_blocking(move || -> Result<(Arc<ServerIdentity>, IssuerKind)> {
        let issuer = attest::issuer_from_env_or_default()?;
        let kind = issuer.kind();
        Ok((Arc::new(ServerIdentity::generate(issuer, claims)?), kind))
    })
    .await??;

    // 4. The store and its key.
    let store = open_store(&cfg, issuer_kind).await?;

    // 5. Backends: static, or the routing table. A policy the table offers later is only
    //    compared with the attested one, never applied.
    let pool = Pool::new(policy, Some(identity.clone()), cfg.timing);
    pool.set_unary_in_flight(cfg.backend_in_flight);
    pool.set_call_timeout(cfg.backend_timeout);
    pool.set_backends(&cfg.backends);
    let _routes_task = follow_routes(&cfg, &pool, policy_digest).await?;
    if cfg.backends.is_empty() && cfg.routes.is_none() {
        tracing::warn!("no backends configured: every request that needs a model fails with UNAVAILABLE");
    }

    // 6. The RAG flow and its two front doors.
    let pipeline =
        Arc::new(Pipeline { pool, store: Arc::new(store), chunker: Arc::new(chunker), settings: cfg.settings.clone() });
    let metrics = Metrics::new("gateway");
    let admission = admission::Admission::new(cfg.max_concurrent_requests);
    let rag = grpc::RagService::new(pipeline.clone(), metrics.clone()).with_admission(admission.clone());
    let routes = tonic::service::Routes::new(rag.into_server());

    let (listener, metrics_listener, http_listener) = bind(&cfg).await?;
    let transport = transport(&cfg, &identity)?;
    let local = |l: &TcpListener| l.local_addr().map_err(|e| GatewayError::Serve(e.to_string()));
    // The HTTP API on the RA-TLS port too, for clients on other machines (`gelo proxy`),
    // whenever its access is configured: the same keys as the plain port.
    let access = &cfg.http_access;
    let routes = match (&transport, access.api_keys_file.is_some() || access.unauthenticated) {
        (Transport::RaTls { .. }, true) => {
            let app = http::router_with(
                pipeline.clone(),
                metrics.clone(),
                http::Access::attested(access, local(&listener)?)?,
                admission.clone(),
            );
            http::attested::alongside_grpc(routes, app)
        }
        _ => routes,
    };
    let mut line = ready_line(
        "gateway",
        local(&listener)?,
        metrics_listener.as_ref().and_then(|l| l.local_addr().ok()),
        match &transport {
            Transport::RaTls { identity, .. } => Some(identity.as_ref()),
            Transport::Insecure => None,
        },
    );
    if let Some(h) = &http_listener {
        line.push_str(&format!(" http={}", local(h)?));
    }
    line.push_str(&format!(" model={}", hex::encode(identity_bytes)));

    let shutdown = shutdown.shared();
    if let Some(l) = http_listener {
        let access = http::Access::new(&cfg.http_access, local(&l)?)?;
        let app = http::router_with(pipeline.clone(), metrics.clone(), access, admission);
        let stop = shutdown.clone();
        tokio::spawn(http::serve(l, app, cfg.connection_limits(), stop));
    }
    println!("{line}");
    let opts = ServeOptions { listener, transport, metrics_listener, metrics };
    serve_front_door(opts, routes, cfg.connection_limits(), shutdown)
        .await
        .map_err(|e| GatewayError::Serve(e.to_string()))?;
    tracing::info!("gateway stopped");
    Ok(())
}

/// The gRPC port: over RA-TLS under the connection limits ([`connections::attested`]);
/// plaintext (`--insecure`, for local testing) as the model services serve theirs.
async fn serve_front_door(
    opts: ServeOptions,
    routes: tonic::service::Routes,
    limits: connections::ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::result::Result<(), server::serve::ServeError> {
    let ServeOptions { listener, transport, metrics_listener, metrics } = opts;
    match transport {
        Transport::RaTls { identity, clients } => {
            let config = match clients {
                Some(verifier) => identity.server_config_mutual(verifier)?,
                None => identity.server_config()?,
            };
            let (routes, incoming) = connections::attested(listener, config, limits, routes, identity);
            server::serve::serve_incoming(incoming, metrics_listener, metrics, routes, health(), shutdown).await
        }
        Transport::Insecure => {
            let opts = ServeOptions { listener, transport: Transport::Insecure, metrics_listener, metrics };
            serve(opts, routes, health(), shutdown).await
        }
    }
}

/// The tokenizer model's identity (checked against `--expect-identity`) and the chunker
/// built from its tokenizer.
async fn load_model(cfg: &GatewayConfig) -> Result<([u8; 32], chunker::Chunker)> {
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || -> Result<([u8; 32], chunker::Chunker)> {
        let model = &cfg.model;
        let (_, manifest) = models::Manifest::of_path(model)
            .map_err(|e| GatewayError::Config(format!("model {}: {e}", model.display())))?;
        let id = manifest.identity().0;
        if let Some(want) = cfg.expect_identity
            && want != id
        {
            return Err(GatewayError::Config(format!(
                "model {} has identity {} but {} was expected",
                model.display(),
                hex::encode(id),
                hex::encode(want)
            )));
        }
        Ok((id, chunker::Chunker::load(model, cfg.chunk_tokens, cfg.chunk_overlap)?))
    })
    .await?
}

/// The sealed document store in `--data-dir`, opened with the key its source gives.
async fn open_store(cfg: &GatewayConfig, issuer_kind: IssuerKind) -> Result<docstore::DocStore> {
    let key_source = docstore::key_source(cfg.sealing_key_file.as_deref(), &cfg.data_dir, issuer_kind);
    let data_dir = cfg.data_dir.clone();
    tokio::task::spawn_blocking(move || -> Result<docstore::DocStore> {
        std::fs::create_dir_all(&data_dir).map_err(GatewayError::file(&data_dir))?;
        let key = docstore::sealing_key(&key_source)?;
        docstore::DocStore::open(&data_dir, key)
    })
    .await?
}

/// Adds the routing table's backends to `pool` and starts following it (a file or, with the
/// `kubernetes` feature, a ConfigMap); `None` without a table.
async fn follow_routes(
    cfg: &GatewayConfig,
    pool: &Pool,
    policy_digest: [u8; 32],
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let watch_policy = cfg.policy.is_none().then_some(policy_digest);
    Ok(match &cfg.routes {
        Some(RoutesSource::File { routes, policy, poll }) => {
            let (specs, _, fingerprint) = backends::routes::read_file(routes, policy.as_deref())?;
            let mut all = cfg.backends.clone();
            all.extend(specs);
            pool.set_backends(&all);
            let follow_policy = watch_policy.and(policy.clone());
            Some(backends::routes::follow_file(
                pool.clone(),
                routes.clone(),
                follow_policy,
                policy_digest,
                *poll,
                fingerprint,
            ))
        }
        #[cfg(feature = "kubernetes")]
        Some(RoutesSource::ConfigMap { name, namespace }) => {
            Some(backends::routes::follow_configmap(pool.clone(), name.clone(), namespace.clone(), watch_policy).await?)
        }
        #[cfg(not(feature = "kubernetes"))]
        Some(RoutesSource::ConfigMap { .. }) => {
            return Err(GatewayError::Config(
                "this gelo was built without the `kubernetes` feature: mount the routes ConfigMap and use --routes-file".into(),
            ));
        }
        None => None,
    })
}

/// The gRPC, metrics and HTTP listeners; a non-loopback HTTP address is refused unless
/// `--http-allow-remote`.
async fn bind(cfg: &GatewayConfig) -> Result<(TcpListener, Option<TcpListener>, Option<TcpListener>)> {
    let listener =
        TcpListener::bind(cfg.listen).await.map_err(|e| GatewayError::Serve(format!("binding {}: {e}", cfg.listen)))?;
    let metrics_listener = match cfg.metrics_listen {
        Some(a) => Some(TcpListener::bind(a).await.map_err(|e| GatewayError::Serve(format!("binding {a}: {e}")))?),
        None => None,
    };
    let http_listener = match cfg.http_listen {
        Some(a) if !is_loopback(&a) && !cfg.http_allow_remote => {
            return Err(GatewayError::Config(format!(
                "--http-listen {a} is not a loopback address: the OpenAI API is plain HTTP (prompts and answers in the clear); \
                 add --http-allow-remote if something in the same trust boundary terminates TLS in front of it"
            )));
        }
        Some(a) => Some(TcpListener::bind(a).await.map_err(|e| GatewayError::Serve(format!("binding {a}: {e}")))?),
        None => None,
    };
    Ok((listener, metrics_listener, http_listener))
}

/// RA-TLS with the gateway's identity (and the client policy, when given), or plaintext
/// with `--insecure`.
fn transport(cfg: &GatewayConfig, identity: &Arc<ServerIdentity>) -> Result<Transport> {
    Ok(if cfg.insecure {
        tracing::warn!(
            "INSECURE: plaintext gRPC to clients, the gateway is not attested to them; for local testing only"
        );
        Transport::Insecure
    } else {
        let clients = match &cfg.client_policy {
            Some(p) => {
                Some(Arc::new(AttestedClientVerifier::new(Arc::new(Policy::from_file(p)?), ExpectedPeer::default())))
            }
            None => None,
        };
        Transport::RaTls { identity: identity.clone(), clients }
    })
}
