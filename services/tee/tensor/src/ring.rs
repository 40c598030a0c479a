//! Integer products over the ring `Z_{2^32}`: what the `dual-lpn` protection offloads.
//!
//! A weight is quantized to int8 once per output column ([`RingWeight`]) and an activation
//! row to int8 with one scale ([`quantize_rows`]). Their product `x_q·W_q` is an integer
//! below `d_in·127²` in magnitude, so it is exact as an `i32` while `d_in < 133,000`, and
//! exact modulo `2^32` for any `u32` operand: the engine multiplies a masked row
//! `x_q + r mod 2^32` by `W_q` in wrapping 32-bit arithmetic, and the TEE subtracts
//! `r·W_q`. One kernel, [`RingWeight::product`], serves both the engine's masked product
//! and the TEE's quantized plaintext reference (an int8 row sign-extended to `u32` gives
//! the same bits as the `i32` product).

use std::sync::Arc;

use crate::{Matrix, Weight, WeightError, pool};

/// Largest magnitude of a quantized element.
pub const Q_MAX: i32 = 127;

/// A public weight quantized to int8 per output column: `W[i][o] ≈ q[o][i] · scales[o]`.
#[derive(Clone, Debug)]
pub struct RingWeight {
    pub d_in: usize,
    pub d_out: usize,
    /// `q[o * d_in + i]`: each output column contiguous.
    q: Arc<[i8]>,
    scales: Arc<[f32]>,
}

impl RingWeight {
    /// Symmetric int8 per output column (the column's largest magnitude maps to 127; an
    /// all-zero column has scale 0).
    pub fn quantize(w: &Weight) -> Result<Self, WeightError> {
        if w.d_in == 0 || w.d_out == 0 || w.data.len() != w.d_in * w.d_out {
            return Err(WeightError::Shape(format!("{}x{} weight with {} elements", w.d_in, w.d_out, w.data.len())));
        }
        if w.d_in >= MAX_D_IN {
            return Err(WeightError::Shape(format!("input width {} is not exact in 32 bits", w.d_in)));
        }
        let data = w.data.to_f32();
        let (d_in, d_out) = (w.d_in, w.d_out);
        let columns = pool::global().map(d_out, &|o| {
            let col: Vec<f32> = (0..d_in).map(|i| data[w.index(i, o)]).collect();
            let amax = col.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = amax / Q_MAX as f32;
            let q: Vec<i8> = col.iter().map(|&v| quantize_one(v, scale)).collect();
            (q, scale)
        });
        let mut q = Vec::with_capacity(d_in * d_out);
        let mut scales = Vec::with_capacity(d_out);
        for (col, s) in columns {
            q.extend_from_slice(&col);
            scales.push(s);
        }
        Ok(RingWeight { d_in, d_out, q: q.into(), scales: scales.into() })
    }

