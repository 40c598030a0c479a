//! `WgpuEngine`: the untrusted engine on a Vulkan GPU.
//!
//! One call is one submission: the host packs every parameter block and operand of the call
//! into a persistently mapped upload buffer, one copy moves them to the device, every product
//! of the call runs in one compute pass, one copy brings all results back into a mapped
//! read-back buffer, and the caller waits once. The buffers of a call come from a pool of
//! slots, so steady-state calls allocate nothing on the device; several threads each hold
//! their own slot, so their uploads, kernels and read-backs overlap on the queue.
//!
//! This file holds the engine, its opening and the `protocol::Engine` interface; the rest
//! lives along the way of a call: `config` (settings and call statistics), `registry`
//! (resident weights), `plan` (tile and split choice, autotuning), `jobs` (a call's
//! dispatches and parameter blocks), `slots` (the pooled call buffers and their bind groups)
//! and `execute` (upload, submission, wait and read-back); `ring` holds the int8 weights
//! and jobs of the ring products (`dual-lpn`), which take the same way.

use std::{
    collections::HashMap,
    num::NonZeroU64,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use protocol::{Engine, EngineError, EngineInfo, Masked, Registered, RingMasked};
use tensor::{Matrix, MatrixView, Precision, Weight, WeightId, ring::RingWeight};

use crate::{
    device::Gpu,
    select::{AdapterSpec, AdapterSummary},
    shaders::{self, GemmKey, PARAMS_BYTES, RingKernel, RingKey, TILES, Tile},
    weights::GpuWeight,
};

mod config;
mod execute;
mod jobs;
mod plan;
mod registry;
mod ring;
mod slots;

pub use config::{CallStats, DEFAULT_SPIN_WAIT, RING_KERNEL_ENV, WgpuConfig};
pub use plan::Plan;
use plan::TuneKey;
use ring::GpuRing;
use slots::Slot;

/// The Vulkan engine. Cheap to share: every method takes `&self` and is safe from many
/// threads at once.
pub struct WgpuEngine {
    gpu: Gpu,
    cfg: WgpuConfig,
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    gemm: Mutex<HashMap<GemmKey, Arc<wgpu::ComputePipeline>>>,
    softmax: Arc<wgpu::ComputePipeline>,
    reduce: Arc<wgpu::ComputePipeline>,
    tiles: Vec<Tile>,
    pinned: RwLock<Option<Plan>>,
    parallel: f64,
    autotune: bool,
    tuned: RwLock<HashMap<TuneKey, Plan>>,
    weights: RwLock<HashMap<WeightId, Arc<GpuWeight>>>,
    /// int8 weights of the ring products (`dual-lpn`), a table of their own.
    rings: RwLock<HashMap<WeightId, Arc<GpuRing>>>,
    ring_pipelines: Mutex<HashMap<RingKey, Arc<wgpu::ComputePipeline>>>,
    ring_kernel: RingKernel,
    resident: AtomicU64,
    serial: AtomicU64,
    /// Bumped by `unregister`, so cached bind groups never keep a dropped weight alive.
    epoch: AtomicU64,
    slots: Mutex<Vec<Slot>>,
    timestamps: bool,
    spin_wait: Duration,
    stats: Mutex<CallStats>,
    /// Recycled host buffers for read-backs and callers' operands (`Engine::buffer`).
    buffers: kernels::pool::BufferPool,
}

impl WgpuEngine {
    /// Opens the adapter `spec` names (`vulkan`, `vulkan:N`, `vulkan:<name>`).
    pub fn open(spec: &str, cfg: WgpuConfig) -> Result<Self, EngineError> {
        Self::open_adapter(&spec.parse::<AdapterSpec>()?, cfg)
    }

    pub fn open_adapter(spec: &AdapterSpec, cfg: WgpuConfig) -> Result<Self, EngineError> {
        let gpu = Gpu::open(spec, cfg.tensor_cores)?;
        let recycle_bytes = cfg.recycle_bytes;
        let device = &gpu.device;
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gelo-call"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: NonZeroU64::new(PARAMS_BYTES),
                    },
                    count: None,
                },
                storage(1, true),
                storage(2, true),
                storage(3, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gelo-call"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let lim = &gpu.limits;
        let coop_tiles: &[Tile] = if gpu.coop { &shaders::COOP_TILES } else { &[] };
        let tiles: Vec<Tile> = TILES
            .iter()
            .chain(&shaders::SKINNY_TILES)
            .chain(coop_tiles)
            .copied()
            .filter(|t| {
                t.threads() <= lim.max_compute_invocations_per_workgroup
                    && t.bm / t.tm <= lim.max_compute_workgroup_size_y
                    && t.bn / t.tn <= lim.max_compute_workgroup_size_x
                    && t.shared_bytes() <= lim.max_compute_workgroup_storage_size
            })
            .collect();
        if tiles.is_empty() {
            return Err(EngineError::NoAdapter(format!(
                "{}: the device's compute limits fit none of the engine's tiles",
                gpu.adapter
            )));
        }
        let parallel = cfg.parallel_workgroups.map(f64::from).unwrap_or(match gpu.adapter.device_type {
            // About two resident workgroups per compute unit of a large discrete GPU.
            wgpu::DeviceType::DiscreteGpu => 256.0,
            wgpu::DeviceType::Cpu => std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(4.0),
            _ => 64.0,
        });
        let autotune = cfg.autotune.unwrap_or(gpu.adapter.device_type != wgpu::DeviceType::Cpu);
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let spin_wait = cfg.spin_wait.unwrap_or(if gpu.adapter.device_type == wgpu::DeviceType::Cpu {
            Duration::ZERO
        } else {
            DEFAULT_SPIN_WAIT
        });
        let ring_kernel = cfg.resolved_ring_kernel()?;
        let softmax =
            gpu.scoped("compile", || compile(device, &pipeline_layout, "softmax", &shaders::softmax_wgsl()))?;
        let reduce = gpu.scoped("compile", || compile(device, &pipeline_layout, "reduce", &shaders::reduce_wgsl()))?;
        Ok(WgpuEngine {
            gpu,
            cfg,
            layout,
            pipeline_layout,
            gemm: Mutex::default(),
            softmax: Arc::new(softmax),
            reduce: Arc::new(reduce),
            tiles,
            pinned: RwLock::new(None),
            parallel,
            autotune,
            tuned: RwLock::default(),
            weights: RwLock::default(),
            rings: RwLock::default(),
            ring_pipelines: Mutex::default(),
            ring_kernel,
            resident: AtomicU64::new(0),
            serial: AtomicU64::new(1),
            epoch: AtomicU64::new(0),
            slots: Mutex::default(),
            timestamps,
            spin_wait,
            stats: Mutex::default(),
            buffers: kernels::pool::BufferPool::new(recycle_bytes),
        })
    }

    /// The adapter this engine runs on.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.gpu.adapter
    }

    /// Bytes of weights resident on the device.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// The tiles this device can run, largest first.
    pub fn tiles(&self) -> &[Tile] {
        &self.tiles
    }

    /// Bytes held in recycled buffers now (at most [`WgpuConfig::recycle_bytes`]).
    pub fn recycled_bytes(&self) -> usize {
        self.buffers.held_bytes()
    }

    /// Summed call timings since the last reset.
    pub fn stats(&self) -> CallStats {
        *self.stats.lock().expect("stats poisoned")
    }

    pub fn reset_stats(&self) {
        *self.stats.lock().expect("stats poisoned") = CallStats::default();
    }

    /// Whether [`CallStats::gpu_ns`] is measured on this device.
    pub fn has_gpu_timestamps(&self) -> bool {
        self.timestamps
    }

    /// Destroys the device as a driver reset would. Every later call returns
    /// [`EngineError::DeviceLost`]: the path a service takes to report itself unhealthy.
    #[doc(hidden)]
    pub fn lose_device(&self) {
        self.gpu.destroy();
    }
}

