//! Secret orthogonal masks: sampling, applying `U = A·X`, recovering `Aᵀ·Z`.
//!
//! Two families: dense Haar-uniform `A ∈ O(s)` ([`haar`]) and the structured HD₃ cascade
//! ([`hd3`]). Both act on the row (token) axis of one sequence's stacked block
//! `X = [H; S]`. [`MaskKind::Auto`] picks per shape with a cost model whose constants are
//! measured on this machine and this engine ([`CostModel`]).

pub mod haar;
pub mod hd3;
pub mod small;

use std::sync::OnceLock;
use std::time::Instant;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use tensor::{
    Matrix,
    cpu::{sgemm, sgemm_acc},
};

pub use hd3::Hd3;

/// Which mask family a pass uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskKind {
    /// Dense Haar-uniform orthogonal matrix; `s = n + k`.
    Haar,
    /// `D₃HD₂HD₁H`; `s = next_pow2(n + k)`, shield rows fill the padding.
    Hd3,
    /// HD₃ over Hadamard blocks with secret row permutations; `s = n + k` rounded up to
    /// a multiple of 8, so the engine does no padding work.
    #[serde(rename = "hd3-blocked")]
    Hd3Blocked,
    /// Whichever is cheaper for the shape, by the measured cost model.
    Auto,
}

impl std::str::FromStr for MaskKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "haar" => Ok(MaskKind::Haar),
            "hd3" => Ok(MaskKind::Hd3),
            "hd3-blocked" => Ok(MaskKind::Hd3Blocked),
            "auto" => Ok(MaskKind::Auto),
            other => Err(format!("unknown mask kind `{other}` (haar, hd3, hd3-blocked, auto)")),
        }
    }
}

/// Concrete family for one block (Auto resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Haar,
    Hd3,
    Hd3Blocked,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Haar, Family::Hd3, Family::Hd3Blocked];
}

/// Order `s` of the mask for `n` activation rows and at least `k` shield rows.
pub fn order(family: Family, n: usize, k: usize) -> usize {
    match family {
        Family::Haar => n + k,
        Family::Hd3 => (n + k).next_power_of_two(),
        Family::Hd3Blocked => (n + k).div_ceil(8) * 8,
    }
}

/// The mask material of one sequence for one forward pass.
pub enum BlockMask {
    Haar(Matrix),
    Hd3(Hd3),
}

impl BlockMask {
    pub fn sample(family: Family, s: usize, rng: &mut impl Rng) -> Self {
        match family {
            Family::Haar => BlockMask::Haar(haar::sample(s, rng)),
            Family::Hd3 => BlockMask::Hd3(Hd3::sample(s, rng)),
            Family::Hd3Blocked => BlockMask::Hd3(Hd3::sample_blocked(s, rng)),
        }
    }

    pub fn order(&self) -> usize {
        match self {
            BlockMask::Haar(a) => a.rows(),
            BlockMask::Hd3(h) => h.order(),
        }
    }

    /// `out ← A·[H; S]` for activation rows `h` (`n×d`) and shield rows `shield`
    /// (`(s−n)×d`), without building the stacked matrix.
    pub fn apply(&self, h: &[f32], shield: &[f32], d: usize, out: &mut [f32]) {
        let s = self.order();
        let n = h.len() / d.max(1);
        debug_assert_eq!(n * d + shield.len(), s * d);
        match self {
            // U = A[:, ..n]·H + A[:, n..]·S.
            BlockMask::Haar(a) => {
                sgemm(s, d, n, a.as_slice(), (s, 1), h, (d, 1), out);
                if !shield.is_empty() {
                    sgemm_acc(s, d, s - n, &a.as_slice()[n..], (s, 1), shield, (d, 1), out);
                }
            }
            BlockMask::Hd3(hd) => {
                let rows: Vec<&[f32]> = h.chunks_exact(d).chain(shield.chunks_exact(d)).collect();
                hd.apply(&rows, d, out);
            }
        }
    }

    /// `out ← A·[H; diag(f)·G]`: [`Self::apply`] with shield rows `g` still to be scaled by
    /// `factors` (one per row). A dense mask folds the factors into its shield columns, so
    /// the rows are read once, where they lie; a structured one scales a copy first.
    pub fn apply_scaled(&self, h: &[f32], g: &[f32], factors: &[f32], d: usize, out: &mut [f32]) {
        let s = self.order();
        let n = h.len() / d.max(1);
        let k = s - n;
        debug_assert_eq!((g.len(), factors.len()), (k * d, k));
        match self {
            BlockMask::Haar(a) => {
                let a = a.as_slice();
                sgemm(s, d, n, a, (s, 1), h, (d, 1), out);
                if k > 0 {
                    // (A[:, n..]·diag(f)) is s×k, row-major.
                    let mut scaled: Vec<f32> = (0..s)
                        .flat_map(|i| (0..k).map(move |j| (i, j)))
                        .map(|(i, j)| a[i * s + n + j] * factors[j])
                        .collect();
                    sgemm_acc(s, d, k, &scaled, (k, 1), g, (d, 1), out);
                    zeroize::Zeroize::zeroize(&mut scaled);
                }
            }
            BlockMask::Hd3(_) => {
                let mut rows = g.to_vec();
                for (row, &f) in rows.chunks_exact_mut(d.max(1)).zip(factors) {
                    row.iter_mut().for_each(|v| *v *= f);
                }
                self.apply(h, &rows, d, out);
                zeroize::Zeroize::zeroize(&mut rows);
            }
        }
    }

