//! The engine's settings ([`WgpuConfig`]) and the timings of its calls ([`CallStats`]).

use std::time::Duration;

use tensor::Precision;

use crate::shaders::RingKernel;
// Named in the docs only.
#[cfg(doc)]
use protocol::{EngineInfo, Registered};

#[cfg(doc)]
use super::WgpuEngine;

/// Settings of a [`WgpuEngine`].
#[derive(Clone, Debug)]
pub struct WgpuConfig {
    /// Element type f32 weights are stored in. `F16` halves memory and weight traffic at the
    /// cost of rounding `W` (reported per weight in [`Registered::storage`]); f16
    /// checkpoints are always stored as f16, bf16 ones as `bf16_weights_as` says.
    pub f32_weights_as: Precision,
    /// Element type bf16 checkpoints are stored in: `Bf16` (their own bits, widened exactly
    /// in the kernels) or `F16`. `None`: f16 when the engine runs products on the matrix
    /// units (see `tensor_cores`), whose kernels load f16 weights straight into matrix
    /// fragments and would otherwise round every bf16 value to f16 on each load; bf16
    /// otherwise. The conversion is exact for magnitudes from 2⁻¹⁴ up (f16 has more mantissa
    /// bits than bf16); smaller values land on f16's subnormal grid (at most 2⁻²⁵ off). A
    /// weight with a value beyond f16's range (±65504) keeps bf16 either way.
    /// `Registered::storage` reports the choice per weight, so U-Verify checks against the
    /// values the device holds.
    pub bf16_weights_as: Option<Precision>,
    /// Cap on resident weight bytes; `None` uses the device's memory.
    pub memory_budget: Option<u64>,
    /// Workgroups the device runs at once, for the tile-size model; `None` guesses from the
    /// device type.
    pub parallel_workgroups: Option<u32>,
    /// Time every candidate tile on the first product of each shape class and keep the
    /// fastest (a few milliseconds once per class). `None`: on for hardware GPUs, off for
    /// software rasterizers, where the model's choice is good enough and trials are slow.
    pub autotune: Option<bool>,
    /// Also run products on the matrix units (Vulkan cooperative matrices) where the device
    /// has them and they are faster. Both operands are then rounded to f16 (values beyond
    /// ±65504 overflow), and [`EngineInfo::operand_precision`] says `F16`, which widens
    /// U-Verify's tolerance accordingly. Experimental; off by default.
    pub tensor_cores: bool,
    /// Host memory the engine may keep in recycled operand and result buffers (masked data
    /// only, see `kernels::pool`); 0 turns recycling off. Default 1 GiB: a confidential VM's
    /// memory is scarce, so size it to the largest call's operands.
    pub recycle_bytes: usize,
    /// How long a call's thread polls the device without sleeping before it blocks on the
    /// fence. A blocking wait wakes some tens of microseconds after the GPU finishes, a real
    /// share of a decode-sized call (H200, Qwen3-1.7B decode at B = 1: +23 % tok/s plain,
    /// +26 % masked); spinning costs one core for at most this long per call. `None`:
    /// [`DEFAULT_SPIN_WAIT`] on hardware GPUs, none on software rasterizers, whose own
    /// threads need the cores.
    pub spin_wait: Option<Duration>,
    /// How ring products (`dual-lpn`) multiply: 32-bit multiply-adds of sign-extended
    /// weights, or byte planes through `dot4I8Packed` (docs/GPU.md, "Ring products").
    /// `None`: the environment variable [`RING_KERNEL_ENV`] (`u32` or `dot4`) when set,
    /// else `u32`, the faster on the devices measured.
    pub ring_kernel: Option<RingKernel>,
}

/// The environment variable that picks the ring kernel when the configuration does not.
pub const RING_KERNEL_ENV: &str = "GELO_RING_KERNEL";

impl Default for WgpuConfig {
    fn default() -> Self {
        WgpuConfig {
            f32_weights_as: Precision::F32,
            bf16_weights_as: None,
            memory_budget: None,
            parallel_workgroups: None,
            autotune: None,
            tensor_cores: false,
            recycle_bytes: kernels::pool::DEFAULT_MAX_BYTES,
            spin_wait: None,
            ring_kernel: None,
        }
    }
}

impl WgpuConfig {
    /// [`WgpuConfig::ring_kernel`], else [`RING_KERNEL_ENV`], else `u32`.
    pub(super) fn resolved_ring_kernel(&self) -> Result<RingKernel, protocol::EngineError> {
        match (self.ring_kernel, std::env::var(RING_KERNEL_ENV)) {
            (Some(k), _) => Ok(k),
            (None, Ok(v)) => v.parse().map_err(|e| protocol::EngineError::Backend(format!("{RING_KERNEL_ENV}: {e}"))),
            (None, Err(_)) => Ok(RingKernel::U32),
        }
    }
}

/// Spin before blocking on hardware GPUs (see [`WgpuConfig::spin_wait`]): longer than a
/// decode-sized call, far shorter than a prefill.
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_millis(1);

/// Where the time of the engine's calls went, summed since the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallStats {
    pub calls: u64,
    /// Host work before the submission: packing operands, encoding, submitting.
    pub host_ns: u64,
    /// Submission to results mapped: transfers, kernels and the driver's latency.
    pub wait_ns: u64,
    /// Copying results out of the mapped read-back buffer.
    pub readback_ns: u64,
    /// Kernel time measured by GPU timestamps (calls where the device supports them).
    pub gpu_ns: u64,
    pub gpu_timed_calls: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

impl CallStats {
    /// What was added between `earlier` and `self` (two readings of one engine's stats).
    pub fn since(&self, earlier: &CallStats) -> CallStats {
        CallStats {
            calls: self.calls.saturating_sub(earlier.calls),
            host_ns: self.host_ns.saturating_sub(earlier.host_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            readback_ns: self.readback_ns.saturating_sub(earlier.readback_ns),
            gpu_ns: self.gpu_ns.saturating_sub(earlier.gpu_ns),
            gpu_timed_calls: self.gpu_timed_calls.saturating_sub(earlier.gpu_timed_calls),
            bytes_up: self.bytes_up.saturating_sub(earlier.bytes_up),
            bytes_down: self.bytes_down.saturating_sub(earlier.bytes_down),
        }
    }
}
