//! `gelo gateway`'s configuration as keys and values ([`GatewayOptions`]): read from
//! defaults, a YAML/JSON file, `GELO_*` variables and flags (each over the one before, by
//! [`server::config::load`]), then checked and turned into the [`GatewayConfig`] that
//! [`crate::run`] takes.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use server::config::{Layered, Sources, layers::comma_list};

use crate::{
    BackendSpec, GatewayConfig, GatewayError, Result, Role, RoutesSource, Settings, VerifyTiming, http::AccessConfig,
};

/// Everything `gelo gateway` reads, by flag name (`GELO_<FLAG>`, `flag-name:` in a file);
/// the flags are documented in `gelo gateway --help` and docs/GATEWAY.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct GatewayOptions {
    /// The embedder model's tokenizer files. Required: empty when none was given.
    pub model: PathBuf,
    pub expect_identity: Option<String>,
    /// Accepted for uniformity with the model services; the gateway runs no model.
    pub engine: Option<String>,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub http_listen: Option<SocketAddr>,
    pub http_allow_remote: bool,
    /// The HTTP port's API keys (SHA-256 digests, one per line); re-read when it changes.
    pub api_keys_file: Option<PathBuf>,
    /// Serve the HTTP API without keys (instead of `api-keys-file`).
    pub http_unauthenticated: bool,
    /// More `Host` names the HTTP port answers to: a comma-separated string or a list.
    #[serde(deserialize_with = "comma_list")]
    pub http_allowed_hosts: Vec<String>,
    /// Requests per second per API key, on average.
    pub http_rate_limit: f64,
    /// Requests an API key may send at once.
    pub http_rate_burst: u32,
    pub insecure: bool,
    pub client_policy: Option<PathBuf>,
    pub policy: Option<PathBuf>,
    /// `host:port` backends: a comma-separated string or a list.
    #[serde(deserialize_with = "comma_list")]
    pub embedder: Vec<String>,
    #[serde(deserialize_with = "comma_list")]
    pub reranker: Vec<String>,
    #[serde(deserialize_with = "comma_list")]
    pub generator: Vec<String>,
    pub embedder_identity: Option<String>,
    pub reranker_identity: Option<String>,
    pub generator_identity: Option<String>,
    pub routes_file: Option<PathBuf>,
    pub routes_poll_seconds: f64,
    pub routes_configmap: Option<String>,
    /// Read from `POD_NAMESPACE`, not `GELO_ROUTES_NAMESPACE`.
    pub routes_namespace: String,
    pub verify_interval: f64,
    pub retry_interval: f64,
    pub verify_timeout: f64,
    pub backend_in_flight: usize,
    /// Seconds one backend call (or a stream's first message) may take.
    pub backend_timeout: f64,
    /// Model requests served at once (gRPC and HTTP together); more get RESOURCE_EXHAUSTED / 429.
    pub max_concurrent_requests: usize,
    /// Connections open at once on each port (HTTP, RA-TLS); more are refused at once.
    pub max_connections: usize,
    /// Default: `${GELO_CACHE:-~/.cache/gelo}/gateway`, given to [`GatewayOptions::into_config`].
    pub data_dir: Option<PathBuf>,
    pub sealing_key_file: Option<PathBuf>,
    pub chunk_tokens: usize,
    pub chunk_overlap: usize,
    pub search_top_k: usize,
    pub query_top_k: usize,
    pub rerank: bool,
    pub rerank_candidates: usize,
    pub context_chars: usize,
    pub max_answer_tokens: u32,
    pub answer_repetition_penalty: f32,
    pub answer_focus_units: usize,
    pub answer_focus_candidates: usize,
    pub answer_stop_repeated_words: u32,
    pub max_document_bytes: usize,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        let s = Settings::default();
        let access = AccessConfig::default();
        GatewayOptions {
            model: PathBuf::new(),
            expect_identity: None,
            engine: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: None,
            http_listen: None,
            http_allow_remote: false,
            api_keys_file: None,
            http_unauthenticated: false,
            http_allowed_hosts: vec![],
            http_rate_limit: access.rate_per_second,
            http_rate_burst: access.burst,
            insecure: false,
            client_policy: None,
            policy: None,
            embedder: vec![],
            reranker: vec![],
            generator: vec![],
            embedder_identity: None,
            reranker_identity: None,
            generator_identity: None,
            routes_file: None,
            routes_poll_seconds: 5.0,
            routes_configmap: None,
            routes_namespace: "default".into(),
            verify_interval: 30.0,
            retry_interval: 5.0,
            verify_timeout: 10.0,
            backend_in_flight: crate::backends::DEFAULT_UNARY_IN_FLIGHT,
            backend_timeout: crate::backends::DEFAULT_CALL_TIMEOUT.as_secs_f64(),
            max_concurrent_requests: crate::admission::DEFAULT_MAX_CONCURRENT,
            max_connections: crate::connections::DEFAULT_MAX_CONNECTIONS,
            data_dir: None,
            sealing_key_file: None,
            chunk_tokens: 200,
            chunk_overlap: 40,
            search_top_k: s.search_top_k,
            query_top_k: s.query_top_k,
            rerank: true,
            rerank_candidates: s.rerank_candidates,
            context_chars: s.context_chars,
            max_answer_tokens: s.max_tokens,
            answer_repetition_penalty: s.repetition_penalty,
            answer_focus_units: s.focus_units,
            answer_focus_candidates: s.focus_candidates,
            answer_stop_repeated_words: s.stop_repeated_words,
            max_document_bytes: s.max_document_bytes,
        }
    }
}

