//! Activations quantized to int8 for the products, exactly as llama.cpp's x86 code
//! quantizes them, so that the integer sums of a product equal ggml's and only the order of
//! the float accumulation differs:
//!
//! * [`ActKind::Q8_0`] (with Q4_0, Q5_0, Q8_0 weights): 32 values a block, `d = max|x|/127`
//!   stored as f16, `q = round(x·127/max|x|)` (nearest, ties to even);
//! * [`ActKind::Q8_1`] (Q4_1, Q5_1): the same, plus the block sum `s = d·Σq` stored as f16,
//!   which the weights' mins multiply;
//! * [`ActKind::Q8K`] (the K-quants, streamed): 256 values a super-block, `d = max/127` with
//!   `max` the signed value of largest magnitude (f32), and `Σq` per 16 values;
//! * [`ActKind::Q8KGroups`] (the K-quants, packed): `Q8K`'s values and scale, with the scale
//!   and `d·Σq` repeated per group of 16 or 32 values, as the packed kernels read them.
//!
//! What a format's kernels subtract for its offset or min comes from these block sums.

use half::f16;

use super::format::QK_K;

/// How a row is quantized; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ActKind {
    Q8_0,
    Q8_1,
    Q8K,
    /// Q8K, with its scale and sums per group of this many values (16 or 32).
    Q8KGroups(usize),
}

impl ActKind {
    /// Values per entry of [`QuantRows`]' `d` and `sums`.
    pub fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8K => QK_K,
            ActKind::Q8KGroups(g) => g,
        }
    }

    /// Values a row's length must be a multiple of.
    fn granule(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8K | ActKind::Q8KGroups(_) => QK_K,
        }
    }
}

/// Rows of activations quantized per block; see the module documentation.
pub struct QuantRows {
    pub(crate) kind: ActKind,
    pub(crate) block: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `rows × cols`.
    pub(crate) qs: Vec<i8>,
    /// `rows × cols/block`: each block's scale.
    pub(crate) d: Vec<f32>,
    /// `rows × cols/block`, all kinds but `Q8K`: the block's sum (see [`ActKind`]).
    pub(crate) sums: Vec<f32>,
    /// `rows × cols/16`, `Q8K` only: `Σq` of each 16 values.
    pub(crate) bsums: Vec<i16>,
}

impl QuantRows {
    /// Quantizes `rows` rows of `cols` values (`x`, row-major) as `kind` says (`cols` a
    /// multiple of 32, or of 256 for the K kinds).
    pub fn new(x: &[f32], rows: usize, cols: usize, kind: ActKind) -> Self {
        assert!(cols.is_multiple_of(kind.granule()) && x.len() == rows * cols, "activation shape for {kind:?}");
        if let ActKind::Q8KGroups(g) = kind {
            assert!(matches!(g, 16 | 32), "packed groups are 16 or 32 values");
        }
        let block = kind.block();
        let nb = rows * cols / block;
        let mut q = QuantRows {
            kind,
            block,
            rows,
            cols,
            qs: vec![0; rows * cols],
            d: vec![0.0; nb],
            sums: if kind == ActKind::Q8K { Vec::new() } else { vec![0.0; nb] },
            bsums: if kind == ActKind::Q8K { vec![0; rows * cols / 16] } else { Vec::new() },
        };
        match kind {
            ActKind::Q8_0 | ActKind::Q8_1 => {
                quantize_q8_0(x, &mut q.qs, &mut q.d, &mut q.sums, kind == ActKind::Q8_1);
            }
            ActKind::Q8K => quantize_q8_k(x, &mut q.qs, &mut q.d, &mut q.bsums),
            ActKind::Q8KGroups(g) => {
                let mut d256 = vec![0.0; rows * cols / QK_K];
                let mut bsums = vec![0; rows * cols / 16];
                quantize_q8_k(x, &mut q.qs, &mut d256, &mut bsums);
                for (i, (d, s)) in q.d.iter_mut().zip(q.sums.iter_mut()).enumerate() {
                    *d = d256[i * g / QK_K];
                    let isum: i32 = bsums[i * g / 16..(i + 1) * g / 16].iter().map(|&v| v as i32).sum();
                    *s = *d * isum as f32;
                }
            }
        }
        q
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`'s values, scales and sums.
    pub(crate) fn row(&self, r: usize) -> ActRow<'_> {
        let nb = self.cols / self.block;
        ActRow {
            qs: &self.qs[r * self.cols..(r + 1) * self.cols],
            d: &self.d[r * nb..(r + 1) * nb],
            sums: if self.sums.is_empty() { &[] } else { &self.sums[r * nb..(r + 1) * nb] },
            bsums: if self.bsums.is_empty() { &[] } else { &self.bsums[r * self.cols / 16..(r + 1) * self.cols / 16] },
        }
    }

    /// The values as the kernels see them, `d·q` (tests measure the quantization error).
    pub fn dequantize(&self) -> Vec<f32> {
        self.qs.iter().enumerate().map(|(i, &q)| self.d[i / self.block] * q as f32).collect()
    }
}

/// One quantized row.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub sums: &'a [f32],
    pub bsums: &'a [i16],
}

fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

crate::simd_dispatch! {
    /// ggml's `quantize_row_q8_0` / `quantize_row_q8_1` (x86): the sum is `d16·Σq` (exact),
    /// or with `rounded_sum` ggml's `s = f16(d·Σq)`.
    fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [f32], rounded_sum: bool) {
        for (((xb, qb), db), sb) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).zip(d.iter_mut()).zip(sums.iter_mut()) {
            let amax = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
            let dv = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut isum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                let r = (v * id).round_ties_even() as i32;
                *q = r as i8;
                isum += r;
            }
            *db = round_f16(dv);
            *sb = if rounded_sum { round_f16(dv * isum as f32) } else { *db * isum as f32 };
        }
    }
}

crate::simd_dispatch! {
    /// ggml's `quantize_row_q8_K`: the scale from the signed value of largest magnitude.
    fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
        for (((xb, qb), db), bs) in x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K)).zip(d.iter_mut()).zip(bsums.chunks_exact_mut(16)) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in xb {
                if v.abs() > amax {
                    (amax, max) = (v.abs(), v);
                }
            }
            if amax == 0.0 {
                *db = 0.0;
                qb.iter_mut().for_each(|q| *q = 0);
                bs.iter_mut().for_each(|s| *s = 0);
                continue;
            }
            let iscale = -127.0 / max;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (s, q16) in bs.iter_mut().zip(qb.chunks_exact(16)) {
                *s = q16.iter().map(|&q| q as i16).sum();
            }
            *db = 1.0 / iscale;
        }
    }
}
