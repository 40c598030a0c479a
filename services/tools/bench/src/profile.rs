//! Where a forward pass spends its time: an [`Executor`] that forwards to another and adds
//! up the wall time of the products (`linear`, `linear_many`, their input checks included)
//! and of attention (`attend`, `attend_sequences`) apart. What is left of a timed pass is
//! the model code between them — norms, activations, residuals, the heads' copies, RoPE,
//! embeddings — which is where a pass that does not scale with threads loses them. The
//! process's minor page faults are counted beside them: memory the allocator hands back to
//! the kernel and takes again is zeroed and mapped anew on every pass.

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
    /// The process's minor faults at the last `take`.
    faults: AtomicU64,
}

/// What [`Spent::take`] returns: the executor's time and the process's minor page faults
/// since the last take.
#[derive(Clone, Copy, Default)]
pub struct Taken {
    pub linear: Duration,
    pub attend: Duration,
    pub faults: u64,
}

impl std::ops::Add for Taken {
    type Output = Taken;
    fn add(self, o: Taken) -> Taken {
        Taken { linear: self.linear + o.linear, attend: self.attend + o.attend, faults: self.faults + o.faults }
    }
}

impl Spent {
    /// The products' and attention's time and the page faults so far, reset to zero.
    pub fn take(&self) -> Taken {
        let ns = |a: &AtomicU64| Duration::from_nanos(a.swap(0, Ordering::Relaxed));
        let now = minor_faults();
        let faults = now.saturating_sub(self.faults.swap(now, Ordering::Relaxed));
        Taken { linear: ns(&self.linear), attend: ns(&self.attend), faults }
    }

    fn add(counter: &AtomicU64, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The process's minor page faults so far (`/proc/self/stat`, Linux; 0 elsewhere).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces:
    // state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(7)).and_then(|v| v.parse().ok()).unwrap_or(0)
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
