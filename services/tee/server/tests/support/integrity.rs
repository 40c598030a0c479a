//! Shared by the integrity tests (the server's and the gateway's): a tampering GPU — the CPU
//! engine, except that once armed it adds 10 to one element of every `every`-th product —
//! and the real model they run.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use kernels::CpuEngine;
use protocol::{Engine, EngineError, EngineInfo, Masked, Matrix, Registered, Weight, WeightId};

/// MiniLM from the offline cache (scripts/fetch-models.sh).
pub fn minilm() -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/gelo"));
    let p = root.join("models/all-minilm-l6-v2");
    assert!(p.exists(), "run scripts/fetch-models.sh");
    p
}

pub struct Corrupting {
    inner: CpuEngine,
    armed: Arc<AtomicBool>,
    every: usize,
    products: AtomicUsize,
}

impl Corrupting {
    /// The engine and its switch (off at first).
    pub fn new(every: usize) -> (Self, Arc<AtomicBool>) {
        let armed = Arc::new(AtomicBool::new(false));
        (
            Corrupting {
                inner: CpuEngine::new(),
                armed: armed.clone(),
                every: every.max(1),
                products: AtomicUsize::new(0),
            },
            armed,
        )
    }
}

impl Engine for Corrupting {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn register(&self, id: WeightId, w: Weight) -> Result<Registered, EngineError> {
        self.inner.register(id, w)
    }
    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.inner.unregister(id)
    }
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        let out = self.inner.matmul_many(x, ids)?;
        if !self.armed.load(Ordering::SeqCst) {
            return Ok(out);
        }
        Ok(out
            .into_iter()
            .map(|z| {
                if self.products.fetch_add(1, Ordering::SeqCst) % self.every != self.every - 1 {
                    return z;
                }
                let mut z = z;
                z.set(0, 0, z.get(0, 0) + 10.0);
                z
            })
            .collect())
    }
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, t: bool) -> Result<Matrix, EngineError> {
        self.inner.matmul_dynamic(a, b, t)
    }
    fn softmax_rows(&self, x: &Masked, s: f32) -> Result<Matrix, EngineError> {
        self.inner.softmax_rows(x, s)
    }
}
