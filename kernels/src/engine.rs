//! The `Engine` contract: what the TEE may ask of the untrusted device.

use std::{fmt, sync::Arc};

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::{Masked, MaskedView};

/// Name under which a public weight is registered (e.g. `blk.3.attn_qkv`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(Arc<str>);

impl WeightId {
    pub fn new(s: impl AsRef<str>) -> Self {
        Self(Arc::from(s.as_ref()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for WeightId {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for WeightId {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl fmt::Display for WeightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WeightId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// How a weight's elements are laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightLayout {
    /// `data[i * d_out + o]`: the product is `x · W` directly.
    InOut,
    /// `data[o * d_in + i]`: PyTorch `nn.Linear` / GGUF order; the product is `x · Wᵀ`.
    OutIn,
}

/// Element type a weight is stored or computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    F32,
    F16,
    Bf16,
}

impl Precision {
    /// Unit roundoff of the format.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Precision::F32 => crate::F32_UNIT_ROUNDOFF,
            Precision::F16 => 1.0 / 2048.0,
            Precision::Bf16 => 1.0 / 256.0,
        }
    }
}

/// Weight elements, shared so the TEE and a same-host engine need not copy them.
#[derive(Clone)]
pub enum WeightData {
    F32(Arc<[f32]>),
    F16(Arc<[f16]>),
    Bf16(Arc<[bf16]>),
}

impl WeightData {
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(d) => d.len(),
            WeightData::F16(d) => d.len(),
            WeightData::Bf16(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn precision(&self) -> Precision {
        match self {
            WeightData::F32(_) => Precision::F32,
            WeightData::F16(_) => Precision::F16,
            WeightData::Bf16(_) => Precision::Bf16,
        }
    }

    /// The elements as f32 (exact for every stored format).
    pub fn to_f32(&self) -> Arc<[f32]> {
        match self {
            WeightData::F32(d) => d.clone(),
            WeightData::F16(d) => d.iter().map(|v| v.to_f32()).collect(),
            WeightData::Bf16(d) => d.iter().map(|v| v.to_f32()).collect(),
        }
    }

    /// The elements rounded to `p` and widened back to f32: what an engine that stores in
    /// `p` multiplies with.
    pub fn rounded_to(&self, p: Precision) -> Arc<[f32]> {
        let exact = self.to_f32();
        match p {
            Precision::F32 => exact,
            Precision::F16 => exact.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            Precision::Bf16 => exact.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        }
    }
}

/// A public weight `W` of shape `(d_in, d_out)`; products are `x · W`.
#[derive(Clone)]
pub struct Weight {
    pub d_in: usize,
    pub d_out: usize,
    pub layout: WeightLayout,
    pub data: WeightData,
}

impl Weight {
    pub fn f32(d_in: usize, d_out: usize, layout: WeightLayout, data: Vec<f32>) -> Self {
        Self { d_in, d_out, layout, data: WeightData::F32(data.into()) }
    }

    /// Element `(i, o)` of `W` whatever the layout.
    pub fn index(&self, i: usize, o: usize) -> usize {
        match self.layout {
            WeightLayout::InOut => i * self.d_out + o,
            WeightLayout::OutIn => o * self.d_in + i,
        }
    }

    pub fn check(&self, id: &WeightId) -> Result<(), EngineError> {
        if self.d_in == 0 || self.d_out == 0 {
            return Err(EngineError::Shape {
                op: "register",
                detail: format!("weight `{id}` has an empty shape {}x{}", self.d_in, self.d_out),
            });
        }
        if self.data.len() != self.d_in * self.d_out {
            return Err(EngineError::Shape {
                op: "register",
                detail: format!(
                    "weight `{id}` has {} elements, shape {}x{} needs {}",
                    self.data.len(),
                    self.d_in,
                    self.d_out,
                    self.d_in * self.d_out
                ),
            });
        }
        Ok(())
    }
}

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
    fn matmul(&self, x: &Masked, id: &WeightId) -> Result<Masked, EngineError> {
        let mut out = self.matmul_many(x, std::slice::from_ref(id))?;
        Ok(out.pop().expect("one id gives one product"))
    }

    /// `x · W_id` for every id, with one transfer of `x` and one synchronisation.
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Masked>, EngineError>;

    /// [`Engine::matmul_many`] with the products lent to `read` (once, all of them, in the
    /// order of `ids`) instead of returned: an engine that reads results out of mapped
    /// memory lends them from there, so the caller's own pass over them is the only one.
    /// The default lends them from the matrices [`Engine::matmul_many`] returns
    /// ([`lend_returned`]).
    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MaskedView<'_>]),
    ) -> Result<(), EngineError> {
        lend_returned(self, x, ids, read)
    }

    /// Runtime × runtime product `a · b`, or `a · bᵀ` when `transpose_b`.
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Masked, EngineError>;

    /// Several independent runtime products in one submission.
    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Masked>, EngineError> {
        pairs.iter().map(|(a, b)| self.matmul_dynamic(a, b, transpose_b)).collect()
    }

    /// Row-wise softmax of `scale · x` (every row is independent, so many score matrices
    /// can be stacked into one call).
    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Masked, EngineError>;

    /// A buffer of `len` elements for an operand the caller will fill completely (contents
    /// unspecified), from the engine's recycled buffers when it keeps any ([`crate::pool`]).
    fn buffer(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    /// Hands back the buffer of an operand or result the caller is done with, for reuse
    /// by later calls. Only masked data (what the engine saw anyway) may be recycled.
    fn recycle(&self, buf: Vec<f32>) {
        drop(buf);
    }
}

/// [`Engine::matmul_many_with`] through [`Engine::matmul_many`]: the products are copied
/// out first, lent from the copies, and the copies recycled.
pub fn lend_returned<E: Engine + ?Sized>(
    engine: &E,
    x: &Masked,
    ids: &[WeightId],
    read: &mut dyn FnMut(&[MaskedView<'_>]),
) -> Result<(), EngineError> {
    let zs = engine.matmul_many(x, ids)?;
    read(&zs.iter().map(Masked::view).collect::<Vec<_>>());
    zs.into_iter().for_each(|z| engine.recycle(z.into_matrix().into_vec()));
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
