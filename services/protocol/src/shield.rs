//! Shield rows (TwinShield): `k` random high-energy rows stacked under each sequence's
//! activations before masking and stripped after recovery.
//!
//! Without them the engine sees `UᵀU = HᵀA ᵀAH = HᵀH`: the masked operand leaks the
//! activations' Gram matrix exactly. With them it sees `HᵀH + SᵀS`, and the fresh
//! Gaussian rows dominate the spectrum at energy 4× the mean row norm.

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize;

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
///
/// Every piece of a row is drawn from its own ChaCha12 stream keyed from `rng`, so the draws
/// run in parallel: at decode a linear's input is one real row under `k` shield rows, and
/// drawing those `k·d` Gaussians on one core was a quarter of a masked Qwen3-1.7B decode step.
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
    // Rows are drawn in pieces of at most PIECE values, each from its own stream, so even
    // one sequence's few rows spread over the cores; a row is scaled once all its pieces
    // are drawn.
    let per_row = d.div_ceil(PIECE);
    let mut seeds: Vec<[u8; 32]> = (0..out.len() / d * per_row).map(|_| rng.random()).collect();
    let draw = |(piece, seed): (&mut [f32], &[u8; 32])| -> f64 {
        let mut rng = ChaCha12Rng::from_seed(*seed);
        let mut sq = 0.0f64;
        for v in piece.iter_mut() {
            let g: f32 = StandardNormal.sample(&mut rng);
            *v = g;
            sq += (g as f64) * (g as f64);
        }
        sq
    };
    // Below a few thousand draws a fork costs more than it saves.
    let parallel = out.len() >= PARALLEL_DRAWS;
    let pieces: Vec<&mut [f32]> = out.chunks_exact_mut(d).flat_map(|row| row.chunks_mut(PIECE)).collect();
    let sq: Vec<f64> = if parallel {
        pieces.into_par_iter().zip(seeds.par_iter()).map(draw).collect()
    } else {
        pieces.into_iter().zip(seeds.iter()).map(draw).collect()
    };
    for (row, sq) in out.chunks_exact_mut(d).zip(sq.chunks(per_row)) {
        let f = (target / sq.iter().sum::<f64>().sqrt().max(f64::MIN_POSITIVE)) as f32;
        row.iter_mut().for_each(|v| *v *= f);
    }
    seeds.zeroize();
}

/// Values per independently seeded piece of a shield row.
const PIECE: usize = 2048;
const PARALLEL_DRAWS: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Every row has norm `energy ×` the block's mean row norm, on both the sequential and
    /// the parallel path and for widths that split rows into uneven pieces; rows and pieces
    /// are independent draws.
    #[test]
    fn rows_have_the_target_energy_and_independent_pieces() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        for (k, d) in [(2usize, 100usize), (8, 5000), (8, 2 * PIECE)] {
            let h: Vec<f32> = (0..3 * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let mean = h.chunks(d).map(|r| r.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt()).sum::<f64>() / 3.0;
            let mut out = vec![0.0f32; k * d];
            fill(&mut out, &h, d, 4.0, &mut rng);
            for row in out.chunks(d) {
                let norm = row.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
                assert!((norm / (4.0 * mean) - 1.0).abs() < 1e-5, "k {k}, d {d}: row norm {norm} vs {}", 4.0 * mean);
            }
            assert_ne!(out[..d], out[d..2 * d]);
            if d >= 2 * PIECE {
                assert_ne!(out[..PIECE], out[PIECE..2 * PIECE], "pieces of a row must not repeat a stream");
            }
        }
        let mut zero = vec![1.0f32; 16];
        fill(&mut zero, &[1.0; 8], 8, 0.0, &mut rng);
        assert!(zero.iter().all(|&v| v == 0.0));
    }
}
