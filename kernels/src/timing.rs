//! An engine wrapper that accounts the time spent inside the engine, so a service can
//! report engine time against TEE time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use protocol::{Engine, EngineError, EngineInfo, Masked, Registered, RingMasked};
use tensor::{Matrix, MatrixView, Weight, WeightId, ring::RingWeight};

/// Wraps an engine and sums the wall time of its calls.
pub struct TimedEngine<E> {
    inner: E,
    nanos: AtomicU64,
    calls: AtomicU64,
}

impl<E: Engine> TimedEngine<E> {
    pub fn new(inner: E) -> Self {
        Self { inner, nanos: AtomicU64::new(0), calls: AtomicU64::new(0) }
    }

    /// Total seconds spent in engine calls so far.
    pub fn seconds(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.account(t.elapsed());
        out
    }

    fn account(&self, spent: Duration) {
        self.nanos.fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl<E: Engine> Engine for TimedEngine<E> {
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
        self.timed(|| self.inner.matmul_many(x, ids))
    }

    /// The caller's time in `read` is its own, not the engine's: it is left out.
    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MatrixView<'_>]),
    ) -> Result<(), EngineError> {
        let (t, mut reading) = (Instant::now(), Duration::ZERO);
        let out = self.inner.matmul_many_with(x, ids, &mut |zs| {
            let r = Instant::now();
            read(zs);
            reading += r.elapsed();
        });
        self.account(t.elapsed().saturating_sub(reading));
        out
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        self.timed(|| self.inner.matmul_dynamic(a, b, transpose_b))
    }

    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Matrix>, EngineError> {
        self.timed(|| self.inner.matmul_dynamic_batched(pairs, transpose_b))
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        self.timed(|| self.inner.softmax_rows(x, scale))
    }

    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        self.inner.register_ring(id, weight)
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        self.timed(|| self.inner.ring_matmul_many(x, ids))
    }

    fn buffer(&self, len: usize) -> Vec<f32> {
        self.inner.buffer(len)
    }

    fn recycle(&self, buf: Vec<f32>) {
        self.inner.recycle(buf)
    }
}

#[cfg(test)]
mod tests {
    use protocol::danger::expose_ring;
    use tensor::WeightLayout;

    use super::*;
    use crate::CpuEngine;

    /// The wrapper passes ring products through (the `dual-lpn` protection on a timed
    /// engine), timing them: a default method left unforwarded refuses them instead.
    #[test]
    fn ring_products_pass_through_and_are_timed() {
        let timed = TimedEngine::new(CpuEngine::new());
        let w = Weight::f32(3, 2, WeightLayout::InOut, vec![0.5, -1.0, 0.25, 1.0, -0.75, 0.125]);
        let ring = Arc::new(RingWeight::quantize(&w).unwrap());
        timed.register_ring("w".into(), ring.clone()).unwrap();
        let x = expose_ring(2, 3, vec![1, 2, u32::MAX, 7, 0, 1 << 31]);
        let got = timed.ring_matmul_many(&x, &["w".into()]).unwrap();
        let inner = CpuEngine::new();
        inner.register_ring("w".into(), ring).unwrap();
        assert_eq!(got, inner.ring_matmul_many(&x, &["w".into()]).unwrap());
        assert_eq!(timed.calls(), 1);
    }
}
