//! TEE-side tensor operations shared by the architectures: norms, activations, biases and
//! residuals, head blocks, pooling. Everything here runs on plaintext inside the CVM and
//! never reaches the engine. (RoPE, which only the decoders use, is in `decoder::rope`.)

use tensor::{Matrix, cpu::PAR_MIN_LEN, pool};

/// `f(first_row, rows)` over `x`'s rows in parallel pieces on the compute pool, the same
/// pool the products run on (a second pool would contend with its polling workers); a
/// decode step's few rows stay on the calling thread.
fn for_rows(x: &mut [f32], d: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    pool::global().for_chunks_mut(x, d.max(1), rows_per_piece(d), f);
}

/// `x ← LayerNorm(x)·w + b`, row by row.
pub fn layer_norm(x: &mut Matrix, w: &[f32], b: &[f32], eps: f32) {
    let d = x.cols();
    for_rows(x.as_mut_slice(), d, &|_, rows| {
        for row in rows.chunks_exact_mut(d) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for ((v, &wi), &bi) in row.iter_mut().zip(w).zip(b) {
                *v = ((*v as f64 - mean) * inv) as f32 * wi + bi;
            }
        }
    });
}

/// Rows of width `d` per parallel piece: decode's few rows stay on the calling thread.
fn rows_per_piece(d: usize) -> usize {
    PAR_MIN_LEN.div_ceil(d.max(1))
}

/// RMSNorm of one row into `out`.
pub fn rms_norm_row(row: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / row.len() as f64;
    let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
    for ((o, &v), &wi) in out.iter_mut().zip(row).zip(w) {
        *o = v * inv * wi;
    }
}

/// RMSNorm of every row.
pub fn rms_norm(x: &Matrix, w: &[f32], eps: f32) -> Matrix {
    let d = x.cols();
    let mut out = Matrix::zeros(x.rows(), d);
    for_rows(out.as_mut_slice(), d, &|first, rows| {
        for (i, o) in rows.chunks_exact_mut(d).enumerate() {
            rms_norm_row(x.row(first + i), w, eps, o);
        }
    });
    out
}

/// Adds `bias` to every row.
pub fn add_bias(x: &mut Matrix, bias: &[f32]) {
    let d = x.cols();
    for_rows(x.as_mut_slice(), d, &|_, rows| {
        rows.chunks_exact_mut(d).for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b))
    });
}

/// `x ← x + y`.
pub fn add_in_place(x: &mut Matrix, y: &Matrix) {
    pool::global().for_chunks_mut(x.as_mut_slice(), 1, PAR_MIN_LEN, &|first, xs| {
        xs.iter_mut().zip(&y.as_slice()[first..]).for_each(|(a, b)| *a += b)
    });
}

/// Exact GELU, `x·Φ(x)` (BERT's `gelu`), with the vectorized erf of [`tensor::simd::gelu`].
pub fn gelu(x: &mut Matrix) {
    pool::global().for_chunks_mut(x.as_mut_slice(), 1, PAR_MIN_LEN, &|_, xs| tensor::simd::gelu(xs));
}

/// `silu(gate) ⊙ up`, into `gate` (the vectorized exp of [`tensor::simd::silu_mul`]).
pub fn swiglu(gate: &mut Matrix, up: &Matrix) {
    pool::global().for_chunks_mut(gate.as_mut_slice(), 1, PAR_MIN_LEN, &|first, g| {
        tensor::simd::silu_mul(g, &up.as_slice()[first..])
    });
}

/// Scales `v` to unit L2 norm (zero stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let n = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
    }
}

/// Columns `start..start + width` of rows `r0..r1` as a new matrix.
/// Every value rounded to the nearest f16 (kept as f32): the precision of llama.cpp's
/// default KV cache, whose keys, values and the queries meeting them are f16.
pub fn round_to_f16(x: &mut Matrix) {
    use half::slice::HalfFloatSliceExt;
    let mut h = [half::f16::ZERO; 64];
    for c in x.as_mut_slice().chunks_mut(64) {
        let h = &mut h[..c.len()];
        h.convert_from_f32_slice(c);
        h.convert_to_f32_slice(c);
    }
}

