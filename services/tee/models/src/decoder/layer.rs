//! One decoder block (`model.layers.N`), the same for every family: pre-norm attention and
//! pre-norm SwiGLU feed-forward, each with a residual.

use protocol::{Executor, Pass};
use tensor::Matrix;

use crate::{error::Result, ops, tensors::Tensors};

use super::{
    DecoderConfig, KvCache,
    attention::{Attention, Batch},
    mlp::Mlp,
    norm::RmsNorm,
};

/// `model.layers.N`.
pub(super) struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Loads `model.layers.{index}.*` and provisions its linears under `tag/…`.
    pub(super) fn load(exec: &dyn Executor, t: &Tensors, tag: &str, index: usize, cfg: &DecoderConfig) -> Result<Self> {
        let (d, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let l = format!("model.layers.{index}");
        Ok(DecoderLayer {
            input_layernorm: RmsNorm::load(t, &format!("{l}.input_layernorm"), d, eps)?,
            post_attention_layernorm: RmsNorm::load(t, &format!("{l}.post_attention_layernorm"), d, eps)?,
            self_attn: Attention::load(exec, t, tag, &format!("{l}.self_attn"), cfg)?,
            mlp: Mlp::load(exec, t, tag, &format!("{l}.mlp"), d, cfg.intermediate_size)?,
        })
    }

    /// `x + attn(norm(x))`, then `+ mlp(norm(·))`; appends the layer's keys and values to
    /// `caches`.
    pub(super) fn forward(
        &self,
        pass: &mut dyn Pass,
        index: usize,
        mut x: Matrix,
        caches: &mut [&mut KvCache],
        batch: &Batch<'_>,
    ) -> Result<Matrix> {
        let h = self.input_layernorm.forward(&x);
        let o = self.self_attn.forward(pass, &h, index, caches, batch)?;
        ops::add_in_place(&mut x, &o);
        let h = self.post_attention_layernorm.forward(&x);
        let down = self.mlp.forward(pass, &h)?;
        ops::add_in_place(&mut x, &down);
        Ok(x)
    }
}