    /// Builds one from its int8 columns (`q[o * d_in + i]`) and scales.
    pub fn from_parts(d_in: usize, d_out: usize, q: Vec<i8>, scales: Vec<f32>) -> Result<Self, WeightError> {
        if q.len() != d_in * d_out || scales.len() != d_out || d_in >= MAX_D_IN {
            return Err(WeightError::Shape(format!("{d_in}x{d_out} ring weight with {} elements", q.len())));
        }
        Ok(RingWeight { d_in, d_out, q: q.into(), scales: scales.into() })
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Column `o` of `W_q`.
    pub fn column(&self, o: usize) -> &[i8] {
        &self.q[o * self.d_in..(o + 1) * self.d_in]
    }

    /// `x · W_q mod 2^32` for `rows` rows of `x` (row-major, `d_in` wide), row-major out.
    pub fn product(&self, x: &[u32], rows: usize) -> Vec<u32> {
        assert_eq!(x.len(), rows * self.d_in, "ring operand shape");
        let (d, m) = (self.d_in, self.d_out);
        let mut out = vec![0u32; rows * m];
        // Tasks over blocks of output columns, every row inside: each column of W_q is
        // read once a task, the rows of x stay in cache.
        let cols_per = if pool::worth(rows * d * m) { 16 } else { m };
        let tasks = m.div_ceil(cols_per);
        let ptr = pool::SyncPtr(out.as_mut_ptr());
        pool::global().run(tasks, &|t| {
            let o0 = t * cols_per;
            let o1 = (o0 + cols_per).min(m);
            for r0 in (0..rows).step_by(ROWS) {
                let nr = ROWS.min(rows - r0);
                for o in o0..o1 {
                    let sums = dot_rows(&x[r0 * d..(r0 + nr) * d], nr, self.column(o));
                    for (k, s) in sums.iter().take(nr).enumerate() {
                        // SAFETY: (r0 + k, o) is written by the task owning column o only,
                        // inside `out`, which outlives the region.
                        unsafe { *ptr.get().add((r0 + k) * m + o) = *s };
                    }
                }
            }
        });
        out
    }

    /// `W_q · v mod 2^32` for `k` vectors `v` of `d_out` entries (`v[j * d_out + o]`):
    /// `k` vectors of `d_in` entries, the TEE's side of a Freivalds check.
    pub fn times_vectors(&self, v: &[u32], k: usize) -> Vec<u32> {
        assert_eq!(v.len(), k * self.d_out, "probe shape");
        let (d, m) = (self.d_in, self.d_out);
        let mut out = vec![0u32; k * d];
        for j in 0..k {
            let acc = &mut out[j * d..(j + 1) * d];
            for o in 0..m {
                let vo = v[j * m + o];
                for (a, &w) in acc.iter_mut().zip(self.column(o)) {
                    *a = a.wrapping_add(vo.wrapping_mul(w as i32 as u32));
                }
            }
        }
        out
    }

    /// The quantized plaintext product: `x` quantized per row, multiplied exactly, scaled
    /// back. What the `dual-lpn` protection returns, bit for bit.
    pub fn reference(&self, x: &Matrix) -> Matrix {
        let (xq, sx) = quantize_rows(x);
        let wide: Vec<u32> = xq.iter().map(|&v| v as i32 as u32).collect();
        let acc = self.product(&wide, x.rows());
        self.dequantize(&acc, &sx)
    }

    /// Exact integer products (`acc`, row-major, `d_out` wide) scaled back to f32 with the
    /// rows' scales `sx`.
    pub fn dequantize(&self, acc: &[u32], sx: &[f32]) -> Matrix {
        let m = self.d_out;
        Matrix::from_fn(sx.len(), m, |r, o| dequantize_one(acc[r * m + o], sx[r], self.scales[o]))
    }
}

/// Input widths at or above this could overflow an exact int8 product in 32 bits.
pub const MAX_D_IN: usize = (1usize << 31) / (127 * 127);

/// `x_q[r][i]` and the scale of each row: symmetric int8, the row's largest magnitude
/// mapping to 127 (a zero row has scale 0).
pub fn quantize_rows(x: &Matrix) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.rows() * x.cols());
    let mut scales = Vec::with_capacity(x.rows());
    for r in 0..x.rows() {
        let row = x.row(r);
        let scale = row.iter().fold(0.0f32, |m, v| m.max(v.abs())) / Q_MAX as f32;
        q.extend(row.iter().map(|&v| quantize_one(v, scale)));
        scales.push(scale);
    }
    (q, scales)
}

fn quantize_one(v: f32, scale: f32) -> i8 {
    if scale == 0.0 { 0 } else { (v / scale).round().clamp(-(Q_MAX as f32), Q_MAX as f32) as i8 }
}

/// One exact product, read as a signed integer, scaled back.
pub fn dequantize_one(acc: u32, sx: f32, sw: f32) -> f32 {
    acc as i32 as f32 * (sx * sw)
}

/// `acc += e · row (mod 2^32)`, elementwise: one sparse row of the dual-LPN mask
/// (`e·H`) or of its unmasking (`e·(H·W)`).
pub fn axpy(acc: &mut [u32], e: u32, row: &[u32]) {
    assert_eq!(acc.len(), row.len(), "axpy lengths");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { axpy_avx2(acc, e, row) };
    }
    axpy_portable(acc, e, row);
}

