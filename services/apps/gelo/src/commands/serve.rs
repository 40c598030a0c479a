//! `gelo embedder|reranker|generator`: a model service. Its flags, `GELO_*` variables and
//! `--config` file make a `server::ServiceConfig` (commands/config.rs); this command opens
//! the engine it names (the GPU engines are linked here, not in `gelo-server`) and
//! `server::run` does the rest: executor, model identity check, RA-TLS claims, then the port.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::Result;
use kernels::timing::TimedEngine;
use serde::Serialize;
use server::{Role, ServiceConfig, ServiceEngine, embedder::EngineClock};

use super::{
    config::{ConfigFile, is_false, sources},
    engine::{ProtocolFlags, open_engine},
    telemetry::Otlp,
};

/// A model service's flags, every one optional here: a flag not given leaves the value to
/// `GELO_<FLAG>`, the `--config` file or the default (`server::ServiceConfig`).
#[derive(clap::Args, Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ServiceArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub config: ConfigFile,
    /// Model folder (safetensors) or GGUF file (required).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Refuse to start unless the model files hash to this identity (64 hex).
    #[arg(long)]
    pub expect_identity: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub protocol: ProtocolFlags,
    /// Send activations to the engine in the clear (parity baseline; never in production).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub plaintext: bool,
    /// gRPC listen address (port 0: any free port, printed on the ready line).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Prometheus `/metrics` listen address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Plaintext TCP instead of RA-TLS. Nothing is attested.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure: bool,
    /// Require RA-TLS clients whose evidence satisfies this policy file (mutual RA-TLS).
    #[arg(long)]
    pub client_policy: Option<PathBuf>,
    /// Override the model's maximum input length (tokens).
    #[arg(long)]
    pub max_seq_length: Option<usize>,
    /// Groups a batched decode step runs as, concurrently (generator; 1: one pass per step).
    #[arg(long)]
    pub decode_groups: Option<usize>,
    #[arg(long)]
    pub max_texts: Option<usize>,
    #[arg(long)]
    pub max_documents: Option<usize>,
    /// Tokens per text (embedder) or (query, document) pair (reranker); default: the
    /// model's maximum, which also caps this.
    #[arg(long)]
    pub max_tokens_per_text: Option<usize>,
    /// Prompt tokens per Generate request; default: the model's context, which also caps this.
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    #[arg(long)]
    pub max_output_tokens: Option<usize>,
    /// Stop strings per Generate request.
    #[arg(long)]
    pub max_stop_strings: Option<usize>,
    #[arg(long)]
    pub max_queue: Option<usize>,
    #[arg(long)]
    pub max_batch_sequences: Option<usize>,
    #[arg(long)]
    pub batch_window_ms: Option<u64>,
    #[arg(long)]
    pub batch_tokens: Option<usize>,
    /// Largest encoded request (bytes).
    #[arg(long)]
    pub max_request_bytes: Option<usize>,
    /// Export traces over OTLP/gRPC to this collector (`http://127.0.0.1:4317`); off when
    /// unset. `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` also
    /// turn it on. Spans carry methods, status codes and counts, never request text.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
}

impl ServiceArgs {
    /// The service's configuration: these flags over `GELO_*` over `--config` over defaults.
    pub fn config(&self) -> Result<ServiceConfig> {
        ServiceConfig::load(&sources(&self.config, self)?)
    }
}

/// The trace exporter the configuration (or the standard OTel variables) asks for, if any.
pub fn otlp(role: Role, cfg: &ServiceConfig) -> Option<Otlp> {
    let endpoint = cfg.otlp_endpoint.clone().or_else(|| {
        ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"].iter().find_map(|v| std::env::var(v).ok())
    });
    endpoint
        .filter(|e| !e.trim().is_empty())
        .map(|endpoint| Otlp { endpoint, service_name: format!("gelo-{}", role.as_str()) })
}

/// Opens the engine (timed, for engine vs TEE time) and runs the service until SIGINT or
/// SIGTERM.
pub fn run(role: Role, cfg: ServiceConfig) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let timed = Arc::new(TimedEngine::new(open_engine(&cfg.protocol)?));
        let clock: EngineClock = {
            let t = timed.clone();
            Arc::new(move || t.seconds())
        };
        server::run(role, cfg, ServiceEngine { engine: timed, clock }, shutdown_signal()).await
    })
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
