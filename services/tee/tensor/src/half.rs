//! Weights kept as their checkpoint's 16-bit floats (f16 or bf16 safetensors) on the host
//! CPU: half the bytes of an f32 copy, widened on the fly. Few rows stream each weight row
//! once, converting eight values at a time in registers; more rows widen tiles of 64 weight
//! rows into a thread's buffer and multiply them with the f32 GEMM. The conversion is exact,
//! so products equal those of the widened weight up to the order of the f32 sums.

use std::{cell::RefCell, sync::Arc};

use half::{bf16, f16};

use crate::{Matrix, cpu, pool};

/// 16-bit weight elements.
#[derive(Clone)]
pub enum HalfData {
    F16(Arc<[f16]>),
    Bf16(Arc<[bf16]>),
}

/// A weight of `rows` outputs × `cols` inputs as 16-bit floats, one output per row (the
/// `OutIn` layout checkpoints store). Products are `x·Wᵀ`.
#[derive(Clone)]
pub struct HalfMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: HalfData,
}

/// Output rows a many-row task widens and multiplies at once (64 × 4096 f32 = 1 MB).
const TILE_ROWS: usize = 64;

impl HalfMatrix {
    /// Rows `r0..r0 + n` widened into `out`.
    fn widen_rows(&self, r0: usize, n: usize, out: &mut [f32]) {
        let span = r0 * self.cols..(r0 + n) * self.cols;
        match &self.data {
            HalfData::F16(d) => out.iter_mut().zip(&d[span]).for_each(|(o, v)| *o = v.to_f32()),
            HalfData::Bf16(d) => out.iter_mut().zip(&d[span]).for_each(|(o, v)| *o = v.to_f32()),
        }
    }

    /// `x · Wᵀ` (`x.rows() × rows`).
    pub fn product(&self, x: &Matrix) -> Matrix {
        assert_eq!(x.cols(), self.cols, "product input width");
        let m = x.rows();
        let mut out = Matrix::zeros(m, self.rows);
        if m == 0 {
            return out;
        }
        let ptr = pool::SyncPtr(out.as_mut_slice().as_mut_ptr());
        let ldo = self.rows;
        if m <= cpu::SMALL_M {
            let min_rows = (8192 / self.cols).max(1);
            pool::global().for_ranges(self.rows, min_rows, &|range| {
                for o in range {
                    for j in 0..m {
                        // SAFETY: this task owns columns `range` of `out`.
                        unsafe { *ptr.get().add(j * ldo + o) = self.dot(o, x.row(j)) };
                    }
                }
            });
            return out;
        }
        thread_local! {
            static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        }
        let tiles = self.rows.div_ceil(TILE_ROWS);
        pool::global().run(tiles, &|t| {
            let (o0, n) = (t * TILE_ROWS, TILE_ROWS.min(self.rows - t * TILE_ROWS));
            TILE.with_borrow_mut(|tile| {
                tile.resize(n * self.cols, 0.0);
                self.widen_rows(o0, n, tile);
                // SAFETY: this task owns columns `o0..o0 + n` of every row of `out`, which
                // holds `m` rows of `ldo`.
                unsafe { cpu::sgemm_into(m, n, self.cols, x.as_slice(), tile, ptr.get().add(o0), ldo) };
            });
        });
        out
    }

    /// `x · W_o` for one weight row.
    fn dot(&self, o: usize, x: &[f32]) -> f32 {
        let span = o * self.cols..(o + 1) * self.cols;
        match &self.data {
            HalfData::F16(d) => dot_f16(&d[span], x),
            HalfData::Bf16(d) => dot_bf16(&d[span], x),
        }
    }
}

/// `w · x` for f16 `w`: F16C's conversion of eight values at a time where the CPU has it.
fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() && std::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU supports AVX2, FMA and F16C.
        return unsafe { dot_f16_avx2(w, x) };
    }
    w.iter().zip(x).map(|(a, b)| a.to_f32() * b).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(w: &[f16], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY (loads): i + 16 ≤ n, resp. i + 8 ≤ n, keeps every read inside both slices.
    unsafe {
        while i + 16 <= n {
            let w0 = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i).cast()));
            let w1 = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i + 8).cast()));
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.as_ptr().add(i + 8)), a1);
            i += 16;
        }
        while i + 8 <= n {
            let w0 = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i).cast()));
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), a0);
            i += 8;
        }
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(a0, a1)) };
    lanes.iter().sum::<f32>() + w[i..n].iter().zip(&x[i..n]).map(|(a, b)| a.to_f32() * b).sum::<f32>()
}

crate::simd_dispatch! {
    fn dot_bf16(w: &[bf16], x: &[f32]) -> f32 {
        let mut acc = [0.0f32; 8];
        let (cw, cx) = (w.chunks_exact(8), x.chunks_exact(8));
        let tail: f32 = cw.remainder().iter().zip(cx.remainder()).map(|(a, b)| a.to_f32() * b).sum();
        for (a, b) in cw.zip(cx) {
            for k in 0..8 {
                acc[k] += f32::from_bits((a[k].to_bits() as u32) << 16) * b[k];
            }
        }
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Weight, WeightData, WeightLayout, WeightTable};

    #[test]
    fn products_equal_the_widened_weights_on_both_paths() {
        let (rows, cols) = (150, 200);
        let vals: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        let widened = Matrix::from_vec(rows, cols, vals.clone()).unwrap();
        for data in [
            WeightData::F16(vals.iter().map(|&v| f16::from_f32(v)).collect()),
            WeightData::Bf16(vals.iter().map(|&v| bf16::from_f32(v)).collect()),
        ] {
            let exact = Matrix::from_vec(rows, cols, data.to_f32().to_vec()).unwrap();
            let table = WeightTable::in_place();
            table.insert("w".into(), &Weight { d_in: cols, d_out: rows, layout: WeightLayout::OutIn, data }).unwrap();
            let held = table.get(&"w".into()).unwrap();
            assert!(matches!(held.data, crate::HostData::Half(_)), "kept as 16-bit values");
            for m in [1, 3, 33, 70] {
                let x = Matrix::from_fn(m, cols, |r, c| ((r * 7 + c * 3) % 13) as f32 * 0.1 - 0.6);
                let want = cpu::matmul(&x, &exact, true);
                let got = held.product(&x);
                assert!(got.rel_err(&want) < 1e-5, "m={m}: {}", got.rel_err(&want));
                assert!(cpu::matmul(&x, &widened, true).rel_err(&want) < 1e-2, "the rounding is the checkpoint's");
            }
        }
    }
}
