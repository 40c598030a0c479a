//! HD₃ masks: `A = D₃·H·D₂·H·D₁·H`, with `H` the normalized Walsh–Hadamard matrix of
//! order `s = 2^m` and `Dᵢ` secret random ±1 diagonals (the QuIP#/QuaRot family).
//!
//! `A` is never formed. It acts on the row axis of an `s×d` block with an in-place fast
//! Walsh–Hadamard transform, `O(s·log s)` per column. Columns are processed in tiles that
//! stay in cache for all three transforms, and tiles run in parallel.

use rand::{Rng, RngExt};
use rayon::prelude::*;
use zeroize::Zeroize;

/// Columns per tile: `s × TILE` floats stay in L1/L2 for the whole cascade.
const TILE: usize = 64;

/// The secret part of an HD₃ mask: three ±1 diagonals of length `s`.
pub struct Hd3 {
    s: usize,
    signs: [Vec<f32>; 3],
}

impl Hd3 {
    /// Samples fresh diagonals. `s` must be a power of two.
    pub fn sample(s: usize, rng: &mut impl Rng) -> Self {
        assert!(s.is_power_of_two(), "HD3 order must be a power of two");
        let mut draw = || (0..s).map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 }).collect();
        Hd3 { s, signs: [draw(), draw(), draw()] }
    }

    pub fn order(&self) -> usize {
        self.s
    }

    /// `x ← A·x` for a row-major `s×d` block.
    pub fn apply(&self, x: &mut [f32], d: usize) {
        self.cascade(x, d, false);
    }

    /// `x ← Aᵀ·x` for a row-major `s×d` block.
    pub fn apply_transpose(&self, x: &mut [f32], d: usize) {
        self.cascade(x, d, true);
    }

    /// Element `(r, c)` of `A`, by transforming a unit vector (tests only need this).
    pub fn dense(&self) -> kernels::Matrix {
        let mut eye = vec![0.0f32; self.s * self.s];
        for i in 0..self.s {
            eye[i * self.s + i] = 1.0;
        }
        self.apply(&mut eye, self.s);
        kernels::Matrix::from_vec(self.s, self.s, eye).expect("square")
    }

    fn cascade(&self, x: &mut [f32], d: usize, transpose: bool) {
        let s = self.s;
        assert_eq!(x.len(), s * d, "HD3 block must be s×d");
        let scale = (s as f32).powf(-1.5);
        // A = D3·H·D2·H·D1·H  → apply right to left: H, D1, H, D2, H, D3.
        // Aᵀ = H·D1·H·D2·H·D3 → apply right to left: D3, H, D2, H, D1, H.
        let order: [usize; 3] = if transpose { [2, 1, 0] } else { [0, 1, 2] };
        let tiles = d.div_ceil(TILE);
        let run_tile = |tile: &mut Vec<f32>, t: usize, x: *mut f32| {
            let c0 = t * TILE;
            let w = TILE.min(d - c0);
            // SAFETY: tiles cover disjoint column ranges of `x`, so concurrent tiles never
            // touch the same element; every index is below s·d.
            let x = unsafe { std::slice::from_raw_parts_mut(x, s * d) };
            tile.clear();
            for r in 0..s {
                tile.extend_from_slice(&x[r * d + c0..r * d + c0 + w]);
            }
            for (step, &k) in order.iter().enumerate() {
                if transpose {
                    scale_rows(tile, w, &self.signs[k], 1.0);
                    fwht(tile, s, w);
                } else {
                    fwht(tile, s, w);
                    let sc = if step == 2 { scale } else { 1.0 };
                    scale_rows(tile, w, &self.signs[k], sc);
                }
            }
            if transpose {
                tile.iter_mut().for_each(|v| *v *= scale);
            }
            for r in 0..s {
                x[r * d + c0..r * d + c0 + w].copy_from_slice(&tile[r * w..(r + 1) * w]);
            }
            tile.zeroize();
        };
        let ptr = SendPtr(x.as_mut_ptr());
        if s * d >= 1 << 14 {
            (0..tiles).into_par_iter().for_each_init(Vec::new, |tile, t| run_tile(tile, t, ptr.get()));
        } else {
            let mut tile = Vec::new();
            (0..tiles).for_each(|t| run_tile(&mut tile, t, ptr.get()));
        }
    }
}

impl Hd3 {
    /// Overwrites the diagonals with zeros (the mask becomes the zero map).
    pub fn scrub(&mut self) {
        self.signs.iter_mut().for_each(|v| v.iter_mut().for_each(|x| x.zeroize()));
    }
}

impl Drop for Hd3 {
    fn drop(&mut self) {
        self.scrub();
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint column tiles of one buffer to rayon workers.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Row r of the `s×w` tile times `signs[r]·scale`.
fn scale_rows(tile: &mut [f32], w: usize, signs: &[f32], scale: f32) {
    for (row, &sg) in tile.chunks_exact_mut(w).zip(signs) {
        let f = sg * scale;
        row.iter_mut().for_each(|v| *v *= f);
    }
}

/// Unnormalized Walsh–Hadamard transform along the rows of an `s×w` tile.
fn fwht(tile: &mut [f32], s: usize, w: usize) {
    let mut h = 1;
    while h < s {
        for i in (0..s).step_by(2 * h) {
            for j in i..i + h {
                let (lo, hi) = tile.split_at_mut((j + h) * w);
                let a = &mut lo[j * w..(j + 1) * w];
                let b = &mut hi[..w];
                for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                    let (p, q) = (*x + *y, *x - *y);
                    *x = p;
                    *y = q;
                }
            }
        }
        h *= 2;
    }
}
