//! Decoder-only LLMs: Llama (SmolLM2), Qwen2 (Qwen2.5, QKV bias) and Qwen3 (per-head
//! QK-norm before RoPE), written once: RMSNorm, RoPE, grouped-query attention, SwiGLU, tied
//! or untied LM head.
//!
//! Each family's file ([`llama`], [`qwen2`], [`qwen3`]) holds a [`Family`]: which optional
//! block parts its checkpoints carry. The config (`config.rs`) looks it up once, by the
//! checkpoint's architecture name; the shared parts read its fields and never branch on the
//! name: the block (`layer.rs`), its attention with the KV cache (`attention.rs`,
//! `kv_cache.rs`), the SwiGLU feed-forward (`mlp.rs`), RMSNorm (`norm.rs`) and RoPE
//! (`rope.rs`). This file holds the model itself: embeddings, the forward pass, the batched
//! decode step and the LM head. Weight fields carry the checkpoint's names (`q_proj`,
//! `input_layernorm`, `embed_tokens`, …).
//!
//! Offload groups per block: Q/K/V bundled, O, gate+up bundled, down; the LM head too.
//! Attention, norms, RoPE, SwiGLU, residuals and the KV cache stay in the TEE.

mod attention;
mod config;
mod family;
mod kv_cache;
mod layer;
pub mod llama;
mod mlp;
mod norm;
pub mod qwen2;
pub mod qwen3;
mod rope;

use std::sync::Arc;

use protocol::Executor;
use rayon::prelude::*;
use tensor::{Matrix, Weight, WeightData, WeightId, WeightLayout};

use self::{attention::Batch, layer::DecoderLayer, norm::RmsNorm, rope::Rope};
pub use self::{
    config::{DecoderConfig, KvPrecision},
    family::{FAMILIES, Family, Presence},
    kv_cache::KvCache,
};
use crate::{
    error::{ModelError, Result},
    provision,
    tensors::Tensors,
};

/// A decoder LLM provisioned on an executor.
pub struct Decoder {
    pub cfg: DecoderConfig,
    exec: Arc<dyn Executor>,
    tag: String,
    /// `model.embed_tokens` (`vocab × hidden`, in the checkpoint's format), gathered in
    /// the TEE row by row.
    embed_tokens: WeightData,
    layers: Vec<DecoderLayer>,
    /// `model.norm`.
    norm: RmsNorm,
    /// `lm_head`, or `model.embed_tokens` when tied; on the executor.
    lm_head: WeightId,
    rope: Rope,
    /// Groups a decode step's sequences are split into, each run through the model on its
    /// own thread (see [`Decoder::step`]).
    decode_groups: usize,
}

/// Groups a batched decode step runs as by default: two, so that one group's TEE work
/// (masks, attention, norms) overlaps the other's engine calls.
pub const DEFAULT_DECODE_GROUPS: usize = 2;

impl Decoder {
    /// Loads weights by their HF names (`model.layers.N.self_attn.q_proj.weight`, …) and
    /// provisions the linears under `tag/…`.
    pub fn load(t: &Tensors, cfg: DecoderConfig, exec: Arc<dyn Executor>, tag: &str) -> Result<Self> {
        cfg.validate()?;
        let d = cfg.hidden_size;
        let embed_tokens = t.weight("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
        let layers =
            (0..cfg.num_layers).map(|i| DecoderLayer::load(exec.as_ref(), t, tag, i, &cfg)).collect::<Result<_>>()?;
        let norm = RmsNorm::load(t, "model.norm", d, cfg.rms_norm_eps)?;
        // The LM head goes through the executor too; a tied head shares the embedding
        // table's memory with the TEE's lookup table.
        let lm_head = WeightId::new(format!("{tag}/lm_head"));
        let data = if !cfg.tie_embeddings && t.has("lm_head.weight") {
            t.weight("lm_head.weight", &[cfg.vocab_size, d])?
        } else {
            embed_tokens.clone()
        };
        provision::provision_shared(
            exec.as_ref(),
            &lm_head,
            Weight { d_in: d, d_out: cfg.vocab_size, layout: WeightLayout::OutIn, data },
        )?;
        let rope = Rope::new(cfg.rope_theta, cfg.head_dim);
        // Groups overlap one group's TEE work with another's engine calls; with every
        // product on the TEE's own cores there is nothing to overlap, and one pass reads
        // each weight once for the whole batch.
        let decode_groups = if exec.scheme().executor == "sealed" { 1 } else { DEFAULT_DECODE_GROUPS };
        Ok(Decoder { cfg, exec, tag: tag.to_string(), embed_tokens, layers, norm, lm_head, rope, decode_groups })
    }

    /// Sets how many groups a batched decode step is split into (1: one pass for the whole
    /// batch).
    pub fn set_decode_groups(&mut self, groups: usize) {
        self.decode_groups = groups.max(1);
    }

    pub fn decode_groups(&self) -> usize {
        self.decode_groups
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim)
    }

