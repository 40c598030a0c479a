//! An engine for this crate's unit tests: products on the host CPU through the same table
//! and kernels the sealed executor uses. The CPU engine of `kernels/` depends on this
//! crate, so unit tests here cannot use it; integration tests under `tests/` do.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tensor::{Matrix, Weight, WeightId, WeightTable, cpu, ring::RingWeight};

use crate::{
    Engine, EngineError, EngineInfo, Masked, Registered, RingMasked,
    engine::{check_operand, dynamic_shape},
};

#[derive(Default)]
pub(crate) struct HostEngine(WeightTable, Mutex<HashMap<WeightId, Arc<RingWeight>>>);

impl Engine for HostEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo::host_cpu()
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.0.insert(id, &weight)?;
        Ok(Registered { storage: tensor::Precision::F32 })
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        if self.1.lock().unwrap().remove(id).is_some() {
            return Ok(());
        }
        Ok(self.0.remove(id)?)
    }

    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        self.1.lock().unwrap().insert(id, weight);
        Ok(())
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        let ring = self.1.lock().unwrap();
        ids.iter()
            .map(|id| {
                let w = ring.get(id).ok_or_else(|| EngineError::UnknownWeight(id.clone()))?;
                Ok(w.product(x.as_slice(), x.rows()))
            })
            .collect()
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        ids.iter()
            .map(|id| {
                let w = self.0.get(id)?;
                check_operand("matmul", x, w.d_in)?;
                Ok(w.product(x.matrix()))
            })
            .collect()
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        dynamic_shape(a, b, transpose_b)?;
        Ok(cpu::matmul(a.matrix(), b.matrix(), transpose_b))
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        let mut out = x.matrix().clone();
        let cols = out.cols().max(1);
        out.as_mut_slice().chunks_mut(cols).for_each(|row| cpu::softmax_in_place(row, scale));
        Ok(out)
    }
}