fn axpy_portable(acc: &mut [u32], e: u32, row: &[u32]) {
    for (a, &h) in acc.iter_mut().zip(row) {
        *a = a.wrapping_add(e.wrapping_mul(h));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpy_avx2(acc: &mut [u32], e: u32, row: &[u32]) {
    use std::arch::x86_64::*;
    let n = acc.len().min(row.len());
    let body = n - n % 8;
    let ev = _mm256_set1_epi32(e as i32);
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 <= body <= both lengths; loads and stores are unaligned.
        unsafe {
            let a = _mm256_loadu_si256(acc.as_ptr().add(i) as *const __m256i);
            let h = _mm256_loadu_si256(row.as_ptr().add(i) as *const __m256i);
            let sum = _mm256_add_epi32(a, _mm256_mullo_epi32(ev, h));
            _mm256_storeu_si256(acc.as_mut_ptr().add(i) as *mut __m256i, sum);
        }
    }
    axpy_portable(&mut acc[body..n], e, &row[body..n]);
}

/// Rows a column is multiplied with at once.
const ROWS: usize = 4;

/// `Σ_i x[k][i]·w[i] mod 2^32` for the `nr ≤ ROWS` rows of `x`.
fn dot_rows(x: &[u32], nr: usize, w: &[i8]) -> [u32; ROWS] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { dot_rows_avx2(x, nr, w) };
    }
    dot_rows_portable(x, nr, w)
}

/// Eight 32-bit lanes a row: `vpmovsxbd` widens eight weights once for every row,
/// `vpmulld` multiplies modulo 2^32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_rows_avx2(x: &[u32], nr: usize, w: &[i8]) -> [u32; ROWS] {
    use std::arch::x86_64::*;
    let d = w.len();
    assert!(x.len() >= nr * d && nr <= ROWS);
    let body = d - d % 8;
    let mut acc = [_mm256_setzero_si256(); ROWS];
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 <= body <= d, so the eight weights and each row's eight words
        // (k·d + i + 8 <= nr·d <= x.len()) are in bounds; loads are unaligned.
        unsafe {
            let wv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(w.as_ptr().add(i) as *const __m128i));
            for (k, a) in acc.iter_mut().enumerate().take(nr) {
                let xv = _mm256_loadu_si256(x.as_ptr().add(k * d + i) as *const __m256i);
                *a = _mm256_add_epi32(*a, _mm256_mullo_epi32(xv, wv));
            }
        }
    }
    let mut out = [0u32; ROWS];
    for (k, o) in out.iter_mut().enumerate().take(nr) {
        let mut lanes = [0u32; 8];
        // SAFETY: `lanes` holds exactly one 256-bit vector.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc[k]) };
        let mut s = lanes.iter().fold(0u32, |s, &v| s.wrapping_add(v));
        for i in body..d {
            s = s.wrapping_add(x[k * d + i].wrapping_mul(w[i] as i32 as u32));
        }
        *o = s;
    }
    out
}

