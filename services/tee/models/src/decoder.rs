//! Decoder-only LLMs, written once for Llama (SmolLM2), Qwen2 (QKV bias) and Qwen3
//! (per-head QK-norm before RoPE): RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or
//! untied LM head.
//!
//! Offload groups per block: Q/K/V bundled, O, gate+up bundled, down; the LM head too.
//! Attention, norms, RoPE, SwiGLU, residuals and the KV cache stay in the TEE.

use std::sync::Arc;

use protocol::{Executor, Pass, attention::Head};
use rayon::prelude::*;
use serde::Deserialize;
use tensor::{Matrix, Weight, WeightData, WeightId, WeightLayout};

use crate::{
    error::{ModelError, Result},
    ops::{self, Rope, RopeAngles},
    tensors::Tensors,
};

/// Decoder hyper-parameters, from an HF `config.json` or GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `llama`, `qwen2` or `qwen3`.
    pub arch: String,
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
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
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

const ARCHES: [&str; 3] = ["llama", "qwen2", "qwen3"];

impl DecoderConfig {
    pub fn from_hf(v: &serde_json::Value) -> Result<Self> {
        let model_type = v.get("model_type").and_then(|m| m.as_str()).unwrap_or_default();
        if !ARCHES.contains(&model_type) {
            return Err(ModelError::UnknownArchitecture(model_type.to_string()));
        }
        let c: HfConfig =
            serde_json::from_value(v.clone()).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        if c.hidden_act.as_deref().is_some_and(|a| a != "silu") {
            return Err(ModelError::Config(format!("hidden_act {:?} is not supported (silu)", c.hidden_act)));
        }
        Ok(DecoderConfig {
            arch: c.model_type,
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
        })
    }

    pub fn from_gguf(h: &gguf::LlmHparams) -> Result<Self> {
        if !ARCHES.contains(&h.architecture.as_str()) {
            return Err(ModelError::UnknownArchitecture(h.architecture.clone()));
        }
        if h.rope_dimension_count != h.key_length || h.key_length != h.value_length {
            return Err(ModelError::Config("partial RoPE or distinct K/V head sizes are not supported".into()));
        }
        Ok(DecoderConfig {
            arch: h.architecture.clone(),
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
        })
    }

    fn validate(&self) -> Result<()> {
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ModelError::Config("num_attention_heads must be a multiple of num_key_value_heads".into()));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::Config("head_dim must be even for RoPE".into()));
        }
        Ok(())
    }
}

struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    qkv: [WeightId; 3],
    qkv_bias: Option<[Vec<f32>; 3]>,
    qk_norm: Option<[Vec<f32>; 2]>,
    o: WeightId,
    gate_up: [WeightId; 2],
    down: WeightId,
}

/// Keys and values of one sequence, per layer and KV head, in TEE memory.
pub struct KvCache {
    k: Vec<Vec<Matrix>>,
    v: Vec<Vec<Matrix>>,
    len: usize,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held (keys and values).
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).flatten().map(|m| m.as_slice().len() * 4).sum()
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        // Cached keys and values are plaintext activations of the prompt.
        self.k.iter_mut().chain(self.v.iter_mut()).flatten().for_each(Matrix::scrub);
    }
}

