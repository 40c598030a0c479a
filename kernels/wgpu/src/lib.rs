//! The Vulkan GPU engine of GELO.
//!
//! [`WgpuEngine`] implements [`protocol::Engine`] on a Vulkan adapter through `wgpu`: public
//! weights are uploaded once and stay resident (f32, f16, or bf16 as stored), products run
//! as tiled WGSL kernels generated in [`shaders`], and each call is one upload, one
//! submission and one read-back. Like every engine it is the untrusted side: it sees masked
//! operands and public weights, nothing else.
//!
//! Engines are chosen by a spec string, the same one the services' configuration takes:
//! `cpu`, `vulkan` (the best adapter: discrete first), `vulkan:N` (the N-th adapter of
//! [`adapters`]) or `vulkan:<name>` (the first whose name contains it). See [`open_engine`].

mod device;
mod engine;
mod select;
pub mod shaders;
mod weights;

use std::sync::Arc;

pub use engine::{CallStats, DEFAULT_SPIN_WAIT, Plan, RING_KERNEL_ENV, WgpuConfig, WgpuEngine};
use kernels::CpuEngine;
use protocol::{Engine, EngineError};
pub use select::{AdapterSpec, AdapterSummary, adapters};
pub use shaders::RingKernel;
/// Adapter kinds, as [`AdapterSummary::device_type`] reports them.
pub use wgpu::DeviceType;

/// Opens the engine a spec string names: `cpu`, `vulkan`, `vulkan:N` or `vulkan:<name>`.
///
/// A Vulkan spec that matches no adapter is [`EngineError::NoAdapter`], with the list of
/// adapters present in its message.
pub fn open_engine(spec: &str) -> Result<Arc<dyn Engine>, EngineError> {
    open_engine_with(spec, WgpuConfig::default())
}

/// [`open_engine`] with Vulkan settings (ignored for `cpu`).
pub fn open_engine_with(spec: &str, cfg: WgpuConfig) -> Result<Arc<dyn Engine>, EngineError> {
    if spec.trim().eq_ignore_ascii_case("cpu") {
        return Ok(Arc::new(CpuEngine::new()));
    }
    Ok(Arc::new(WgpuEngine::open(spec, cfg)?))
}
