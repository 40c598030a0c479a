//! The decoders' self-attention (`self_attn`): Q/K/V in one offload (with biases when the
//! family has them), QK-norm when it has that, RoPE, the KV cache, causal grouped-query
//! attention, then `o_proj`. Everything but the projections stays in the TEE.

use protocol::{Executor, Pass, attention::Head};
use tensor::{Matrix, WeightId, pool};

use crate::{error::Result, ops, provision, tensors::Tensors};

use super::{DecoderConfig, KvCache, KvPrecision, norm::RmsNorm, rope::RopeAngles};

/// Where a forward pass's sequences sit: in the stacked rows of the pass and in their own
/// positions. Worked out once per pass, shared by its layers.
pub(super) struct Batch<'a> {
    /// Tokens each sequence brings.
    pub lens: &'a [usize],
    /// Each sequence's first row in the pass.
    pub firsts: Vec<usize>,
    /// Each sequence's first position (its cache length before the pass).
    pub starts: Vec<usize>,
    /// The RoPE rotation of each sequence's new positions.
    pub angles: Vec<RopeAngles>,
}

/// `q_proj`, `k_proj` or `v_proj`: the weight on the executor, the bias (when the
/// checkpoint has one) in the TEE.
struct Projection {
    weight: WeightId,
    bias: Option<Vec<f32>>,
}

/// `model.layers.N.self_attn`.
pub(super) struct Attention {
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: WeightId,
    /// Per-head norms of queries and keys, both or neither.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    kv: KvPrecision,
}

impl Attention {
    /// Loads `{prefix}.*` (`prefix` = `model.layers.N.self_attn`): the family says whether
    /// the Q/K/V biases and the QK-norm are read.
    pub(super) fn load(exec: &dyn Executor, t: &Tensors, tag: &str, prefix: &str, cfg: &DecoderConfig) -> Result<Self> {
        let (d, hd) = (cfg.hidden_size, cfg.head_dim);
        let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
        let name = |n: &str| format!("{prefix}.{n}");
        let [q_bias, k_bias, v_bias] = if cfg.arch.qkv_bias.resolve(t, &name("q_proj.bias"))? {
            [
                Some(t.f32(&name("q_proj.bias"), &[qd])?),
                Some(t.f32(&name("k_proj.bias"), &[kvd])?),
                Some(t.f32(&name("v_proj.bias"), &[kvd])?),
            ]
        } else {
            [None, None, None]
        };
        let (q_norm, k_norm) = if cfg.arch.qk_norm.resolve(t, &name("q_norm.weight"))? {
            let eps = cfg.rms_norm_eps;
            (Some(RmsNorm::load(t, &name("q_norm"), hd, eps)?), Some(RmsNorm::load(t, &name("k_norm"), hd, eps)?))
        } else {
            (None, None)
        };
        let linear = |n: &str, d_in, d_out| provision::linear(exec, t, tag, &name(n), d_in, d_out);
        Ok(Attention {
            q_proj: Projection { weight: linear("q_proj", d, qd)?, bias: q_bias },
            k_proj: Projection { weight: linear("k_proj", d, kvd)?, bias: k_bias },
            v_proj: Projection { weight: linear("v_proj", d, kvd)?, bias: v_bias },
            o_proj: linear("o_proj", qd, d)?,
            q_norm,
            k_norm,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: hd,
            kv: cfg.kv,
        })
    }

    /// Attention of layer `layer` for the normed hidden states `h` of every sequence of
    /// `batch`: appends their keys and values to `caches` and returns `o_proj` of the
    /// context (`rows × hidden`).
    pub(super) fn forward(
        &self,
        pass: &mut dyn Pass,
        h: &Matrix,
        layer: usize,
        caches: &mut [&mut KvCache],
        batch: &Batch<'_>,
    ) -> Result<Matrix> {
        let (hd, heads) = (self.head_dim, self.num_heads);
        let group = heads / self.num_kv_heads;
        // 1. Q/K/V in one masked offload.
        let proj = [&self.q_proj, &self.k_proj, &self.v_proj];
        let mut qkv = pass.linear_many(h, &proj.map(|p| p.weight.clone()))?;
        for (m, p) in qkv.iter_mut().zip(proj) {
            if let Some(bias) = &p.bias {
                ops::add_bias(m, bias);
            }
        }
        // 2. Per sequence: QK-norm, RoPE, K/V into the cache; then causal GQA for all
        //    sequences in one call, so a batched decode step's heads run in parallel.
        let qs = self.queries_and_cache(&qkv, layer, caches, batch);
        let heads_of: Vec<Vec<Head>> = qs
            .iter()
            .zip(caches.iter())
            .map(|(q, cache)| {
                q.iter()
                    .enumerate()
                    .map(|(h, q)| Head { q, k: &cache.k[layer][h / group], v: &cache.v[layer][h / group] })
                    .collect()
            })
            .collect();
        let seqs: Vec<(&[Head], Option<usize>)> =
            heads_of.iter().zip(&batch.starts).map(|(h, &pos0)| (h.as_slice(), Some(pos0))).collect();
        let outs = pass.attend_sequences(&seqs, 1.0 / (hd as f32).sqrt())?;
        let mut ctx = Matrix::zeros(h.rows(), heads * hd);
        let outs: Vec<Matrix> = outs.into_iter().flatten().collect();
        ops::put_heads(&mut ctx, &batch.firsts, heads, &outs);
        // 3. Output projection.
        Ok(pass.linear(&ctx, &self.o_proj)?)
    }

