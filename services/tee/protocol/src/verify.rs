//! U-Verify: a Freivalds-style check that the engine's product `Z = U·W` is right, at a
//! cost that does not grow with the weight.
//!
//! At provisioning the TEE draws `k` secret probe vectors `r_j ∈ {−L..L}∖{0}` of length
//! `d_out` for each weight and precomputes `W·r_j` once. Checking one product then costs
//! `O(s·(d_in + d_out)·k)`: compare `Z·r_j` with `U·(W·r_j)`. A tampered product
//! `Z + E` passes only if `E·r_j` vanishes (up to rounding) for every probe; for any `E`
//! above the rounding floor that happens with probability at most `(2L)^−k`
//! (Schwartz–Zippel over the probe set). `docs/PROTOCOL.md` has the full argument.
//!
//! The tolerance is the forward-error bound of the engine's product, not a guess:
//! `|Ẑ_io − Z_io| ≤ γ·Σ_t |U_it||W_to|` with `γ = d_in·u/(1 − d_in·u) + 2u_op`, so a
//! probe's honest residual is at most `γ·L·(|U|·‖W‖_row,1)_i`.

use std::fmt;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use tensor::{Matrix, MatrixView, Precision, Weight};
use zeroize::Zeroize;

/// Probe count and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UVerifyConfig {
    /// `k`: probes per weight; the miss probability is `(2L)^−k`.
    pub probes: usize,
    /// `L`: probe entries are drawn from `{−L..L}∖{0}`.
    pub range: i32,
}

impl Default for UVerifyConfig {
    fn default() -> Self {
        UVerifyConfig { probes: 2, range: 3 }
    }
}

impl UVerifyConfig {
    /// Upper bound on the probability that one tampered product goes undetected.
    pub fn miss_bound(&self) -> f64 {
        (2.0 * self.range as f64).powi(-(self.probes as i32))
    }
}

/// A product that failed its check.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct IntegrityViolation {
    pub weight: String,
    pub row: usize,
    pub probe: usize,
    /// `|Z·r − U·(W·r)|` and the tolerance it exceeded.
    pub residual: f64,
    pub tolerance: f64,
}

impl fmt::Display for IntegrityViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "engine product for weight `{}` is wrong (row {}, probe {}: residual {:.3e} > tolerance {:.3e})",
            self.weight, self.row, self.probe, self.residual, self.tolerance
        )
    }
}

/// Secret probes of one weight, and what the check needs precomputed.
pub struct Probes {
    k: usize,
    range: f64,
    d_in: usize,
    d_out: usize,
    /// `k×d_out`, row j is `r_j`.
    r: Vec<f64>,
    /// `k×d_in`: row j is `W·r_j`.
    wr: Vec<f64>,
    /// `d_in`: `Σ_o |W_io|`.
    w_abs: Vec<f64>,
    /// Forward-error factor γ of the engine's product.
    gamma: f64,
}

impl Probes {
    /// Draws fresh probes for `weight` as the engine stores it (`storage`), for an engine
    /// that rounds its operands to `operand`.
    pub fn draw(
        cfg: &UVerifyConfig,
        weight: &Weight,
        storage: Precision,
        operand: Precision,
        rng: &mut impl Rng,
    ) -> Probes {
        let (d_in, d_out, k) = (weight.d_in, weight.d_out, cfg.probes);
        let l = cfg.range.max(1);
        let r: Vec<f64> = (0..k * d_out)
            .map(|_| {
                let v = rng.random_range(1..=l) as f64;
                if rng.random::<bool>() { v } else { -v }
            })
            .collect();
        let w = weight.data.rounded_to(storage);
        let mut wr = vec![0.0f64; d_in * k];
        let mut w_abs = vec![0.0f64; d_in];
        // Walk the weight in storage order so the pass over it streams.
        let mut visit = |i: usize, o: usize, v: f64| {
            w_abs[i] += v.abs();
            for j in 0..k {
                wr[j * d_in + i] += v * r[j * d_out + o];
            }
        };
        match weight.layout {
            tensor::WeightLayout::InOut => {
                for (idx, &v) in w.iter().enumerate() {
                    visit(idx / d_out, idx % d_out, v as f64);
                }
            }
            tensor::WeightLayout::OutIn => {
                for (idx, &v) in w.iter().enumerate() {
                    visit(idx % d_in, idx / d_in, v as f64);
                }
            }
        }
        let u = Precision::F32.unit_roundoff();
        let nu = d_in as f64 * u;
        // Accumulation error of a length-d_in dot product, plus rounding of both operands
        // when the engine multiplies in a narrower format than f32.
        let op = if operand == Precision::F32 { 0.0 } else { 2.0 * operand.unit_roundoff() };
        let gamma = nu / (1.0 - nu) + op + u;
        Probes { k, range: l as f64, d_in, d_out, r, wr, w_abs, gamma }
    }

    /// Checks `z = u·W` for `u` (`s×d_in`) and `z` (`s×d_out`). Rows are checked in
    /// parallel when there is enough work; the first failing row (lowest index) is reported.
    pub fn check(&self, weight: &str, u: &Matrix, z: MatrixView<'_>) -> Result<(), IntegrityViolation> {
        debug_assert_eq!(u.cols(), self.d_in);
        debug_assert_eq!(z.cols(), self.d_out);
        let check_row = |row: usize| -> Option<IntegrityViolation> {
            let (ur, zr) = (u.row(row), z.row(row));
            let bound = dot_abs(ur, &self.w_abs);
            // Our own f64 sums add at most ~1e-16 relative; the margin absorbs them.
            let tolerance = self.gamma * self.range * bound * 1.01 + f64::MIN_POSITIVE;
            (0..self.k).find_map(|j| {
                let lhs = dot(zr, &self.r[j * self.d_out..(j + 1) * self.d_out]);
                let rhs = dot(ur, &self.wr[j * self.d_in..(j + 1) * self.d_in]);
                let residual = (lhs - rhs).abs();
                // Not `residual > tolerance`: a NaN residual is not within it either.
                let within = residual <= tolerance;
                (!within).then(|| IntegrityViolation { weight: weight.to_string(), row, probe: j, residual, tolerance })
            })
        };
        let work = u.rows() * (self.d_in + self.d_out) * (self.k + 1);
        let failed = if work >= 1 << 18 {
            use rayon::prelude::*;
            (0..u.rows()).into_par_iter().find_map_first(check_row)
        } else {
            (0..u.rows()).find_map(check_row)
        };
        failed.map_or(Ok(()), Err)
    }
}

/// `Σ a_i·b_i` in f64 with four independent accumulators (a dependent chain of f64 adds
/// would bound the check by add latency, not by the multiply-adds).
fn dot(a: &[f32], b: &[f64]) -> f64 {
    dot_by(a, b, |x| x as f64)
}

/// `Σ |a_i|·b_i`, as [`dot`].
fn dot_abs(a: &[f32], b: &[f64]) -> f64 {
    dot_by(a, b, |x| (x as f64).abs())
}

#[inline(always)]
fn dot_by(a: &[f32], b: &[f64], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..4 {
            acc[l] += f(x[l]) * y[l];
        }
    }
    let tail: f64 = ar.iter().zip(br).map(|(&x, &y)| f(x) * y).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.r.zeroize();
        self.wr.zeroize();
    }
}
