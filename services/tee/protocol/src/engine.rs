//! The `Engine` contract: what the TEE may ask of the untrusted device.
//!
//! An engine holds public weights and multiplies the [`Masked`] operands it is given; what
//! it returns is a plain [`Matrix`] (or a [`MatrixView`] of its own memory), which the
//! executors unmix. The implementations, the CPU engine and the Vulkan GPU engine, live
//! in `kernels/`, outside the TEE's code: they depend on this contract, never the reverse.

use serde::{Deserialize, Serialize};
use tensor::{Matrix, MatrixView, Precision, Weight, WeightError, WeightId, ring::RingWeight};

use crate::{Masked, RingMasked};

/// What an engine did with a registered weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// Precision the engine multiplies this weight in.
    pub storage: Precision,
}

/// Self-description of an engine, for logs and for the attested `scheme_identity`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// `cpu` or `vulkan`.
    pub kind: String,
    /// Device name as the driver reports it.
    pub device: String,
    pub driver: String,
    /// Device memory in bytes, when known.
    pub memory_bytes: Option<u64>,
    /// Precision in which operands are rounded before multiplication.
    pub operand_precision: Precision,
}

impl EngineInfo {
    /// The host CPU multiplying in f32 with the `gemm` crate: the CPU engine, and the
    /// sealed executor's products inside the TEE.
    pub fn host_cpu() -> Self {
        EngineInfo {
            kind: "cpu".into(),
            device: format!("host CPU, {} threads", rayon::current_num_threads()),
            driver: "gemm".into(),
            memory_bytes: None,
            operand_precision: Precision::F32,
        }
    }
}

/// Everything that can go wrong on the untrusted side.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("unknown weight `{0}`")]
    UnknownWeight(WeightId),
    #[error("weight `{0}` is already registered")]
    DuplicateWeight(WeightId),
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("empty operand in {0}")]
    Empty(&'static str),
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("device out of memory: {0}")]
    OutOfMemory(String),
    #[error("device lost: {0}")]
    DeviceLost(String),
    #[error("engine backend error: {0}")]
    Backend(String),
    #[error("this engine does not compute {0}")]
    Unsupported(&'static str),
}

/// The untrusted device. Implementations must be safe to call from many threads at once.
///
/// All operands are row-major `f32`. Products with a registered weight are `x · W` for
/// `x` of shape `(rows, d_in)`.
pub trait Engine: Send + Sync {
    fn info(&self) -> EngineInfo;

    /// Registers a public weight once; later products refer to it by id.
    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError>;

    /// Forgets a weight and frees its memory.
    fn unregister(&self, id: &WeightId) -> Result<(), EngineError>;

    /// `x · W_id`.
    fn matmul(&self, x: &Masked, id: &WeightId) -> Result<Matrix, EngineError> {
        let mut out = self.matmul_many(x, std::slice::from_ref(id))?;
        Ok(out.pop().expect("one id gives one product"))
    }

    /// `x · W_id` for every id, with one transfer of `x` and one synchronisation.
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError>;

    /// [`Engine::matmul_many`] with the products lent to `read` (once, all of them, in the
    /// order of `ids`) instead of returned: an engine that reads results out of mapped
    /// memory lends them from there, so the caller's own pass over them is the only one.
    /// The default lends them from the matrices [`Engine::matmul_many`] returns
    /// ([`lend_returned`]).
    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MatrixView<'_>]),
    ) -> Result<(), EngineError> {
        lend_returned(self, x, ids, read)
    }

    /// Runtime × runtime product `a · b`, or `a · bᵀ` when `transpose_b`.
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError>;

    /// Several independent runtime products in one submission.
    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Matrix>, EngineError> {
        pairs.iter().map(|(a, b)| self.matmul_dynamic(a, b, transpose_b)).collect()
    }

    /// Row-wise softmax of `scale · x` (every row is independent, so many score matrices
    /// can be stacked into one call).
    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError>;

    /// A buffer of `len` elements for an operand the caller will fill completely (contents
    /// unspecified), from the engine's recycled buffers when it keeps any.
    fn buffer(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    /// Registers an int8 weight for ring products (the `dual-lpn` protection). Engines
    /// without integer products refuse with [`EngineError::Unsupported`].
    fn register_ring(&self, id: WeightId, weight: std::sync::Arc<RingWeight>) -> Result<(), EngineError> {
        let _ = (id, weight);
        Err(EngineError::Unsupported("ring products"))
    }

    /// `x · W_q mod 2^32` for every id, row-major, one vector per id.
    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        let _ = (x, ids);
        Err(EngineError::Unsupported("ring products"))
    }

    /// Hands back the buffer of an operand or result the caller is done with, for reuse
    /// by later calls. Only masked data (what the engine saw anyway) may be recycled.
    fn recycle(&self, buf: Vec<f32>) {
        drop(buf);
    }
}

