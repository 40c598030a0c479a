//! The decoders' SwiGLU feed-forward (`mlp.gate_proj`, `mlp.up_proj`, `mlp.down_proj`):
//! gate and up in one offload, `silu(gate) ⊙ up` in the TEE, then down.

use protocol::{Executor, Pass};
use tensor::{Matrix, WeightId};

use crate::{error::Result, ops, provision, tensors::Tensors};

/// `model.layers.N.mlp`.
pub(super) struct Mlp {
    gate_proj: WeightId,
    up_proj: WeightId,
    down_proj: WeightId,
}

impl Mlp {
    /// Provisions `{prefix}.gate_proj`, `.up_proj` (`hidden → intermediate`) and
    /// `.down_proj` (`intermediate → hidden`).
    pub(super) fn load(
        exec: &dyn Executor,
        t: &Tensors,
        tag: &str,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
    ) -> Result<Self> {
        let linear =
            |name: &str, d_in, d_out| provision::linear(exec, t, tag, &format!("{prefix}.{name}"), d_in, d_out);
        Ok(Mlp {
            gate_proj: linear("gate_proj", hidden, intermediate)?,
            up_proj: linear("up_proj", hidden, intermediate)?,
            down_proj: linear("down_proj", intermediate, hidden)?,
        })
    }

    /// `down_proj(silu(gate_proj(h)) ⊙ up_proj(h))`.
    pub(super) fn forward(&self, pass: &mut dyn Pass, h: &Matrix) -> Result<Matrix> {
        let mut gu = pass.linear_many(h, &[self.gate_proj.clone(), self.up_proj.clone()])?;
        let up = gu.pop().expect("two products");
        let mut gate = gu.pop().expect("two products");
        ops::swiglu(&mut gate, &up);
        Ok(pass.linear(&gate, &self.down_proj)?)
    }
}
