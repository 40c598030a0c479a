//! Public weights: their names, layouts, element types, and the table that holds them
//! for products on the host CPU.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, RwLock},
};

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::Matrix;

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

    /// Whether the shape is non-empty and the data has `d_in × d_out` elements.
    pub fn check(&self, id: &WeightId) -> Result<(), WeightError> {
        if self.d_in == 0 || self.d_out == 0 {
            return Err(WeightError::Shape(format!("weight `{id}` has an empty shape {}x{}", self.d_in, self.d_out)));
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

/// A weight widened to f32, as the host CPU multiplies it.
pub struct HostWeight {
    pub d_in: usize,
    pub d_out: usize,
    pub layout: WeightLayout,
    pub data: Arc<[f32]>,
}

impl HostWeight {
    /// `x · W` (few rows stream the weight once, more go through the blocked GEMM).
    pub fn product(&self, x: &Matrix) -> Matrix {
        crate::cpu::linear(x, self.d_in, self.d_out, self.layout, &self.data)
    }
}

/// Public weights by name, held for products on the host CPU: the CPU engine's store and
/// the sealed executor's.
#[derive(Default)]
pub struct WeightTable {
    weights: RwLock<HashMap<WeightId, Arc<HostWeight>>>,
}

impl WeightTable {
    /// Checks `weight` and holds it as f32 under `id`.
    pub fn insert(&self, id: WeightId, weight: &Weight) -> Result<(), WeightError> {
        weight.check(&id)?;
        let mut table = self.weights.write().expect("weight table poisoned");
        if table.contains_key(&id) {
            return Err(WeightError::Duplicate(id));
        }
        let held =
            HostWeight { d_in: weight.d_in, d_out: weight.d_out, layout: weight.layout, data: weight.data.to_f32() };
        table.insert(id, Arc::new(held));
        Ok(())
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
