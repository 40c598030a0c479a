//! Small mask blocks (a decode step's: one row, or a batch of rows, under `k` shield rows),
//! applied through their dense columns, with the shield rows' share of `U` prepared ahead.
//!
//! `U = A·[H; S]` splits into `A[:, ..n]·H + A[:, n..]·S`. Shield row `j` is a fresh
//! Gaussian row `ĝ_j` of unit norm scaled to `t = energy ×` the mean row norm of `H`, so
//! the second term is `t·P` with `P = A[:, n..]·Ĝ`, which depends on the mask and the
//! CSPRNG but not on `H`. `P` is computed while the engine works on the previous linear
//! (the TEE's cores idle then), and the linear itself only adds `n` rank-one terms: at
//! Qwen3-1.7B decode that took the masks (40 µs a call) off the path between engine calls.
//! Every `P` serves one linear; its buffer is then stale and the next preparation for that
//! width overwrites it in place. The buffers are zeroized when the block is dropped (at the
//! end of the pass), not after each use: `zeroize`'s volatile stores go one element at a
//! time, ~10 µs a call at these widths, on the path between engine calls.

use rand::Rng;
use tensor::cpu::{sgemm, sgemm_acc};
use zeroize::Zeroize;

use super::BlockMask;
use crate::shield;

/// Largest mask order applied through dense columns (an HD₃ mask is densified once per pass,
/// `s²` values; above this the structured cascade is cheaper).
pub const MAX_ORDER: usize = 64;

/// Activation rows up to which products are a sum of rank-one updates (SIMD `axpy`)
/// rather than a GEMM call, whose fixed cost dominates at a decode step's shapes.
const AXPY_ROWS: usize = 4;

/// The activation columns `A[:, ..n]` of one small mask block (`s×n` row-major): what
/// applying the mask and recovering products need. Kept apart from the [`SmallBlock`]
/// so recovery can read them while the next linears' shield products are being drawn.
pub struct Lead {
    s: usize,
    n: usize,
    a: Vec<f32>,
}

/// The shield columns of one small mask block and its prepared shield products.
pub struct SmallBlock {
    s: usize,
    n: usize,
    /// `A[:, n..]`, `s×(s−n)` row-major.
    shield: Vec<f32>,
    /// One per input width seen: `P = A[:, n..]·Ĝ` (`s×d`) for the next linear of width `d`.
    products: Vec<Product>,
    /// Scratch for the unit Gaussian rows `Ĝ` (`k×d`), overwritten by every draw.
    gauss: Vec<f32>,
}

/// A shield product for input width `d`, `fresh` until one linear has used it.
struct Product {
    d: usize,
    p: Vec<f32>,
    fresh: bool,
}

/// The dense columns of `mask` over `n` activation rows, split into its [`Lead`] and its
/// [`SmallBlock`]; `None` when the mask is larger than [`MAX_ORDER`] or has no activation
/// rows.
pub fn split(mask: &BlockMask, n: usize) -> Option<(Lead, SmallBlock)> {
    let s = mask.order();
    if s > MAX_ORDER || n == 0 || n > s {
        return None;
    }
    let mut a = mask.dense();
    let k = s - n;
    let (mut lead, mut shield) = (Vec::with_capacity(s * n), Vec::with_capacity(s * k));
    for i in 0..s {
        let row = a.row(i);
        lead.extend_from_slice(&row[..n]);
        shield.extend_from_slice(&row[n..]);
    }
    a.scrub();
    Some((Lead { s, n, a: lead }, SmallBlock { s, n, shield, products: Vec::new(), gauss: Vec::new() }))
}

impl Lead {
    /// `out ← (Aᵀ·Z)[..n]` for the engine's `s×d` block `z`.
    pub fn recover(&self, z: &[f32], d: usize, out: &mut [f32]) {
        debug_assert_eq!((z.len(), out.len()), (self.s * d, self.n * d));
        let n = self.n;
        if n <= AXPY_ROWS {
            out.iter_mut().for_each(|v| *v = 0.0);
            for (j, row) in out.chunks_exact_mut(d.max(1)).enumerate() {
                for (i, zi) in z.chunks_exact(d.max(1)).enumerate() {
                    tensor::simd::axpy(self.a[i * n + j], zi, row);
                }
            }
        } else {
            // (Aᵀ)[..n, :]: element (j, i) is a[i·n + j].
            sgemm(n, d, self.s, &self.a, (1, n), z, (d, 1), out);
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.a.zeroize();
    }
}

impl SmallBlock {
    pub fn order(&self) -> usize {
        self.s
    }

