//! Where a forward pass spends its time: an [`Executor`] that forwards to another and adds
//! up the wall time of the products (`linear`, `linear_many`, their input checks included)
//! and of attention (`attend`, `attend_sequences`) apart. What is left of a timed pass is
//! the model code between them — norms, activations, residuals, the heads' copies, RoPE,
//! embeddings — which is where a pass that does not scale with threads loses them.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use protocol::{
    Executor, IntegrityStatus, Pass, ProtocolError, Scheme,
    attention::{Causal, Head},
};
use tensor::{Matrix, Weight, WeightId};

type ProtocolResult<T> = Result<T, ProtocolError>;

/// Time spent inside the executor's calls, in nanoseconds, since the last [`Spent::take`].
#[derive(Default)]
pub struct Spent {
    linear: AtomicU64,
    attend: AtomicU64,
}

impl Spent {
    /// The products' and attention's time so far, reset to zero.
    pub fn take(&self) -> (Duration, Duration) {
        let ns = |a: &AtomicU64| Duration::from_nanos(a.swap(0, Ordering::Relaxed));
        (ns(&self.linear), ns(&self.attend))
    }

    fn add(counter: &AtomicU64, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(ns, Ordering::Relaxed);
    }
}

/// `inner`, with its passes' calls timed into `spent`.
pub struct Timed {
    pub inner: Arc<dyn Executor>,
    pub spent: Arc<Spent>,
}

impl Executor for Timed {
    fn provision(&self, id: WeightId, weight: Weight) -> ProtocolResult<()> {
        self.inner.provision(id, weight)
    }

    fn begin(&self, blocks: &[usize]) -> ProtocolResult<Box<dyn Pass + '_>> {
        Ok(Box::new(TimedPass { inner: self.inner.begin(blocks)?, spent: &self.spent }))
    }

    fn scheme(&self) -> Scheme {
        self.inner.scheme()
    }

    fn integrity(&self) -> IntegrityStatus {
        self.inner.integrity()
    }
}

struct TimedPass<'a> {
    inner: Box<dyn Pass + 'a>,
    spent: &'a Spent,
}

impl Pass for TimedPass<'_> {
    fn blocks(&self) -> &[usize] {
        self.inner.blocks()
    }

    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> ProtocolResult<Vec<Matrix>> {
        let t = Instant::now();
        let out = self.inner.linear_many(h, ids);
        Spent::add(&self.spent.linear, t);
        out
    }

    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> ProtocolResult<Vec<Matrix>> {
        let t = Instant::now();
        let out = self.inner.attend(heads, scale, causal);
        Spent::add(&self.spent.attend, t);
        out
    }

    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> ProtocolResult<Vec<Vec<Matrix>>> {
        let t = Instant::now();
        let out = self.inner.attend_sequences(seqs, scale);
        Spent::add(&self.spent.attend, t);
        out
    }

    fn end(self: Box<Self>) {
        self.inner.end();
    }
}
