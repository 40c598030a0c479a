//! Ground truth for scoring: an executor wrapper on the trusted side that records the
//! plaintext input `H` of every linear layer, in call order. The attacker never gets this;
//! the harness pairs it with what the engine saw to score recovery.

use std::sync::{Arc, Mutex};

use protocol::{
    Executor, IntegrityStatus, Matrix, Pass, ProtocolError, Scheme, Weight, WeightId,
    attention::{Causal, Head},
};

/// One `linear_many` call as the model made it.
pub struct Truth {
    pub ids: Vec<WeightId>,
    /// Rows of each sequence in the pass.
    pub blocks: Vec<usize>,
    /// The plaintext input, when the call is one the harness keeps.
    pub input: Option<Matrix>,
}

type Keep = dyn Fn(&[WeightId]) -> bool + Send + Sync;

/// Wraps the executor the model runs on.
pub struct Recorder {
    inner: Arc<dyn Executor>,
    keep: Box<Keep>,
    log: Mutex<Vec<Truth>>,
}

impl Recorder {
    /// Records every call; clones the input only where `keep(ids)` holds.
    pub fn new(inner: Arc<dyn Executor>, keep: impl Fn(&[WeightId]) -> bool + Send + Sync + 'static) -> Self {
        Recorder { inner, keep: Box::new(keep), log: Mutex::new(Vec::new()) }
    }

    /// Takes the calls recorded so far.
    pub fn take(&self) -> Vec<Truth> {
        std::mem::take(&mut *self.log.lock().expect("record log poisoned"))
    }
}

impl Executor for Recorder {
    fn provision(&self, id: WeightId, weight: Weight) -> Result<(), ProtocolError> {
        self.inner.provision(id, weight)
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>, ProtocolError> {
        let inner = self.inner.begin(blocks)?;
        Ok(Box::new(RecordingPass { inner, rec: self }))
    }

    fn scheme(&self) -> Scheme {
        self.inner.scheme()
    }

    fn integrity(&self) -> IntegrityStatus {
        self.inner.integrity()
    }
}

struct RecordingPass<'a> {
    inner: Box<dyn Pass + 'a>,
    rec: &'a Recorder,
}

impl Pass for RecordingPass<'_> {
    fn blocks(&self) -> &[usize] {
        self.inner.blocks()
    }

    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> Result<Vec<Matrix>, ProtocolError> {
        let input = (self.rec.keep)(ids).then(|| h.clone());
        let truth = Truth { ids: ids.to_vec(), blocks: self.inner.blocks().to_vec(), input };
        self.rec.log.lock().expect("record log poisoned").push(truth);
        self.inner.linear_many(h, ids)
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>, ProtocolError> {
        self.inner.attend(heads, scale, causal)
    }

    fn end(self: Box<Self>) {
        self.inner.end();
    }
}
