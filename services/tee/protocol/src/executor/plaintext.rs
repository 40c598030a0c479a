//! The plaintext executor: computes on activations in the clear. On an engine it is the
//! parity baseline the masked executor is measured against, never a deployment on an
//! untrusted engine; on the TEE's own CPU ([`PlaintextExecutor::host`]) it is what the
//! sealed executor runs.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use tensor::{Matrix, Weight, WeightId, WeightTable, ring::RingWeight};

use super::{
    Dims, Executor, IntegrityStatus, Pass, Scheme, attend_in_tee, attend_sequences_in_tee, check_blocks, check_input,
};
use crate::{
    Engine, EngineInfo,
    attention::{Causal, Head},
    danger,
    error::{ProtocolError, Result},
};

/// Computes on activations in the clear: on an engine the parity baseline, never a
/// deployment; on the host CPU the sealed executor's products.
pub struct PlaintextExecutor {
    products: Products,
    dims: RwLock<HashMap<WeightId, Dims>>,
}

/// Where the products are computed.
enum Products {
    /// On an engine, which receives every activation in the clear.
    Engine(Arc<dyn Engine>),
    /// On the host CPU, inside the TEE's address space: no engine receives anything.
    Host(WeightTable),
    /// On the host CPU in the `dual-lpn` scheme's int8 arithmetic (weights per output
    /// column, activations per row): the quantized plaintext path that scheme must equal.
    Int8(RwLock<HashMap<WeightId, RingWeight>>),
}

impl PlaintextExecutor {
    /// Sends every activation to `engine` in the clear.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        PlaintextExecutor { products: Products::Engine(engine), dims: RwLock::default() }
    }

    /// Computes every product on the host CPU; no engine is involved. Quantized weights
    /// stay in their blocks and are multiplied in int8.
    pub(crate) fn host() -> Self {
        PlaintextExecutor { products: Products::Host(WeightTable::in_place()), dims: RwLock::default() }
    }

    /// Computes every product on the host CPU as the `dual-lpn` scheme quantizes it, in
    /// the clear: that scheme's parity baseline, and how its rounding is measured.
    pub fn int8_reference() -> Self {
        PlaintextExecutor { products: Products::Int8(RwLock::default()), dims: RwLock::default() }
    }

    pub(crate) fn engine_info(&self) -> EngineInfo {
        match &self.products {
            Products::Engine(engine) => engine.info(),
            Products::Host(_) | Products::Int8(_) => EngineInfo::host_cpu(),
        }
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
        match &self.products {
            Products::Engine(engine) => drop(engine.register(id.clone(), weight)?),
            Products::Host(table) => table.insert(id.clone(), &weight).map_err(crate::EngineError::from)?,
            Products::Int8(table) => {
                let ring = RingWeight::quantize(&weight).map_err(crate::EngineError::from)?;
                table.write().expect("poisoned").insert(id.clone(), ring);
            }
        }
        dims.insert(id, d);
        Ok(())
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>> {
        check_blocks(blocks)?;
        Ok(Box::new(PlainPass { exec: self, blocks: blocks.to_vec() }))
    }

    fn scheme(&self) -> Scheme {
        Scheme { executor: "plaintext".into(), masked: None, lpn: None, engine: self.engine_info() }
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
        match &self.exec.products {
            Products::Engine(engine) => Ok(engine.matmul_many(&danger::expose_plaintext(h.clone()), ids)?),
            Products::Host(table) => Ok(table.products(ids, h).map_err(crate::EngineError::from)?),
            Products::Int8(table) => {
                let table = table.read().expect("poisoned");
                Ok(ids.iter().map(|id| table[id].reference(h)).collect())
            }
        }
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
        attend_in_tee(heads, scale, causal)
    }

    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
        attend_sequences_in_tee(seqs, scale)
    }

    fn end(self: Box<Self>) {}
}
