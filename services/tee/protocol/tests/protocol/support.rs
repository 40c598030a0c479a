//! Shared test helpers: random matrices, executors, a tampering engine.

use std::sync::{Arc, Mutex};

use kernels::CpuEngine;
use protocol::{Engine, EngineError, EngineInfo, Masked, Registered};
use protocol::{Executor, MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor, ShieldConfig};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use tensor::{Matrix, Weight, WeightId, WeightLayout};

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn gaussian(rows: usize, cols: usize, rng: &mut impl Rng) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| StandardNormal.sample(rng))
}

/// Rows with heavy tails and a few outlier channels, like transformer hidden states.
pub fn hidden_like(rows: usize, cols: usize, rng: &mut impl Rng) -> Matrix {
    let outliers: Vec<usize> = (0..3).map(|_| rng.random_range(0..cols)).collect();
    Matrix::from_fn(rows, cols, |_, c| {
        // Laplace(0, 1) by inverse CDF; outlier channels 20× louder.
        let u: f32 = rng.random_range(-0.4999..0.4999);
        let v = -u.signum() * (1.0 - 2.0 * u.abs()).ln();
        if outliers.contains(&c) { 20.0 * v } else { v }
    })
}

pub fn weight(d_in: usize, d_out: usize, rng: &mut impl Rng) -> Weight {
    let data = (0..d_in * d_out).map(|_| rng.random_range(-0.1f32..0.1)).collect();
    Weight::f32(d_in, d_out, WeightLayout::OutIn, data)
}

pub fn masked(kind: MaskKind, shield: ShieldConfig) -> MaskedExecutor {
    MaskedExecutor::new(Arc::new(CpuEngine::new()), MaskedConfig { mask: kind, shield, ..Default::default() }).unwrap()
}

pub fn plain() -> PlaintextExecutor {
    PlaintextExecutor::new(Arc::new(CpuEngine::new()))
}

/// `h·W` through one pass of `exec` over sequences `blocks`.
pub fn run(exec: &dyn Executor, h: &Matrix, id: &str, blocks: &[usize]) -> Matrix {
    let mut pass = exec.begin(blocks).unwrap();
    let y = pass.linear(h, &WeightId::new(id)).unwrap();
    pass.end();
    y
}

/// How the tampering engine corrupts a product.
#[derive(Clone, Copy, Debug)]
pub enum Tamper {
    /// One element changed by `delta`.
    Element { row: usize, col: usize, delta: f32 },
    /// `Z + δ·u·vᵀ` with `u = e_row` and `v = e_a − e_b`: undetected exactly when every
    /// probe has r_a = r_b.
    RankOne { row: usize, a: usize, b: usize, delta: f32 },
    /// Every element scaled.
    Scale(f32),
}

/// A CPU engine that corrupts its products as told.
pub struct TamperingEngine {
    inner: CpuEngine,
    pub tamper: Mutex<Option<Tamper>>,
}

impl TamperingEngine {
    pub fn new() -> Self {
        TamperingEngine { inner: CpuEngine::new(), tamper: Mutex::new(None) }
    }
}

impl Engine for TamperingEngine {
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
        let out = self.inner.matmul_many(x, ids)?;
        let Some(t) = *self.tamper.lock().unwrap() else { return Ok(out) };
        Ok(out
            .into_iter()
            .map(|z| {
                let mut z = z;
                match t {
                    Tamper::Element { row, col, delta } => z.set(row, col, z.get(row, col) + delta),
                    Tamper::RankOne { row, a, b, delta } => {
                        z.set(row, a, z.get(row, a) + delta);
                        z.set(row, b, z.get(row, b) - delta);
                    }
                    Tamper::Scale(f) => z.as_mut_slice().iter_mut().for_each(|v| *v *= f),
                }
                z
            })
            .collect())
    }
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, t: bool) -> Result<Matrix, EngineError> {
        self.inner.matmul_dynamic(a, b, t)
    }
    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        self.inner.softmax_rows(x, scale)
    }
}
