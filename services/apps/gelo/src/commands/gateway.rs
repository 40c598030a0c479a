//! `gelo gateway`: the RAG gateway (crate `gelo-gateway`). Flags become a
//! `gateway::GatewayConfig`; everything else happens in `gateway::run`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use gateway::{BackendSpec, GatewayConfig, Role, RoutesSource, Settings, VerifyTiming};

use super::serve::shutdown_signal;

/// `${GELO_CACHE:-~/.cache/gelo}`.
pub fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("GELO_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/gelo")
}

#[derive(clap::Args, Clone, Debug)]
pub struct GatewayArgs {
    /// The embedder model's files (folder with tokenizer.json, or GGUF): the gateway chunks
    /// by its tokens, and its identity is the gateway's attested model identity.
    #[arg(long, env = "GELO_MODEL")]
    pub model: PathBuf,
    /// Refuse to start unless `--model` hashes to this identity (64 hex).
    #[arg(long, env = "GELO_EXPECT_IDENTITY")]
    pub expect_identity: Option<String>,
    /// Accepted for uniformity with the model services (the operator passes it); the
    /// gateway runs no model.
    #[arg(long, env = "GELO_ENGINE", hide = true)]
    pub engine: Option<String>,
    /// gRPC listen address (`gelo.v1.Rag`, health, reflection, attestation).
    #[arg(long, env = "GELO_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(long, env = "GELO_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// OpenAI-compatible HTTP API listen address (plain HTTP; loopback unless --http-allow-remote).
    #[arg(long, env = "GELO_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Allow the plain-HTTP API on a non-loopback address (TLS terminated in front of it,
    /// inside the same trust boundary).
    #[arg(long, env = "GELO_HTTP_ALLOW_REMOTE")]
    pub http_allow_remote: bool,
    /// Plaintext gRPC to clients: the gateway is not attested to them. Local testing only.
    #[arg(long, env = "GELO_INSECURE")]
    pub insecure: bool,
    /// Require RA-TLS clients whose evidence satisfies this policy (mutual RA-TLS).
    #[arg(long, env = "GELO_CLIENT_POLICY")]
    pub client_policy: Option<PathBuf>,
    /// Attestation policy backends must satisfy (with a routing table, defaults to its policy.json).
    #[arg(long, env = "GELO_POLICY")]
    pub policy: Option<PathBuf>,
    /// Embedder backends, `host:port` (comma-separated or repeated).
    #[arg(long, env = "GELO_EMBEDDER", value_delimiter = ',')]
    pub embedder: Vec<String>,
    #[arg(long, env = "GELO_RERANKER", value_delimiter = ',')]
    pub reranker: Vec<String>,
    #[arg(long, env = "GELO_GENERATOR", value_delimiter = ',')]
    pub generator: Vec<String>,
    /// Model identity (64 hex) the embedder backends must prove.
    #[arg(long, env = "GELO_EMBEDDER_IDENTITY")]
    pub embedder_identity: Option<String>,
    #[arg(long, env = "GELO_RERANKER_IDENTITY")]
    pub reranker_identity: Option<String>,
    #[arg(long, env = "GELO_GENERATOR_IDENTITY")]
    pub generator_identity: Option<String>,
    /// The operator's routing table (`routes.json`, e.g. the routes ConfigMap mounted as a
    /// volume); re-read when it changes. A sibling `policy.json` is the policy unless --policy.
    #[arg(long, env = "GELO_ROUTES_FILE")]
    pub routes_file: Option<PathBuf>,
    #[arg(long, env = "GELO_ROUTES_POLL_SECONDS", default_value_t = 5.0)]
    pub routes_poll_seconds: f64,
    /// Watch this routing-table ConfigMap through the Kubernetes API (namespace: --routes-namespace).
    #[arg(long, env = "GELO_ROUTES_CONFIGMAP", conflicts_with = "routes_file")]
    pub routes_configmap: Option<String>,
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub routes_namespace: String,
    /// Seconds between re-verifications of a verified backend (fresh nonce + health).
    #[arg(long, env = "GELO_VERIFY_INTERVAL", default_value_t = 30.0)]
    pub verify_interval: f64,
    /// Seconds between attempts on a backend that failed verification or a request.
    #[arg(long, env = "GELO_RETRY_INTERVAL", default_value_t = 5.0)]
    pub retry_interval: f64,
    /// Seconds one handshake, challenge or health check may take.
    #[arg(long, env = "GELO_VERIFY_TIMEOUT", default_value_t = 10.0)]
    pub verify_timeout: f64,
    /// Embed and rerank calls in flight per backend; more wait in the gateway.
    #[arg(long, env = "GELO_BACKEND_IN_FLIGHT", default_value_t = gateway::backends::DEFAULT_UNARY_IN_FLIGHT)]
    pub backend_in_flight: usize,
    /// Where the sealed document store lives.
    #[arg(long, env = "GELO_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Sealing key file (created if missing). Default: DATA_DIR/sealing.key with mock
    /// attestation; on SEV-SNP hardware the key the AMD-SP derives for this image (no file).
    #[arg(long, env = "GELO_SEALING_KEY_FILE")]
    pub sealing_key_file: Option<PathBuf>,
    /// Passage size in embedder tokens.
    #[arg(long, env = "GELO_CHUNK_TOKENS", default_value_t = 200)]
    pub chunk_tokens: usize,
    /// Tokens consecutive passages share.
    #[arg(long, env = "GELO_CHUNK_OVERLAP", default_value_t = 40)]
    pub chunk_overlap: usize,
    /// Passages a Search returns by default.
    #[arg(long, env = "GELO_SEARCH_TOP_K", default_value_t = Settings::default().search_top_k)]
    pub search_top_k: usize,
    /// Passages a Query answers from by default.
    #[arg(long, env = "GELO_QUERY_TOP_K", default_value_t = Settings::default().query_top_k)]
    pub query_top_k: usize,
    /// Rerank by default when a reranker is configured (requests can override).
    #[arg(long, env = "GELO_RERANK", default_value_t = true, action = clap::ArgAction::Set)]
    pub rerank: bool,
    /// Candidates retrieved for the reranker.
    #[arg(long, env = "GELO_RERANK_CANDIDATES", default_value_t = Settings::default().rerank_candidates)]
    pub rerank_candidates: usize,
    /// Characters of passage text in a Query's prompt.
    #[arg(long, env = "GELO_CONTEXT_CHARS", default_value_t = Settings::default().context_chars)]
    pub context_chars: usize,
    /// Answer tokens when a Query does not say.
    #[arg(long, env = "GELO_MAX_ANSWER_TOKENS", default_value_t = Settings::default().max_tokens)]
    pub max_answer_tokens: u32,
    /// Repetition penalty of a Query's answer (1: none).
    #[arg(long, env = "GELO_ANSWER_REPETITION_PENALTY", default_value_t = Settings::default().repetition_penalty)]
    pub answer_repetition_penalty: f32,
    /// Sentences (or list items, table rows) of each passage shown to the generator, from
    /// the one closest to the question; 0 shows whole passages.
    #[arg(long, env = "GELO_ANSWER_FOCUS_UNITS", default_value_t = Settings::default().focus_units)]
    pub answer_focus_units: usize,
    /// Passages retrieved for a Query when the focus is on; the best `top_k` by their closest
    /// sentence are shown.
    #[arg(long, env = "GELO_ANSWER_FOCUS_CANDIDATES", default_value_t = Settings::default().focus_candidates)]
    pub answer_focus_candidates: usize,
    /// An answer ends once a run of this many words repeats one it already wrote
    /// (degenerate repetition); 0: off.
    #[arg(long, env = "GELO_ANSWER_STOP_REPEATED_WORDS", default_value_t = Settings::default().stop_repeated_words)]
    pub answer_stop_repeated_words: u32,
    /// Largest document (bytes of text, title and metadata).
    #[arg(long, env = "GELO_MAX_DOCUMENT_BYTES", default_value_t = Settings::default().max_document_bytes)]
    pub max_document_bytes: usize,
}

