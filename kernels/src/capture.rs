//! An engine wrapper that records every operand the device receives: what an attacker who
//! owns the GPU, its driver or the PCIe link gets to see. The attack harness and the
//! protocol's leak tests read it.

use std::sync::{Arc, Mutex};

use protocol::{Engine, EngineError, EngineInfo, Masked, Registered, RingMasked};
use tensor::{Matrix, Weight, WeightId, ring::RingWeight};

/// Which engine entry point an operand was sent to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Product with registered weights (the ids, in order).
    Linear(Vec<WeightId>),
    /// Runtime × runtime product (left and right operands are recorded separately).
    Dynamic {
        transpose_b: bool,
    },
    Softmax,
    /// Product over `Z_{2^32}` with registered int8 weights (the `dual-lpn` protection; the
    /// ids, in order). Its operand is in [`Captured::words`], not [`Captured::operand`].
    Ring(Vec<WeightId>),
}

/// A ring operand exactly as the device saw it: `rows × cols` words, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Words {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<u32>,
}

/// One operand as the device saw it.
#[derive(Clone, Debug)]
pub struct Captured {
    /// Sequence number of the engine call.
    pub call: usize,
    pub op: OpKind,
    /// The operand of an f32 entry point; `0×0` for a ring product.
    pub operand: Matrix,
    /// The operand of a ring product, every word as sent; `None` for the f32 entry points.
    pub words: Option<Words>,
}

/// Wraps an engine and keeps a copy of every operand it is sent.
pub struct CapturingEngine<E> {
    inner: E,
    log: Mutex<(usize, Vec<Captured>)>,
}

impl<E: Engine> CapturingEngine<E> {
    pub fn new(inner: E) -> Self {
        Self { inner, log: Mutex::new((0, Vec::new())) }
    }

    /// Takes everything captured so far, leaving the log empty.
    pub fn take(&self) -> Vec<Captured> {
        std::mem::take(&mut self.log.lock().expect("capture log poisoned").1)
    }

    fn push(&self, entries: impl FnOnce(usize) -> Vec<Captured>) {
        let mut log = self.log.lock().expect("capture log poisoned");
        let call = log.0;
        log.0 += 1;
        log.1.extend(entries(call));
    }

    fn record(&self, op: OpKind, operands: &[&Masked]) {
        self.push(|call| {
            operands
                .iter()
                .map(|m| Captured { call, op: op.clone(), operand: m.matrix().clone(), words: None })
                .collect()
        });
    }
}

impl<E: Engine> Engine for CapturingEngine<E> {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.inner.register(id, weight)
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.inner.unregister(id)
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        self.record(OpKind::Linear(ids.to_vec()), &[x]);
        self.inner.matmul_many(x, ids)
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        self.record(OpKind::Dynamic { transpose_b }, &[a, b]);
        self.inner.matmul_dynamic(a, b, transpose_b)
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        self.record(OpKind::Softmax, &[x]);
        self.inner.softmax_rows(x, scale)
    }

    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        self.inner.register_ring(id, weight)
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        self.push(|call| {
            let words = Words { rows: x.rows(), cols: x.cols(), data: x.as_slice().to_vec() };
            vec![Captured { call, op: OpKind::Ring(ids.to_vec()), operand: Matrix::zeros(0, 0), words: Some(words) }]
        });
        self.inner.ring_matmul_many(x, ids)
    }
}

#[cfg(test)]
mod tests {
    use protocol::danger::{expose_plaintext, expose_ring};
    use tensor::WeightLayout;

    use super::*;
    use crate::CpuEngine;

    fn ring_weight() -> Arc<RingWeight> {
        let w = Weight::f32(3, 2, WeightLayout::InOut, vec![0.5, -1.0, 0.25, 1.0, -0.75, 0.125]);
        Arc::new(RingWeight::quantize(&w).unwrap())
    }

    /// Ring products reach the inner engine (a default method left unforwarded would refuse
    /// them) and every word of the operand is kept, the ones an f32 would round included.
    #[test]
    fn ring_products_pass_through_and_every_word_is_kept() {
        let engine = CapturingEngine::new(CpuEngine::new());
        engine.register_ring("w".into(), ring_weight()).unwrap();
        let data = vec![1, 2, u32::MAX, 7, 0, (1 << 31) | 1];
        let got = engine.ring_matmul_many(&expose_ring(2, 3, data.clone()), &["w".into()]).unwrap();
        let inner = CpuEngine::new();
        inner.register_ring("w".into(), ring_weight()).unwrap();
        assert_eq!(got, inner.ring_matmul_many(&expose_ring(2, 3, data.clone()), &["w".into()]).unwrap());
        let seen = engine.take();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].op, OpKind::Ring(vec!["w".into()]));
        assert_eq!(seen[0].words, Some(Words { rows: 2, cols: 3, data }));
        assert_eq!(seen[0].operand.shape(), (0, 0));
        assert!(engine.take().is_empty(), "take leaves the log empty");
    }

    /// Ring and f32 calls share one call sequence, so a capture can pair them in order.
    #[test]
    fn ring_and_f32_calls_are_numbered_in_order() {
        let engine = CapturingEngine::new(CpuEngine::new());
        engine.register_ring("r".into(), ring_weight()).unwrap();
        let a = Matrix::from_vec(2, 2, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        engine.softmax_rows(&expose_plaintext(a.clone()), 1.0).unwrap();
        engine.ring_matmul_many(&expose_ring(1, 3, vec![3, 4, 5]), &["r".into()]).unwrap();
        engine.matmul_dynamic(&expose_plaintext(a.clone()), &expose_plaintext(a), true).unwrap();
        let calls: Vec<(usize, bool)> = engine.take().iter().map(|c| (c.call, c.words.is_some())).collect();
        assert_eq!(calls, [(0, false), (1, true), (2, false), (2, false)]);
    }
}