fn compile(device: &wgpu::Device, layout: &wgpu::PipelineLayout, label: &str, src: &str) -> wgpu::ComputePipeline {
    // SAFETY: the generated kernels guard every global access against the shape in their
    // parameter block, workgroup-memory indices are in range by construction, and the host
    // sizes every buffer for the shapes it writes into that block. Without the compiler's
    // own clamps and loop counters the inner product is a few instructions shorter.
    let module = unsafe {
        device.create_shader_module_trusted(
            wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(src.into()) },
            wgpu::ShaderRuntimeChecks::unchecked(),
        )
    };
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: Some(layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

impl Engine for WgpuEngine {
    fn buffer(&self, len: usize) -> Vec<f32> {
        self.buffers.take(len)
    }

    fn recycle(&self, buf: Vec<f32>) {
        self.buffers.give(buf)
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: "vulkan".into(),
            device: self.gpu.adapter.name.clone(),
            driver: self.gpu.adapter.driver.clone(),
            memory_bytes: self.gpu.memory_bytes,
            // Operands and accumulation stay f32 in the FMA kernels (a 16-bit weight's own
            // rounding is reported per weight by `register`); the cooperative kernels round
            // both operands to f16.
            operand_precision: if self.gpu.coop { Precision::F16 } else { Precision::F32 },
        }
    }

    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.register_weight(id, weight)
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.unregister_weight(id)
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        let Some(job) = self.products_job(x, ids)? else {
            return Ok(Vec::new());
        };
        self.execute(job)
    }

    /// The products are lent straight out of the mapped read-back buffer.
    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MatrixView<'_>]),
    ) -> Result<(), EngineError> {
        match self.products_job(x, ids)? {
            Some(job) => self.execute_with(job, false, read),
            None => {
                read(&[]);
                Ok(())
            }
        }
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        let mut out = self.dynamic_call(&[(a, b)], transpose_b)?;
        Ok(out.pop().expect("one pair, one product"))
    }

    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Matrix>, EngineError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        self.dynamic_call(pairs, transpose_b)
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        let mut out = self.execute(self.softmax_job(x, scale)?)?;
        Ok(out.pop().expect("one output"))
    }

    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        self.register_ring_weight(id, &weight)
    }

    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        self.ring_products(x, ids)
    }
}
