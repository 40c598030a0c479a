//! `CpuEngine`: the untrusted engine on host cores (rayon + the `gemm` crate's packed
//! SIMD kernels, through the TEE's own [`tensor::cpu`] math). It is the parity baseline for
//! every GPU engine and the engine of CI.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use protocol::{
    Engine, EngineError, EngineInfo, Masked, Registered, RingMasked,
    engine::{check_operand, dynamic_shape},
};
use rayon::prelude::*;
use tensor::{Matrix, Precision, Weight, WeightId, WeightTable, cpu, ring::RingWeight};

/// Untrusted engine on the host CPU.
#[derive(Default)]
pub struct CpuEngine {
    weights: WeightTable,
    /// int8 weights for the ring products of the `dual-lpn` protection.
    ring: RwLock<HashMap<WeightId, Arc<RingWeight>>>,
}

impl CpuEngine {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Engine for CpuEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo::host_cpu()
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.weights.insert(id, &weight)?;
        Ok(Registered { storage: Precision::F32 })
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        if self.ring.write().expect("ring table poisoned").remove(id).is_some() {
            return Ok(());
        }
        Ok(self.weights.remove(id)?)
    }

    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        let mut ring = self.ring.write().expect("ring table poisoned");
        if ring.contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        ring.insert(id, weight);
        Ok(())
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        let ring = self.ring.read().expect("ring table poisoned");
        let weights = ids
            .iter()
            .map(|id| ring.get(id).cloned().ok_or_else(|| EngineError::UnknownWeight(id.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        drop(ring);
        if x.rows() == 0 || x.cols() == 0 {
            return Err(EngineError::Empty("ring_matmul"));
        }
        for w in &weights {
            if x.cols() != w.d_in {
                return Err(EngineError::Shape {
                    op: "ring_matmul",
                    detail: format!("operand has {} columns, weight expects {}", x.cols(), w.d_in),
                });
            }
        }
        Ok(weights.iter().map(|w| w.product(x.as_slice(), x.rows())).collect())
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        let weights = ids.iter().map(|id| self.weights.get(id)).collect::<Result<Vec<_>, _>>()?;
        for w in &weights {
            check_operand("matmul", x, w.d_in)?;
        }
        Ok(weights.iter().map(|w| w.product(x.matrix())).collect())
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        let (m, k, n) = dynamic_shape(a, b, transpose_b)?;
        let mut out = Matrix::zeros(m, n);
        let b_strides = if transpose_b { (1, k) } else { (n, 1) };
        cpu::sgemm(m, n, k, a.matrix().as_slice(), (k, 1), b.matrix().as_slice(), b_strides, out.as_mut_slice());
        Ok(out)
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        if x.rows() == 0 || x.cols() == 0 {
            return Err(EngineError::Empty("softmax_rows"));
        }
        let mut out = x.matrix().clone();
        let cols = out.cols();
        out.as_mut_slice().par_chunks_mut(cols).for_each(|row| cpu::softmax_in_place(row, scale));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use protocol::danger::expose_plaintext;
    use tensor::WeightLayout;

    use super::*;

    #[test]
    fn products_match_the_tee_math_in_both_layouts() {
        let engine = CpuEngine::new();
        let x = Matrix::from_fn(3, 5, |r, c| (r * 5 + c) as f32 * 0.1 - 0.7);
        let w = Matrix::from_fn(5, 4, |r, c| (r as f32 - c as f32) * 0.25);
        engine.register("io".into(), Weight::f32(5, 4, WeightLayout::InOut, w.as_slice().to_vec())).unwrap();
        engine.register("oi".into(), Weight::f32(5, 4, WeightLayout::OutIn, w.transpose().into_vec())).unwrap();
        let want = cpu::matmul(&x, &w, false);
        for got in engine.matmul_many(&expose_plaintext(x.clone()), &["io".into(), "oi".into()]).unwrap() {
            assert!(got.rel_err(&want) < 1e-6);
        }
        let got_t = engine.matmul_dynamic(&expose_plaintext(x), &expose_plaintext(w.transpose()), true).unwrap();
        assert!(got_t.rel_err(&want) < 1e-6);
    }

    #[test]
    fn bad_input_gives_typed_errors() {
        let engine = CpuEngine::new();
        let x = expose_plaintext(Matrix::zeros(2, 3));
        assert_eq!(engine.matmul(&x, &"nope".into()).unwrap_err(), EngineError::UnknownWeight("nope".into()));
        engine.register("w".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 8])).unwrap();
        assert!(matches!(engine.matmul(&x, &"w".into()), Err(EngineError::Shape { .. })));
        assert!(matches!(
            engine.register("w".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 8])),
            Err(EngineError::DuplicateWeight(_))
        ));
        assert!(matches!(
            engine.register("bad".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 7])),
            Err(EngineError::Shape { .. })
        ));
        let empty = expose_plaintext(Matrix::zeros(0, 4));
        assert_eq!(engine.matmul(&empty, &"w".into()).unwrap_err(), EngineError::Empty("matmul"));
        assert!(matches!(
            engine.matmul_dynamic(&x, &expose_plaintext(Matrix::zeros(2, 2)), false),
            Err(EngineError::Shape { .. })
        ));
        assert_eq!(engine.softmax_rows(&empty, 1.0).unwrap_err(), EngineError::Empty("softmax_rows"));
        engine.unregister(&"w".into()).unwrap();
        assert!(engine.unregister(&"w".into()).is_err());
    }
}
