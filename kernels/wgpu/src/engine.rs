//! `WgpuEngine`: the untrusted engine on a Vulkan GPU.
//!
//! One call is one submission: the host packs every parameter block and operand of the call
//! into a persistently mapped upload buffer, one copy moves them to the device, every product
//! of the call runs in one compute pass, one copy brings all results back into a mapped
//! read-back buffer, and the caller waits once. The buffers of a call come from a pool of
//! slots, so steady-state calls allocate nothing on the device; several threads each hold
//! their own slot, so their uploads, kernels and read-backs overlap on the queue.

use std::{
    collections::HashMap,
    num::NonZeroU64,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use kernels::{
    Engine, EngineError, EngineInfo, Masked, MaskedView, Matrix, Precision, Registered, Weight, WeightId, WeightLayout,
    engine::{check_operand, dynamic_shape},
};

use crate::{
    device::Gpu,
    select::{AdapterSpec, AdapterSummary},
    shaders::{
        self, GemmKey, GemmParams, PARAMS_BYTES, REDUCE_THREADS, ReduceParams, SoftmaxParams, TILES, Tile, WeightType,
    },
    weights::{self, GpuWeight},
};

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
}

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

/// How one product runs: its tile, and into how many K slices it is split (each slice a
/// workgroup layer of its own, summed by a second dispatch). Splitting gives skinny products
/// (decode, few rows) enough workgroups to keep the memory system busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub tile: Tile,
    pub splits: u32,
}

impl Plan {
    pub fn new(tile: Tile) -> Self {
        Plan { tile, splits: 1 }
    }

    pub fn name(&self) -> String {
        if self.splits > 1 { format!("{}·k/{}", self.tile.name(), self.splits) } else { self.tile.name() }
    }
}

/// Whether `k` splits into `s` slices that start on whole 16-bit words and are long enough
/// to be worth a workgroup.
fn splits_evenly(k: usize, s: u32) -> bool {
    let s = s as usize;
    s == 1 || (k.is_multiple_of(s) && (k / s).is_multiple_of(2) && k / s >= 64)
}

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

/// Idle slots kept for reuse; more concurrent callers than this allocate and free theirs.
const MAX_IDLE_SLOTS: usize = 16;
/// Bind groups a slot keeps (one per weight it has served, plus the dynamic operand).
const MAX_SLOT_GROUPS: usize = 1024;
/// Smallest slot buffer, so that small calls of different sizes share one.
const MIN_SLOT_BYTES: u64 = 1 << 16;
/// GPU time an autotuning trial aims for, repeating a fast plan's kernels to get there.
const TRIAL_NS: u64 = 1_000_000;
/// At most this many repeats per trial (the shortest kernels take a few microseconds).
const TRIAL_MAX_REPEAT: u64 = 32;
/// Timed runs of every candidate plan, interleaved (the fastest counts).
const TRIAL_ROUNDS: usize = 2;

/// The buffers of one in-flight call.
struct Slot {
    /// Host-visible, mapped for writing whenever the slot is idle.
    up: wgpu::Buffer,
    /// Device-local copy of `up`: parameter blocks (uniform) then operands (storage).
    input: wgpu::Buffer,
    in_cap: u64,
    output: wgpu::Buffer,
    /// Host-visible read-back of `output` (plus 16 bytes of timestamps).
    down: wgpu::Buffer,
    out_cap: u64,
    queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    groups: HashMap<u64, wgpu::BindGroup>,
    epoch: u64,
}

/// A class of products that share a tile choice: rows rounded up to a power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TuneKey {
    rows: usize,
    n: usize,
    k: usize,
    out_in: bool,
    wtype: WeightType,
    batch: usize,
}

/// Which buffer a GEMM reads `W` from: a resident weight, or the call's own operands.
#[derive(Clone)]
enum WSource {
    Weight(Arc<GpuWeight>),
    Input,
}

impl WSource {
    fn key(&self) -> u64 {
        match self {
            WSource::Weight(w) => w.serial,
            WSource::Input => 0,
        }
    }
}

struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    w: WSource,
    groups: (u32, u32, u32),
}

/// One call as the device sees it.
struct Job<'a> {
    op: &'static str,
    params: Vec<u8>,
    dispatches: Vec<Dispatch>,
    inputs: Vec<&'a [f32]>,
    /// `(offset, rows, cols)` of each result in the output buffer, in elements.
    outputs: Vec<(usize, usize, usize)>,
    /// Elements of results, read back.
    out_len: usize,
    /// Elements of split-K partials after the results, never read back.
    scratch_len: usize,
    /// Times the dispatches run back to back in the one pass (1 for a call; more only to
    /// time kernels on a busy device: every dispatch overwrites what it writes, so the
    /// results are those of one run).
    repeat: u32,
}

fn to_u32(op: &'static str, v: usize) -> Result<u32, EngineError> {
    u32::try_from(v).map_err(|_| EngineError::Shape {
        op,
        detail: format!("an offset of {v} elements exceeds what one call can address"),
    })
}

