//! The TEE's tensor math on its own CPU.
//!
//! [`Matrix`] is the one tensor type that crosses crate seams; [`cpu`] holds the products,
//! softmax and parallel thresholds the protocol and the models compute with inside the
//! CVM; [`simd`] the vector kernels under them; [`weight`] the public weights' names,
//! layouts and element types. Nothing here knows about masks or the untrusted device: the
//! protocol crate draws that line.

pub mod cpu;
pub mod half;
mod matrix;
pub mod memory;
pub mod pool;
pub mod quant;
pub mod ring;
pub mod simd;
pub mod weight;

pub use matrix::{Matrix, MatrixView, ShapeError};
pub use weight::{
    HostData, HostWeight, Precision, Weight, WeightData, WeightError, WeightId, WeightLayout, WeightTable,
};

/// Unit roundoff of IEEE-754 binary32 (2⁻²⁴).
pub const F32_UNIT_ROUNDOFF: f64 = 1.0 / 16_777_216.0;
