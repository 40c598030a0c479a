//! BERT encoders (BGE, MiniLM, sentence-transformers, cross-encoders): post-LayerNorm
//! blocks with GELU and bidirectional attention.
//!
//! Offload groups per block, all through the executor: Q/K/V bundled, attention output,
//! intermediate, output; the pooler and classifier of a cross-encoder too. Embeddings,
//! LayerNorm, GELU, attention, residuals and pooling stay in the TEE.

use std::sync::Arc;

use protocol::{Executor, Pass, attention::Head};
use serde::Deserialize;
use tensor::{Matrix, Weight, WeightId, WeightLayout};

use crate::{
    error::{ModelError, Result},
    ops,
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

struct Linear {
    id: WeightId,
    bias: Vec<f32>,
}

struct Layer {
    qkv: [Linear; 3],
    attn_out: Linear,
    attn_norm: (Vec<f32>, Vec<f32>),
    intermediate: Linear,
    output: Linear,
    out_norm: (Vec<f32>, Vec<f32>),
}

/// A BERT encoder provisioned on an executor.
pub struct Bert {
    pub cfg: BertConfig,
    exec: Arc<dyn Executor>,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
    /// Pooler (dense + tanh over [CLS]) and classifier of a sequence-classification head.
    head: Option<(Linear, Linear)>,
}

/// One input sequence: token ids and segment ids.
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
        let norm = |name: &str| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((vec(format!("{name}.weight"), d)?, vec(format!("{name}.bias"), d)?))
        };
        let linear = |name: String, d_in: usize, d_out: usize| -> Result<Linear> {
            let data = t.weight(&format!("{name}.weight"), &[d_out, d_in])?;
            let id = WeightId::new(format!("{tag}/{name}"));
            crate::load::provision_shared(
                exec.as_ref(),
                &id,
                Weight { d_in, d_out, layout: WeightLayout::OutIn, data },
            )?;
            Ok(Linear { id, bias: vec(format!("{name}.bias"), d_out)? })
        };
        let word = t.f32(&format!("{p}embeddings.word_embeddings.weight"), &[cfg.vocab_size, d])?;
        let position =
            t.f32(&format!("{p}embeddings.position_embeddings.weight"), &[cfg.max_position_embeddings, d])?;
        let token_type = t.f32(&format!("{p}embeddings.token_type_embeddings.weight"), &[cfg.type_vocab_size, d])?;
        let emb_norm = norm(&format!("{p}embeddings.LayerNorm"))?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = format!("{p}encoder.layer.{i}");
            layers.push(Layer {
                qkv: [
                    linear(format!("{l}.attention.self.query"), d, d)?,
                    linear(format!("{l}.attention.self.key"), d, d)?,
                    linear(format!("{l}.attention.self.value"), d, d)?,
                ],
                attn_out: linear(format!("{l}.attention.output.dense"), d, d)?,
                attn_norm: norm(&format!("{l}.attention.output.LayerNorm"))?,
                intermediate: linear(format!("{l}.intermediate.dense"), d, ff)?,
                output: linear(format!("{l}.output.dense"), ff, d)?,
                out_norm: norm(&format!("{l}.output.LayerNorm"))?,
            });
        }
        let head = if t.has("classifier.weight") {
            let labels = t.get("classifier.weight")?.shape[0];
            Some((linear(format!("{p}pooler.dense"), d, d)?, linear("classifier".into(), d, labels)?))
        } else {
            None
        };
        Ok(Bert { cfg, exec, word, position, token_type, emb_norm, layers, head })
    }

    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    /// Number of classifier outputs, for cross-encoders.
    pub fn num_labels(&self) -> Option<usize> {
        self.head.as_ref().map(|(_, c)| c.bias.len())
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
                for (j, v) in row[..d].iter_mut().enumerate() {
                    *v = self.word[w + j] + self.position[p + j] + self.token_type[ty + j];
                }
                r += 1;
            }
        }
        ops::layer_norm(&mut x, &self.emb_norm.0, &self.emb_norm.1, self.cfg.layer_norm_eps);
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

    fn block(&self, pass: &mut dyn Pass, l: &Layer, mut x: Matrix, lens: &[usize]) -> Result<Matrix> {
        let (d, eps) = (self.cfg.hidden_size, self.cfg.layer_norm_eps);
        let heads = self.cfg.num_attention_heads;
        let hd = d / heads;
        // 1. Q, K, V: one masked offload for the three.
        let ids: Vec<WeightId> = l.qkv.iter().map(|q| q.id.clone()).collect();
        let mut qkv = pass.linear_many(&x, &ids)?;
        for (m, lin) in qkv.iter_mut().zip(&l.qkv) {
            ops::add_bias(m, &lin.bias);
        }
        // 2. Bidirectional attention of every sequence's heads, in one call (the heads of a
        //    batch run in parallel), in the TEE (or as the executor decides).
        let mut ctx = Matrix::zeros(x.rows(), d);
        let scale = 1.0 / (hd as f32).sqrt();
        let starts: Vec<usize> = lens.iter().scan(0, |r0, &n| Some(std::mem::replace(r0, *r0 + n))).collect();
        let outs = {
            // The heads' operand copies live only for the call.
            let parts: Vec<[Matrix; 3]> = starts
                .iter()
                .zip(lens)
                .flat_map(|(&r0, &n)| (0..heads).map(move |h| (r0, n, h)))
                .map(|(r0, n, h)| std::array::from_fn(|i| ops::block(&qkv[i], r0, r0 + n, h * hd, hd)))
                .collect();
            let hs: Vec<Head> = parts.iter().map(|[q, k, v]| Head { q, k, v }).collect();
            pass.attend(&hs, scale, None)?
        };
        for (i, o) in outs.iter().enumerate() {
            ops::put_block(&mut ctx, starts[i / heads], (i % heads) * hd, o);
        }
        // 3. Attention output, residual, LayerNorm.
        let mut o = pass.linear(&ctx, &l.attn_out.id)?;
        ops::add_bias(&mut o, &l.attn_out.bias);
        ops::add_in_place(&mut o, &x);
        ops::layer_norm(&mut o, &l.attn_norm.0, &l.attn_norm.1, eps);
        x = o;
        // 4. Feed-forward: intermediate + GELU, output, residual, LayerNorm.
        let mut i = pass.linear(&x, &l.intermediate.id)?;
        ops::add_bias(&mut i, &l.intermediate.bias);
        ops::gelu(&mut i);
        let mut y = pass.linear(&i, &l.output.id)?;
        ops::add_bias(&mut y, &l.output.bias);
        ops::add_in_place(&mut y, &x);
        ops::layer_norm(&mut y, &l.out_norm.0, &l.out_norm.1, eps);
        Ok(y)
    }

    /// Sequence-classification logits (`tanh(pooler([CLS]))·classifier`), for cross-encoders.
    pub fn classify(&self, seqs: &[Encoded]) -> Result<Vec<Vec<f32>>> {
        let Some((pooler, classifier)) = &self.head else {
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
        let mut p = pass.linear(&cls, &pooler.id)?;
        ops::add_bias(&mut p, &pooler.bias);
        p.as_mut_slice().iter_mut().for_each(|v| *v = v.tanh());
        let mut logits = pass.linear(&p, &classifier.id)?;
        pass.end();
        ops::add_bias(&mut logits, &classifier.bias);
        Ok((0..logits.rows()).map(|r| logits.row(r).to_vec()).collect())
    }
}