fn ceil_div(a: usize, b: u32) -> usize {
    a.div_ceil(b as usize)
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

    /// Forces one plan for every GEMM (benchmarks, tests), or returns to automatic choice.
    /// A split plan applies to products by registered weights; dynamic ones run unsplit.
    pub fn pin(&self, plan: Option<Plan>) -> Result<(), EngineError> {
        if let Some(p) = plan
            && (!self.tiles.contains(&p.tile) || !(1..=64).contains(&p.splits))
        {
            return Err(EngineError::Backend(format!("plan {} is not available on this device", p.name())));
        }
        *self.pinned.write().expect("plan lock poisoned") = plan;
        Ok(())
    }

    /// The tile the cost model picks for a `m×n` product (of `batch` independent ones).
    pub fn model_tile(&self, m: usize, n: usize, batch: usize) -> Tile {
        // Time ≈ waves of workgroups × work per workgroup ÷ the tile's efficiency (larger
        // tiles reuse each loaded element more often). Small products pick small tiles so
        // that enough workgroups exist to occupy the device.
        let cost = |t: &Tile| {
            let wgs = (ceil_div(m, t.bm) * ceil_div(n, t.bn) * batch) as f64;
            // Smaller workgroups fit more at once on a compute unit.
            let resident = self.parallel * 256.0 / f64::from(t.threads());
            let waves = (wgs / resident).ceil();
            let area = f64::from(t.bm * t.bn);
            let eff = (f64::from(t.tm * t.tn) / 64.0).powf(0.5) * (area / 16384.0).powf(0.15);
            waves * area / eff
        };
        // Cooperative and few-row tiles are chosen only by measurement.
        *self
            .tiles
            .iter()
            .filter(|t| !t.coop && !t.skinny)
            .min_by(|a, b| cost(a).total_cmp(&cost(b)))
            .expect("at least one FMA tile")
    }

    /// Plans chosen by autotuning so far: `(rows class, n, k, plan)`.
    pub fn tuned_plans(&self) -> Vec<(usize, usize, usize, Plan)> {
        let mut v: Vec<_> =
            self.tuned.read().expect("tune table poisoned").iter().map(|(k, t)| (k.rows, k.n, k.k, *t)).collect();
        v.sort_by_key(|e| (e.1, e.2, e.0));
        v
    }

    /// The plan autotuning chose for products of `rows` rows (any count in the same
    /// tuning class, see `row_class`) by an `(k, n)` weight in `layout` stored as `storage`.
    pub fn tuned_plan(
        &self,
        rows: usize,
        k: usize,
        n: usize,
        layout: WeightLayout,
        storage: Precision,
    ) -> Option<Plan> {
        let key = TuneKey {
            rows: row_class(rows),
            n,
            k,
            out_in: layout == WeightLayout::OutIn,
            wtype: weights::wtype(storage),
            batch: 1,
        };
        self.tuned.read().expect("tune table poisoned").get(&key).copied()
    }

    /// The plan for one product: pinned, else tuned (running the trials through `trial` on
    /// first sight of the class), else the cost model's tile unsplit. `splittable`: whether
    /// the caller can run split plans.
    fn choose_plan<'a>(
        &self,
        key: TuneKey,
        m: usize,
        splittable: bool,
        trial: impl Fn(Plan) -> Result<Job<'a>, EngineError>,
    ) -> Result<Plan, EngineError> {
        if let Some(p) = *self.pinned.read().expect("plan lock poisoned") {
            let splits = if splittable && splits_evenly(key.k, p.splits) { p.splits } else { 1 };
            return Ok(Plan { splits, ..p });
        }
        if !self.autotune {
            return Ok(Plan::new(self.model_tile(m, key.n, key.batch)));
        }
        if let Some(p) = self.tuned.read().expect("tune table poisoned").get(&key) {
            return Ok(*p);
        }
        // Tiles far taller than the product only compute padding; K splits pay only where
        // the unsplit product has too few workgroups to occupy the device.
        let mut candidates = Vec::new();
        // A few-row tile competes only in its own row class (its rows are unrolled).
        for &t in self.tiles.iter().filter(|t| {
            if t.skinny {
                t.bm as usize == key.rows || t.bm as usize == key.rows.next_power_of_two()
            } else {
                t.bm as usize <= (2 * key.rows).max(32)
            }
        }) {
            candidates.push(Plan::new(t));
            let wgs = ceil_div(key.rows, t.bm) * ceil_div(key.n, t.bn) * key.batch;
            if splittable && (wgs as f64) < 4.0 * self.parallel {
                let most = if t.bm <= 32 { 8 } else { 4 };
                for s in [2, 4, 8].into_iter().filter(|&s| s <= most) {
                    if splits_evenly(key.k, s) {
                        candidates.push(Plan { tile: t, splits: s });
                    }
                }
            }
        }
        // The first run of each plan compiles its pipeline and warms caches. Then every
        // plan is timed once per round, repeating its kernels back to back for about
        // `TRIAL_NS` so that it is measured on a busy device, as it runs inside a model's
        // stream of calls. Rounds go over all plans in turn: a GPU that raises its clocks
        // while the trials run would otherwise favour whichever plans come last (at
        // Qwen3-1.7B's LM head it picked a plan 2.3× slower than the best).
        let mut trials = Vec::with_capacity(candidates.len());
        for plan in candidates {
            let first = self.timed_run(trial(plan)?)?;
            let repeat = (TRIAL_NS / first.max(1)).clamp(1, TRIAL_MAX_REPEAT) as u32;
            trials.push((plan, repeat, u64::MAX));
        }
        for _ in 0..TRIAL_ROUNDS {
            for (plan, repeat, fastest) in trials.iter_mut() {
                let mut job = trial(*plan)?;
                job.repeat = *repeat;
                *fastest = (*fastest).min(self.timed_run(job)? / u64::from(*repeat));
            }
        }
        let plan = trials
            .iter()
            .min_by_key(|t| t.2)
            .map(|t| t.0)
            .unwrap_or_else(|| Plan::new(self.model_tile(m, key.n, key.batch)));
        tracing::debug!(target: "gelo::engine", ?key, plan = %plan.name(), "tuned");
        self.tuned.write().expect("tune table poisoned").insert(key, plan);
        Ok(plan)
    }

    /// Runs `job` once: its results, its GPU time in ns (all repeats) where the device has
    /// timestamps, and the call's wall time in ns.
    fn timed_execute(&self, job: Job<'_>) -> Result<(Vec<Matrix>, Option<u64>, u64), EngineError> {
        let before = self.stats();
        let t = Instant::now();
        let out = self.execute(job)?;
        let wall = t.elapsed().as_nanos() as u64;
        let after = self.stats();
        let gpu = (after.gpu_timed_calls > before.gpu_timed_calls).then(|| after.gpu_ns - before.gpu_ns);
        Ok((out, gpu, wall))
    }

    /// [`Self::timed_execute`]'s GPU time, else its wall time.
    fn timed_run(&self, job: Job<'_>) -> Result<u64, EngineError> {
        let (_, gpu, wall) = self.timed_execute(job)?;
        Ok(gpu.unwrap_or(wall))
    }

    /// Kernel time of one product `x · W[id]` with the plan a call would use, measured as
    /// `repeat` back-to-back runs of its kernels in one submission and divided by `repeat`:
    /// the device busy, as a peer's kernel timing (CUDA events around launches in a tight
    /// loop) measures it, and without the upload and read-back that separate a call's
    /// kernels. Returns the product (that of one run: the kernels overwrite what they write)
    /// and the seconds, `None` on a device without GPU timestamps.
    pub fn steady_kernel_seconds(
        &self,
        x: &Masked,
        id: &WeightId,
        repeat: u32,
    ) -> Result<(Masked, Option<f64>), EngineError> {
        let w = self.weight(id)?;
        check_operand("matmul", x, w.d_in)?;
        let ws = [w];
        let plans = self.many_plans(x, &ws)?;
        let mut job = self.many_job(x, &ws, &plans)?;
        let repeat = repeat.max(1);
        job.repeat = repeat;
        let (mut out, gpu, _) = self.timed_execute(job)?;
        let secs = gpu.map(|ns| ns as f64 * 1e-9 / f64::from(repeat));
        Ok((Masked::from_mixed(out.pop().expect("one product")), secs))
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

    fn pipeline(&self, key: GemmKey) -> Result<Arc<wgpu::ComputePipeline>, EngineError> {
        let mut cache = self.gemm.lock().expect("pipeline cache poisoned");
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let label = format!("gemm {} {:?} {:?}", key.tile.name(), key.layout, key.wtype);
        let src = shaders::gemm_wgsl(&key);
        let p =
            Arc::new(self.gpu.scoped("compile", || compile(&self.gpu.device, &self.pipeline_layout, &label, &src))?);
        cache.insert(key, p.clone());
        Ok(p)
    }

    fn weight(&self, id: &WeightId) -> Result<Arc<GpuWeight>, EngineError> {
        self.weights
            .read()
            .expect("weight table poisoned")
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::UnknownWeight(id.clone()))
    }

    /// Adds one GEMM dispatch to `job`.
    #[allow(clippy::too_many_arguments)]
    fn push_gemm(
        &self,
        job: &mut Job<'_>,
        w: WSource,
        layout: WeightLayout,
        wtype: WeightType,
        mut p: GemmParams,
        batch: usize,
        plan: Plan,
    ) -> Result<(), EngineError> {
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let tile = plan.tile;
        // A split product runs its K slices as the batch dimension into scratch, then sums.
        let split = plan.splits > 1 && batch == 1 && splits_evenly(k, plan.splits);
        let batch = if split { plan.splits as usize } else { batch };
        let mut reduce = None;
        if split {
            let ks = k / plan.splits as usize;
            let scratch = job.out_len + job.scratch_len;
            job.scratch_len += plan.splits as usize * m * n;
            reduce = Some(ReduceParams {
                count: to_u32(job.op, m * n)?,
                splits: plan.splits,
                src: to_u32(job.op, scratch)?,
                dst: p.o_off,
                stride: to_u32(job.op, m * n)?,
                ..Default::default()
            });
            p.k = to_u32(job.op, ks)?;
            p.x_bs = p.k;
            p.w_bs = if layout == WeightLayout::OutIn { p.k } else { to_u32(job.op, ks * p.w_ld as usize)? };
            p.o_off = to_u32(job.op, scratch)?;
            p.o_bs = to_u32(job.op, m * n)?;
        }
        let groups = (ceil_div(n, tile.bn), ceil_div(m, tile.bm), batch);
        let max = self.gpu.limits.max_compute_workgroups_per_dimension as usize;
        if groups.0 > max || groups.1 > max || groups.2 > max {
            return Err(EngineError::Shape {
                op: job.op,
                detail: format!("{m}x{n} product (batch {batch}) needs more workgroups than a dispatch allows"),
            });
        }
        let pipeline = self.pipeline(GemmKey { tile, layout, wtype })?;
        job.params.extend_from_slice(bytemuck::bytes_of(&p));
        job.params.resize(job.params.len().next_multiple_of(PARAMS_BYTES as usize), 0);
        job.dispatches.push(Dispatch { pipeline, w, groups: (groups.0 as u32, groups.1 as u32, groups.2 as u32) });
        if let Some(mut r) = reduce {
            let wgs = (m * n).div_ceil(REDUCE_THREADS as usize);
            let gx = wgs.min(max);
            let gy = wgs.div_ceil(gx);
            r.row = to_u32(job.op, gx * REDUCE_THREADS as usize)?;
            job.params.extend_from_slice(bytemuck::bytes_of(&r));
            job.params.resize(job.params.len().next_multiple_of(PARAMS_BYTES as usize), 0);
            job.dispatches.push(Dispatch {
                pipeline: self.reduce.clone(),
                w: WSource::Input,
                groups: (gx as u32, gy as u32, 1),
            });
        }
        Ok(())
    }

    fn take_slot(&self, in_bytes: u64, out_bytes: u64) -> Result<Slot, EngineError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let reuse = {
            let mut idle = self.slots.lock().expect("slot pool poisoned");
            // Prefer a slot that is already large enough.
            let pos = idle.iter().position(|s| s.in_cap >= in_bytes && s.out_cap >= out_bytes);
            match pos {
                Some(i) => Some(idle.swap_remove(i)),
                None => idle.pop(),
            }
        };
        let mut slot = match reuse {
            Some(s) => s,
            None => self.new_slot(in_bytes, out_bytes)?,
        };
        if slot.in_cap < in_bytes || slot.out_cap < out_bytes {
            slot = self.new_slot(in_bytes.max(slot.in_cap), out_bytes.max(slot.out_cap))?;
        }
        if slot.epoch != epoch {
            slot.groups.clear();
            slot.epoch = epoch;
        }
        Ok(slot)
    }

    fn new_slot(&self, in_bytes: u64, out_bytes: u64) -> Result<Slot, EngineError> {
        let in_cap = in_bytes.max(MIN_SLOT_BYTES).next_power_of_two();
        let out_cap = out_bytes.max(MIN_SLOT_BYTES).next_power_of_two();
        let d = &self.gpu.device;
        self.gpu.scoped("allocate call buffers", || {
            let buf = |label, size, usage, mapped| {
                d.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: mapped })
            };
            use wgpu::BufferUsages as U;
            let queries = self.timestamps.then(|| {
                let set = d.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("gelo-timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2,
                });
                (set, buf("gelo-resolve", 256, U::QUERY_RESOLVE | U::COPY_SRC, false))
            });
            Slot {
                up: buf("gelo-up", in_cap, U::MAP_WRITE | U::COPY_SRC, true),
                input: buf("gelo-input", in_cap, U::UNIFORM | U::STORAGE | U::COPY_DST, false),
                in_cap,
                output: buf("gelo-output", out_cap, U::STORAGE | U::COPY_SRC, false),
                down: buf("gelo-down", out_cap + 256, U::MAP_READ | U::COPY_DST, false),
                out_cap,
                queries,
                groups: HashMap::new(),
                epoch: self.epoch.load(Ordering::Acquire),
            }
        })
    }

    fn put_slot(&self, slot: Slot) {
        let mut idle = self.slots.lock().expect("slot pool poisoned");
        if idle.len() < MAX_IDLE_SLOTS {
            idle.push(slot);
        }
    }

    fn binding_size(&self, cap: u64) -> Option<NonZeroU64> {
        let max = self.gpu.limits.max_storage_buffer_binding_size;
        NonZeroU64::new(cap.min(max) & !3)
    }

    fn bind_group(&self, slot: &mut Slot, w: &WSource) -> wgpu::BindGroup {
        if let Some(g) = slot.groups.get(&w.key()) {
            return g.clone();
        }
        let whole = |buffer, cap| {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: 0, size: self.binding_size(cap) })
        };
        let w_res = match w {
            // The whole 16-byte words the buffer holds: kernels may view it as `vec4`s.
            WSource::Weight(w) => whole(&w.buffer, w.bytes.next_multiple_of(16)),
            WSource::Input => whole(&slot.input, slot.in_cap),
        };
        let g = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gelo-call"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &slot.input,
                        offset: 0,
                        size: NonZeroU64::new(PARAMS_BYTES),
                    }),
                },
                wgpu::BindGroupEntry { binding: 1, resource: whole(&slot.input, slot.in_cap) },
                wgpu::BindGroupEntry { binding: 2, resource: w_res },
                wgpu::BindGroupEntry { binding: 3, resource: whole(&slot.output, slot.out_cap) },
            ],
        });
        // One group per weight a slot has served: a model's worth (Qwen3-1.7B: 197 weights)
        // stays cached; the earlier cap of 64 was below that, so a decode step recreated them.
        if slot.groups.len() >= MAX_SLOT_GROUPS {
            slot.groups.clear();
        }
        slot.groups.insert(w.key(), g.clone());
        g
    }

    /// Runs one call: upload, every dispatch, read-back, one wait.
    fn execute(&self, job: Job<'_>) -> Result<Vec<Matrix>, EngineError> {
        self.execute_with(job, true, |views| {
            views
                .iter()
                .map(|z| {
                    // Into a recycled buffer when one is pooled (results are masked data).
                    let mut data = self.buffers.take_empty(z.rows() * z.cols());
                    kernels::cpu::extend_parallel(&mut data, z.as_slice());
                    Matrix::from_vec(z.rows(), z.cols(), data).expect("output sized to its shape")
                })
                .collect()
        })
    }

    /// [`Self::execute`], with the results lent to `read` straight out of the mapped
    /// read-back buffer. `read`'s time counts as read-back only when it is the engine's own
    /// (`ours`: copying results out), not when the caller reads in place.
    fn execute_with<R>(
        &self,
        job: Job<'_>,
        ours: bool,
        read: impl FnOnce(&[MaskedView<'_>]) -> R,
    ) -> Result<R, EngineError> {
        self.gpu.check_alive()?;
        let t0 = Instant::now();
        let op = job.op;
        // Operands first (offsets in the kernels' parameters count from 0), then the
        // parameter blocks at the next dynamic-offset boundary.
        let data_bytes = job.inputs.iter().map(|s| s.len() as u64 * 4).sum::<u64>();
        let params_base = data_bytes.next_multiple_of(PARAMS_BYTES);
        let in_bytes = params_base + job.params.len() as u64;
        // Dynamic offsets are 32-bit.
        to_u32(op, in_bytes as usize)?;
        let out_bytes = (job.out_len as u64 * 4).max(4);
        let work_bytes = ((job.out_len + job.scratch_len) as u64 * 4).max(4);
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        if in_bytes > max_binding || work_bytes > max_binding {
            return Err(EngineError::OutOfMemory(format!(
                "{op}: {in_bytes} bytes in and {out_bytes} out exceed the device's largest binding ({max_binding})"
            )));
        }
        let mut slot = self.take_slot(in_bytes, work_bytes)?;

        // 1. Pack parameters and operands straight into the mapped upload buffer.
        {
            let mut view = slot
                .up
                .slice(..in_bytes)
                .get_mapped_range_mut()
                .map_err(|e| self.gpu.classify(op, format!("upload buffer not mapped: {e}")))?;
            // Write-only view: the mapping may be write-combining memory, never read back.
            let mut at = 0;
            for s in &job.inputs {
                write_mapped(view.slice(at..at + s.len() * 4), bytemuck::cast_slice(s));
                at += s.len() * 4;
            }
            let base = params_base as usize;
            view.slice(base..base + job.params.len()).copy_from_slice(&job.params);
        }
        slot.up.unmap();

        // 2. One command buffer: upload copy, all dispatches, read-back copy.
        let groups: Vec<wgpu::BindGroup> = job.dispatches.iter().map(|d| self.bind_group(&mut slot, &d.w)).collect();
        let ts_offset = out_bytes.next_multiple_of(8);
        let index = self.gpu.scoped(op, || {
            let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
            enc.copy_buffer_to_buffer(&slot.up, 0, &slot.input, 0, in_bytes);
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(op),
                    timestamp_writes: slot.queries.as_ref().map(|(set, _)| wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
                });
                for _ in 0..job.repeat.max(1) {
                    for (i, (d, g)) in job.dispatches.iter().zip(&groups).enumerate() {
                        pass.set_pipeline(&d.pipeline);
                        pass.set_bind_group(0, g, &[(params_base + i as u64 * PARAMS_BYTES) as u32]);
                        pass.dispatch_workgroups(d.groups.0, d.groups.1, d.groups.2);
                    }
                }
            }
            enc.copy_buffer_to_buffer(&slot.output, 0, &slot.down, 0, out_bytes);
            if let Some((set, resolve)) = &slot.queries {
                enc.resolve_query_set(set, 0..2, resolve, 0);
                enc.copy_buffer_to_buffer(resolve, 0, &slot.down, ts_offset, 16);
            }
            self.gpu.queue.submit([enc.finish()])
        })?;
        let t1 = Instant::now();

        // 3. Map the read-back, and the upload buffer again for the slot's next call.
        let (tx, rx) = mpsc::channel();
        let down_len = if slot.queries.is_some() { ts_offset + 16 } else { out_bytes };
        let tx2 = tx.clone();
        slot.up.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            let _ = tx.send(r);
        });
        slot.down.slice(..down_len).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx2.send(r);
        });
        for r in self.gpu.wait(index, &rx, 2, self.spin_wait)? {
            r.map_err(|e| self.gpu.classify(op, format!("mapping a call buffer: {e}")))?;
        }
        let t2 = Instant::now();

        // 4. Results lent out of the mapped read-back.
        let mut gpu_ns = None;
        let reading;
        let out = {
            let view = slot
                .down
                .slice(..down_len)
                .get_mapped_range()
                .map_err(|e| self.gpu.classify(op, format!("read-back not mapped: {e}")))?;
            if slot.queries.is_some() {
                let ts: Vec<u64> = bytemuck::pod_collect_to_vec(&view[ts_offset as usize..ts_offset as usize + 16]);
                let ticks = ts[1].saturating_sub(ts[0]);
                gpu_ns = Some((ticks as f64 * f64::from(self.gpu.queue.get_timestamp_period())) as u64);
            }
            let bytes = &view[..out_bytes as usize];
            // A mapping is aligned far beyond 4 bytes; copy only if one ever is not.
            let copied;
            let all: &[f32] = match bytemuck::try_cast_slice(bytes) {
                Ok(v) => v,
                Err(_) => {
                    copied =
                        bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
                    &copied
                }
            };
            let views: Vec<MaskedView<'_>> = job
                .outputs
                .iter()
                .map(|&(off, rows, cols)| {
                    MaskedView::from_mixed(rows, cols, &all[off..off + rows * cols]).expect("output sized to its shape")
                })
                .collect();
            let r = Instant::now();
            let out = read(&views);
            reading = if ours { Duration::ZERO } else { r.elapsed() };
            out
        };
        slot.down.unmap();
        self.put_slot(slot);
        let t3 = Instant::now() - reading;

        let mut st = self.stats.lock().expect("stats poisoned");
        st.calls += 1;
        st.host_ns += (t1 - t0).as_nanos() as u64;
        st.wait_ns += (t2 - t1).as_nanos() as u64;
        st.readback_ns += (t3 - t2).as_nanos() as u64;
        if let Some(g) = gpu_ns {
            st.gpu_ns += g;
            st.gpu_timed_calls += 1;
        }
        st.bytes_up += in_bytes;
        st.bytes_down += out_bytes;
        drop(st);
        // Per call, for profiles of a model's stream of calls (shapes only, never data).
        tracing::trace!(target: "gelo::engine::call", op, products = job.outputs.len(),
            rows = job.outputs.first().map_or(0, |o| o.1), cols = job.outputs.iter().map(|o| o.2).sum::<usize>(),
            dispatches = job.dispatches.len(), gpu_us = gpu_ns.map_or(f64::NAN, |g| g as f64 / 1e3),
            wall_us = (t3 - t0).as_secs_f64() * 1e6, "call");
        Ok(out)
    }

    /// Shape class of a dynamic call, for tuning: `None` when the pairs differ in shape.
    fn dynamic_key(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Option<(TuneKey, usize)>, EngineError> {
        let shapes = pairs.iter().map(|(a, b)| dynamic_shape(a, b, transpose_b)).collect::<Result<Vec<_>, _>>()?;
        if !shapes.windows(2).all(|w| w[0] == w[1]) {
            return Ok(None);
        }
        let (m, k, n) = shapes[0];
        let key = TuneKey {
            rows: row_class(m),
            n,
            k,
            out_in: transpose_b,
            wtype: WeightType::F32,
            batch: pairs.len().next_power_of_two(),
        };
        Ok(Some((key, m)))
    }

    fn dynamic_call(&self, pairs: &[(&Masked, &Masked)], transpose_b: bool) -> Result<Vec<Matrix>, EngineError> {
        let tile = match self.dynamic_key(pairs, transpose_b)? {
            Some((key, m)) => {
                Some(self.choose_plan(key, m, false, |p| self.dynamic_job(pairs, transpose_b, Some(p.tile)))?.tile)
            }
            None => None,
        };
        self.execute(self.dynamic_job(pairs, transpose_b, tile)?)
    }

    /// The job of a dynamic call; `tile` is used for every dispatch when given.
    fn dynamic_job<'a>(
        &self,
        pairs: &[(&'a Masked, &'a Masked)],
        transpose_b: bool,
        tile: Option<Tile>,
    ) -> Result<Job<'a>, EngineError> {
        let op = "matmul_dynamic";
        let shapes = pairs.iter().map(|(a, b)| dynamic_shape(a, b, transpose_b)).collect::<Result<Vec<_>, _>>()?;
        let uniform = shapes.windows(2).all(|w| w[0] == w[1]);
        let base = 0;
        let mut job = Job {
            op,
            params: Vec::new(),
            dispatches: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            out_len: 0,
            scratch_len: 0,
            repeat: 1,
        };
        // Operands: every `a`, then every `b`; results consecutive.
        let a_offs: Vec<usize> = shapes
            .iter()
            .scan(base, |o, &(m, k, _)| {
                let r = *o;
                *o += m * k;
                Some(r)
            })
            .collect();
        let b_start = a_offs.last().map_or(base, |&l| l + shapes.last().map_or(0, |s| s.0 * s.1));
        let b_offs: Vec<usize> = shapes
            .iter()
            .scan(b_start, |o, &(_, k, n)| {
                let r = *o;
                *o += k * n;
                Some(r)
            })
            .collect();
        for (a, _) in pairs {
            job.inputs.push(a.matrix().as_slice());
        }
        for (_, b) in pairs {
            job.inputs.push(b.matrix().as_slice());
        }
        for &(m, _, n) in &shapes {
            job.outputs.push((job.out_len, m, n));
            job.out_len += m * n;
        }
        let o_offs: Vec<usize> = job.outputs.iter().map(|o| o.0).collect();
        let layout = if transpose_b { WeightLayout::OutIn } else { WeightLayout::InOut };
        let params = |i: usize| -> Result<GemmParams, EngineError> {
            let (m, k, n) = shapes[i];
            Ok(GemmParams {
                m: to_u32(op, m)?,
                n: to_u32(op, n)?,
                k: to_u32(op, k)?,
                x_off: to_u32(op, a_offs[i])?,
                x_ld: to_u32(op, k)?,
                x_bs: to_u32(op, m * k)?,
                w_off: to_u32(op, b_offs[i])?,
                w_ld: to_u32(op, if transpose_b { k } else { n })?,
                w_bs: to_u32(op, k * n)?,
                o_off: to_u32(op, o_offs[i])?,
                o_ld: to_u32(op, n)?,
                o_bs: to_u32(op, m * n)?,
                ..Default::default()
            })
        };
        if uniform {
            let p = params(0)?;
            let (m, n) = (p.m as usize, p.n as usize);
            let tile = tile.unwrap_or_else(|| self.model_tile(m, n, pairs.len()));
            self.push_gemm(&mut job, WSource::Input, layout, WeightType::F32, p, pairs.len(), Plan::new(tile))?;
        } else {
            for i in 0..pairs.len() {
                let p = params(i)?;
                let (m, n) = (p.m as usize, p.n as usize);
                let tile = tile.unwrap_or_else(|| self.model_tile(m, n, 1));
                self.push_gemm(&mut job, WSource::Input, layout, WeightType::F32, p, 1, Plan::new(tile))?;
            }
        }
        Ok(job)
    }
}

