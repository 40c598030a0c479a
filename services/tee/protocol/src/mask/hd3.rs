//! HD₃ masks: `A = D₃·H·D₂·H·D₁·H`, with `H` the normalized Walsh–Hadamard matrix and
//! `Dᵢ` secret random ±1 diagonals (the QuIP#/QuaRot family).
//!
//! Two shapes of `H`:
//! * classic — one Hadamard of order `s = 2^m` (shield rows pad the stack to `s`);
//! * blocked — `H = ⊕_b H_{2^{m_b}}`, Hadamard blocks following the binary expansion of
//!   any `s` (a multiple of 8), with a secret row permutation `πᵢ` after each stage:
//!   `A = D₃π₃H·D₂π₂H·D₁π₁H`. No zero-padding waste: at `n = 128` the classic form
//!   doubles the engine's rows (`s = 256`), the blocked form adds 8.
//!
//! `A` is never formed. It acts on the row axis of an `s×d` block with in-place fast
//! Walsh–Hadamard transforms, `O(s·log s)` per column, on column tiles small enough that
//! the whole cascade stays in L1/L2, tiles in parallel.

use rand::{Rng, RngExt, seq::SliceRandom};
use rayon::prelude::*;
use zeroize::Zeroize;

/// The secret part of an HD₃ mask.
pub struct Hd3 {
    s: usize,
    /// `(start, len)` of each Hadamard block; one block of the whole order when classic.
    blocks: Vec<(usize, usize)>,
    /// Per stage: the row permutation (`new[r] = old[perm[r]]`), empty when classic.
    perms: [Vec<u32>; 3],
    /// Per stage: ±1 sign of row r times the normalization `1/√len` of the block row
    /// `perm[r]` came from.
    factors: [Vec<f32>; 3],
}

impl Hd3 {
    /// Classic HD₃ of power-of-two order `s`.
    pub fn sample(s: usize, rng: &mut impl Rng) -> Self {
        assert!(s.is_power_of_two(), "classic HD3 order must be a power of two");
        Self::build(s, vec![(0, s)], false, rng)
    }

    /// Blocked HD₃ of any order `s` (blocks follow the binary expansion of `s`).
    pub fn sample_blocked(s: usize, rng: &mut impl Rng) -> Self {
        assert!(s > 0, "empty mask");
        let mut blocks = Vec::new();
        let mut start = 0;
        for bit in (0..usize::BITS).rev() {
            let len = 1usize << bit;
            if s & len != 0 {
                blocks.push((start, len));
                start += len;
            }
        }
        let permute = blocks.len() > 1;
        Self::build(s, blocks, permute, rng)
    }

    fn build(s: usize, blocks: Vec<(usize, usize)>, permute: bool, rng: &mut impl Rng) -> Self {
        let mut norm = vec![0.0f32; s];
        for &(start, len) in &blocks {
            norm[start..start + len].iter_mut().for_each(|v| *v = 1.0 / (len as f32).sqrt());
        }
        let mut perms: [Vec<u32>; 3] = Default::default();
        let mut factors: [Vec<f32>; 3] = Default::default();
        for i in 0..3 {
            if permute {
                let mut p: Vec<u32> = (0..s as u32).collect();
                p.shuffle(rng);
                perms[i] = p;
            }
            factors[i] = (0..s)
                .map(|r| {
                    let src = if permute { perms[i][r] as usize } else { r };
                    let sign = if rng.random::<bool>() { 1.0 } else { -1.0 };
                    sign * norm[src]
                })
                .collect();
        }
        Hd3 { s, blocks, perms, factors }
    }

    pub fn order(&self) -> usize {
        self.s
    }

    /// `out ← A·X`, where row `r` of `X` is `rows[r]` (each `d` long) and `out` is `s×d`.
    pub fn apply(&self, rows: &[&[f32]], d: usize, out: &mut [f32]) {
        assert_eq!(rows.len(), self.s, "HD3 input must have s rows");
        self.cascade(rows, d, out, self.s, false);
    }

    /// `out ← (Aᵀ·Z)[..n]`: the first `n` rows of `Aᵀ·Z` for a row-major `s×d` block `z`.
    pub fn recover(&self, z: &[f32], d: usize, n: usize, out: &mut [f32]) {
        assert_eq!(z.len(), self.s * d, "HD3 block must be s×d");
        let rows: Vec<&[f32]> = z.chunks_exact(d.max(1)).collect();
        self.cascade(&rows, d, out, n, true);
    }

