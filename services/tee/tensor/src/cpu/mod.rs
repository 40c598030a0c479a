//! The TEE's own CPU math: blocked GEMM (the `gemm` crate's packed SIMD kernels, split over
//! the compute [`pool`](crate::pool)),
//! the few-row product that streams a weight once, softmax, and the thresholds below which
//! forking onto rayon's pool does not pay. The protocol and the models run on these; the
//! untrusted CPU engine reuses them for its products.

pub mod panels;

use crate::{Matrix, WeightLayout, pool};

/// `x · W` for a public weight of shape `(d_in, d_out)` held as f32 in `layout`: few rows
/// stream the weight once ([`SMALL_M`]), more go through the blocked GEMM.
pub fn linear(x: &Matrix, d_in: usize, d_out: usize, layout: WeightLayout, w: &[f32]) -> Matrix {
    if x.rows() <= SMALL_M {
        let mut out = Matrix::zeros(x.rows(), d_out);
        small_m(x, d_in, d_out, layout, w, out.as_mut_slice());
        return out;
    }
    let (rs, cs) = match layout {
        WeightLayout::InOut => (d_out, 1),
        WeightLayout::OutIn => (1, d_in),
    };
    product(x.rows(), d_out, d_in, (x.as_slice(), (x.cols(), 1)), (w, (rs, cs)), true)
}

/// A new `m × n` matrix `a · b` (operands with their strides, as for [`sgemm`]). The
/// product overwrites every element, so there is no zeroing pass first: a BERT-base batch's
/// intermediate product is 100 MB, which one thread would clear before the pool starts.
fn product(
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], (usize, usize)),
    b: (&[f32], (usize, usize)),
    may_fork: bool,
) -> Matrix {
    let mut c = Vec::with_capacity(m * n);
    // SAFETY: `c` has room for the `m × n` result, which `sgemm_impl` writes in full without
    // reading it (`accumulate` false); only then is the length set.
    unsafe {
        sgemm_impl(m, n, k, a.0, a.1, b.0, b.1, (pool::SyncPtr(c.as_mut_ptr()), m * n), false, may_fork);
        c.set_len(m * n);
    }
    Matrix::from_vec(m, n, c).expect("m × n values")
}

/// Flops below which splitting TEE work over rayon's pool costs more than it saves. A fork
/// wakes sleeping workers, and on a virtual machine's vCPUs a wake-up takes tens of
/// microseconds, about what one core needs for this much arithmetic. A decode step runs
/// hundreds of operations far smaller than this (norms, residuals, one row's attention).
pub const PAR_MIN_FLOPS: usize = 1 << 20;

/// Element updates below which a parallel elementwise pass costs more than it saves (see
/// [`PAR_MIN_FLOPS`]): the least length of one parallel piece.
pub const PAR_MIN_LEN: usize = 1 << 15;

/// Whether work of `flops` is worth a rayon fork.
pub fn worth_parallel(flops: usize) -> bool {
    flops >= PAR_MIN_FLOPS && rayon::current_num_threads() > 1
}

/// Elements from which [`extend_parallel`] splits a copy over the pool (1 MiB of f32).
pub const PAR_COPY_MIN: usize = 1 << 18;

/// `dst.extend_from_slice(src)`, in pieces of 256 KiB on the compute pool when `src` is at
/// least [`PAR_COPY_MIN`] long: reading a large product out of a mapped read-back buffer
/// on one core runs at ~10 GB/s (a masked B = 8 decode step reads back 44 MB of logits).
pub fn extend_parallel(dst: &mut Vec<f32>, src: &[f32]) {
    if src.len() < PAR_COPY_MIN || pool::global().threads() < 2 {
        dst.extend_from_slice(src);
        return;
    }
    const PIECE: usize = 1 << 16;
    dst.reserve(src.len());
    let start = dst.len();
    pool::global().for_chunks_mut(&mut dst.spare_capacity_mut()[..src.len()], PIECE, 1, &|first, d| {
        d.iter_mut().zip(&src[first * PIECE..]).for_each(|(d, &v)| {
            d.write(v);
        })
    });
    // SAFETY: the loop above initialised the first `src.len()` elements of the spare
    // capacity, which `reserve` made at least that long.
    unsafe { dst.set_len(start + src.len()) };
}

/// Up to this many rows, products stream the weight once (`small_m`) instead of packing
/// it for a blocked GEMM: decode steps (one row plus shield rows) are weight-bandwidth
/// bound, and packing would read and write the whole weight again.
pub const SMALL_M: usize = 32;

