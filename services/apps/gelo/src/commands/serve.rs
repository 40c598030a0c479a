//! `gelo embedder|reranker|generator`: a model service. The model is loaded and its identity
//! checked, its weights provisioned on the engine, and only then is the port opened.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::{Context, Result};
use attest::{ExpectedPeer, Policy, ServerIdentity, ServiceClaims, ratls::danger::AttestedClientVerifier};
use kernels::timing::TimedEngine;
use models::{LoadOptions, ModelIdentity};
use protocol::Engine;
use server::{
    Health, Limits, Metrics,
    embedder::{EmbedderService, EngineClock},
    generator::GeneratorService,
    reranker::RerankerService,
    serve::{ServeOptions, Transport, health, ready_line, serve},
};
use tokio::net::TcpListener;

use super::{engine::ProtocolArgs, telemetry::Otlp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Embedder,
    Reranker,
    Generator,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Embedder => "embedder",
            Role::Reranker => "reranker",
            Role::Generator => "generator",
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct ServiceArgs {
    /// Model folder (safetensors) or GGUF file.
    #[arg(long, env = "GELO_MODEL")]
    pub model: PathBuf,
    /// Refuse to start unless the model files hash to this identity (64 hex).
    #[arg(long, env = "GELO_EXPECT_IDENTITY")]
    pub expect_identity: Option<String>,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Send activations to the engine in the clear (parity baseline; never in production).
    #[arg(long, env = "GELO_PLAINTEXT")]
    pub plaintext: bool,
    /// gRPC listen address (port 0: any free port, printed on the ready line).
    #[arg(long, env = "GELO_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(long, env = "GELO_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Plaintext TCP instead of RA-TLS. Nothing is attested.
    #[arg(long, env = "GELO_INSECURE")]
    pub insecure: bool,
    /// Require RA-TLS clients whose evidence satisfies this policy file (mutual RA-TLS).
    #[arg(long, env = "GELO_CLIENT_POLICY")]
    pub client_policy: Option<PathBuf>,
    /// Override the model's maximum input length (tokens).
    #[arg(long, env = "GELO_MAX_SEQ_LENGTH")]
    pub max_seq_length: Option<usize>,
    /// Groups a batched decode step runs as, concurrently (generator; 1: one pass per step).
    #[arg(long, env = "GELO_DECODE_GROUPS", default_value_t = models::decoder::DEFAULT_DECODE_GROUPS)]
    pub decode_groups: usize,
    #[arg(long, env = "GELO_MAX_TEXTS", default_value_t = Limits::default().max_texts)]
    pub max_texts: usize,
    #[arg(long, env = "GELO_MAX_DOCUMENTS", default_value_t = Limits::default().max_documents)]
    pub max_documents: usize,
    /// Tokens per text (embedder) or (query, document) pair (reranker); default: the
    /// model's maximum, which also caps this.
    #[arg(long, env = "GELO_MAX_TOKENS_PER_TEXT")]
    pub max_tokens_per_text: Option<usize>,
    /// Prompt tokens per Generate request; default: the model's context, which also caps this.
    #[arg(long, env = "GELO_MAX_PROMPT_TOKENS")]
    pub max_prompt_tokens: Option<usize>,
    #[arg(long, env = "GELO_MAX_OUTPUT_TOKENS", default_value_t = Limits::default().max_output_tokens)]
    pub max_output_tokens: usize,
    /// Stop strings per Generate request.
    #[arg(long, env = "GELO_MAX_STOP_STRINGS", default_value_t = Limits::default().max_stop_strings)]
    pub max_stop_strings: usize,
    #[arg(long, env = "GELO_MAX_QUEUE", default_value_t = Limits::default().max_queue)]
    pub max_queue: usize,
    #[arg(long, env = "GELO_MAX_BATCH_SEQUENCES", default_value_t = Limits::default().max_batch_sequences)]
    pub max_batch_sequences: usize,
    #[arg(long, env = "GELO_BATCH_WINDOW_MS", default_value_t = 5)]
    pub batch_window_ms: u64,
    #[arg(long, env = "GELO_BATCH_TOKENS", default_value_t = Limits::default().batch_tokens)]
    pub batch_tokens: usize,
    /// Largest encoded request (bytes).
    #[arg(long, env = "GELO_MAX_REQUEST_BYTES", default_value_t = Limits::default().max_request_bytes)]
    pub max_request_bytes: usize,
    /// Export traces over OTLP/gRPC to this collector (`http://127.0.0.1:4317`); off when
    /// unset. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` also
    /// turn it on. Spans carry methods, status codes and counts, never request text.
    #[arg(long, env = "GELO_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl ServiceArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_texts: self.max_texts,
            max_documents: self.max_documents,
            max_tokens_per_text: self.max_tokens_per_text,
            max_prompt_tokens: self.max_prompt_tokens,
            max_output_tokens: self.max_output_tokens,
            max_stop_strings: self.max_stop_strings,
            max_queue: self.max_queue,
            max_batch_sequences: self.max_batch_sequences,
            batch_window: std::time::Duration::from_millis(self.batch_window_ms),
            batch_tokens: self.batch_tokens,
            max_request_bytes: self.max_request_bytes,
        }
    }

    /// The trace exporter these flags (or the standard OTel variables) ask for, if any.
    pub fn otlp(&self, role: Role) -> Option<Otlp> {
        let endpoint = self.otlp_endpoint.clone().or_else(|| {
            ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
                .iter()
                .find_map(|v| std::env::var(v).ok())
        });
        endpoint
            .filter(|e| !e.trim().is_empty())
            .map(|endpoint| Otlp { endpoint, service_name: format!("gelo-{}", role.name()) })
    }
}

