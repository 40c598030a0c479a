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

use std::ops::Range;

use half::f16;

use super::format::QK_K;
use crate::{cpu::PAR_MIN_LEN, pool};

/// The output buffers of a [`QuantRows`], shared by the tasks that fill its rows.
struct Parts {
    qs: pool::SyncPtr<i8>,
    d: pool::SyncPtr<f32>,
    sums: pool::SyncPtr<f32>,
    bsums: pool::SyncPtr<i16>,
}

/// Quantizes rows `r` of `x` (`cols` wide) into their entries of `p`.
///
/// # Safety
/// `p`'s buffers are those of a [`QuantRows`] of `kind` with at least `r.end` rows of
/// `cols` values, and no one else touches rows `r` of them during the call.
unsafe fn quantize_range(x: &[f32], cols: usize, kind: ActKind, p: &Parts, r: Range<usize>) {
    let n = r.len();
    let block = kind.block();
    let x = &x[r.start * cols..r.end * cols];
    // SAFETY: rows `r` of each buffer, entries per row as `QuantRows::new` sized them.
    let (qs, d) = unsafe {
        (
            std::slice::from_raw_parts_mut(p.qs.get().add(r.start * cols), n * cols),
            std::slice::from_raw_parts_mut(p.d.get().add(r.start * cols / block), n * cols / block),
        )
    };
    match kind {
        ActKind::Q8_0 | ActKind::Q8_1 => {
            // SAFETY: as above; `sums` has one entry per block for these kinds.
            let sums =
                unsafe { std::slice::from_raw_parts_mut(p.sums.get().add(r.start * cols / block), n * cols / block) };
            quantize_q8_0(x, qs, d, sums, kind == ActKind::Q8_1);
        }
        ActKind::Q8K => {
            // SAFETY: as above; `bsums` has one entry per 16 values for this kind.
            let bsums =
                unsafe { std::slice::from_raw_parts_mut(p.bsums.get().add(r.start * cols / 16), n * cols / 16) };
            quantize_q8_k(x, qs, d, bsums);
        }
        ActKind::Q8KGroups(g) => {
            // SAFETY: as above; `sums` has one entry per group.
            let sums = unsafe { std::slice::from_raw_parts_mut(p.sums.get().add(r.start * cols / g), n * cols / g) };
            let mut d256 = vec![0.0; n * cols / QK_K];
            let mut bsums = vec![0; n * cols / 16];
            quantize_q8_k(x, qs, &mut d256, &mut bsums);
            for (i, (d, s)) in d.iter_mut().zip(sums.iter_mut()).enumerate() {
                *d = d256[i * g / QK_K];
                let isum: i32 = bsums[i * g / 16..(i + 1) * g / 16].iter().map(|&v| v as i32).sum();
                *s = *d * isum as f32;
            }
        }
    }
}

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
        // Rows are quantized independently: a prefill's activations (512 rows of 2048 to
        // 6144 values before every product) go over the pool, where one thread would leave
        // the others waiting at every product of every layer.
        let ptrs = Parts {
            qs: pool::SyncPtr(q.qs.as_mut_ptr()),
            d: pool::SyncPtr(q.d.as_mut_ptr()),
            sums: pool::SyncPtr(q.sums.as_mut_ptr()),
            bsums: pool::SyncPtr(q.bsums.as_mut_ptr()),
        };
        let task = |r: Range<usize>| {
            // SAFETY: tasks get disjoint row ranges, and each buffer holds a whole number
            // of entries per row (checked above: `cols` is a multiple of the granule), so
            // the slices made for `r` are disjoint and inside the buffers.
            unsafe { quantize_range(x, cols, kind, &ptrs, r) }
        };
        if rows * cols >= PAR_MIN_LEN {
            pool::global().for_ranges(rows, PAR_MIN_LEN.div_ceil(cols), &task);
        } else {
            task(0..rows);
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