impl WgpuEngine {
    /// The job of `x · W` for every weight, `tiles[i]` for the i-th.
    /// The plan of each product of `x` by `ws` (tuning classes seen for the first time).
    /// The job of `x · W_id` for every id, `None` for no ids.
    fn products_job<'a>(&self, x: &'a Masked, ids: &[WeightId]) -> Result<Option<Job<'a>>, EngineError> {
        let ws = ids.iter().map(|id| self.weight(id)).collect::<Result<Vec<_>, _>>()?;
        for w in &ws {
            check_operand("matmul", x, w.d_in)?;
        }
        if ws.is_empty() {
            return Ok(None);
        }
        let plans = self.many_plans(x, &ws)?;
        self.many_job(x, &ws, &plans).map(Some)
    }

    fn many_plans(&self, x: &Masked, ws: &[Arc<GpuWeight>]) -> Result<Vec<Plan>, EngineError> {
        let (m, k) = (x.rows(), x.cols());
        ws.iter()
            .map(|w| {
                let key = TuneKey {
                    rows: row_class(m),
                    n: w.d_out,
                    k,
                    out_in: w.layout == WeightLayout::OutIn,
                    wtype: w.wtype,
                    batch: 1,
                };
                self.choose_plan(key, m, true, |p| self.many_job(x, std::slice::from_ref(w), &[p]))
            })
            .collect()
    }

    fn many_job<'a>(&self, x: &'a Masked, ws: &[Arc<GpuWeight>], plans: &[Plan]) -> Result<Job<'a>, EngineError> {
        let op = "matmul";
        let (m, k) = (x.rows(), x.cols());
        let mut job = Job {
            op,
            params: Vec::new(),
            dispatches: Vec::new(),
            inputs: vec![x.matrix().as_slice()],
            outputs: Vec::new(),
            out_len: 0,
            scratch_len: 0,
            repeat: 1,
        };
        let x_off = 0;
        // Every result's place first: split products put their scratch after all of them.
        for w in ws {
            job.outputs.push((job.out_len, m, w.d_out));
            job.out_len += m * w.d_out;
        }
        for ((w, &plan), &(o_off, _, _)) in ws.iter().zip(plans).zip(&job.outputs.clone()) {
            let p = GemmParams {
                m: to_u32(op, m)?,
                n: to_u32(op, w.d_out)?,
                k: to_u32(op, k)?,
                x_off: to_u32(op, x_off)?,
                x_ld: to_u32(op, k)?,
                w_ld: to_u32(op, w.ld)?,
                o_off: to_u32(op, o_off)?,
                o_ld: to_u32(op, w.d_out)?,
                ..Default::default()
            };
            self.push_gemm(&mut job, WSource::Weight(w.clone()), w.layout, w.wtype, p, 1, plan)?;
        }
        Ok(job)
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
        weight.check(&id)?;
        self.gpu.check_alive()?;
        if self.weights.read().expect("weight table poisoned").contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        let bf16_as = match self.cfg.bf16_weights_as {
            Some(p) => p,
            None if self.gpu.coop => Precision::F16,
            None => Precision::Bf16,
        };
        let storage = weights::storage_for(&weight.data, self.cfg.f32_weights_as, bf16_as);
        let bytes = weights::stored_bytes(&weight, storage);
        let lim = &self.gpu.limits;
        let largest = lim.max_buffer_size.min(lim.max_storage_buffer_binding_size);
        if bytes > largest {
            return Err(EngineError::OutOfMemory(format!(
                "weight `{id}` needs {bytes} bytes; the device's largest buffer binding is {largest}"
            )));
        }
        let budget = self.cfg.memory_budget.or(self.gpu.memory_bytes).unwrap_or(u64::MAX);
        let resident = self.resident.load(Ordering::Relaxed);
        if resident + bytes > budget {
            return Err(EngineError::OutOfMemory(format!(
                "weight `{id}` needs {bytes} bytes; {resident} of the {budget}-byte budget are in use"
            )));
        }
        let (_, contig) = weights::stored_shape(&weight);
        let mut packed = vec![0u8; bytes.next_multiple_of(16) as usize];
        weights::pack_into(&weight, storage, &mut packed[..bytes as usize]);
        let buffer = self.gpu.scoped("register", || {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(id.as_str()),
                // Whole 16-byte words: kernels may view a weight as `vec4`s.
                size: bytes.next_multiple_of(16),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view =
                buffer.slice(..).get_mapped_range_mut().map_err(|e| self.gpu.classify("register", e.to_string()))?;
            view.copy_from_slice(&packed);
        }
        buffer.unmap();
        // Start the copy to device memory now rather than with the next product.
        self.gpu.scoped("register", || self.gpu.queue.submit([]))?;
        let w = GpuWeight {
            serial: self.serial.fetch_add(1, Ordering::Relaxed),
            buffer,
            d_in: weight.d_in,
            d_out: weight.d_out,
            layout: weight.layout,
            wtype: weights::wtype(storage),
            ld: weights::stored_ld(contig, storage),
            bytes,
        };
        let mut table = self.weights.write().expect("weight table poisoned");
        if table.contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        table.insert(id, Arc::new(w));
        self.resident.fetch_add(bytes, Ordering::Relaxed);
        Ok(Registered { storage })
    }

    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        let w = self
            .weights
            .write()
            .expect("weight table poisoned")
            .remove(id)
            .ok_or_else(|| EngineError::UnknownWeight(id.clone()))?;
        self.resident.fetch_sub(w.bytes, Ordering::Relaxed);
        // Idle slots drop their bind groups now; busy ones when they are next taken.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for s in self.slots.lock().expect("slot pool poisoned").iter_mut() {
            s.groups.clear();
        }
        Ok(())
    }

    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Masked>, EngineError> {
        let Some(job) = self.products_job(x, ids)? else {
            return Ok(Vec::new());
        };
        Ok(self.execute(job)?.into_iter().map(Masked::from_mixed).collect())
    }

    /// The products are lent straight out of the mapped read-back buffer.
    fn matmul_many_with(
        &self,
        x: &Masked,
        ids: &[WeightId],
        read: &mut dyn FnMut(&[MaskedView<'_>]),
    ) -> Result<(), EngineError> {
        match self.products_job(x, ids)? {
            Some(job) => self.execute_with(job, false, read),
            None => {
                read(&[]);
                Ok(())
            }
        }
    }

    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Masked, EngineError> {
        let mut out = self.dynamic_call(&[(a, b)], transpose_b)?;
        Ok(Masked::from_mixed(out.pop().expect("one pair, one product")))
    }

    fn matmul_dynamic_batched(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Masked>, EngineError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.dynamic_call(pairs, transpose_b)?.into_iter().map(Masked::from_mixed).collect())
    }

    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Masked, EngineError> {
        let op = "softmax_rows";
        let (rows, cols) = (x.rows(), x.cols());
        if rows == 0 || cols == 0 {
            return Err(EngineError::Empty(op));
        }
        let max = self.gpu.limits.max_compute_workgroups_per_dimension as usize;
        let grid_x = rows.min(max);
        let grid_y = rows.div_ceil(grid_x);
        if grid_y > max {
            return Err(EngineError::Shape { op, detail: format!("{rows} rows exceed one dispatch") });
        }
        let p = SoftmaxParams {
            rows: to_u32(op, rows)?,
            cols: to_u32(op, cols)?,
            scale,
            grid_x: grid_x as u32,
            x_off: 0,
            o_off: 0,
            ..Default::default()
        };
        let mut params = bytemuck::bytes_of(&p).to_vec();
        params.resize(PARAMS_BYTES as usize, 0);
        let job = Job {
            op,
            params,
            dispatches: vec![Dispatch {
                pipeline: self.softmax.clone(),
                w: WSource::Input,
                groups: (grid_x as u32, grid_y as u32, 1),
            }],
            inputs: vec![x.matrix().as_slice()],
            outputs: vec![(0, rows, cols)],
            out_len: rows * cols,
            scratch_len: 0,
            repeat: 1,
        };
        let mut out = self.execute(job)?;
        Ok(Masked::from_mixed(out.pop().expect("one output")))
    }
}