    /// Whether a shield product for input width `d` waits to be used.
    pub fn is_ready(&self, d: usize) -> bool {
        self.products.iter().any(|q| q.d == d && q.fresh)
    }

    /// Draws fresh unit-norm shield rows for one linear of input width `d` and stores their
    /// product with the mask's shield columns, unless one is already waiting.
    pub fn prepare(&mut self, d: usize, rng: &mut impl Rng) {
        self.fresh_product(d, rng);
    }

    /// Index of a fresh product for width `d`, drawn now unless one waits.
    fn fresh_product(&mut self, d: usize, rng: &mut impl Rng) -> usize {
        let i = self.product_slot(d);
        if !self.products[i].fresh {
            self.draw_product(i, rng);
        }
        i
    }

    /// Index of width `d`'s product buffer (an empty stale one when `d` is new).
    fn product_slot(&mut self, d: usize) -> usize {
        match self.products.iter().position(|q| q.d == d) {
            Some(i) => i,
            None => {
                self.products.push(Product { d, p: Vec::new(), fresh: false });
                self.products.len() - 1
            }
        }
    }

    /// Overwrites product `i` with `A[:, n..]·Ĝ` for fresh unit Gaussian rows `Ĝ`.
    fn draw_product(&mut self, i: usize, rng: &mut impl Rng) {
        let (s, k) = (self.s, self.s - self.n);
        let Product { d, p, fresh } = &mut self.products[i];
        let d = *d;
        p.resize(s * d, 0.0);
        *fresh = true;
        if k == 0 || d == 0 {
            p.fill(0.0);
            return;
        }
        self.gauss.resize(k * d, 0.0);
        shield::draw_gaussians(&mut self.gauss, rng);
        for row in self.gauss.chunks_exact_mut(d) {
            let f = shield::row_factor(row, 1.0);
            row.iter_mut().for_each(|v| *v *= f);
        }
        sgemm(s, d, k, &self.shield, (k, 1), &self.gauss, (d, 1), p);
    }

    /// `out ← A·[H; S]` for the `n×d` activation rows `h`, the shield rows at norm
    /// `energy ×` the mean row norm of `h` (zero rows when `energy` is 0). Uses the
    /// prepared shield product for width `d` (drawing one now if none waits); it is stale
    /// afterwards.
    pub fn apply(&mut self, lead: &Lead, h: &[f32], d: usize, energy: f32, rng: &mut impl Rng, out: &mut [f32]) {
        debug_assert_eq!((h.len(), out.len()), (self.n * d, self.s * d));
        debug_assert_eq!((lead.s, lead.n), (self.s, self.n));
        match self.take_product(h, d, energy, rng) {
            None => out.iter_mut().for_each(|v| *v = 0.0),
            Some((i, t)) => out.iter_mut().zip(&self.products[i].p).for_each(|(o, &v)| *o = t * v),
        }
        let n = self.n;
        if n <= AXPY_ROWS {
            for (i, row) in out.chunks_exact_mut(d.max(1)).enumerate() {
                for (j, hj) in h.chunks_exact(d.max(1)).enumerate() {
                    tensor::simd::axpy(lead.a[i * n + j], hj, row);
                }
            }
        } else {
            sgemm_acc(self.s, d, n, &lead.a, (n, 1), h, (d, 1), out);
        }
    }

    /// The fresh shield product for width `d` (now stale) and the shield norm `t` for `h`;
    /// `None` when `energy` is 0 (zero shield rows).
    fn take_product(&mut self, h: &[f32], d: usize, energy: f32, rng: &mut impl Rng) -> Option<(usize, f32)> {
        if energy == 0.0 {
            return None;
        }
        let i = self.fresh_product(d, rng);
        self.products[i].fresh = false;
        Some((i, shield::target_norm(h, d, energy) as f32))
    }
}

impl Drop for SmallBlock {
    fn drop(&mut self) {
        self.shield.zeroize();
        self.gauss.zeroize();
        self.products.iter_mut().for_each(|q| q.p.zeroize());
    }
}
