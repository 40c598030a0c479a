//! Decoder hyper-parameters from `{arch}.*` metadata, with llama.cpp's defaults for the
//! optional keys, so model code gets the same numbers llama.cpp runs with.

use crate::error::Result;
use crate::file::GgufFile;

/// The fields of an HF `config.json` a Llama/Qwen2/Qwen3 decoder needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmHparams {
    pub architecture: String,
    /// `num_hidden_layers`
    pub block_count: usize,
    /// `max_position_embeddings`
    pub context_length: usize,
    /// `hidden_size`
    pub embedding_length: usize,
    /// `intermediate_size`
    pub feed_forward_length: usize,
    /// `num_attention_heads`
    pub head_count: usize,
    /// `num_key_value_heads` (defaults to `head_count`)
    pub head_count_kv: usize,
    /// `head_dim` for Q and K (`attention.key_length`, defaults to hidden / heads; Qwen3 sets it)
    pub key_length: usize,
    /// `head_dim` for V (`attention.value_length`, same default)
    pub value_length: usize,
    /// `rope_theta` (`rope.freq_base`, llama.cpp's default 10000)
    pub rope_freq_base: f32,
    /// Rotated dimensions per head (`rope.dimension_count`, defaults to `key_length`)
    pub rope_dimension_count: usize,
    /// `rms_norm_eps`
    pub rms_norm_eps: f32,
    /// Rows of the token embedding (`{arch}.vocab_size` when present, else its tensor rows).
    pub vocab_size: usize,
    /// No `output.weight`: the LM head is the token embedding.
    pub tied_embeddings: bool,
}

impl GgufFile {
    pub fn llm_hparams(&self) -> Result<LlmHparams> {
        let arch = self.architecture()?.to_string();
        let m = self.metadata();
        let key = |k: &str| format!("{arch}.{k}");
        let embedding_length = m.get_u32(&key("embedding_length"))? as usize;
        let head_count = m.get_u32(&key("attention.head_count"))? as usize;
        let head_count_kv = m.opt_u32(&key("attention.head_count_kv"))?.map_or(head_count, |v| v as usize);
        let default_head_dim = embedding_length.checked_div(head_count).unwrap_or(0);
        let key_length = m.opt_u32(&key("attention.key_length"))?.map_or(default_head_dim, |v| v as usize);
        let value_length = m.opt_u32(&key("attention.value_length"))?.map_or(default_head_dim, |v| v as usize);
        let vocab_size = match m.opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => self.tensor_info("token_embd.weight")?.ne.get(1).copied().unwrap_or(0) as usize,
        };
        Ok(LlmHparams {
            block_count: m.get_u32(&key("block_count"))? as usize,
            context_length: m.get_u32(&key("context_length"))? as usize,
            embedding_length,
            feed_forward_length: m.get_u32(&key("feed_forward_length"))? as usize,
            head_count,
            head_count_kv,
            key_length,
            value_length,
            rope_freq_base: m.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_dimension_count: m.opt_u32(&key("rope.dimension_count"))?.map_or(key_length, |v| v as usize),
            rms_norm_eps: m.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            vocab_size,
            tied_embeddings: !self.has_tensor("output.weight"),
            architecture: arch,
        })
    }
}
