//! An engine wrapper that records every operand the device receives: what an attacker who
//! owns the GPU, its driver or the PCIe link gets to see. The attack harness and the
//! protocol's leak tests read it.

use std::sync::Mutex;

use protocol::{Engine, EngineError, EngineInfo, Masked, Registered};
use tensor::{Matrix, Weight, WeightId};

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
}

/// One operand as the device saw it.
#[derive(Clone, Debug)]
pub struct Captured {
    /// Sequence number of the engine call.
    pub call: usize,
    pub op: OpKind,
    pub operand: Matrix,
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

    fn record(&self, op: OpKind, operands: &[&Masked]) {
        let mut log = self.log.lock().expect("capture log poisoned");
        let call = log.0;
        log.0 += 1;
        for m in operands {
            log.1.push(Captured { call, op: op.clone(), operand: m.matrix().clone() });
        }
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
}