/// A decoder LLM provisioned on an executor.
pub struct Decoder {
    pub cfg: DecoderConfig,
    exec: Arc<dyn Executor>,
    tag: String,
    embed: Arc<[f32]>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
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
        let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
        let linear = |name: String, d_in: usize, d_out: usize| -> Result<WeightId> {
            let data = t.weight(&format!("{name}.weight"), &[d_out, d_in])?;
            let id = WeightId::new(format!("{tag}/{name}"));
            crate::load::provision_shared(
                exec.as_ref(),
                &id,
                Weight { d_in, d_out, layout: WeightLayout::OutIn, data },
            )?;
            Ok(id)
        };
        let embed: Arc<[f32]> = t.f32("model.embed_tokens.weight", &[cfg.vocab_size, d])?.into();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let l = format!("model.layers.{i}");
            let a = format!("{l}.self_attn");
            let qkv_bias = if t.has(&format!("{a}.q_proj.bias")) {
                Some([
                    t.f32(&format!("{a}.q_proj.bias"), &[qd])?,
                    t.f32(&format!("{a}.k_proj.bias"), &[kvd])?,
                    t.f32(&format!("{a}.v_proj.bias"), &[kvd])?,
                ])
            } else {
                None
            };
            let qk_norm = if t.has(&format!("{a}.q_norm.weight")) {
                Some([t.f32(&format!("{a}.q_norm.weight"), &[hd])?, t.f32(&format!("{a}.k_norm.weight"), &[hd])?])
            } else if cfg.arch == "qwen3" {
                return Err(ModelError::MissingTensor(format!("{a}.q_norm.weight")));
            } else {
                None
            };
            layers.push(Layer {
                input_norm: t.f32(&format!("{l}.input_layernorm.weight"), &[d])?,
                post_norm: t.f32(&format!("{l}.post_attention_layernorm.weight"), &[d])?,
                qkv: [
                    linear(format!("{a}.q_proj"), d, qd)?,
                    linear(format!("{a}.k_proj"), d, kvd)?,
                    linear(format!("{a}.v_proj"), d, kvd)?,
                ],
                qkv_bias,
                qk_norm,
                o: linear(format!("{a}.o_proj"), qd, d)?,
                gate_up: [linear(format!("{l}.mlp.gate_proj"), d, ff)?, linear(format!("{l}.mlp.up_proj"), d, ff)?],
                down: linear(format!("{l}.mlp.down_proj"), ff, d)?,
            });
        }
        let final_norm = t.f32("model.norm.weight", &[d])?;
        // The LM head goes through the executor too; a tied head shares the embedding
        // table's memory with the TEE's lookup table.
        let lm_head = WeightId::new(format!("{tag}/lm_head"));
        let data = if !cfg.tie_embeddings && t.has("lm_head.weight") {
            t.weight("lm_head.weight", &[cfg.vocab_size, d])?
        } else {
            WeightData::F32(embed.clone())
        };
        crate::load::provision_shared(
            exec.as_ref(),
            &lm_head,
            Weight { d_in: d, d_out: cfg.vocab_size, layout: WeightLayout::OutIn, data },
        )?;
        let rope = Rope::new(cfg.rope_theta, hd);
        Ok(Decoder {
            cfg,
            exec,
            tag: tag.to_string(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            decode_groups: DEFAULT_DECODE_GROUPS,
        })
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
        let hd = self.cfg.head_dim;
        let per_layer = || (0..self.cfg.num_kv_heads).map(|_| Matrix::zeros(0, hd)).collect::<Vec<_>>();
        KvCache {
            k: (0..self.cfg.num_layers).map(|_| per_layer()).collect(),
            v: (0..self.cfg.num_layers).map(|_| per_layer()).collect(),
            len: 0,
        }
    }

    /// Provisions a head that scores only `tokens` (rows of the LM head), e.g. the
    /// yes/no head of an LLM reranker.
    pub fn provision_token_head(&self, name: &str, t: &Tensors, tokens: &[u32]) -> Result<WeightId> {
        let d = self.cfg.hidden_size;
        let full: Vec<f32> = if !self.cfg.tie_embeddings && t.has("lm_head.weight") {
            t.f32("lm_head.weight", &[self.cfg.vocab_size, d])?
        } else {
            self.embed.to_vec()
        };
        let mut rows = Vec::with_capacity(tokens.len() * d);
        for &tok in tokens {
            let tok = tok as usize;
            if tok >= self.cfg.vocab_size {
                return Err(ModelError::Config(format!("token {tok} is outside the vocabulary")));
            }
            rows.extend_from_slice(&full[tok * d..(tok + 1) * d]);
        }
        let id = WeightId::new(format!("{}/{name}", self.tag));
        crate::load::provision_shared(
            self.exec.as_ref(),
            &id,
            Weight::f32(d, tokens.len(), WeightLayout::OutIn, rows),
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

    fn forward_on_pool(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Matrix> {
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
        let d = self.cfg.hidden_size;
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        // 1. Token embeddings, gathered in the TEE (the gather index is the secret).
        let mut x = Matrix::zeros(lens.iter().sum(), d);
        for (r, &id) in tokens.iter().flat_map(|t| t.iter()).enumerate() {
            x.row_mut(r).copy_from_slice(&self.embed[id as usize * d..(id as usize + 1) * d]);
        }
        let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let angles: Vec<RopeAngles> = starts.iter().zip(&lens).map(|(&p, &n)| self.rope.at(p, n)).collect();
        // 2. Blocks.
        let mut pass = self.exec.begin(&lens)?;
        for (li, layer) in self.layers.iter().enumerate() {
            x = self.block(pass.as_mut(), li, layer, x, caches, &lens, &starts, &angles)?;
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
            ops::rms_norm_row(x.row(r - 1), &self.final_norm, self.cfg.rms_norm_eps, last.row_mut(i));
        }
        x.scrub();
        Ok(last)
    }

    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        pass: &mut dyn Pass,
        li: usize,
        l: &Layer,
        mut x: Matrix,
        caches: &mut [&mut KvCache],
        lens: &[usize],
        starts: &[usize],
        angles: &[RopeAngles],
    ) -> Result<Matrix> {
        let c = &self.cfg;
        let (hd, heads, kv_heads) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let group = heads / kv_heads;
        // 1. Pre-norm, then Q/K/V in one masked offload.
        let h = ops::rms_norm(&x, &l.input_norm, c.rms_norm_eps);
        let mut qkv = pass.linear_many(&h, &l.qkv)?;
        if let Some(b) = &l.qkv_bias {
            for (m, bias) in qkv.iter_mut().zip(b) {
                ops::add_bias(m, bias);
            }
        }
        // 2. Per sequence: QK-norm (Qwen3), RoPE, append K/V to the cache (sequences in
        //    parallel when a batch gives enough work); then causal GQA for all sequences in
        //    one call, so a batched decode step's heads run in parallel.
        let (qn, kn) = match &l.qk_norm {
            Some([q, k]) => (Some(q), Some(k)),
            None => (None, None),
        };
        let firsts: Vec<usize> = lens.iter().scan(0, |r, &n| Some(std::mem::replace(r, *r + n))).collect();
        let prep_sequence = |(si, cache): (usize, &mut &mut KvCache)| -> Vec<Matrix> {
            let (r0, n) = (firsts[si], lens[si]);
            let prep = |m: &Matrix, head: usize, norm: Option<&Vec<f32>>| -> Matrix {
                let mut hm = ops::block(m, r0, r0 + n, head * hd, hd);
                let mut tmp = vec![0.0f32; hd];
                for t in 0..n {
                    let row = hm.row_mut(t);
                    if let Some(w) = norm {
                        ops::rms_norm_row(row, w, c.rms_norm_eps, &mut tmp);
                        row.copy_from_slice(&tmp);
                    }
                    angles[si].rotate(t, row);
                }
                hm
            };
            for g in 0..kv_heads {
                let k = prep(&qkv[1], g, kn);
                cache.k[li][g].push_rows(k.as_slice());
                let v = ops::block(&qkv[2], r0, r0 + n, g * hd, hd);
                cache.v[li][g].push_rows(v.as_slice());
            }
            (0..heads).map(|h| prep(&qkv[0], h, qn)).collect()
        };
        let touched = x.rows() * (heads + 2 * kv_heads) * hd;
        let qs: Vec<Vec<Matrix>> = if lens.len() > 1 && touched >= tensor::cpu::PAR_MIN_LEN {
            caches.par_iter_mut().enumerate().map(prep_sequence).collect()
        } else {
            caches.iter_mut().enumerate().map(prep_sequence).collect()
        };
        let heads_of: Vec<Vec<Head>> = qs
            .iter()
            .zip(caches.iter())
            .map(|(q, cache)| {
                q.iter()
                    .enumerate()
                    .map(|(h, q)| Head { q, k: &cache.k[li][h / group], v: &cache.v[li][h / group] })
                    .collect()
            })
            .collect();
        let seqs: Vec<(&[Head], Option<usize>)> =
            heads_of.iter().zip(starts).map(|(h, &pos0)| (h.as_slice(), Some(pos0))).collect();
        let outs = pass.attend_sequences(&seqs, 1.0 / (hd as f32).sqrt())?;
        let mut ctx = Matrix::zeros(x.rows(), heads * hd);
        for (o, &r0) in outs.iter().zip(&firsts) {
            for (h, o) in o.iter().enumerate() {
                ops::put_block(&mut ctx, r0, h * hd, o);
            }
        }
        // 3. Output projection and residual.
        let o = pass.linear(&ctx, &l.o)?;
        ops::add_in_place(&mut x, &o);
        // 4. SwiGLU feed-forward: gate and up in one offload, then down; residual.
        let h = ops::rms_norm(&x, &l.post_norm, c.rms_norm_eps);
        let mut gu = pass.linear_many(&h, &l.gate_up)?;
        let up = gu.pop().expect("two products");
        let mut gate = gu.pop().expect("two products");
        ops::swiglu(&mut gate, &up);
        let down = pass.linear(&gate, &l.down)?;
        ops::add_in_place(&mut x, &down);
        Ok(x)
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
