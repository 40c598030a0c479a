//! RMSNorm with its checkpoint weight: the decoders' block norms (`input_layernorm`,
//! `post_attention_layernorm`), final norm (`model.norm`) and QK-norm (`q_norm`, `k_norm`).

use tensor::Matrix;

use crate::{error::Result, ops, tensors::Tensors};

/// `x / rms(x) · weight`, row by row, in the TEE.
pub(super) struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// Reads `{name}.weight` (`dim` elements).
    pub(super) fn load(t: &Tensors, name: &str, dim: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm { weight: t.f32(&format!("{name}.weight"), &[dim])?, eps })
    }

    /// Every row of `x`.
    pub(super) fn forward(&self, x: &Matrix) -> Matrix {
        ops::rms_norm(x, &self.weight, self.eps)
    }

    /// One row, into `out`.
    pub(super) fn forward_row(&self, row: &[f32], out: &mut [f32]) {
        ops::rms_norm_row(row, &self.weight, self.eps, out);
    }
}