impl Layered for GatewayOptions {
    const ENV_NAMES: &'static [(&'static str, &'static str)] = &[("routes-namespace", "POD_NAMESPACE")];
}

fn identity(flag: &str, v: Option<&str>) -> Result<Option<[u8; 32]>> {
    v.map(|s| {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)
            .map_err(|_| GatewayError::Config(format!("--{flag}: expected 64 hex digits")))?;
        Ok(out)
    })
    .transpose()
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        return Err(GatewayError::Config(format!("--{flag} must be a positive number of seconds")));
    }
    Ok(Duration::from_secs_f64(v))
}

impl GatewayOptions {
    /// Reads the options from their layers, and checks that a model was named.
    pub fn load<F: Serialize>(sources: &Sources<'_, F>) -> Result<Self> {
        let options: GatewayOptions = server::config::load(sources).map_err(|e| GatewayError::Config(e.to_string()))?;
        if options.model.as_os_str().is_empty() {
            return Err(GatewayError::Config(
                "a model is required: --model PATH (or GELO_MODEL, or `model:` in the config file)".into(),
            ));
        }
        Ok(options)
    }

    fn backends(&self) -> Result<Vec<BackendSpec>> {
        let mut backends = Vec::new();
        for (role, endpoints, id, flag) in [
            (Role::Embedder, &self.embedder, &self.embedder_identity, "embedder-identity"),
            (Role::Reranker, &self.reranker, &self.reranker_identity, "reranker-identity"),
            (Role::Generator, &self.generator, &self.generator_identity, "generator-identity"),
        ] {
            let model_identity = identity(flag, id.as_deref())?;
            if !endpoints.is_empty() && model_identity.is_none() {
                return Err(GatewayError::Config(format!(
                    "--{role} needs --{flag}: the model identity its evidence must prove (`gelo model identity PATH`)"
                )));
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
        Ok(backends)
    }

    fn routes(&self) -> Result<Option<RoutesSource>> {
        Ok(match (&self.routes_file, &self.routes_configmap) {
            (Some(_), Some(_)) => {
                return Err(GatewayError::Config("--routes-file and --routes-configmap: give one, not both".into()));
            }
            (Some(f), None) => Some(RoutesSource::File {
                routes: f.clone(),
                policy: crate::backends::routes::sibling_policy(f),
                poll: seconds("routes-poll-seconds", self.routes_poll_seconds)?,
            }),
            (None, Some(name)) => {
                Some(RoutesSource::ConfigMap { name: name.clone(), namespace: self.routes_namespace.clone() })
            }
            (None, None) => None,
        })
    }

    /// The checked configuration; `default_data_dir` unless `data-dir` was given.
    pub fn into_config(self, default_data_dir: &Path) -> Result<GatewayConfig> {
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
        let (backends, routes) = (self.backends()?, self.routes()?);
        let http_access = AccessConfig {
            api_keys_file: self.api_keys_file,
            unauthenticated: self.http_unauthenticated,
            allowed_hosts: self.http_allowed_hosts,
            rate_per_second: self.http_rate_limit,
            burst: self.http_rate_burst,
        };
        if self.http_listen.is_some() {
            http_access.validate()?;
        }
        Ok(GatewayConfig {
            backends,
            routes,
            expect_identity: identity("expect-identity", self.expect_identity.as_deref())?,
            timing: VerifyTiming {
                interval: seconds("verify-interval", self.verify_interval)?,
                retry: seconds("retry-interval", self.retry_interval)?,
                timeout: seconds("verify-timeout", self.verify_timeout)?,
            },
            data_dir: self.data_dir.unwrap_or_else(|| default_data_dir.to_path_buf()),
            model: self.model,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            http_listen: self.http_listen,
            http_allow_remote: self.http_allow_remote,
            http_access,
            insecure: self.insecure,
            client_policy: self.client_policy,
            policy: self.policy,
            backend_in_flight: self.backend_in_flight,
            backend_timeout: seconds("backend-timeout", self.backend_timeout)?,
            max_concurrent_requests: self.max_concurrent_requests,
            max_connections: self.max_connections,
            sealing_key_file: self.sealing_key_file,
            chunk_tokens: self.chunk_tokens,
            chunk_overlap: self.chunk_overlap,
            settings,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    }

    #[test]
    fn flag_over_env_over_file_over_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.yaml");
        let text = "model: /m\nchunk-tokens: 100\nchunk-overlap: 10\nsearch-top-k: 3\nrerank: false\n\
                    embedder: [a:1, b:2]\nembedder-identity: '0000000000000000000000000000000000000000000000000000000000000001'\n";
        std::fs::write(&path, text).unwrap();
        let sources = Sources {
            file: Some(path.as_path()),
            env: env(&[
                ("GELO_CHUNK_TOKENS", "150"),
                ("GELO_CHUNK_OVERLAP", "20"),
                ("GELO_RERANK", "true"),
                ("GELO_RERANKER", "r:1, r:2"),
                ("GELO_RERANKER_IDENTITY", &"ab".repeat(32)),
                ("POD_NAMESPACE", "rag"),
                ("GELO_ROUTES_NAMESPACE", "ignored"),
            ]),
            flags: json!({ "chunk-tokens": 250, "routes-configmap": "routes" }),
        };
        let options = GatewayOptions::load(&sources).unwrap();
        assert_eq!(options.chunk_tokens, 250, "flag over env and file");
        assert_eq!(options.chunk_overlap, 20, "env over file");
        assert!(options.rerank, "env over file");
        assert_eq!(options.search_top_k, 3, "file over default");
        assert_eq!(options.query_top_k, Settings::default().query_top_k, "default");
        assert_eq!(options.embedder, ["a:1", "b:2"]);
        assert_eq!(options.reranker, ["r:1", "r:2"]);
        assert_eq!(options.routes_namespace, "rag");
        let cfg = options.into_config(Path::new("/data")).unwrap();
        assert_eq!(cfg.backends.len(), 4);
        assert_eq!(cfg.data_dir, PathBuf::from("/data"));
        assert!(matches!(cfg.routes, Some(RoutesSource::ConfigMap { ref namespace, .. }) if namespace == "rag"));
    }

    #[test]
    fn unknown_file_key_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.json");
        std::fs::write(&path, r#"{"model": "/m", "max-queue": 5}"#).unwrap();
        let sources = Sources { file: Some(path.as_path()), env: vec![], flags: json!({}) };
        let err = GatewayOptions::load(&sources).unwrap_err().to_string();
        assert!(err.contains("unknown key `max-queue`"), "{err}");
    }

    #[test]
    fn defaults_match_and_checks_hold() {
        let sources = Sources { file: None, env: vec![], flags: json!({ "model": "/m" }) };
        let options = GatewayOptions::load(&sources).unwrap();
        assert_eq!(options, GatewayOptions { model: "/m".into(), ..GatewayOptions::default() });
        let both = GatewayOptions { routes_file: Some("r.json".into()), routes_configmap: Some("r".into()), ..options };
        assert!(both.clone().into_config(Path::new("/d")).is_err());
        let no_identity = GatewayOptions { generator: vec!["g:1".into()], routes_file: None, ..both };
        let err = no_identity.into_config(Path::new("/d")).unwrap_err().to_string();
        assert!(err.contains("--generator-identity"), "{err}");
    }

    #[test]
    fn an_http_port_needs_a_keys_file_or_the_unauthenticated_switch() {
        let env = env(&[("GELO_HTTP_ALLOWED_HOSTS", "gelo.internal, proxy:443"), ("GELO_HTTP_RATE_BURST", "7")]);
        let flags = json!({ "model": "/m", "http-listen": "127.0.0.1:8080" });
        let options = GatewayOptions::load(&Sources { file: None, env, flags }).unwrap();
        let err = options.clone().into_config(Path::new("/d")).unwrap_err().to_string();
        assert!(err.contains("--api-keys-file") && err.contains("--http-unauthenticated"), "{err}");
        let keys = GatewayOptions { api_keys_file: Some("/k".into()), ..options.clone() };
        let access = keys.into_config(Path::new("/d")).unwrap().http_access;
        assert_eq!(access.api_keys_file, Some(PathBuf::from("/k")));
        assert_eq!(access.allowed_hosts, ["gelo.internal", "proxy:443"]);
        assert_eq!((access.burst, access.rate_per_second), (7, AccessConfig::default().rate_per_second));
        let open = GatewayOptions { http_unauthenticated: true, ..options.clone() };
        assert!(open.into_config(Path::new("/d")).unwrap().http_access.unauthenticated);
        // Without an HTTP port there is nothing to authenticate.
        assert!(GatewayOptions { http_listen: None, ..options }.into_config(Path::new("/d")).is_ok());
    }
}