    /// First `n` rows of `Aᵀ·z` for a row-major `s×d` block `z`.
    pub fn recover(&self, z: &[f32], d: usize, n: usize, out: &mut [f32]) {
        let s = self.order();
        match self {
            // (Aᵀ)[..n, :] = (A[:, ..n])ᵀ: element (i, t) is A[t][i].
            BlockMask::Haar(a) => sgemm(n, d, s, a.as_slice(), (1, s), z, (d, 1), out),
            BlockMask::Hd3(h) => h.recover(z, d, n, out),
        }
    }

    /// The dense matrix (tests and the attack harness's ground truth only).
    pub fn dense(&self) -> Matrix {
        match self {
            BlockMask::Haar(a) => a.clone(),
            BlockMask::Hd3(h) => h.dense(),
        }
    }
}

impl BlockMask {
    /// Overwrites the secret material with zeros.
    pub fn scrub(&mut self) {
        match self {
            BlockMask::Haar(a) => a.scrub(),
            BlockMask::Hd3(h) => h.scrub(),
        }
    }
}

impl Drop for BlockMask {
    fn drop(&mut self) {
        self.scrub();
    }
}

/// Rates that decide `Auto`, measured once per process on this CPU.
#[derive(Clone, Copy, Debug)]
pub struct CostModel {
    /// TEE dense product rate (flop/s).
    pub tee_gemm: f64,
    /// Fast Walsh–Hadamard butterflies per second (element updates).
    pub fwht: f64,
    /// Haar sampling rate (flop/s of the O(s³) QR).
    pub qr: f64,
}

impl CostModel {
    /// Measured once and cached for the process.
    pub fn measured() -> CostModel {
        static MODEL: OnceLock<CostModel> = OnceLock::new();
        *MODEL.get_or_init(Self::measure)
    }

    fn measure() -> CostModel {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let (s, d) = (256usize, 512usize);
        let a = Matrix::from_fn(s, s, |_, _| rng.random::<f32>());
        let x: Vec<f32> = (0..s * d).map(|_| rng.random::<f32>()).collect();
        let mut out = vec![0.0f32; s * d];
        let best = |f: &mut dyn FnMut()| {
            f();
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
                .max(1e-9)
        };
        let t_gemm = best(&mut || sgemm(s, d, s, a.as_slice(), (s, 1), &x, (d, 1), &mut out));
        let h = Hd3::sample(s, &mut rng);
        let rows: Vec<&[f32]> = x.chunks_exact(d).collect();
        let t_fwht = best(&mut || h.apply(&rows, d, &mut out));
        let q = 96;
        let t_qr = best(&mut || {
            haar::sample(q, &mut rng);
        });
        CostModel {
            tee_gemm: (2 * s * s * d) as f64 / t_gemm,
            fwht: (3 * 8 * s * d) as f64 / t_fwht,
            qr: (8.0 / 3.0) * (q * q * q) as f64 / t_qr,
        }
    }

    /// Estimated seconds for one linear `(d_in → d_out)` of a pass with `n` rows, `k`
    /// shield rows, `linears` products per pass, on an engine doing `engine_flops` flop/s.
    pub fn cost(
        &self,
        family: Family,
        n: usize,
        k: usize,
        dims: (usize, usize),
        linears: usize,
        engine_flops: f64,
    ) -> f64 {
        let (d_in, d_out) = (dims.0 as f64, dims.1 as f64);
        let s = order(family, n, k) as f64;
        let engine = 2.0 * s * d_in * d_out / engine_flops;
        let mask = match family {
            Family::Haar => {
                let sample = (8.0 / 3.0) * s * s * s / self.qr / linears.max(1) as f64;
                (2.0 * s * s * d_in + 2.0 * n as f64 * s * d_out) / self.tee_gemm + sample
            }
            Family::Hd3 | Family::Hd3Blocked => 3.0 * s.log2().max(1.0) * s * (d_in + d_out) / self.fwht,
        };
        engine + mask
    }

    /// The cheapest family for this shape.
    pub fn choose(&self, n: usize, k: usize, dims: (usize, usize), linears: usize, engine_flops: f64) -> Family {
        Family::ALL
            .into_iter()
            .map(|f| (f, self.cost(f, n, k, dims, linears, engine_flops)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(f, _)| f)
            .expect("three families")
    }
}

use rand::SeedableRng;

#[cfg(test)]
mod tests;
