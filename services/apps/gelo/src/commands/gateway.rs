//! `gelo gateway`: the RAG gateway (crate `gelo-gateway`). Flags, `GELO_*` variables and
//! the `--config` file make a `gateway::GatewayOptions` (commands/config.rs), checked into
//! a `gateway::GatewayConfig`; everything else happens in `gateway::run`.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Result;
use gateway::GatewayOptions;
use serde::Serialize;

use super::{
    config::{ConfigFile, is_false, sources},
    serve::shutdown_signal,
};

/// `${GELO_CACHE:-~/.cache/gelo}`.
pub fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("GELO_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/gelo")
}

/// The gateway's flags, every one optional here: a flag not given leaves the value to
/// `GELO_<FLAG>`, the `--config` file or the default (`gateway::GatewayOptions`).
#[derive(clap::Args, Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GatewayArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub config: ConfigFile,
    /// The embedder model's files (folder with tokenizer.json, or GGUF): the gateway chunks
    /// by its tokens, and its identity is the gateway's attested model identity.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Refuse to start unless `--model` hashes to this identity (64 hex).
    #[arg(long)]
    pub expect_identity: Option<String>,
    /// Accepted for uniformity with the model services (the operator passes it); the
    /// gateway runs no model.
    #[arg(long, hide = true)]
    pub engine: Option<String>,
    /// gRPC listen address (`gelo.v1.Rag`, health, reflection, attestation).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Prometheus `/metrics` listen address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// OpenAI-compatible HTTP API listen address (plain HTTP; loopback unless --http-allow-remote).
    #[arg(long)]
    pub http_listen: Option<SocketAddr>,
    /// Allow the plain-HTTP API on a non-loopback address (TLS terminated in front of it,
    /// inside the same trust boundary).
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub http_allow_remote: bool,
    /// The HTTP API's keys: a file of their SHA-256 digests, one per line (`gelo api-key new
    /// --keys-file FILE` makes a key and adds it). Clients send `Authorization: Bearer KEY`;
    /// the file is read again within a second of a change, so keys rotate without a restart.
    #[arg(long, value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Serve the HTTP API without API keys: anything that reaches the port may read answers
    /// from the store and add documents. Instead of --api-keys-file, never with it.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub http_unauthenticated: bool,
    /// More names the HTTP port answers to in `Host` and `Origin` (`name` for any port,
    /// `name:port` for one), besides localhost, 127.0.0.1 and [::1] on its port: the names a
    /// TLS terminator in front of it forwards.
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub http_allowed_hosts: Vec<String>,
    /// Requests per second per API key, on average (more are answered 429 with Retry-After).
    #[arg(long)]
    pub http_rate_limit: Option<f64>,
    /// Requests an API key may send at once before the rate applies.
    #[arg(long)]
    pub http_rate_burst: Option<u32>,
    /// Plaintext gRPC to clients: the gateway is not attested to them. Local testing only.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure: bool,
    /// Require RA-TLS clients whose evidence satisfies this policy (mutual RA-TLS).
    #[arg(long)]
    pub client_policy: Option<PathBuf>,
    /// Attestation policy backends must satisfy (with a routing table, defaults to its policy.json).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Embedder backends, `host:port` (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub embedder: Vec<String>,
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reranker: Vec<String>,
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub generator: Vec<String>,
    /// Model identity (64 hex) the embedder backends must prove.
    #[arg(long)]
    pub embedder_identity: Option<String>,
    #[arg(long)]
    pub reranker_identity: Option<String>,
    #[arg(long)]
    pub generator_identity: Option<String>,
    /// The operator's routing table (`routes.json`, e.g. the routes ConfigMap mounted as a
    /// volume); re-read when it changes. A sibling `policy.json` is the policy unless --policy.
    #[arg(long)]
    pub routes_file: Option<PathBuf>,
    /// Seconds between reads of --routes-file.
    #[arg(long)]
    pub routes_poll_seconds: Option<f64>,
    /// Watch this routing-table ConfigMap through the Kubernetes API (namespace: --routes-namespace).
    #[arg(long, conflicts_with = "routes_file")]
    pub routes_configmap: Option<String>,
    /// Namespace of --routes-configmap.
    #[arg(long)]
    pub routes_namespace: Option<String>,
    /// Seconds between re-verifications of a verified backend (fresh nonce + health).
    #[arg(long)]
    pub verify_interval: Option<f64>,
    /// Seconds between attempts on a backend that failed verification or a request.
    #[arg(long)]
    pub retry_interval: Option<f64>,
    /// Seconds one handshake, challenge or health check may take.
    #[arg(long)]
    pub verify_timeout: Option<f64>,
    /// Embed and rerank calls in flight per backend; more wait in the gateway.
    #[arg(long)]
    pub backend_in_flight: Option<usize>,
    /// Seconds one backend call (or a stream's first token) may take; then DEADLINE_EXCEEDED
    /// naming the backend, which leaves the rotation until it verifies again.
    #[arg(long)]
    pub backend_timeout: Option<f64>,
    /// Model requests served at once, gRPC and HTTP together; more are refused at once with
    /// RESOURCE_EXHAUSTED / HTTP 429 and Retry-After.
    #[arg(long)]
    pub max_concurrent_requests: Option<usize>,
    /// Connections open at once on each port (HTTP, RA-TLS); one more is refused at once (HTTP
    /// 503 with Retry-After; on the RA-TLS port closed before its handshake).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Where the sealed document store lives.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Sealing key file (created if missing). Default: DATA_DIR/sealing.key with mock
    /// attestation; on SEV-SNP hardware the key the AMD-SP derives for this image (no file).
    #[arg(long)]
    pub sealing_key_file: Option<PathBuf>,
    /// Passage size in embedder tokens.
    #[arg(long)]
    pub chunk_tokens: Option<usize>,
    /// Tokens consecutive passages share.
    #[arg(long)]
    pub chunk_overlap: Option<usize>,
    /// Passages a Search returns by default.
    #[arg(long)]
    pub search_top_k: Option<usize>,
    /// Passages a Query answers from by default.
    #[arg(long)]
    pub query_top_k: Option<usize>,
    /// Rerank by default when a reranker is configured (requests can override).
    #[arg(long)]
    pub rerank: Option<bool>,
    /// Candidates retrieved for the reranker.
    #[arg(long)]
    pub rerank_candidates: Option<usize>,
    /// Characters of passage text in a Query's prompt.
    #[arg(long)]
    pub context_chars: Option<usize>,
    /// Answer tokens when a Query does not say.
    #[arg(long)]
    pub max_answer_tokens: Option<u32>,
    /// Repetition penalty of a Query's answer (1: none).
    #[arg(long)]
    pub answer_repetition_penalty: Option<f32>,
    /// Sentences (or list items, table rows) of each passage shown to the generator, from
    /// the one closest to the question; 0 shows whole passages.
    #[arg(long)]
    pub answer_focus_units: Option<usize>,
    /// Passages retrieved for a Query when the focus is on; the best `top_k` by their closest
    /// sentence are shown.
    #[arg(long)]
    pub answer_focus_candidates: Option<usize>,
    /// An answer ends once a run of this many words repeats one it already wrote
    /// (degenerate repetition); 0: off.
    #[arg(long)]
    pub answer_stop_repeated_words: Option<u32>,
    /// Largest document (bytes of text, title and metadata).
    #[arg(long)]
    pub max_document_bytes: Option<usize>,
}

impl GatewayArgs {
    /// The gateway's configuration: these flags over `GELO_*` over `--config` over defaults.
    pub fn config(&self) -> Result<gateway::GatewayConfig> {
        let options = GatewayOptions::load(&sources(&self.config, self)?)?;
        Ok(options.into_config(&cache_dir().join("gateway"))?)
    }
}

pub fn run(args: GatewayArgs) -> Result<()> {
    let config = args.config()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(gateway::run(config, shutdown_signal()))?;
    Ok(())
}
