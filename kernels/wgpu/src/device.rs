//! The wgpu device the engine owns: opening it on the chosen adapter, turning wgpu's error
//! reports into [`EngineError`]s, and remembering a lost device for good.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use protocol::EngineError;

use crate::select::{self, AdapterSpec, AdapterSummary};

/// How long one submission may take before the device counts as hung. The largest single
/// call (a 2k×6k×2k GEMM on lavapipe) takes seconds; a healthy GPU finishes in milliseconds.
const SUBMISSION_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterSummary,
    pub limits: wgpu::Limits,
    /// Device-local memory (largest device-local heap), when the driver says.
    pub memory_bytes: Option<u64>,
    /// Cooperative-matrix (tensor core) kernels can run: asked for, and the driver offers
    /// 16×16×16 f16 products with f32 accumulation on 32-wide subgroups.
    pub coop: bool,
    /// Set once, by the device-lost callback or by a hung submission; never cleared.
    lost: Arc<OnceLock<String>>,
}

impl Gpu {
    pub fn open(spec: &AdapterSpec, want_coop: bool) -> Result<Gpu, EngineError> {
        let instance = select::instance();
        let (adapter, summary) = select::pick(&instance, spec)?;
        let memory_bytes = device_local_memory(&adapter);
        let coop = want_coop && supports_coop(&adapter);
        if want_coop && !coop {
            tracing::warn!(target: "gelo::engine", adapter = %summary, "tensor cores asked for, but the adapter offers no usable cooperative matrices");
        }
        let coop_features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
        // Take every limit the adapter offers: weights need large storage bindings and the
        // big tiles need more than WebGPU's default 16 KiB of workgroup memory.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("gelo-engine"),
            // Timestamps only measure where time goes; nothing else is optional.
            required_features: (adapter.features() & wgpu::Features::TIMESTAMP_QUERY)
                | if coop { coop_features } else { wgpu::Features::empty() },
            required_limits: limits.clone(),
            experimental_features: if coop {
                // SAFETY: wgpu marks cooperative matrices experimental. The kernels use only
                // the configuration the driver lists (checked by `supports_coop`), one full
                // subgroup per workgroup, in uniform control flow.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| EngineError::NoAdapter(format!("{summary}: the driver refused a device: {e}")))?;

        let lost: Arc<OnceLock<String>> = Arc::default();
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            let _ = flag.set(format!("{reason:?}: {message}"));
            tracing::error!(target: "gelo::engine", ?reason, %message, "Vulkan device lost");
        });
        // wgpu's default handler panics. Every call runs inside error scopes, so what lands
        // here is an error outside any call (a dropped resource on a dying device): log it.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            tracing::error!(target: "gelo::engine", error = %e, "uncaptured wgpu error");
        }));
        tracing::info!(target: "gelo::engine", adapter = %summary, memory_bytes, "Vulkan engine opened");
        Ok(Gpu { device, queue, adapter: summary, limits, memory_bytes, coop, lost })
    }

    /// `DeviceLost` once the device is gone, so callers stop before touching it.
    pub fn check_alive(&self) -> Result<(), EngineError> {
        match self.lost.get() {
            Some(reason) => Err(EngineError::DeviceLost(reason.clone())),
            None => Ok(()),
        }
    }

    pub fn mark_lost(&self, reason: String) {
        let _ = self.lost.set(reason);
    }

    /// Destroys the device as a driver reset would: every later call fails with
    /// `DeviceLost`. For tests of the unhealthy path.
    pub fn destroy(&self) {
        self.device.destroy();
        // The callback fires from the next poll; record the loss now so no call slips by.
        self.mark_lost("Destroyed: the engine's device was destroyed".into());
    }

    /// Runs `f` inside out-of-memory, validation and internal error scopes on this thread
    /// and maps what they caught to a typed error.
    pub fn scoped<T>(&self, op: &'static str, f: impl FnOnce() -> T) -> Result<T, EngineError> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let out = f();
        // Scopes pop in reverse order of their pushing.
        let internal = pollster::block_on(internal.pop());
        let validation = pollster::block_on(validation.pop());
        let oom = pollster::block_on(oom.pop());
        self.check_alive()?;
        if let Some(e) = oom {
            return Err(EngineError::OutOfMemory(format!("{op}: {e}")));
        }
        if let Some(e) = validation.or(internal) {
            return Err(self.classify(op, e.to_string()));
        }
        Ok(out)
    }

    /// A wgpu failure on a device that may have died meanwhile is a lost device, not a bug.
    pub fn classify(&self, op: &'static str, message: String) -> EngineError {
        if let Some(reason) = self.lost.get() {
            return EngineError::DeviceLost(reason.clone());
        }
        let lower = message.to_lowercase();
        if lower.contains("device is lost") || lower.contains("device lost") {
            self.mark_lost(message.clone());
            return EngineError::DeviceLost(message);
        }
        if lower.contains("out of memory") {
            return EngineError::OutOfMemory(format!("{op}: {message}"));
        }
        EngineError::Backend(format!("{op}: {message}"))
    }

    /// Blocks until submission `index` is done, then waits for the callbacks that report
    /// into `done` (buffer mappings) to have run. Another thread's poll may run our
    /// callbacks, so the wait is on their results, not on the poll. For up to `spin` the
    /// thread polls without sleeping before it blocks.
    pub fn wait<T>(
        &self,
        index: wgpu::SubmissionIndex,
        done: &std::sync::mpsc::Receiver<T>,
        expect: usize,
        spin: Duration,
    ) -> Result<Vec<T>, EngineError> {
        let mut got = Vec::with_capacity(expect);
        // Short calls first spin on non-blocking polls: a blocking wait sleeps on the
        // driver's fence and wakes tens of microseconds after the GPU is done, which is a
        // large part of a decode-sized call.
        if !spin.is_zero() {
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                if self.device.poll(wgpu::PollType::Poll).is_err() {
                    break;
                }
                while let Ok(v) = done.try_recv() {
                    got.push(v);
                }
                if got.len() >= expect {
                    return Ok(got);
                }
                std::hint::spin_loop();
            }
        }
        let poll =
            self.device.poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: Some(SUBMISSION_TIMEOUT) });
        if let Err(e) = poll {
            let msg = format!("waiting for the GPU: {e}");
            if matches!(e, wgpu::PollError::Timeout) {
                self.mark_lost(format!("a submission ran past {SUBMISSION_TIMEOUT:?}"));
                return Err(EngineError::DeviceLost(msg));
            }
            return Err(self.classify("wait", msg));
        }
        while got.len() < expect {
            match done.recv_timeout(Duration::from_millis(1)) {
                Ok(v) => got.push(v),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    self.check_alive()?;
                    // Our callbacks may be queued behind a poll on another thread, or not
                    // yet collected at all: poll once more without blocking.
                    let _ = self.device.poll(wgpu::PollType::Poll);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.classify("wait", "a mapping callback was dropped".into()));
                }
            }
        }
        Ok(got)
    }
}

/// Whether the cooperative kernels can run here: the features, an f16×f16→f32 16×16×16
/// configuration, and subgroups of exactly one cooperative workgroup.
fn supports_coop(adapter: &wgpu::Adapter) -> bool {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && info.subgroup_min_size == crate::shaders::COOP_THREADS
        && info.subgroup_max_size == crate::shaders::COOP_THREADS
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Size of the largest device-local memory heap, read through the Vulkan HAL.
fn device_local_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: the HAL adapter is only read (a physical-device query); nothing is created or
    // destroyed through it.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance and outlives the call.
    let props = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    const DEVICE_LOCAL: u32 = 0x1; // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
    props.memory_heaps_as_slice().iter().filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0).map(|h| h.size).max()
}
