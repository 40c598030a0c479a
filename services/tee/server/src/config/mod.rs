//! A model service's configuration ([`ServiceConfig`]), the engine and protocol settings
//! it shares with the tools that run a model ([`ProtocolConfig`]), and how every role's
//! configuration is read from defaults, a file, the environment and flags ([`layers`]).

pub mod layers;
#[cfg(test)]
mod tests;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Result, bail};
use protocol::{DecodeMasks, Engine, Executor, MaskKind, MaskedConfig, Protection, ShieldConfig, UVerifyConfig};
use serde::{Deserialize, Serialize};

pub use layers::{Layered, Sources, load};

use crate::Limits;

/// Which model a service serves: the attested role.
pub use attest::Role;

/// Everything `gelo embedder|reranker|generator` is configured with. Keys (in a config
/// file, and as `GELO_<KEY>` variables) are the flag names; the flags are documented in
/// `gelo embedder --help` and docs/SERVICES.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Model folder (safetensors) or GGUF file. Required: empty when none was given.
    pub model: PathBuf,
    /// Refuse to start unless the model files hash to this identity (64 hex).
    pub expect_identity: Option<String>,
    /// The engine and the protocol: a section whose keys sit at the top level with these
    /// (`shield-rows:`, `GELO_SHIELD_ROWS`, `--shield-rows`; see [`Layered::SECTIONS`]).
    pub protocol: ProtocolConfig,
    /// Activations to the engine in the clear (parity baseline; never in production).
    pub plaintext: bool,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// Plaintext TCP instead of RA-TLS.
    pub insecure: bool,
    /// Mutual RA-TLS: clients' evidence must satisfy this policy file.
    pub client_policy: Option<PathBuf>,
    pub max_seq_length: Option<usize>,
    pub decode_groups: usize,
    pub max_texts: usize,
    pub max_documents: usize,
    pub max_tokens_per_text: Option<usize>,
    pub max_prompt_tokens: Option<usize>,
    pub max_output_tokens: usize,
    pub max_stop_strings: usize,
    pub max_queue: usize,
    pub max_batch_sequences: usize,
    pub batch_window_ms: u64,
    pub batch_tokens: usize,
    pub max_request_bytes: usize,
    /// OTLP/gRPC trace collector; traces off when unset.
    pub otlp_endpoint: Option<String>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        let limits = Limits::default();
        ServiceConfig {
            model: PathBuf::new(),
            expect_identity: None,
            protocol: ProtocolConfig::default(),
            plaintext: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            insecure: false,
            client_policy: None,
            max_seq_length: None,
            decode_groups: models::decoder::DEFAULT_DECODE_GROUPS,
            max_texts: limits.max_texts,
            max_documents: limits.max_documents,
            max_tokens_per_text: limits.max_tokens_per_text,
            max_prompt_tokens: limits.max_prompt_tokens,
            max_output_tokens: limits.max_output_tokens,
            max_stop_strings: limits.max_stop_strings,
            max_queue: limits.max_queue,
            max_batch_sequences: limits.max_batch_sequences,
            batch_window_ms: 5,
            batch_tokens: limits.batch_tokens,
            max_request_bytes: limits.max_request_bytes,
            otlp_endpoint: None,
        }
    }
}

impl Layered for ServiceConfig {
    const SECTIONS: &'static [(&'static str, layers::Keys)] = &[("protocol", layers::field_names::<ProtocolConfig>)];
}

