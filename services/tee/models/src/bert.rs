//! BERT encoders (BGE, MiniLM, sentence-transformers, cross-encoders): post-LayerNorm
//! blocks with GELU and bidirectional attention.
//!
//! Offload groups per block, all through the executor: Q/K/V bundled, attention output,
//! intermediate, output; the pooler and classifier of a cross-encoder too. Embeddings,
//! LayerNorm, GELU, attention, residuals and pooling stay in the TEE.
//!
//! The structs follow the checkpoint's tensor tree, so a field maps to a tensor name:
//! `encoder.layer.N.attention.self.query` is `BertLayer::attention.query`,
//! `….attention.output.{dense, LayerNorm}` is `attention.output.{dense, layer_norm}`,
//! `….intermediate.dense` is `intermediate`, `….output.{dense, LayerNorm}` is `output`.

use std::sync::Arc;

use protocol::{Executor, Pass, attention::Head};
use serde::Deserialize;
use tensor::{Matrix, WeightId};

use crate::{
    error::{ModelError, Result},
    ops, provision,
    tensors::Tensors,
};

/// The fields of a BERT `config.json` the encoder needs.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_types")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f32,
    #[serde(default)]
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_types() -> usize {
    2
}
fn default_eps() -> f32 {
    1e-12
}

/// A linear layer: its weight, provisioned on the executor, and its bias, kept in the TEE.
struct Linear {
    weight: WeightId,
    bias: Vec<f32>,
}

impl Linear {
    /// `x·Wᵀ + b`: the product through the executor, the bias in the TEE.
    fn forward(&self, pass: &mut dyn Pass, x: &Matrix) -> Result<Matrix> {
        let mut y = pass.linear(x, &self.weight)?;
        ops::add_bias(&mut y, &self.bias);
        Ok(y)
    }
}

/// A LayerNorm's `weight` (γ) and `bias` (β).
struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// `attention.output` and `output`: a dense layer, then LayerNorm over it plus the residual.
struct Output {
    dense: Linear,
    layer_norm: LayerNorm,
}

impl Output {
    /// `LayerNorm(dense(x) + residual)`.
    fn forward(&self, pass: &mut dyn Pass, x: &Matrix, residual: &Matrix, eps: f32) -> Result<Matrix> {
        let mut y = self.dense.forward(pass, x)?;
        ops::add_in_place(&mut y, residual);
        ops::layer_norm(&mut y, &self.layer_norm.weight, &self.layer_norm.bias, eps);
        Ok(y)
    }
}

/// `encoder.layer.N.attention`: self-attention (`self.query`, `self.key`, `self.value`)
/// and its output projection.
struct Attention {
    query: Linear,
    key: Linear,
    value: Linear,
    output: Output,
}

/// `encoder.layer.N`.
struct BertLayer {
    attention: Attention,
    /// `intermediate.dense`.
    intermediate: Linear,
    output: Output,
}

/// `embeddings`: word, position and segment tables, kept in the TEE.
struct Embeddings {
    word_embeddings: Vec<f32>,
    position_embeddings: Vec<f32>,
    token_type_embeddings: Vec<f32>,
    layer_norm: LayerNorm,
}

/// The sequence-classification head of a cross-encoder.
struct ClassificationHead {
    /// `pooler.dense` (then tanh, over [CLS]).
    pooler: Linear,
    classifier: Linear,
}

/// A BERT encoder provisioned on an executor.
pub struct Bert {
    pub cfg: BertConfig,
    exec: Arc<dyn Executor>,
    embeddings: Embeddings,
    layers: Vec<BertLayer>,
    head: Option<ClassificationHead>,
}

/// One input sequence: token ids and segment ids.
#[derive(Clone)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub types: Vec<u32>,
}