/// `y = x·W` for few rows: every weight element is read once from memory and used for all
/// rows while it is in cache. Parallel over output columns.
fn small_m(x: &Matrix, d_in: usize, d_out: usize, layout: WeightLayout, w: &[f32], y: &mut [f32]) {
    let m = x.rows();
    match layout {
        // Row o of W is the weights of output o: m dot products per weight row.
        WeightLayout::OutIn => {
            const OB: usize = 32;
            let mut yt = vec![0.0f32; d_out * m];
            pool::global().for_chunks_mut(&mut yt, OB * m, 1, &|c, chunk| {
                let o0 = c * OB;
                let rows = chunk.len() / m;
                outin_chunk(x.as_slice(), m, &w[o0 * d_in..(o0 + rows) * d_in], chunk);
            });
            for o in 0..d_out {
                for j in 0..m {
                    y[j * d_out + o] = yt[o * m + j];
                }
            }
        }
        // Row i of W feeds every output: m axpys per weight row, on a column slice that
        // stays in L1.
        WeightLayout::InOut => {
            const CB: usize = 256;
            let blocks = d_out.div_ceil(CB);
            let parts = pool::global().map(blocks, &|b| {
                let (c0, c1) = (b * CB, ((b + 1) * CB).min(d_out));
                let mut acc = vec![0.0f32; m * (c1 - c0)];
                inout_block(x.as_slice(), m, d_in, w, d_out, c0, c1, &mut acc);
                acc
            });
            for (b, acc) in parts.iter().enumerate() {
                let (c0, c1) = (b * CB, ((b + 1) * CB).min(d_out));
                for j in 0..m {
                    y[j * d_out + c0..j * d_out + c1].copy_from_slice(&acc[j * (c1 - c0)..(j + 1) * (c1 - c0)]);
                }
            }
        }
    }
}

/// `out[k·m + j] = x_j · W_k` for the weight rows in `w_rows` (each `x.len()/m` long).
fn outin_chunk(x: &[f32], m: usize, w_rows: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA.
        return unsafe { outin_chunk_avx2(x, m, w_rows, out) };
    }
    let d_in = x.len() / m;
    for (k, o) in out.chunks_exact_mut(m).enumerate() {
        let wrow = &w_rows[k * d_in..(k + 1) * d_in];
        for (j, v) in o.iter_mut().enumerate() {
            *v = crate::simd::dot_portable(&x[j * d_in..(j + 1) * d_in], wrow);
        }
    }
}

/// Register-blocked version: tiles of 4 weight rows × 2 input rows, so every 8-float load
/// of a weight row feeds two FMAs and every load of an input row feeds four.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn outin_chunk_avx2(x: &[f32], m: usize, w_rows: &[f32], out: &mut [f32]) {
    let d_in = x.len() / m;
    let rows = out.len() / m;
    let mut k0 = 0;
    while k0 < rows {
        let kn = (rows - k0).min(4);
        let mut j0 = 0;
        while j0 < m {
            let jn = (m - j0).min(2);
            // SAFETY: k0 + kn ≤ rows and j0 + jn ≤ m keep the tile inside both operands.
            unsafe {
                match (kn, jn) {
                    (4, 2) => tile::<4, 2>(x, d_in, j0, w_rows, k0, m, out),
                    (4, 1) => tile::<4, 1>(x, d_in, j0, w_rows, k0, m, out),
                    (3, 2) => tile::<3, 2>(x, d_in, j0, w_rows, k0, m, out),
                    (3, 1) => tile::<3, 1>(x, d_in, j0, w_rows, k0, m, out),
                    (2, 2) => tile::<2, 2>(x, d_in, j0, w_rows, k0, m, out),
                    (2, 1) => tile::<2, 1>(x, d_in, j0, w_rows, k0, m, out),
                    (1, 2) => tile::<1, 2>(x, d_in, j0, w_rows, k0, m, out),
                    _ => tile::<1, 1>(x, d_in, j0, w_rows, k0, m, out),
                }
            }
            j0 += jn;
        }
        k0 += kn;
    }
}

/// `out[(k0+k)·m + j0+j] = x_{j0+j} · W_{k0+k}` for `k < KN`, `j < JN`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const KN: usize, const JN: usize>(
    x: &[f32],
    d_in: usize,
    j0: usize,
    w: &[f32],
    k0: usize,
    m: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); KN]; JN];
    let xp: [*const f32; JN] = std::array::from_fn(|j| x[(j0 + j) * d_in..].as_ptr());
    let wp: [*const f32; KN] = std::array::from_fn(|k| w[(k0 + k) * d_in..].as_ptr());
    let mut i = 0;
    while i + 8 <= d_in {
        // SAFETY: i + 8 ≤ d_in, and every row pointer starts a full row of d_in floats.
        unsafe {
            let wv: [__m256; KN] = std::array::from_fn(|k| _mm256_loadu_ps(wp[k].add(i)));
            for j in 0..JN {
                let xv = _mm256_loadu_ps(xp[j].add(i));
                for k in 0..KN {
                    acc[j][k] = _mm256_fmadd_ps(xv, wv[k], acc[j][k]);
                }
            }
        }
        i += 8;
    }
    for j in 0..JN {
        for k in 0..KN {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][k]) };
            let mut s: f32 = lanes.iter().sum();
            let (xr, wr) = (&x[(j0 + j) * d_in..(j0 + j + 1) * d_in], &w[(k0 + k) * d_in..(k0 + k + 1) * d_in]);
            for t in i..d_in {
                s += xr[t] * wr[t];
            }
            out[(k0 + k) * m + j0 + j] = s;
        }
    }
}