pub fn run(role: Role, args: ServiceArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run_async(role, args))
}

async fn run_async(role: Role, args: ServiceArgs) -> Result<()> {
    // 1. Engine (timed, for engine vs TEE time) and executor.
    let timed = Arc::new(TimedEngine::new(args.protocol.engine()?));
    let clock: EngineClock = {
        let t = timed.clone();
        Arc::new(move || t.seconds())
    };
    let engine: Arc<dyn Engine> = timed;
    let executor = args.protocol.service_executor(args.plaintext, engine)?;
    if args.plaintext {
        tracing::warn!("PLAINTEXT EXECUTOR: activations reach the engine unmasked");
    }
    // 2. Model: identity checked, weights provisioned, before any port opens.
    let expected = args.expect_identity.as_deref().map(str::parse::<ModelIdentity>).transpose()?;
    let opts = LoadOptions {
        expected_identity: expected,
        max_seq_length: args.max_seq_length,
        instruction: None,
        decode_groups: Some(args.decode_groups),
    };
    let metrics = Metrics::new(role.name());
    let limits = args.limits();
    let (model, exec, path) = (role, executor.clone(), args.model.clone());
    let loaded = tokio::task::spawn_blocking(move || -> Result<(Loaded, ModelIdentity)> {
        Ok(match model {
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
    .await??;
    let (loaded, identity) = loaded;
    tracing::info!(role = role.name(), model = %identity, "model loaded and provisioned");
    // The services report engine failures here; the health service and probes show them.
    let health = health();
    let (m, h) = (metrics.clone(), health.clone());
    let routes = match loaded {
        Loaded::Embedder(e) => tonic::service::Routes::new(EmbedderService::new(e, limits, m, clock, h).into_server()),
        Loaded::Reranker(r) => tonic::service::Routes::new(RerankerService::new(r, limits, m, clock, h).into_server()),
        Loaded::Generator(g) => {
            tonic::service::Routes::new(GeneratorService::new(g, limits, m, clock, h).into_server())
        }
    };
    // 3. Transport: RA-TLS with evidence for this model and these settings, unless told.
    let scheme = serde_json::json!({ "role": role.name(), "protocol": executor.scheme() });
    let transport = if args.insecure {
        tracing::warn!("INSECURE: plaintext gRPC, no attestation; for local testing only");
        Transport::Insecure
    } else {
        let issuer = attest::issuer_from_env_or_default()?;
        let claims =
            ServiceClaims { model_identity: identity.0, scheme_json: scheme.to_string(), role: role.name().into() };
        let identity = Arc::new(ServerIdentity::generate(issuer, claims)?);
        let clients = match &args.client_policy {
            Some(p) => {
                let policy = Policy::from_file(p).with_context(|| format!("client policy {}", p.display()))?;
                Some(Arc::new(AttestedClientVerifier::new(Arc::new(policy), ExpectedPeer::default())))
            }
            None => None,
        };
        Transport::RaTls { identity, clients }
    };
    serve_with(role, args.listen, args.metrics_listen, transport, metrics, routes, health).await
}

enum Loaded {
    Embedder(Arc<dyn models::Embedder>),
    Reranker(Arc<dyn models::Reranker>),
    Generator(Arc<models::TextGenerator>),
}

pub async fn serve_with(
    role: Role,
    listen: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    transport: Transport,
    metrics: Metrics,
    routes: tonic::service::Routes,
    health: Health,
) -> Result<()> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let metrics_listener = match metrics_listen {
        Some(a) => Some(TcpListener::bind(a).await.with_context(|| format!("binding {a}"))?),
        None => None,
    };
    let identity = match &transport {
        Transport::RaTls { identity, .. } => Some(identity.clone()),
        Transport::Insecure => None,
    };
    let line = ready_line(
        role.name(),
        listener.local_addr()?,
        metrics_listener.as_ref().and_then(|l| l.local_addr().ok()),
        identity.as_deref(),
    );
    println!("{line}");
    let opts = ServeOptions { listener, transport, metrics_listener, metrics };
    serve(opts, routes, health, shutdown_signal()).await?;
    tracing::info!(role = role.name(), "stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