impl Bert {
    /// Loads weights named like the checkpoint (`embeddings.…`, `encoder.layer.N.…`, with
    /// or without a `bert.` prefix) and provisions the linears under `tag/…`.
    pub fn load(t: &Tensors, cfg: BertConfig, exec: Arc<dyn Executor>, tag: &str) -> Result<Self> {
        if cfg.hidden_act != "gelu" {
            return Err(ModelError::Config(format!("hidden_act `{}` is not supported (gelu)", cfg.hidden_act)));
        }
        if !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(ModelError::Config("hidden_size is not a multiple of num_attention_heads".into()));
        }
        let p = if t.has("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let vec = |name: String, n: usize| t.f32(&name, &[n]);
        let layer_norm = |name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm { weight: vec(format!("{name}.weight"), d)?, bias: vec(format!("{name}.bias"), d)? })
        };
        let linear = |name: String, d_in: usize, d_out: usize| -> Result<Linear> {
            let weight = provision::linear(exec.as_ref(), t, tag, &name, d_in, d_out)?;
            Ok(Linear { weight, bias: vec(format!("{name}.bias"), d_out)? })
        };
        let output = |name: String, d_in: usize| -> Result<Output> {
            Ok(Output {
                dense: linear(format!("{name}.dense"), d_in, d)?,
                layer_norm: layer_norm(&format!("{name}.LayerNorm"))?,
            })
        };
        let e = format!("{p}embeddings");
        let embeddings = Embeddings {
            word_embeddings: t.f32(&format!("{e}.word_embeddings.weight"), &[cfg.vocab_size, d])?,
            position_embeddings: t
                .f32(&format!("{e}.position_embeddings.weight"), &[cfg.max_position_embeddings, d])?,
            token_type_embeddings: t.f32(&format!("{e}.token_type_embeddings.weight"), &[cfg.type_vocab_size, d])?,
            layer_norm: layer_norm(&format!("{e}.LayerNorm"))?,
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = format!("{p}encoder.layer.{i}");
            layers.push(BertLayer {
                attention: Attention {
                    query: linear(format!("{l}.attention.self.query"), d, d)?,
                    key: linear(format!("{l}.attention.self.key"), d, d)?,
                    value: linear(format!("{l}.attention.self.value"), d, d)?,
                    output: output(format!("{l}.attention.output"), d)?,
                },
                intermediate: linear(format!("{l}.intermediate.dense"), d, ff)?,
                output: output(format!("{l}.output"), ff)?,
            });
        }
        let head = if t.has("classifier.weight") {
            let labels = t.get("classifier.weight")?.shape[0];
            Some(ClassificationHead {
                pooler: linear(format!("{p}pooler.dense"), d, d)?,
                classifier: linear("classifier".into(), d, labels)?,
            })
        } else {
            None
        };
        Ok(Bert { cfg, exec, embeddings, layers, head })
    }

    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    /// Number of classifier outputs, for cross-encoders.
    pub fn num_labels(&self) -> Option<usize> {
        self.head.as_ref().map(|h| h.classifier.bias.len())
    }

    fn check(&self, seqs: &[Encoded]) -> Result<()> {
        for s in seqs {
            if s.ids.is_empty() {
                return Err(ModelError::InvalidRequest("empty token sequence".into()));
            }
            if s.ids.len() > self.cfg.max_position_embeddings {
                return Err(ModelError::ContextTooLong {
                    tokens: s.ids.len(),
                    limit: self.cfg.max_position_embeddings,
                });
            }
            if s.ids.iter().any(|&i| i as usize >= self.cfg.vocab_size)
                || s.types.iter().any(|&t| t as usize >= self.cfg.type_vocab_size)
            {
                return Err(ModelError::InvalidRequest("token id out of the vocabulary".into()));
            }
        }
        Ok(())
    }

    /// Last hidden states of every sequence (`n_i × hidden`), one forward pass for all,
    /// run on rayon's pool ([`crate::on_pool`]).
    pub fn forward(&self, seqs: &[Encoded]) -> Result<Vec<Matrix>> {
        crate::on_pool(|| self.forward_on_pool(seqs))
    }

    fn forward_on_pool(&self, seqs: &[Encoded]) -> Result<Vec<Matrix>> {
        self.check(seqs)?;
        let lens: Vec<usize> = seqs.iter().map(|s| s.ids.len()).collect();
        let d = self.cfg.hidden_size;
        // 1. Embeddings: word + position + segment, then LayerNorm.
        let total: usize = lens.iter().sum();
        let mut x = Matrix::zeros(total, d);
        let mut r = 0;
        for s in seqs {
            for (t, (&id, &ty)) in s.ids.iter().zip(s.types.iter().chain(std::iter::repeat(&0))).enumerate() {
                let row = x.row_mut(r);
                let (w, p, ty) = (id as usize * d, t * d, ty as usize * d);
                let e = &self.embeddings;
                for (j, v) in row[..d].iter_mut().enumerate() {
                    *v = e.word_embeddings[w + j] + e.position_embeddings[p + j] + e.token_type_embeddings[ty + j];
                }
                r += 1;
            }
        }
        let norm = &self.embeddings.layer_norm;
        ops::layer_norm(&mut x, &norm.weight, &norm.bias, self.cfg.layer_norm_eps);
        // 2. Blocks, all sequences in one pass, each with its own mask.
        let mut pass = self.exec.begin(&lens)?;
        for layer in &self.layers {
            x = self.block(pass.as_mut(), layer, x, &lens)?;
        }
        pass.end();
        // 3. Split per sequence.
        let mut out = Vec::with_capacity(seqs.len());
        let mut r = 0;
        for &n in &lens {
            out.push(x.slice_rows(r, r + n));
            r += n;
        }
        Ok(out)
    }

    fn block(&self, pass: &mut dyn Pass, l: &BertLayer, x: Matrix, lens: &[usize]) -> Result<Matrix> {
        let eps = self.cfg.layer_norm_eps;
        // 1. Self-attention, its output projection, residual, LayerNorm.
        let ctx = self.attention(pass, &l.attention, &x, lens)?;
        let x = l.attention.output.forward(pass, &ctx, &x, eps)?;
        // 2. Feed-forward: intermediate + GELU, output, residual, LayerNorm.
        let mut i = l.intermediate.forward(pass, &x)?;
        ops::gelu(&mut i);
        l.output.forward(pass, &i, &x, eps)
    }

    /// Bidirectional self-attention of every sequence: the context (`rows × hidden`) before
    /// the output projection.
    fn attention(&self, pass: &mut dyn Pass, a: &Attention, x: &Matrix, lens: &[usize]) -> Result<Matrix> {
        let d = self.cfg.hidden_size;
        let heads = self.cfg.num_attention_heads;
        let hd = d / heads;
        // 1. Q, K, V: one masked offload for the three.
        let qkv_proj = [&a.query, &a.key, &a.value];
        let ids: Vec<WeightId> = qkv_proj.iter().map(|q| q.weight.clone()).collect();
        let mut qkv = pass.linear_many(x, &ids)?;
        for (m, lin) in qkv.iter_mut().zip(qkv_proj) {
            ops::add_bias(m, &lin.bias);
        }
        // 2. Bidirectional attention of every sequence's heads, in one call (the heads of a
        //    batch run in parallel), in the TEE (or as the executor decides).
        let mut ctx = Matrix::zeros(x.rows(), d);
        let scale = 1.0 / (hd as f32).sqrt();
        let starts: Vec<usize> = lens.iter().scan(0, |r0, &n| Some(std::mem::replace(r0, *r0 + n))).collect();
        let outs = {
            // The heads' operand copies live only for the call.
            let parts = ops::head_blocks([&qkv[0], &qkv[1], &qkv[2]], &starts, lens, heads, hd);
            let hs: Vec<Head> = parts.iter().map(|[q, k, v]| Head { q, k, v }).collect();
            pass.attend(&hs, scale, None)?
        };
        ops::put_heads(&mut ctx, &starts, heads, &outs);
        Ok(ctx)
    }

    /// Sequence-classification logits (`tanh(pooler([CLS]))·classifier`), for cross-encoders.
    pub fn classify(&self, seqs: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        let Some(ClassificationHead { pooler, classifier }) = &self.head else {
            return Err(ModelError::Config("this BERT checkpoint has no classification head".into()));
        };
        let hidden = self.forward(seqs)?;
        // Row 0 of every sequence is [CLS].
        let d = self.cfg.hidden_size;
        let mut cls = Matrix::zeros(seqs.len(), d);
        for (i, h) in hidden.iter().enumerate() {
            cls.row_mut(i).copy_from_slice(h.row(0));
        }
        let blocks = vec![1; seqs.len()];
        let mut pass = self.exec.begin(&blocks)?;
        let mut p = pooler.forward(pass.as_mut(), &cls)?;
        p.as_mut_slice().iter_mut().for_each(|v| *v = v.tanh());
        let mut logits = pass.linear(&p, &classifier.weight)?;
        pass.end();
        ops::add_bias(&mut logits, &classifier.bias);
        Ok((0..logits.rows()).map(|r| logits.row(r).to_vec()).collect())
    }
}
