//! The untrusted side of GELO.
//!
//! An [`Engine`] is the GPU as the TEE sees it: a device that holds public weights and
//! multiplies whatever operands it is given. It only ever receives [`Masked`] operands, a
//! type that the protocol crate produces after mixing activations with a secret mask. This
//! crate knows nothing about masks, tokens or models, and depends on nothing in `services/`.

mod boundary;
pub mod capture;
pub mod cpu;
pub mod engine;
mod matrix;
pub mod pool;
pub mod simd;
pub mod timing;

pub use boundary::{Masked, MaskedView, danger};
pub use cpu::CpuEngine;
pub use engine::{Engine, EngineError, EngineInfo, Precision, Registered, Weight, WeightData, WeightId, WeightLayout};
pub use matrix::{Matrix, ShapeError};

/// Unit roundoff of IEEE-754 binary32 (2⁻²⁴).
pub const F32_UNIT_ROUNDOFF: f64 = 1.0 / 16_777_216.0;
