//! Public weights: their names, layouts, element types, and the table that holds them
//! for products on the host CPU.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, RwLock},
};

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::{
    Matrix,
    cpu::panels::{self, PanelWeight},
    half::{HalfData, HalfMatrix},
    quant::QuantMatrix,
};

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
    /// A checkpoint's quantized blocks, one output per row (the `OutIn` layout only).
    Quant(QuantMatrix),
}

impl WeightData {
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(d) => d.len(),
            WeightData::F16(d) => d.len(),
            WeightData::Bf16(d) => d.len(),
            WeightData::Quant(q) => q.rows() * q.cols(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The precision an engine widening this data stores it in (quantized blocks widen to
    /// f32).
    pub fn precision(&self) -> Precision {
        match self {
            WeightData::F32(_) | WeightData::Quant(_) => Precision::F32,
            WeightData::F16(_) => Precision::F16,
            WeightData::Bf16(_) => Precision::Bf16,
        }
    }

    /// The elements as f32 (exact for every stored format; blocks are dequantized).
    pub fn to_f32(&self) -> Arc<[f32]> {
        match self {
            WeightData::F32(d) => d.clone(),
            WeightData::F16(d) => d.iter().map(|v| v.to_f32()).collect(),
            WeightData::Bf16(d) => d.iter().map(|v| v.to_f32()).collect(),
            WeightData::Quant(q) => q.dequantize().into(),
        }
    }

    /// Quantized blocks widened to f32, the other formats as they are: what an engine
    /// multiplies exactly, against which masked products are checked.
    pub fn widened(self) -> WeightData {
        match self {
            WeightData::Quant(q) => WeightData::F32(q.dequantize().into()),
            other => other,
        }
    }

    /// Row `r` of an `OutIn` weight of rows of `cols` values into `out`: an embedding lookup.
    pub fn row_into(&self, r: usize, cols: usize, out: &mut [f32]) {
        let span = r * cols..(r + 1) * cols;
        match self {
            WeightData::F32(d) => out.copy_from_slice(&d[span]),
            WeightData::F16(d) => out.iter_mut().zip(&d[span]).for_each(|(o, v)| *o = v.to_f32()),
            WeightData::Bf16(d) => out.iter_mut().zip(&d[span]).for_each(|(o, v)| *o = v.to_f32()),
            WeightData::Quant(q) => q.dequantize_row(r, out),
        }
    }

    /// The rows `picks` of an `OutIn` weight of rows of `cols` values, in that order.
    pub fn select_rows(&self, picks: &[usize], cols: usize) -> Result<WeightData, WeightError> {
        let rows = self.len() / cols.max(1);
        if let Some(&bad) = picks.iter().find(|&&r| r >= rows) {
            return Err(WeightError::Shape(format!("row {bad} of a {rows}-row weight")));
        }
        fn gather<T: Copy>(d: &[T], picks: &[usize], cols: usize) -> Arc<[T]> {
            picks.iter().flat_map(|&r| d[r * cols..(r + 1) * cols].iter().copied()).collect()
        }
        Ok(match self {
            WeightData::F32(d) => WeightData::F32(gather(d, picks, cols)),
            WeightData::F16(d) => WeightData::F16(gather(d, picks, cols)),
            WeightData::Bf16(d) => WeightData::Bf16(gather(d, picks, cols)),
            WeightData::Quant(q) => WeightData::Quant(q.select_rows(picks)?),
        })
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

    /// Whether the shape is non-empty and the data has `d_in × d_out` elements.
    pub fn check(&self, id: &WeightId) -> Result<(), WeightError> {
        if self.d_in == 0 || self.d_out == 0 {
            return Err(WeightError::Shape(format!("weight `{id}` has an empty shape {}x{}", self.d_in, self.d_out)));
        }
        if let WeightData::Quant(q) = &self.data
            && (self.layout != WeightLayout::OutIn || q.rows() != self.d_out || q.cols() != self.d_in)
        {
            return Err(WeightError::Shape(format!(
                "weight `{id}`: {q:?} does not hold {}x{} in the out-in layout",
                self.d_in, self.d_out
            )));
        }
        if self.data.len() != self.d_in * self.d_out {
            return Err(WeightError::Shape(format!(
                "weight `{id}` has {} elements, shape {}x{} needs {}",
                self.data.len(),
                self.d_in,
                self.d_out,
                self.d_in * self.d_out
            )));
        }
        Ok(())
    }
}

/// What can be wrong with a weight or its name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    #[error("unknown weight `{0}`")]
    Unknown(WeightId),
    #[error("weight `{0}` is already registered")]
    Duplicate(WeightId),
    #[error("{0}")]
    Shape(String),
}

/// A weight as the host CPU multiplies it: f32, or quantized blocks.
pub struct HostWeight {
    pub d_in: usize,
    pub d_out: usize,
    pub layout: WeightLayout,
    pub data: HostData,
}

/// The elements of a [`HostWeight`].
pub enum HostData {
    F32(Arc<[f32]>),
    /// Multiplied in int8 against activations quantized per block ([`crate::quant`]).
    Quant(QuantMatrix),
    /// f16 or bf16, widened on the fly ([`crate::half`]).
    Half(HalfMatrix),
    /// f32 packed for the AVX-512 kernels ([`crate::cpu::panels`]).
    Panels(PanelWeight),
}

impl HostWeight {
    /// `x · W` (few rows stream the weight once, more go through a blocked GEMM).
    pub fn product(&self, x: &Matrix) -> Matrix {
        match &self.data {
            HostData::F32(w) => crate::cpu::linear(x, self.d_in, self.d_out, self.layout, w),
            HostData::Quant(q) => q.product(x),
            HostData::Half(h) => h.product(x),
            HostData::Panels(p) => p.product(x),
        }
    }
}

/// Public weights by name, held for products on the host CPU: the CPU engine's store and
/// the sealed executor's.
///
/// A table made by [`WeightTable::default`] widens every weight to f32, so that its
/// products are the exact reference a masked product is checked against (the CPU engine).
/// [`WeightTable::in_place`] keeps quantized weights as their blocks and multiplies them
/// in int8 (the sealed executor): a quarter or less of the memory and of the bytes a decode
/// step reads, at the rounding of int8 activations; and f16/bf16 weights as 16-bit values,
/// widened exactly on the fly.
#[derive(Default)]
pub struct WeightTable {
    weights: RwLock<HashMap<WeightId, Arc<HostWeight>>>,
    in_place: bool,
}

impl WeightTable {
    /// A table that keeps quantized weights in their blocks (see [`WeightTable`]).
    pub fn in_place() -> Self {
        WeightTable { weights: RwLock::default(), in_place: true }
    }

    /// Checks `weight` and holds it under `id`.
    pub fn insert(&self, id: WeightId, weight: &Weight) -> Result<(), WeightError> {
        weight.check(&id)?;
        let mut table = self.weights.write().expect("weight table poisoned");
        if table.contains_key(&id) {
            return Err(WeightError::Duplicate(id));
        }
        let out_in = weight.layout == WeightLayout::OutIn;
        let half = |data| HostData::Half(HalfMatrix { rows: weight.d_out, cols: weight.d_in, data });
        let data = match &weight.data {
            WeightData::Quant(q) if self.in_place => HostData::Quant(q.clone()),
            WeightData::F16(d) if self.in_place && out_in => half(HalfData::F16(d.clone())),
            WeightData::Bf16(d) if self.in_place && out_in => half(HalfData::Bf16(d.clone())),
            // f32 weights of the sealed path are packed once for the AVX-512 kernels
            // where the CPU runs them, instead of being packed by the GEMM at every call.
            other if self.in_place && panels::available() => {
                HostData::Panels(PanelWeight::pack(&other.to_f32(), weight.d_in, weight.d_out, weight.layout))
            }
            other => HostData::F32(other.to_f32()),
        };
        let held = HostWeight { d_in: weight.d_in, d_out: weight.d_out, layout: weight.layout, data };
        table.insert(id, Arc::new(held));
        Ok(())
    }

    /// `x · W` for each of `ids`: quantized weights together, in one parallel region with
    /// the activations quantized once ([`crate::quant::products`]), f32 ones one by one.
    pub fn products(&self, ids: &[WeightId], x: &Matrix) -> Result<Vec<Matrix>, WeightError> {
        let held = ids.iter().map(|id| self.get(id)).collect::<Result<Vec<_>, _>>()?;
        let quant: Vec<&QuantMatrix> = held
            .iter()
            .filter_map(|w| match &w.data {
                HostData::Quant(q) => Some(q),
                HostData::F32(_) | HostData::Half(_) | HostData::Panels(_) => None,
            })
            .collect();
        let mut quant_products = crate::quant::products(&quant, x).into_iter();
        Ok(held
            .iter()
            .map(|w| match &w.data {
                HostData::Quant(_) => quant_products.next().expect("one product per quantized weight"),
                HostData::F32(_) | HostData::Half(_) | HostData::Panels(_) => w.product(x),
            })
            .collect())
    }

    pub fn get(&self, id: &WeightId) -> Result<Arc<HostWeight>, WeightError> {
        self.weights
            .read()
            .expect("weight table poisoned")
            .get(id)
            .cloned()
            .ok_or_else(|| WeightError::Unknown(id.clone()))
    }

    pub fn remove(&self, id: &WeightId) -> Result<(), WeightError> {
        self.weights
            .write()
            .expect("weight table poisoned")
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| WeightError::Unknown(id.clone()))
    }
}
