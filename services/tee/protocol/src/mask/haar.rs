//! Haar-uniform orthogonal masks.
//!
//! `A` is the `Q` factor of the Householder QR of an `s×s` standard Gaussian matrix, with
//! each column multiplied by the sign of the matching diagonal entry of `R` (Mezzadri 2007).
//! Without that fix `Q` is orthogonal but not Haar: the stable Householder choice makes
//! `R_jj = −sign(z_jj)‖z_j‖`, which biases the signs of `Q`'s entries.

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use tensor::Matrix;
use zeroize::Zeroize;

/// Samples a Haar-distributed orthogonal `s×s` matrix.
pub fn sample(s: usize, rng: &mut impl Rng) -> Matrix {
    householder_q(s, rng, true)
}

/// `Q` from the Householder QR of a Gaussian matrix; `sign_fix = false` gives the biased
/// (merely orthogonal) factor, kept for the statistical test that tells them apart.
pub(crate) fn householder_q(s: usize, rng: &mut impl Rng, sign_fix: bool) -> Matrix {
    // Columns are stored contiguously (`cols[j]` is column j), so every Householder update
    // is a dot product and an axpy over contiguous memory.
    let mut cols: Vec<Vec<f64>> = (0..s).map(|_| (0..s).map(|_| StandardNormal.sample(rng)).collect()).collect();
    let mut vs: Vec<Vec<f64>> = Vec::with_capacity(s);
    let mut signs = vec![1.0f64; s];
    // The QR is ~(4/3)s³ flops: at decode's s = 9 a fork per reflector costs far more.
    let par = tensor::cpu::worth_parallel(2 * s * s * s);

    // 1. Factor: for column j, the reflector v_j zeroes rows j+1.. of the column.
    for j in 0..s {
        let (head, tail) = cols.split_at_mut(j + 1);
        let x = &head[j][j..];
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let alpha = if x[0] >= 0.0 { -norm } else { norm }; // R_jj, the stable choice
        signs[j] = alpha.signum();
        let mut v = x.to_vec();
        v[0] -= alpha;
        let vnorm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        if vnorm > 0.0 {
            v.iter_mut().for_each(|a| *a /= vnorm);
        }
        if par {
            tail.par_iter_mut().for_each(|c| reflect(&v, &mut c[j..]));
        } else {
            tail.iter_mut().for_each(|c| reflect(&v, &mut c[j..]));
        }
        vs.push(v);
    }
    cols.iter_mut().for_each(|c| c.zeroize());

    // 2. Accumulate Q = H_0·H_1·…·H_{s−1} backwards on the identity, column by column.
    let mut q: Vec<Vec<f64>> = (0..s)
        .map(|c| {
            let mut col = vec![0.0; s];
            col[c] = 1.0;
            col
        })
        .collect();
    for j in (0..s).rev() {
        let v = &vs[j];
        if par {
            q[j..].par_iter_mut().for_each(|c| reflect(v, &mut c[j..]));
        } else {
            q[j..].iter_mut().for_each(|c| reflect(v, &mut c[j..]));
        }
    }
    vs.iter_mut().for_each(|v| v.zeroize());

    // 3. Sign fix, and write out row-major f32.
    let mut a = Matrix::zeros(s, s);
    for (c, col) in q.iter_mut().enumerate() {
        let sign = if sign_fix { signs[c] } else { 1.0 };
        for (r, v) in col.iter().enumerate() {
            a.set(r, c, (v * sign) as f32);
        }
        col.zeroize();
    }
    a
}

/// `x ← (I − 2vvᵀ)·x` for unit `v`.
fn reflect(v: &[f64], x: &mut [f64]) {
    let dot: f64 = v.iter().zip(x.iter()).map(|(a, b)| a * b).sum();
    let f = 2.0 * dot;
    x.iter_mut().zip(v).for_each(|(xi, vi)| *xi -= f * vi);
}