/// The portable form: eight lanes per row, summed at the end.
fn dot_rows_portable(x: &[u32], nr: usize, w: &[i8]) -> [u32; ROWS] {
    const L: usize = 8;
    let d = w.len();
    let mut acc = [[0u32; L]; ROWS];
    let body = d - d % L;
    for i in (0..body).step_by(L) {
        let wv: [u32; L] = std::array::from_fn(|l| w[i + l] as i32 as u32);
        for (k, a) in acc.iter_mut().enumerate().take(nr) {
            let xr = &x[k * d + i..k * d + i + L];
            for l in 0..L {
                a[l] = a[l].wrapping_add(xr[l].wrapping_mul(wv[l]));
            }
        }
    }
    let mut out = [0u32; ROWS];
    for (k, o) in out.iter_mut().enumerate().take(nr) {
        let mut s = acc[k].iter().fold(0u32, |s, &v| s.wrapping_add(v));
        for i in body..d {
            s = s.wrapping_add(x[k * d + i].wrapping_mul(w[i] as i32 as u32));
        }
        *o = s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WeightLayout;

    fn weight(d_in: usize, d_out: usize, layout: WeightLayout) -> Weight {
        let data = (0..d_in * d_out).map(|k| ((k * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.3).collect();
        Weight::f32(d_in, d_out, layout, data)
    }

    #[test]
    fn the_ring_product_is_the_wrapping_integer_product() {
        for (d_in, d_out, rows) in [(1, 1, 1), (13, 5, 3), (64, 37, 9), (300, 70, 17)] {
            let w = RingWeight::quantize(&weight(d_in, d_out, WeightLayout::OutIn)).unwrap();
            let x: Vec<u32> = (0..rows * d_in).map(|k| (k as u32).wrapping_mul(2_654_435_761)).collect();
            let got = w.product(&x, rows);
            for r in 0..rows {
                for o in 0..d_out {
                    let want = (0..d_in)
                        .fold(0u32, |s, i| s.wrapping_add(x[r * d_in + i].wrapping_mul(w.column(o)[i] as i32 as u32)));
                    assert_eq!(got[r * d_out + o], want, "{d_in}x{d_out} row {r} col {o}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_gives_the_same_words() {
        let w: Vec<i8> = (0..203i32).map(|k| (k * 37 % 255 - 127) as i8).collect();
        let x: Vec<u32> = (0..ROWS * 203).map(|k| (k as u32).wrapping_mul(0x9E37_79B9)).collect();
        for nr in 1..=ROWS {
            let want = dot_rows_portable(&x, nr, &w);
            assert_eq!(dot_rows(&x, nr, &w)[..nr], want[..nr], "{nr} rows");
        }
    }

    #[test]
    fn axpy_is_the_wrapping_sum() {
        let row: Vec<u32> = (0..37).map(|k| (k as u32).wrapping_mul(0x85EB_CA6B)).collect();
        let mut got: Vec<u32> = (0..37).map(|k| k as u32 * 3).collect();
        let mut want = got.clone();
        axpy(&mut got, 0xDEAD_BEEF, &row);
        axpy_portable(&mut want, 0xDEAD_BEEF, &row);
        assert_eq!(got, want);
        assert_eq!(want[5], 15u32.wrapping_add(0xDEAD_BEEFu32.wrapping_mul(row[5])));
    }

    #[test]
    fn both_layouts_quantize_alike_and_within_half_a_step() {
        let io = weight(40, 24, WeightLayout::InOut);
        let a = RingWeight::quantize(&io).unwrap();
        let f = io.data.to_f32();
        let oi = Weight::f32(40, 24, WeightLayout::OutIn, (0..24 * 40).map(|k| f[(k % 40) * 24 + k / 40]).collect());
        let b = RingWeight::quantize(&oi).unwrap();
        assert_eq!(a.q, b.q);
        assert_eq!(a.scales, b.scales);
        for i in 0..40 {
            for o in 0..24 {
                let err = (a.column(o)[i] as f32 * a.scales[o] - f[i * 24 + o]).abs();
                assert!(err <= a.scales[o] * 0.5 + 1e-7, "element ({i},{o}) off by {err}");
            }
        }
    }

    #[test]
    fn the_reference_matches_f32_within_the_quantization_error() {
        let w = weight(96, 32, WeightLayout::InOut);
        let ring = RingWeight::quantize(&w).unwrap();
        let x = Matrix::from_fn(5, 96, |r, c| ((r * 96 + c) as f32 * 0.37).sin());
        let f = w.data.to_f32();
        let exact = Matrix::from_fn(5, 32, |r, o| (0..96).map(|i| x.get(r, i) * f[i * 32 + o]).sum());
        let got = ring.reference(&x);
        assert!(got.rel_err(&exact) < 0.02, "int8 reference off by {}", got.rel_err(&exact));
        assert!(got.rel_err(&exact) > 0.0, "the int8 path must round");
        // A zero row stays zero; a zero column has scale 0.
        let z = ring.reference(&Matrix::zeros(2, 96));
        assert!(z.as_slice().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn freivalds_vectors_agree_with_the_product() {
        let ring = RingWeight::quantize(&weight(50, 20, WeightLayout::OutIn)).unwrap();
        let v: Vec<u32> = (0..2 * 20).map(|k| (k as u32 + 1).wrapping_mul(0x9E37_79B9)).collect();
        let wv = ring.times_vectors(&v, 2);
        let x: Vec<u32> = (0..3 * 50).map(|k| (k as u32).wrapping_mul(0x85EB_CA6B)).collect();
        let y = ring.product(&x, 3);
        for r in 0..3 {
            for j in 0..2 {
                let lhs = (0..20).fold(0u32, |s, o| s.wrapping_add(y[r * 20 + o].wrapping_mul(v[j * 20 + o])));
                let rhs = (0..50).fold(0u32, |s, i| s.wrapping_add(x[r * 50 + i].wrapping_mul(wv[j * 50 + i])));
                assert_eq!(lhs, rhs);
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let bad = Weight {
            d_in: 4,
            d_out: 3,
            layout: WeightLayout::InOut,
            data: crate::WeightData::F32(vec![0.0; 11].into()),
        };
        assert!(RingWeight::quantize(&bad).is_err());
        assert!(RingWeight::from_parts(4, 3, vec![0; 11], vec![1.0; 3]).is_err());
        assert!(RingWeight::from_parts(MAX_D_IN, 1, vec![0; MAX_D_IN], vec![1.0]).is_err());
    }
}
