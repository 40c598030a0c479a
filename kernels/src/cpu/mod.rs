//! `CpuEngine`: the untrusted engine on host cores (rayon + the `gemm` crate's packed
//! SIMD kernels). It is the parity baseline for every GPU engine and the engine of CI.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use rayon::prelude::*;

use crate::{
    engine::{check_operand, dynamic_shape},
    Engine, EngineError, EngineInfo, Masked, Matrix, Precision, Registered, Weight, WeightId,
    WeightLayout,
};

struct Stored {
    d_in: usize,
    d_out: usize,
    layout: WeightLayout,
    data: Arc<[f32]>,
}

/// Untrusted engine on the host CPU.
#[derive(Default)]
pub struct CpuEngine {
    weights: RwLock<HashMap<WeightId, Arc<Stored>>>,
}

impl CpuEngine {
    pub fn new() -> Self {
        Self::default()
    }

    fn get(&self, id: &WeightId) -> Result<Arc<Stored>, EngineError> {
        self.weights
            .read()
            .expect("weight table poisoned")
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::UnknownWeight(id.clone()))
    }
}

impl Engine for CpuEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: "cpu".into(),
            device: format!("host CPU, {} threads", rayon::current_num_threads()),
            driver: "gemm".into(),
            memory_bytes: None,
            operand_precision: Precision::F32,
        }
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        weight.check(&id)?;
        let mut table = self.weights.write().expect("weight table poisoned");
        if table.contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        let stored = Stored {
            d_in: weight.d_in,
            d_out: weight.d_out,
            layout: weight.layout,
            data: weight.data.to_f32(),
        };
        table.insert(id, Arc::new(stored));
        Ok(Registered { storage: Precision::F32 })
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.weights
            .write()
            .expect("weight table poisoned")
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| EngineError::UnknownWeight(id.clone()))
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Masked>, EngineError> {
        let weights = ids.iter().map(|id| self.get(id)).collect::<Result<Vec<_>, _>>()?;
        for w in &weights {
            check_operand("matmul", x, w.d_in)?;
        }
        let x = x.matrix();
        Ok(weights
            .iter()
            .map(|w| {
                let mut out = Matrix::zeros(x.rows(), w.d_out);
                let (rs, cs) = match w.layout {
                    WeightLayout::InOut => (w.d_out, 1),
                    WeightLayout::OutIn => (1, w.d_in),
                };
                sgemm(
                    x.rows(),
                    w.d_out,
                    w.d_in,
                    x.as_slice(),
                    (x.cols(), 1),
                    &w.data,
                    (rs, cs),
                    out.as_mut_slice(),
                );
                Masked::from_mixed(out)
            })
            .collect())
    }

    fn matmul_dynamic(
        &self,
        a: &Masked,
        b: &Masked,
        transpose_b: bool,
    ) -> Result<Masked, EngineError> {
        let (m, k, n) = dynamic_shape(a, b, transpose_b)?;
        let mut out = Matrix::zeros(m, n);
        let b_strides = if transpose_b { (1, k) } else { (n, 1) };
        sgemm(m, n, k, a.matrix().as_slice(), (k, 1), b.matrix().as_slice(), b_strides, out.as_mut_slice());
        Ok(Masked::from_mixed(out))
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Masked, EngineError> {
        if x.rows() == 0 || x.cols() == 0 {
            return Err(EngineError::Empty("softmax_rows"));
        }
        let mut out = x.matrix().clone();
        let cols = out.cols();
        out.as_mut_slice().par_chunks_mut(cols).for_each(|row| softmax_in_place(row, scale));
        Ok(Masked::from_mixed(out))
    }
}

/// Numerically stable softmax of `scale · row`, in place.
pub fn softmax_in_place(row: &mut [f32], scale: f32) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
    if max == f32::NEG_INFINITY {
        // Every entry masked out: define the result as uniform zero weight.
        row.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v * scale - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
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
    assert!(c.len() >= m * n, "sgemm output too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n].iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let max_a = (m - 1) * a_strides.0 + (k - 1) * a_strides.1;
    let max_b = (k - 1) * b_strides.0 + (n - 1) * b_strides.1;
    assert!(max_a < a.len() && max_b < b.len(), "sgemm operand too small for its strides");
    let flops = 2 * m * n * k;
    let par = if flops >= 1 << 20 && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above keep every index the kernel touches inside the slices;
    // `c` is exclusively borrowed and does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_strides.1 as isize,
            a_strides.0 as isize,
            b.as_ptr(),
            b_strides.1 as isize,
            b_strides.0 as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `a · b` (or `a · bᵀ`) for plain matrices: the CPU's dense product, used TEE-side too.
pub fn matmul(a: &Matrix, b: &Matrix, transpose_b: bool) -> Matrix {
    let (k, n, bs) = if transpose_b {
        (b.cols(), b.rows(), (1, b.cols()))
    } else {
        (b.rows(), b.cols(), (b.cols(), 1))
    };
    assert_eq!(a.cols(), k, "matmul inner dimensions differ");
    let mut c = Matrix::zeros(a.rows(), n);
    sgemm(a.rows(), n, k, a.as_slice(), (a.cols(), 1), b.as_slice(), bs, c.as_mut_slice());
    c
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