fn identity(flag: &str, v: &Option<String>) -> Result<Option<[u8; 32]>> {
    v.as_deref()
        .map(|s| {
            let mut out = [0u8; 32];
            hex::decode_to_slice(s.trim(), &mut out).with_context(|| format!("--{flag}: expected 64 hex digits"))?;
            Ok(out)
        })
        .transpose()
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        bail!("--{flag} must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

impl GatewayArgs {
    pub fn config(&self) -> Result<GatewayConfig> {
        let mut backends = Vec::new();
        for (role, endpoints, id, flag) in [
            (Role::Embedder, &self.embedder, &self.embedder_identity, "embedder-identity"),
            (Role::Reranker, &self.reranker, &self.reranker_identity, "reranker-identity"),
            (Role::Generator, &self.generator, &self.generator_identity, "generator-identity"),
        ] {
            let model_identity = identity(flag, id)?;
            if !endpoints.is_empty() && model_identity.is_none() {
                bail!(
                    "--{role} needs --{flag}: the model identity its evidence must prove (`gelo model identity PATH`)"
                );
            }
            for e in endpoints.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
                backends.push(BackendSpec {
                    role,
                    endpoint: e.to_string(),
                    model_identity,
                    scheme_identity: None,
                    tls_spki_sha256: None,
                });
            }
        }
        let routes = match (&self.routes_file, &self.routes_configmap) {
            (Some(f), _) => Some(RoutesSource::File {
                routes: f.clone(),
                policy: gateway::backends::routes::sibling_policy(f),
                poll: seconds("routes-poll-seconds", self.routes_poll_seconds)?,
            }),
            (None, Some(name)) => {
                Some(RoutesSource::ConfigMap { name: name.clone(), namespace: self.routes_namespace.clone() })
            }
            (None, None) => None,
        };
        let settings = Settings {
            search_top_k: self.search_top_k,
            query_top_k: self.query_top_k,
            rerank: self.rerank,
            rerank_candidates: self.rerank_candidates,
            context_chars: self.context_chars,
            max_tokens: self.max_answer_tokens,
            repetition_penalty: self.answer_repetition_penalty,
            focus_units: self.answer_focus_units,
            focus_candidates: self.answer_focus_candidates,
            stop_repeated_words: self.answer_stop_repeated_words,
            max_document_bytes: self.max_document_bytes,
            ..Settings::default()
        };
        Ok(GatewayConfig {
            model: self.model.clone(),
            expect_identity: identity("expect-identity", &self.expect_identity)?,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            http_listen: self.http_listen,
            http_allow_remote: self.http_allow_remote,
            insecure: self.insecure,
            client_policy: self.client_policy.clone(),
            policy: self.policy.clone(),
            backends,
            routes,
            timing: VerifyTiming {
                interval: seconds("verify-interval", self.verify_interval)?,
                retry: seconds("retry-interval", self.retry_interval)?,
                timeout: seconds("verify-timeout", self.verify_timeout)?,
            },
            backend_in_flight: self.backend_in_flight,
            data_dir: self.data_dir.clone().unwrap_or_else(|| cache_dir().join("gateway")),
            sealing_key_file: self.sealing_key_file.clone(),
            chunk_tokens: self.chunk_tokens,
            chunk_overlap: self.chunk_overlap,
            settings,
        })
    }
}

pub fn run(args: GatewayArgs) -> Result<()> {
    let config = args.config()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(gateway::run(config, shutdown_signal()))?;
    Ok(())
}