    /// Provisions a head that scores only `tokens` (rows of the LM head), e.g. the
    /// yes/no head of an LLM reranker.
    pub fn provision_token_head(&self, name: &str, t: &Tensors, tokens: &[u32]) -> Result<WeightId> {
        let d = self.cfg.hidden_size;
        let full = if !self.cfg.tie_embeddings && t.has("lm_head.weight") {
            t.weight("lm_head.weight", &[self.cfg.vocab_size, d])?
        } else {
            self.embed_tokens.clone()
        };
        if let Some(&tok) = tokens.iter().find(|&&tok| tok as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Config(format!("token {tok} is outside the vocabulary")));
        }
        let picks: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
        let data = full.select_rows(&picks, d).map_err(|e| ModelError::Config(e.to_string()))?;
        let id = WeightId::new(format!("{}/{name}", self.tag));
        provision::provision_shared(
            self.exec.as_ref(),
            &id,
            Weight { d_in: d, d_out: tokens.len(), layout: WeightLayout::OutIn, data },
        )?;
        Ok(id)
    }

    /// Runs `tokens[i]` through the model on top of `caches[i]` (one forward pass for all
    /// sequences, each with its own mask), appends their keys and values, and returns the
    /// final-normed hidden state of each sequence's last token (`B × hidden`). Runs on
    /// rayon's pool ([`crate::on_pool`]).
    pub fn forward(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Matrix> {
        crate::on_pool(|| self.forward_on_pool(caches, tokens))
    }

    fn check(&self, caches: &[&mut KvCache], tokens: &[&[u32]]) -> Result<()> {
        if caches.len() != tokens.len() || tokens.is_empty() {
            return Err(ModelError::InvalidRequest("one token list per sequence".into()));
        }
        for (c, t) in caches.iter().zip(tokens) {
            if t.is_empty() {
                return Err(ModelError::InvalidRequest("empty token sequence".into()));
            }
            if c.len + t.len() > self.cfg.max_positions {
                return Err(ModelError::ContextTooLong { tokens: c.len + t.len(), limit: self.cfg.max_positions });
            }
            if t.iter().any(|&id| id as usize >= self.cfg.vocab_size) {
                return Err(ModelError::InvalidRequest("token id out of the vocabulary".into()));
            }
        }
        Ok(())
    }

    fn forward_on_pool(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Matrix> {
        self.check(caches, tokens)?;
        let d = self.cfg.hidden_size;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        // 1. Token embeddings, gathered in the TEE (the gather index is the secret).
        let mut x = Matrix::zeros(lens.iter().sum(), d);
        for (r, &id) in tokens.iter().flat_map(|t| t.iter()).enumerate() {
            self.embed_tokens.row_into(id as usize, d, x.row_mut(r));
        }
        let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let batch = Batch {
            lens: &lens,
            firsts: lens.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect(),
            angles: starts.iter().zip(&lens).map(|(&p, &n)| self.rope.at(p, n)).collect(),
            starts,
        };
        // 2. Blocks.
        let mut pass = self.exec.begin(&lens)?;
        for (li, layer) in self.layers.iter().enumerate() {
            x = layer.forward(pass.as_mut(), li, x, caches, &batch)?;
        }
        pass.end();
        for (c, &n) in caches.iter_mut().zip(&lens) {
            c.len += n;
        }
        // 3. Final norm of each sequence's last row.
        let mut last = Matrix::zeros(lens.len(), d);
        let mut r = 0;
        for (i, &n) in lens.iter().enumerate() {
            r += n;
            self.norm.forward_row(x.row(r - 1), last.row_mut(i));
        }
        x.scrub();
        Ok(last)
    }

    /// One step of a batch: [`Decoder::forward`] then [`Decoder::logits`], returning the
    /// logits of each sequence's last token (`B × vocab`).
    ///
    /// A decode step (one token per sequence) of at least two sequences is split into up
    /// to `decode_groups` contiguous groups that run concurrently, each its own pass: every
    /// engine call of a step waits for the GPU and every TEE stage between two calls leaves
    /// the GPU idle, so two groups fill each other's gaps. Each sequence's result is what a
    /// pass of its group alone computes (masks are per sequence, or per group with shared
    /// decode masks). Prompts (prefill) run as one pass.
    pub fn step(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Matrix> {
        let groups = self.decode_groups.min(tokens.len());
        if groups < 2 || caches.len() != tokens.len() || tokens.iter().any(|t| t.len() != 1) {
            let last = self.forward(caches, tokens)?;
            return self.logits(&last);
        }
        let size = tokens.len().div_ceil(groups);
        let run = |(cs, ts): (&mut [&mut KvCache], &[&[u32]])| -> Result<Matrix> {
            let last = self.forward_on_pool(cs, ts)?;
            self.logits(&last)
        };
        let mut parts: Vec<Matrix> = crate::on_pool(|| {
            caches.par_chunks_mut(size).zip(tokens.par_chunks(size)).map(run).collect::<Result<_>>()
        })?;
        let logits = Matrix::vstack(&parts).expect("logits of one head share their width");
        parts.iter_mut().for_each(Matrix::scrub);
        Ok(logits)
    }

    /// LM-head logits for final hidden rows (one per sequence), through the executor.
    pub fn logits(&self, last: &Matrix) -> Result<Matrix> {
        self.head_logits(last, &self.lm_head)
    }

    /// Logits of a provisioned head (see [`Decoder::provision_token_head`]).
    pub fn head_logits(&self, last: &Matrix, head: &WeightId) -> Result<Matrix> {
        let blocks = vec![1; last.rows()];
        let mut pass = self.exec.begin(&blocks)?;
        let y = pass.linear(last, head)?;
        pass.end();
        Ok(y)
    }
}