/// A shared engine is an engine (services hold theirs in an `Arc`, decorators wrap it).
impl<E: Engine + ?Sized> Engine for std::sync::Arc<E> {
    fn info(&self) -> EngineInfo {
        (**self).info()
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        (**self).register(id, weight)
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        (**self).unregister(id)
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        (**self).matmul_many(x, ids)
    }

    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MatrixView<'_>]),
    ) -> Result<(), EngineError> {
        (**self).matmul_many_with(x, ids, read)
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        (**self).matmul_dynamic(a, b, transpose_b)
    }

    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Matrix>, EngineError> {
        (**self).matmul_dynamic_batched(pairs, transpose_b)
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        (**self).softmax_rows(x, scale)
    }

    fn buffer(&self, len: usize) -> Vec<f32> {
        (**self).buffer(len)
    }

    fn register_ring(&self, id: WeightId, weight: std::sync::Arc<RingWeight>) -> Result<(), EngineError> {
        (**self).register_ring(id, weight)
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        (**self).ring_matmul_many(x, ids)
    }

    fn recycle(&self, buf: Vec<f32>) {
        (**self).recycle(buf)
    }
}

/// [`Engine::matmul_many_with`] through [`Engine::matmul_many`]: the products are copied
/// out first, lent from the copies, and the copies recycled.
pub fn lend_returned<E: Engine + ?Sized>(
    engine: &E,
    x: &Masked,
    ids: &[WeightId],
    read: &mut dyn FnMut(&[MatrixView<'_>]),
) -> Result<(), EngineError> {
    let zs = engine.matmul_many(x, ids)?;
    read(&zs.iter().map(Matrix::view).collect::<Vec<_>>());
    zs.into_iter().for_each(|z| engine.recycle(z.into_vec()));
    Ok(())
}

/// Checks shared by engines: non-empty operand with the weight's inner dimension.
pub fn check_operand(op: &'static str, x: &Masked, d_in: usize) -> Result<(), EngineError> {
    if x.rows() == 0 || x.cols() == 0 {
        return Err(EngineError::Empty(op));
    }
    if x.cols() != d_in {
        return Err(EngineError::Shape {
            op,
            detail: format!("operand has {} columns, weight expects {d_in}", x.cols()),
        });
    }
    Ok(())
}

/// Shape of `a · b` (or `a · bᵀ`), or the reason it has none.
pub fn dynamic_shape(a: &Masked, b: &Masked, transpose_b: bool) -> Result<(usize, usize, usize), EngineError> {
    if a.rows() == 0 || a.cols() == 0 || b.rows() == 0 || b.cols() == 0 {
        return Err(EngineError::Empty("matmul_dynamic"));
    }
    let (k_b, n) = if transpose_b { (b.cols(), b.rows()) } else { (b.rows(), b.cols()) };
    if a.cols() != k_b {
        return Err(EngineError::Shape {
            op: "matmul_dynamic",
            detail: format!(
                "{}x{} times {}{}x{}",
                a.rows(),
                a.cols(),
                if transpose_b { "transposed " } else { "" },
                b.rows(),
                b.cols()
            ),
        });
    }
    Ok((a.rows(), a.cols(), n))
}

impl From<WeightError> for EngineError {
    fn from(e: WeightError) -> Self {
        match e {
            WeightError::Unknown(id) => EngineError::UnknownWeight(id),
            WeightError::Duplicate(id) => EngineError::DuplicateWeight(id),
            WeightError::Shape(detail) => EngineError::Shape { op: "register", detail },
        }
    }
}