pub fn block(x: &Matrix, r0: usize, r1: usize, start: usize, width: usize) -> Matrix {
    let mut out = Matrix::zeros(r1 - r0, width);
    for r in r0..r1 {
        out.row_mut(r - r0).copy_from_slice(&x.row(r)[start..start + width]);
    }
    out
}

/// Every sequence's heads: for sequence `s` (rows `starts[s]..starts[s] + lens[s]`) and
/// head `h`, columns `h·hd..(h + 1)·hd` of each of `mats`, in the order `s·heads + h`. The
/// copies run in parallel on the compute pool: on many cores a serial copy of a batch's
/// Q, K and V is a region of its own that the others wait for.
pub fn head_blocks<const N: usize>(
    mats: [&Matrix; N],
    starts: &[usize],
    lens: &[usize],
    heads: usize,
    hd: usize,
) -> Vec<[Matrix; N]> {
    let copy = |j: usize| {
        let (s, h) = (j / heads, j % heads);
        std::array::from_fn(|i| block(mats[i], starts[s], starts[s] + lens[s], h * hd, hd))
    };
    let n = starts.len().min(lens.len()) * heads;
    let elements: usize = lens.iter().sum::<usize>() * heads * hd * N;
    if elements < PAR_MIN_LEN { (0..n).map(copy).collect() } else { pool::global().map(n, &copy) }
}

/// The inverse of [`head_blocks`]: `outs[s·heads + h]` into columns `h·hd..` of rows
/// `starts[s]..` of `x`, the sequences in parallel on the compute pool.
///
/// # Panics
/// If a sequence's rows run into the next one's or past `x`, or its heads' outputs differ
/// in rows or do not fit `x`'s columns.
pub fn put_heads(x: &mut Matrix, starts: &[usize], heads: usize, outs: &[Matrix]) {
    let (rows, cols) = (x.rows(), x.cols());
    assert_eq!(outs.len(), starts.len() * heads, "one output per sequence and head");
    for (s, &r0) in starts.iter().enumerate() {
        let seq = &outs[s * heads..(s + 1) * heads];
        let n = seq[0].rows();
        let end = starts.get(s + 1).copied().unwrap_or(rows);
        assert!(r0 + n <= end && end <= rows, "sequence rows overlap or leave the matrix");
        assert!(seq.iter().all(|o| o.rows() == n), "a sequence's heads differ in rows");
        assert!(seq.iter().map(|o| o.cols()).sum::<usize>() <= cols, "heads wider than the matrix");
    }
    let ptr = pool::SyncPtr(x.as_mut_slice().as_mut_ptr());
    let write = |s: usize| {
        let mut c0 = 0;
        for o in &outs[s * heads..(s + 1) * heads] {
            for r in 0..o.rows() {
                // SAFETY: the asserts keep sequence `s`'s rows inside `x` and apart from every
                // other sequence's, so each task writes only its own rows; `x` is borrowed
                // exclusively for the call.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(ptr.get().add((starts[s] + r) * cols + c0), o.cols()) };
                dst.copy_from_slice(o.row(r));
            }
            c0 += o.cols();
        }
    };
    if outs.iter().map(|o| o.rows() * o.cols()).sum::<usize>() < PAR_MIN_LEN {
        (0..starts.len()).for_each(write);
    } else {
        pool::global().run(starts.len(), &write);
    }
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += x as f64 * y as f64;
        na += x as f64 * x as f64;
        nb += y as f64 * y as f64;
    }
    (dot / (na.sqrt() * nb.sqrt()).max(f64::MIN_POSITIVE)) as f32
}
