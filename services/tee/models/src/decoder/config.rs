//! Decoder hyper-parameters, read from an HF `config.json` or GGUF metadata; the family
//! is looked up here, once per checkpoint.

use serde::Deserialize;

use crate::error::{ModelError, Result};

use super::family::Family;

/// Decoder hyper-parameters, from an HF `config.json` or GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// The family (`llama`, `qwen2` or `qwen3`): which optional block parts it carries.
    pub arch: &'static Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub max_positions: usize,
    pub tie_embeddings: bool,
    /// Queries, keys and values rounded to f16 precision before they meet (see
    /// [`KvPrecision`]).
    pub kv: KvPrecision,
}

/// The precision attention's operands are held at: that of the runtime a checkpoint format
/// is made for, so that GELO answers as it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPrecision {
    /// f32, as transformers computes a safetensors checkpoint.
    F32,
    /// Rounded to f16, as llama.cpp's default cache holds a GGUF model's keys and values and
    /// multiplies the queries with them.
    F16,
}

#[derive(Deserialize)]
struct HfConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    hidden_act: Option<String>,
}

fn default_theta() -> f32 {
    10_000.0
}

impl DecoderConfig {
    pub fn from_hf(v: &serde_json::Value) -> Result<Self> {
        let arch = Family::by_name(v.get("model_type").and_then(|m| m.as_str()).unwrap_or_default())?;
        let c: HfConfig =
            serde_json::from_value(v.clone()).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        if c.hidden_act.as_deref().is_some_and(|a| a != "silu") {
            return Err(ModelError::Config(format!("hidden_act {:?} is not supported (silu)", c.hidden_act)));
        }
        Ok(DecoderConfig {
            arch,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
            head_dim: c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads),
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: c.rope_theta,
            max_positions: c.max_position_embeddings,
            tie_embeddings: c.tie_word_embeddings,
            kv: KvPrecision::F32,
        })
    }

    pub fn from_gguf(h: &gguf::LlmHparams) -> Result<Self> {
        let arch = Family::by_name(&h.architecture)?;
        if h.rope_dimension_count != h.key_length || h.key_length != h.value_length {
            return Err(ModelError::Config("partial RoPE or distinct K/V head sizes are not supported".into()));
        }
        Ok(DecoderConfig {
            arch,
            vocab_size: h.vocab_size,
            hidden_size: h.embedding_length,
            intermediate_size: h.feed_forward_length,
            num_layers: h.block_count,
            num_heads: h.head_count,
            num_kv_heads: h.head_count_kv,
            head_dim: h.key_length,
            rms_norm_eps: h.rms_norm_eps,
            rope_theta: h.rope_freq_base,
            max_positions: h.context_length,
            tie_embeddings: h.tied_embeddings,
            kv: KvPrecision::F16,
        })
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ModelError::Config("num_attention_heads must be a multiple of num_key_value_heads".into()));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::Config("head_dim must be even for RoPE".into()));
        }
        Ok(())
    }
}
