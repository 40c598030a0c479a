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
    if energy == 0.0 {
        out.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    draw_gaussians(out, rng);
    scale_rows(out, h, d, energy);
}

/// Standard Gaussians drawn ahead of use, so that the draws of a linear's shield rows can
/// run while the engine works on the previous linear (the TEE's cores are idle then) rather
/// than before the next engine call. The values depend on nothing but the CSPRNG; rows are
/// scaled to their energy only when taken. Zeroized when dropped.
#[derive(Default)]
pub struct Spare {
    values: Vec<f32>,
    /// The most values one call has asked for: what [`Spare::top_up`] refills to.
    want: usize,
}

impl Spare {
    /// Values ready to be taken.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Draws what is missing to hold as many values as the largest call so far took.
    pub fn top_up(&mut self, rng: &mut impl Rng) {
        let have = self.values.len();
        if have >= self.want {
            return;
        }
        self.values.resize(self.want, 0.0);
        draw_gaussians(&mut self.values[have..], rng);
    }

    /// Lends `len` standard Gaussians (`len / d` rows of width `d`) from the spare, drawing
    /// what it lacks, with each row's factor to norm `energy ×` the mean row norm of `h`:
    /// `f` applies the scaled rows without their being copied or scaled in memory (a dense
    /// mask folds the factors into its own columns). The values are zeroized and gone when
    /// `f` returns, so none is lent twice.
    pub fn lend<R>(
        &mut self,
        len: usize,
        h: &[f32],
        d: usize,
        energy: f32,
        rng: &mut impl Rng,
        f: impl FnOnce(&[f32], &[f32]) -> R,
    ) -> R {
        if energy == 0.0 {
            return f(&vec![0.0; len], &vec![0.0; len / d.max(1)]);
        }
        self.want = self.want.max(len);
        let have = self.values.len();
        if have < len {
            self.values.resize(len, 0.0);
            draw_gaussians(&mut self.values[have..], rng);
        }
        let from = self.values.len() - len;
        let rows = &self.values[from..];
        let target = target_norm(h, d, energy);
        let factors: Vec<f32> = rows.chunks_exact(d).map(|r| row_factor(r, target)).collect();
        let out = f(rows, &factors);
        self.values[from..].zeroize();
        self.values.truncate(from);
        out
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        self.values.zeroize();
    }
}

/// Standard Gaussians into `out`, in pieces of at most [`PIECE`] values each drawn from its
/// own ChaCha12 stream keyed from `rng` (in parallel when there are many).
pub(crate) fn draw_gaussians(out: &mut [f32], rng: &mut impl Rng) {
    if out.is_empty() {
        return;
    }
    let mut seeds: Vec<[u8; 32]> = (0..out.len().div_ceil(PIECE)).map(|_| rng.random()).collect();
    let draw = |(piece, seed): (&mut [f32], &[u8; 32])| {
        let mut rng = ChaCha12Rng::from_seed(*seed);
        for v in piece.iter_mut() {
            *v = StandardNormal.sample(&mut rng);
        }
    };
    // Below a few thousand draws a fork costs more than it saves.
    if out.len() >= PARALLEL_DRAWS {
        out.par_chunks_mut(PIECE).zip(seeds.par_iter()).for_each(draw);
    } else {
        out.chunks_mut(PIECE).zip(seeds.iter()).for_each(draw);
    }
    seeds.zeroize();
}

/// `Σ x_i²`: SIMD f32 partial sums over pieces of 256, added in f64 (a plain f64 sum is
/// one dependent add per element, and it was most of a decode step's mask time).
fn sum_squares(x: &[f32]) -> f64 {
    x.chunks(256).map(|c| tensor::simd::dot(c, c) as f64).sum()
}

/// A shield row's norm: `energy ×` the mean `d`-wide row norm of `h`.
pub(crate) fn target_norm(h: &[f32], d: usize, energy: f32) -> f64 {
    let n = (h.len() / d.max(1)).max(1);
    let mean_norm = h.chunks_exact(d.max(1)).map(|r| sum_squares(r).sqrt()).sum::<f64>() / n as f64;
    (energy as f64 * mean_norm).max(f64::MIN_POSITIVE)
}

/// The factor that brings `row` to norm `target`.
pub(crate) fn row_factor(row: &[f32], target: f64) -> f32 {
    (target / sum_squares(row).sqrt().max(f64::MIN_POSITIVE)) as f32
}

/// Scales every `d`-wide row of `out` to norm `energy ×` the mean row norm of `h`.
fn scale_rows(out: &mut [f32], h: &[f32], d: usize, energy: f32) {
    let target = target_norm(h, d, energy);
    for row in out.chunks_exact_mut(d) {
        let f = row_factor(row, target);
        row.iter_mut().for_each(|v| *v *= f);
    }
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
        let mut spare = Spare::default();
        let lent_zero = lent(&mut spare, 16, &[1.0; 8], 8, 0.0, &mut rng);
        assert!(lent_zero.iter().all(|&v| v == 0.0) && spare.is_empty());
        fill(&mut zero, &[1.0; 8], 8, 0.0, &mut rng);
        assert!(zero.iter().all(|&v| v == 0.0));
    }

    /// The rows `Spare::lend` hands out, scaled by their factors.
    fn lent(spare: &mut Spare, len: usize, h: &[f32], d: usize, energy: f32, rng: &mut impl Rng) -> Vec<f32> {
        spare.lend(len, h, d, energy, rng, |g, f| {
            g.chunks(d).zip(f).flat_map(|(row, &fi)| row.iter().map(move |v| v * fi)).collect()
        })
    }

    /// Drawn-ahead values give rows of the target energy, are taken once (never handed out
    /// twice), and the spare refills to the largest call it has served.
    #[test]
    fn spare_values_are_used_once_and_refilled_to_the_largest_call() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
        let d = 300;
        let h: Vec<f32> = (0..d).map(|i| (i % 7) as f32 - 3.0).collect();
        let norm = h.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
        let mut spare = Spare::default();
        lent(&mut spare, 4 * d, &h, d, 2.0, &mut rng);
        assert!(spare.is_empty(), "nothing was drawn ahead yet");
        spare.top_up(&mut rng);
        assert_eq!(spare.len(), 4 * d);
        let mut seen: Vec<f32> = Vec::new();
        for rows in [2usize, 4, 1] {
            let out = lent(&mut spare, rows * d, &h, d, 2.0, &mut rng);
            assert_eq!(spare.len(), (4 - rows) * d, "lent values leave the spare");
            for row in out.chunks(d) {
                let n = row.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
                assert!((n / (2.0 * norm) - 1.0).abs() < 1e-5, "row norm {n} vs {}", 2.0 * norm);
                // A row's direction never repeats an earlier row's (values reused would).
                let cos = |a: &[f32], b: &[f32]| {
                    let dot: f64 = a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum();
                    dot / (a.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt()
                        * b.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt())
                };
                for old in seen.chunks(d) {
                    assert!(cos(row, old).abs() < 0.5, "a shield row repeats an earlier one");
                }
            }
            seen.extend_from_slice(&out);
            spare.top_up(&mut rng);
            assert_eq!(spare.len(), 4 * d, "refilled to the largest call (4 rows)");
        }
    }
}
