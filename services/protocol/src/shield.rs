//! Shield rows (TwinShield): `k` random high-energy rows stacked under each sequence's
//! activations before masking and stripped after recovery.
//!
//! Without them the engine sees `UᵀU = HᵀA ᵀAH = HᵀH`: the masked operand leaks the
//! activations' Gram matrix exactly. With them it sees `HᵀH + SᵀS`, and the fresh
//! Gaussian rows dominate the spectrum at energy 4× the mean row norm.

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

/// How many shield rows, and how loud.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShieldConfig {
    /// Rows stacked under every sequence (HD₃ adds more to reach a power of two).
    pub rows: usize,
    /// Each row's norm, in units of the block's mean activation row norm.
    pub energy: f32,
}

impl Default for ShieldConfig {
    fn default() -> Self {
        ShieldConfig { rows: 8, energy: 4.0 }
    }
}

impl ShieldConfig {
    /// No shield rows (the C1 condition of the attack harness; leaks the Gram matrix).
    pub fn off() -> Self {
        ShieldConfig { rows: 0, energy: 0.0 }
    }
}

/// Fills `out` (`k×d`, row-major) with fresh shield rows for the activation block `h`
/// (`n×d`). With `energy == 0` the rows are zero padding.
pub fn fill(out: &mut [f32], h: &[f32], d: usize, energy: f32, rng: &mut impl Rng) {
    if out.is_empty() {
        return;
    }
    if energy == 0.0 {
        out.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let n = (h.len() / d).max(1);
    let mean_norm = h
        .chunks_exact(d)
        .map(|r| r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt())
        .sum::<f64>()
        / n as f64;
    let target = (energy as f64 * mean_norm).max(f64::MIN_POSITIVE);
    for row in out.chunks_exact_mut(d) {
        let mut sq = 0.0f64;
        for v in row.iter_mut() {
            let g: f32 = StandardNormal.sample(rng);
            *v = g;
            sq += (g as f64) * (g as f64);
        }
        let f = (target / sq.sqrt().max(f64::MIN_POSITIVE)) as f32;
        row.iter_mut().for_each(|v| *v *= f);
    }
}