crate::simd_dispatch! {
    /// Columns `c0..c1` of `x·W` (W row-major `d_in×d_out`) into `acc` (`m×(c1−c0)`).
    #[allow(clippy::too_many_arguments)]
    fn inout_block(x: &[f32], m: usize, d_in: usize, w: &[f32], d_out: usize, c0: usize, c1: usize, acc: &mut [f32]) {
        let wb = c1 - c0;
        for i in 0..d_in {
            let wseg = &w[i * d_out + c0..i * d_out + c1];
            for j in 0..m {
                let xv = x[j * d_in + i];
                for (a, &wv) in acc[j * wb..(j + 1) * wb].iter_mut().zip(wseg) {
                    *a += xv * wv;
                }
            }
        }
    }
}

/// Numerically stable softmax of `scale · row`, in place, vectorized (the exponentials are
/// [`crate::simd::exp`]'s, within 2 ulp of libm's).
pub fn softmax_in_place(row: &mut [f32], scale: f32) {
    let max = crate::simd::max_scaled(row, scale);
    if max == f32::NEG_INFINITY {
        // Every entry masked out: define the result as uniform zero weight.
        row.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let inv = 1.0 / crate::simd::exp_shifted(row, scale, max);
    row.iter_mut().for_each(|v| *v *= inv);
}

/// `c = a · b` for row-major `a (m×k)` with strides `(row, col)` and `b (k×n)` with
/// arbitrary strides, into a contiguous row-major `c (m×n)`. Multithreaded through rayon
/// when the product is large enough to pay for it.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    c: &mut [f32],
) {
    // SAFETY: `c` is an exclusively borrowed slice of its own length.
    unsafe { sgemm_impl(m, n, k, a, a_strides, b, b_strides, (pool::SyncPtr(c.as_mut_ptr()), c.len()), false, true) };
}

/// `c += a · b`, with the shapes and strides of [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm_acc(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    c: &mut [f32],
) {
    // SAFETY: `c` is an exclusively borrowed slice of its own length.
    unsafe { sgemm_impl(m, n, k, a, a_strides, b, b_strides, (pool::SyncPtr(c.as_mut_ptr()), c.len()), true, true) };
}

/// The product into `c = (pointer, length)`.
///
/// # Safety
/// `c` is valid for writes of `length` values, which no one else reads or writes during the
/// call; they may be uninitialised where `accumulate` is false (every one of the `m × n` is
/// then written, none read).
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_impl(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
    (cp, c_len): (pool::SyncPtr<f32>, usize),
    accumulate: bool,
    may_fork: bool,
) {
    assert!(c_len >= m * n, "sgemm output too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            // SAFETY: `c` is valid for `m × n ≤ c_len` writes.
            unsafe { std::ptr::write_bytes(cp.get(), 0, m * n) };
        }
        return;
    }
    let max_a = (m - 1) * a_strides.0 + (k - 1) * a_strides.1;
    let max_b = (k - 1) * b_strides.0 + (n - 1) * b_strides.1;
    assert!(max_a < a.len() && max_b < b.len(), "sgemm operand too small for its strides");
    let flops = 2 * m * n * k;
    let threads = pool::global().threads();
    let ldc = n;
    let one = |m: usize, n: usize, a_off: usize, b_off: usize, c_off: usize| {
        // SAFETY: the asserts above keep every index inside the slices for the whole
        // product, so for any block of its rows or columns; `c` is exclusively borrowed,
        // does not alias `a` or `b`, and concurrent calls write disjoint blocks of it.
        unsafe {
            gemm_call(
                (m, n, k),
                (cp.get().add(c_off), ldc),
                accumulate,
                (a.as_ptr().add(a_off), a_strides),
                (b.as_ptr().add(b_off), b_strides),
                gemm::Parallelism::None,
            )
        }
    };
    if !(may_fork && pool::worth(flops) && flops >= PAR_MIN_FLOPS) {
        one(m, n, 0, 0, 0);
        return;
    }
    if split_in_gemm() {
        // SAFETY: as for `one`, over the whole product.
        unsafe {
            gemm_call(
                (m, n, k),
                (cp.get(), ldc),
                accumulate,
                (a.as_ptr(), a_strides),
                (b.as_ptr(), b_strides),
                gemm::Parallelism::Rayon(threads),
            )
        };
        return;
    }
    // Blocks of rows of C when there are enough (each task packs its own copy of B's
    // panels, one pass over B against its rows' product), else blocks of columns.
    if m >= threads * 16 {
        let step = m.div_ceil(threads * 2).max(16);
        pool::global().run(m.div_ceil(step), &|t| {
            let (r0, r1) = (t * step, ((t + 1) * step).min(m));
            one(r1 - r0, n, r0 * a_strides.0, 0, r0 * ldc);
        });
    } else {
        let step = n.div_ceil(threads * 2).max(64);
        pool::global().run(n.div_ceil(step), &|t| {
            let (c0, c1) = (t * step, ((t + 1) * step).min(n));
            one(m, c1 - c0, 0, c0 * b_strides.1, c0);
        });
    }
}