/// The tuning class of products of `m` rows: `m` itself where a tile of exactly that many
/// rows exists (9: one decode row under the default 8 shield rows; 36 and 72: four and
/// eight of them), else the next power of two.
fn row_class(m: usize) -> usize {
    let tiles = TILES.iter().chain(&shaders::SKINNY_TILES);
    if tiles.map(|t| t.bm as usize).any(|bm| bm == m) { m } else { m.next_power_of_two() }
}

/// Bytes from which [`write_mapped`] splits a copy over rayon's pool, and its pieces.
/// Decode calls (at most 1.8 MB: a masked B = 8 step's `down` input) stay on one core: the
/// masked executor draws the next linears' shield rows on the pool during the call, and a
/// caller that waits for its pieces steals those draws (+70 µs a call on the H200, measured).
const PAR_UPLOAD_MIN: usize = 4 << 20;
const UPLOAD_PIECE: usize = 64 << 10;

/// `dst ← src` for a write-only mapped range, in pieces on rayon's pool when large: one
/// core writes mapped (write-combining) memory at ~10 GB/s, and an embedding batch's
/// linear uploads tens of MB while the TEE's other cores wait for the engine.
fn write_mapped(dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8]) {
    use rayon::prelude::*;
    /// A piece of the mapping, handed to one worker.
    struct Piece<'a>(wgpu::WriteOnly<'a, [u8]>);
    // SAFETY: a `WriteOnly<[u8]>` is an exclusive, write-only borrow of bytes, as `&mut [u8]`
    // is, which is `Send`; wgpu only lacks the impl for unsized `T`. The pieces are disjoint.
    unsafe impl Send for Piece<'_> {}
    let mut dst = dst;
    if src.len() < PAR_UPLOAD_MIN || rayon::current_num_threads() < 2 {
        dst.copy_from_slice(src);
        return;
    }
    let mut pieces = Vec::with_capacity(src.len().div_ceil(UPLOAD_PIECE));
    let (mut rest, mut from) = (dst, src);
    while from.len() > UPLOAD_PIECE {
        let (head, tail) = rest.split_at(UPLOAD_PIECE);
        pieces.push((Piece(head), &from[..UPLOAD_PIECE]));
        rest = tail;
        from = &from[UPLOAD_PIECE..];
    }
    pieces.push((Piece(rest), from));
    pieces.into_par_iter().for_each(|(mut piece, bytes)| piece.0.copy_from_slice(bytes));
}