    /// Each sequence's query heads, QK-normed and rotated, after its keys (likewise) and
    /// values are appended to its cache. For a GGUF model queries, keys and values are
    /// rounded to f16 precision, as llama.cpp's default f16 cache holds them and multiplies
    /// them: measured against llama.cpp over 256 teacher-forced steps of SmolLM2 (sealed),
    /// 251 equal next tokens with the rounding against 247 without. Sequences run in parallel when a batch gives
    /// enough work; a single long sequence (a prefill) runs its heads in parallel.
    fn queries_and_cache(
        &self,
        qkv: &[Matrix],
        layer: usize,
        caches: &mut [&mut KvCache],
        batch: &Batch<'_>,
    ) -> Vec<Vec<Matrix>> {
        let (hd, heads, kv_heads) = (self.head_dim, self.num_heads, self.num_kv_heads);
        let prep_sequence = |(si, cache): (usize, &mut &mut KvCache)| -> Vec<Matrix> {
            let (r0, n) = (batch.firsts[si], batch.lens[si]);
            let prep = |m: &Matrix, head: usize, norm: Option<&RmsNorm>| -> Matrix {
                let mut hm = ops::block(m, r0, r0 + n, head * hd, hd);
                let mut tmp = vec![0.0f32; hd];
                for t in 0..n {
                    let row = hm.row_mut(t);
                    if let Some(norm) = norm {
                        norm.forward_row(row, &mut tmp);
                        row.copy_from_slice(&tmp);
                    }
                    batch.angles[si].rotate(t, row);
                }
                if self.kv == KvPrecision::F16 {
                    ops::round_to_f16(&mut hm);
                }
                hm
            };
            let par_heads = batch.lens.len() == 1 && n * (heads + 2 * kv_heads) * hd >= tensor::cpu::PAR_MIN_LEN;
            let kv_of = |g: usize| {
                let mut v = ops::block(&qkv[2], r0, r0 + n, g * hd, hd);
                if self.kv == KvPrecision::F16 {
                    ops::round_to_f16(&mut v);
                }
                (prep(&qkv[1], g, self.k_norm.as_ref()), v)
            };
            let q_of = |h: usize| prep(&qkv[0], h, self.q_norm.as_ref());
            let kv: Vec<(Matrix, Matrix)> =
                if par_heads { pool::global().map(kv_heads, &kv_of) } else { (0..kv_heads).map(kv_of).collect() };
            for (g, (k, v)) in kv.iter().enumerate() {
                cache.k[layer][g].push_rows(k.as_slice());
                cache.v[layer][g].push_rows(v.as_slice());
            }
            if par_heads { pool::global().map(heads, &q_of) } else { (0..heads).map(q_of).collect() }
        };
        let touched = qkv[0].rows() * (heads + 2 * kv_heads) * hd;
        if batch.lens.len() > 1 && touched >= tensor::cpu::PAR_MIN_LEN {
            // On the compute pool, not rayon's: its workers are still polling after the
            // Q/K/V region, and rayon's threads woken beside them would share the cores
            // with them.
            let ptr = pool::SyncPtr(caches.as_mut_ptr());
            pool::global().map(caches.len(), &|si| {
                // SAFETY: each task takes the one cache of its own index, so no two tasks
                // alias one, and `caches` is borrowed exclusively for the call.
                let cache = unsafe { &mut *ptr.get().add(si) };
                prep_sequence((si, cache))
            })
        } else {
            caches.iter_mut().enumerate().map(prep_sequence).collect()
        }
    }
}