    /// The dense matrix (tests and ground truth for the attack harness).
    pub fn dense(&self) -> tensor::Matrix {
        let eye: Vec<Vec<f32>> = (0..self.s).map(|i| (0..self.s).map(|j| f32::from(i == j)).collect()).collect();
        let rows: Vec<&[f32]> = eye.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; self.s * self.s];
        self.apply(&rows, self.s, &mut out);
        tensor::Matrix::from_vec(self.s, self.s, out).expect("square")
    }

    /// Overwrites the secret material with zeros (the mask becomes the zero map).
    pub fn scrub(&mut self) {
        for i in 0..3 {
            self.factors[i].iter_mut().for_each(|v| v.zeroize());
            self.perms[i].iter_mut().for_each(|v| v.zeroize());
        }
    }

    fn tile_width(&self) -> usize {
        // A tile (s rows × w floats) and its scatter buffer stay within ~512 KiB, so every
        // stage runs from L2, and a tile is at least 16 floats wide, so each row it loads
        // from the activations uses whole 64-byte lines (8-wide tiles read every line twice:
        // qwen3-0.6b block at n = 2048, 1.21× plain with 8-wide tiles, 1.12× with these).
        (64 * 1024 / self.s.max(1)).clamp(16, 64) / 8 * 8
    }

    /// Runs the cascade on column tiles: load a tile from `rows`, transform it in cache,
    /// store its first `keep` rows into `out` (`keep×d`). Tiles run in parallel.
    fn cascade(&self, rows: &[&[f32]], d: usize, out: &mut [f32], keep: usize, transpose: bool) {
        let s = self.s;
        assert_eq!(out.len(), keep * d, "HD3 output must be keep×d");
        let tw = self.tile_width();
        let tiles = d.div_ceil(tw);
        let ptr = SendPtr(out.as_mut_ptr());
        let run = |bufs: &mut TileBufs, t: usize| {
            let c0 = t * tw;
            let w = tw.min(d - c0);
            bufs.tile.resize(s * w, 0.0);
            bufs.tmp.resize(s * w, 0.0);
            for (r, row) in rows.iter().enumerate() {
                bufs.tile[r * w..(r + 1) * w].copy_from_slice(&row[c0..c0 + w]);
            }
            self.transform(&mut bufs.tile, &mut bufs.tmp, w, transpose);
            // SAFETY: tiles cover disjoint column ranges of `out`, so concurrent tiles never
            // write the same element; every index is below keep·d.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr.get(), keep * d) };
            for r in 0..keep {
                out[r * d + c0..r * d + c0 + w].copy_from_slice(&bufs.tile[r * w..(r + 1) * w]);
            }
        };
        if s * d >= 1 << 15 && tiles > 1 {
            (0..tiles).into_par_iter().for_each_init(TileBufs::default, |bufs, t| run(bufs, t));
        } else {
            let mut bufs = TileBufs::default();
            (0..tiles).for_each(|t| run(&mut bufs, t));
        }
    }

    /// The three stages on one tile, compiled for AVX2 where the CPU has it.
    fn transform(&self, tile: &mut Vec<f32>, tmp: &mut Vec<f32>, w: usize, transpose: bool) {
        #[cfg(target_arch = "x86_64")]
        if tensor::simd::has_avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA.
            return unsafe { self.transform_avx2(tile, tmp, w, transpose) };
        }
        self.transform_generic(tile, tmp, w, transpose);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transform_avx2(&self, tile: &mut Vec<f32>, tmp: &mut Vec<f32>, w: usize, transpose: bool) {
        self.transform_generic(tile, tmp, w, transpose);
    }

    #[inline(always)]
    fn transform_generic(&self, tile: &mut Vec<f32>, tmp: &mut Vec<f32>, w: usize, transpose: bool) {
        if transpose {
            // Aᵀ = Hπ₁ᵀD₁·Hπ₂ᵀD₂·Hπ₃ᵀD₃: per stage (3, 2, 1) sign+scatter, then H.
            for i in (0..3).rev() {
                self.scatter(i, tile, tmp, w);
                std::mem::swap(tile, tmp);
                self.hadamard(tile, w);
            }
        } else {
            // A = D₃π₃H·D₂π₂H·D₁π₁H: per stage (1, 2, 3) H, then gather+sign.
            for i in 0..3 {
                self.hadamard(tile, w);
                self.gather(i, tile, tmp, w);
                std::mem::swap(tile, tmp);
            }
        }
    }

    /// Unnormalized Hadamard on every block of the tile (normalization lives in `factors`).
    #[inline(always)]
    fn hadamard(&self, tile: &mut [f32], w: usize) {
        for &(start, len) in &self.blocks {
            fwht(&mut tile[start * w..(start + len) * w], len, w);
        }
    }

    /// `out[r] = factor[r] · tile[perm[r]]` (forward stage).
    #[inline(always)]
    fn gather(&self, i: usize, tile: &[f32], out: &mut [f32], w: usize) {
        let f = &self.factors[i];
        for r in 0..self.s {
            let src = if self.perms[i].is_empty() { r } else { self.perms[i][r] as usize };
            let (o, x) = (&mut out[r * w..(r + 1) * w], &tile[src * w..(src + 1) * w]);
            let fr = f[r];
            o.iter_mut().zip(x).for_each(|(o, &x)| *o = fr * x);
        }
    }

    /// `out[perm[r]] = factor[r] · tile[r]` (transpose stage).
    #[inline(always)]
    fn scatter(&self, i: usize, tile: &[f32], out: &mut [f32], w: usize) {
        let f = &self.factors[i];
        for r in 0..self.s {
            let dst = if self.perms[i].is_empty() { r } else { self.perms[i][r] as usize };
            let (o, x) = (&mut out[dst * w..(dst + 1) * w], &tile[r * w..(r + 1) * w]);
            let fr = f[r];
            o.iter_mut().zip(x).for_each(|(o, &x)| *o = fr * x);
        }
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

/// Per-thread tile buffers; they hold plaintext after a recovery, so they are wiped when
/// the thread is done with them.
#[derive(Default)]
struct TileBufs {
    tile: Vec<f32>,
    tmp: Vec<f32>,
}

impl Drop for TileBufs {
    fn drop(&mut self) {
        self.tile.zeroize();
        self.tmp.zeroize();
    }
}

/// Unnormalized Walsh–Hadamard transform along the rows of a `len×w` tile: radix-4
/// levels (two butterfly levels per pass over the data), then one radix-2 level if
/// `log2(len)` is odd. (Measured: this zipped form vectorizes better than radix-8 with
/// explicit lane arrays, which was ~2× slower here.)
#[inline(always)]
fn fwht(tile: &mut [f32], len: usize, w: usize) {
    let mut h = 1;
    while 4 * h <= len {
        for base in (0..len).step_by(4 * h) {
            for j in base..base + h {
                let (r0, rest) = tile[j * w..].split_at_mut(h * w);
                let (r1, rest) = rest.split_at_mut(h * w);
                let (r2, r3) = rest.split_at_mut(h * w);
                let (a, b, c, d) = (&mut r0[..w], &mut r1[..w], &mut r2[..w], &mut r3[..w]);
                for (((a, b), c), d) in a.iter_mut().zip(b.iter_mut()).zip(c.iter_mut()).zip(d.iter_mut()) {
                    let (p, q, u, v) = (*a + *b, *a - *b, *c + *d, *c - *d);
                    *a = p + u;
                    *b = q + v;
                    *c = p - u;
                    *d = q - v;
                }
            }
        }
        h *= 4;
    }
    if 2 * h == len {
        for j in 0..h {
            let (lo, hi) = tile.split_at_mut((j + h) * w);
            let (a, b) = (&mut lo[j * w..(j + 1) * w], &mut hi[..w]);
            for (a, b) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*a + *b, *a - *b);
                *a = p;
                *b = q;
            }
        }
    }
}

#[cfg(test)]
mod fwht_tests {
    /// The unnormalized transform is Sylvester's Hadamard matrix, H[i][j] = (−1)^popcount(i & j),
    /// for every length (radix-8, radix-4 and radix-2 tails).
    #[test]
    fn fwht_is_the_sylvester_hadamard() {
        for len in [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] {
            let w = len;
            let mut t = vec![0.0f32; len * w];
            for i in 0..len {
                t[i * w + i] = 1.0;
            }
            super::fwht(&mut t, len, w);
            for i in 0..len {
                for j in 0..len {
                    let want = if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
                    assert_eq!(t[i * w + j], want, "len {len}, ({i}, {j})");
                }
            }
        }
    }
}