impl ServiceConfig {
    /// Reads the configuration from its layers, and checks that a model was named.
    pub fn load<F: Serialize>(sources: &Sources<'_, F>) -> Result<Self> {
        let cfg: ServiceConfig = load(sources)?;
        if cfg.model.as_os_str().is_empty() {
            bail!("a model is required: --model PATH (or GELO_MODEL, or `model:` in the config file)");
        }
        Ok(cfg)
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_texts: self.max_texts,
            max_documents: self.max_documents,
            max_tokens_per_text: self.max_tokens_per_text,
            max_prompt_tokens: self.max_prompt_tokens,
            max_output_tokens: self.max_output_tokens,
            max_stop_strings: self.max_stop_strings,
            max_queue: self.max_queue,
            max_batch_sequences: self.max_batch_sequences,
            batch_window: Duration::from_millis(self.batch_window_ms),
            batch_tokens: self.batch_tokens,
            max_request_bytes: self.max_request_bytes,
        }
    }

    /// The service's executor on `engine`: the plaintext baseline when asked for, else the
    /// `protection` scheme (sealed never hands `engine` an operand).
    pub fn executor(&self, engine: Arc<dyn Engine>) -> Result<Arc<dyn Executor>> {
        if self.plaintext {
            tracing::info!(engine = %engine.info().device, masked = false, "engine ready");
            return Ok(Arc::new(protocol::PlaintextExecutor::new(engine)));
        }
        let p = &self.protocol;
        if p.protection == Protection::Sealed && p.engine != "cpu" {
            tracing::warn!(
                engine = %p.engine,
                "protection `sealed`: every product runs on the TEE's CPU and the engine stays unused; \
                 `--protection masked` offloads to it, with the leakage docs/SECURITY.md measures"
            );
        }
        tracing::info!(engine = %engine.info().device, protection = p.protection.as_str(), "engine ready");
        Ok(p.protection.executor(engine, p.masked_config())?)
    }
}

/// The untrusted engine and the protocol settings: a model service's (a section of
/// [`ServiceConfig`]) and the tools' that run a model (`gelo embed`, `generate`, `eval`), read
/// from the same keys, `GELO_*` variables and flags. The defaults are here, and only here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ProtocolConfig {
    /// `sealed` (products on the TEE's CPU) or `masked` (on the engine, under GELO masks).
    #[serde(deserialize_with = "layers::from_str")]
    pub protection: Protection,
    /// `cpu`, `vulkan`, `vulkan:N`, `vulkan:NAME` (opened by the `gelo` binary, which links
    /// the GPU engines).
    pub engine: String,
    #[serde(deserialize_with = "layers::from_str")]
    pub mask: MaskKind,
    /// Shield rows per sequence (0: none).
    pub shield_rows: usize,
    pub shield_energy: f32,
    #[serde(deserialize_with = "layers::from_str")]
    pub decode_masks: DecodeMasks,
    /// U-Verify probes per weight (0: off).
    pub verify_probes: usize,
    /// Host memory (MiB) a Vulkan engine may keep in recycled buffers.
    pub engine_recycle_mib: usize,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            protection: Protection::Sealed,
            engine: "cpu".into(),
            mask: MaskKind::Auto,
            shield_rows: 8,
            shield_energy: 4.0,
            decode_masks: DecodeMasks::PerSequence,
            verify_probes: 2,
            engine_recycle_mib: 1024,
        }
    }
}

impl Layered for ProtocolConfig {}

impl ProtocolConfig {
    /// Reads the settings from their layers (a tool's: the environment and its flags).
    pub fn load<F: Serialize>(sources: &Sources<'_, F>) -> Result<Self> {
        Ok(load(sources)?)
    }

    /// The masked executor's settings (`mask`, `shield-rows`, `shield-energy`,
    /// `verify-probes`, `decode-masks`).
    pub fn masked_config(&self) -> MaskedConfig {
        MaskedConfig {
            mask: self.mask,
            shield: if self.shield_rows == 0 {
                ShieldConfig::off()
            } else {
                ShieldConfig { rows: self.shield_rows, energy: self.shield_energy }
            },
            verify: (self.verify_probes > 0).then_some(UVerifyConfig { probes: self.verify_probes, range: 3 }),
            decode_masks: self.decode_masks,
            ..Default::default()
        }
    }
}