/// `c[i·ldc + j] = Σ_k a[i·k_len + k]·b[j·k_len + k]` (`a`: `m×k` row-major, `b`: `n×k`
/// row-major, so the product is `a·bᵀ`) into `m` rows of `n` values `ldc` apart, on the
/// calling thread: one task's tile of a larger product.
///
/// # Safety
/// `c` is valid for writes of `(m − 1)·ldc + n` values, which no one else reads or writes.
pub unsafe fn sgemm_into(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize) {
    assert!(a.len() >= m * k && b.len() >= n * k && ldc >= n, "sgemm_into operands too small");
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    // SAFETY: the assert keeps the operands' reads inside `a` and `b`; the caller vouches
    // for `c`.
    unsafe {
        gemm_call((m, n, k), (c, ldc), false, (a.as_ptr(), (k, 1)), (b.as_ptr(), (1, k)), gemm::Parallelism::None)
    }
}

/// Whether large products are split by the gemm crate's own rayon parallelism (it packs
/// each panel of B once for all threads) instead of by rows on the compute pool (each task
/// packs its own copy of B): `GELO_SGEMM=gemm`, read once. A measurement switch; the pool
/// split is the default.
fn split_in_gemm() -> bool {
    static GEMM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GEMM.get_or_init(|| std::env::var("GELO_SGEMM").is_ok_and(|v| v == "gemm"))
}

/// One `gemm` call: `c (+)= a · b` for an `m×k` by `k×n` product whose operands are read
/// at `(row stride, column stride)` and whose output rows are `ldc` apart, on the calling
/// thread (`Parallelism::None`) or the gemm crate's own threads.
///
/// # Safety
/// Every element the strides reach lies inside its allocation; `c`'s block is written by no
/// one else and aliases neither operand.
unsafe fn gemm_call(
    (m, n, k): (usize, usize, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    (a, a_strides): (*const f32, (usize, usize)),
    (b, b_strides): (*const f32, (usize, usize)),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: as promised by the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a,
            a_strides.1 as isize,
            a_strides.0 as isize,
            b,
            b_strides.1 as isize,
            b_strides.0 as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `a · b` (or `a · bᵀ`) for plain matrices: the CPU's dense product, used TEE-side too.
pub fn matmul(a: &Matrix, b: &Matrix, transpose_b: bool) -> Matrix {
    matmul_on(a, b, transpose_b, true)
}

/// [`matmul`] on the calling thread alone when `may_fork` is false: for products that
/// already run one per rayon task (an attention head each), where forking again inside
/// each would only add synchronisation.
pub fn matmul_on(a: &Matrix, b: &Matrix, transpose_b: bool, may_fork: bool) -> Matrix {
    let (k, n, bs) =
        if transpose_b { (b.cols(), b.rows(), (1, b.cols())) } else { (b.rows(), b.cols(), (b.cols(), 1)) };
    assert_eq!(a.cols(), k, "matmul inner dimensions differ");
    product(a.rows(), n, k, (a.as_slice(), (a.cols(), 1)), (b.as_slice(), bs), may_fork)
}

/// `aᵀ · b` for plain matrices.
pub fn matmul_tn(a: &Matrix, b: &Matrix) -> Matrix {
    assert_eq!(a.rows(), b.rows(), "matmul_tn inner dimensions differ");
    let (m, k, n) = (a.cols(), a.rows(), b.cols());
    let mut c = Matrix::zeros(m, n);
    sgemm(m, n, k, a.as_slice(), (1, a.cols()), b.as_slice(), (b.cols(), 1), c.as_mut_slice());
    c
}

#[cfg(test)]
mod tests;
