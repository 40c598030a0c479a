//! The plaintext executor: sends activations to the engine in the clear. It is the parity
//! baseline the masked executor is measured against, and what the sealed executor runs on
//! its own CPU engine; never a deployment on an untrusted engine.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use kernels::{Engine, Masked, Matrix, Weight, WeightId, danger};

use super::{Dims, Executor, IntegrityStatus, Pass, Scheme, check_blocks, check_heads, check_input};
use crate::{
    attention::{self, Causal, Head},
    error::{ProtocolError, Result},
};

/// Sends activations to the engine in the clear: the parity baseline, never a deployment.
pub struct PlaintextExecutor {
    engine: Arc<dyn Engine>,
    dims: RwLock<HashMap<WeightId, Dims>>,
}

impl PlaintextExecutor {
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        PlaintextExecutor { engine, dims: RwLock::default() }
    }

    fn dims(&self, id: &WeightId) -> Result<Dims> {
        self.dims.read().expect("poisoned").get(id).copied().ok_or_else(|| ProtocolError::UnknownWeight(id.clone()))
    }
}

impl Executor for PlaintextExecutor {
    fn provision(&self, id: WeightId, weight: Weight) -> Result<()> {
        let mut dims = self.dims.write().expect("poisoned");
        if dims.contains_key(&id) {
            return Err(ProtocolError::DuplicateWeight(id));
        }
        let d = Dims { d_in: weight.d_in, d_out: weight.d_out };
        self.engine.register(id.clone(), weight)?;
        dims.insert(id, d);
        Ok(())
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>> {
        check_blocks(blocks)?;
        Ok(Box::new(PlainPass { exec: self, blocks: blocks.to_vec() }))
    }

    fn scheme(&self) -> Scheme {
        Scheme { executor: "plaintext".into(), masked: None, engine: self.engine.info() }
    }

    fn integrity(&self) -> IntegrityStatus {
        IntegrityStatus::Clean { checked: 0 }
    }
}

struct PlainPass<'a> {
    exec: &'a PlaintextExecutor,
    blocks: Vec<usize>,
}

impl Pass for PlainPass<'_> {
    fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> Result<Vec<Matrix>> {
        let d_ins = ids.iter().map(|id| Ok(self.exec.dims(id)?.d_in)).collect::<Result<Vec<_>>>()?;
        check_input("linear", h, &self.blocks, d_ins)?;
        let x = danger::expose_plaintext(h.clone());
        Ok(self.exec.engine.matmul_many(&x, ids)?.into_iter().map(Masked::into_matrix).collect())
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
        check_heads(heads)?;
        Ok(attention::attend_all(heads, scale, causal))
    }

    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
        seqs.iter().try_for_each(|(heads, _)| check_heads(heads))?;
        Ok(attention::attend_sequences(seqs, scale))
    }

    fn end(self: Box<Self>) {}
}
