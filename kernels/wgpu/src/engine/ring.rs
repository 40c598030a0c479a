//! Ring products of the `dual-lpn` protection on the device: int8 weights resident four to
//! a `u32` word ([`shaders::ring`](crate::shaders) has the layout), and `x · W_q mod 2^32`
//! for every id of a call in one submission, through the same upload, dispatch and
//! read-back path as the f32 products (results travel as raw 32-bit words). Operands
//! larger than [`CHUNK_BYTES`] (the TEE's code matrices, when it computes a weight's table)
//! go as several calls of whole rows.

use std::sync::{Arc, atomic::Ordering};

use protocol::{EngineError, RingMasked};
use tensor::{WeightId, ring::RingWeight};

use super::{
    WgpuEngine, compile,
    jobs::{Dispatch, Job, WSource, ceil_div, to_u32},
};
use crate::shaders::{
    PARAMS_BYTES, RING_SKINNY_TILES, RING_TILES, RingKernel, RingKey, RingParams, RingTile, pack_ring, ring_wgsl,
};

/// An int8 weight resident on the device.
pub(crate) struct GpuRing {
    /// Unique per registration, shared with f32 weights: keys the cached bind groups.
    pub serial: u64,
    pub buffer: wgpu::Buffer,
    pub d_in: usize,
    pub d_out: usize,
    /// Words per column.
    pub ld: usize,
    pub bytes: u64,
}

/// Most bytes of operands, or of results, one submission carries; larger calls are split
/// by rows, so that no call buffer grows past it (slots keep their size while pooled).
const CHUNK_BYTES: u64 = 128 << 20;

/// Rows from which the tiled kernel runs; fewer go to the few-row kernel.
const SKINNY_ROWS: usize = 16;

impl WgpuEngine {
    /// The ring kernel this engine runs ([`super::WgpuConfig::ring_kernel`]).
    pub fn ring_kernel(&self) -> RingKernel {
        self.ring_kernel
    }

    /// [`protocol::Engine::register_ring`]: packs the int8 columns and uploads them.
    pub(super) fn register_ring_weight(&self, id: WeightId, weight: &RingWeight) -> Result<(), EngineError> {
        self.gpu.check_alive()?;
        if self.rings.read().expect("ring table poisoned").contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        let (d_in, d_out) = (weight.d_in, weight.d_out);
        let words = pack_ring(d_in, d_out, |o| weight.column(o));
        let bytes = words.len() as u64 * 4;
        let lim = &self.gpu.limits;
        let largest = lim.max_buffer_size.min(lim.max_storage_buffer_binding_size);
        if bytes > largest {
            return Err(EngineError::OutOfMemory(format!(
                "ring weight `{id}` needs {bytes} bytes; the device's largest buffer binding is {largest}"
            )));
        }
        let budget = self.cfg.memory_budget.or(self.gpu.memory_bytes).unwrap_or(u64::MAX);
        let resident = self.resident.load(Ordering::Relaxed);
        if resident + bytes > budget {
            return Err(EngineError::OutOfMemory(format!(
                "ring weight `{id}` needs {bytes} bytes; {resident} of the {budget}-byte budget are in use"
            )));
        }
        let size = bytes.next_multiple_of(16);
        let buffer = self.gpu.scoped("register", || {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(id.as_str()),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view =
                buffer.slice(..).get_mapped_range_mut().map_err(|e| self.gpu.classify("register", e.to_string()))?;
            let mut padded = vec![0u8; size as usize];
            padded[..bytes as usize].copy_from_slice(bytemuck::cast_slice(&words));
            view.copy_from_slice(&padded);
        }
        buffer.unmap();
        self.gpu.scoped("register", || self.gpu.queue.submit([]))?;
        let ring = GpuRing {
            serial: self.serial.fetch_add(1, Ordering::Relaxed),
            buffer,
            d_in,
            d_out,
            ld: d_in.div_ceil(4),
            bytes: size,
        };
        let mut table = self.rings.write().expect("ring table poisoned");
        if table.contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        table.insert(id, Arc::new(ring));
        self.resident.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// [`protocol::Engine::ring_matmul_many`].
    pub(super) fn ring_products(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        let op = "ring_matmul";
        let ws = {
            let table = self.rings.read().expect("ring table poisoned");
            ids.iter()
                .map(|id| table.get(id).cloned().ok_or_else(|| EngineError::UnknownWeight(id.clone())))
                .collect::<Result<Vec<_>, _>>()?
        };
        let (rows, k) = (x.rows(), x.cols());
        if rows == 0 || k == 0 {
            return Err(EngineError::Empty(op));
        }
        for w in &ws {
            if w.d_in != k {
                return Err(EngineError::Shape {
                    op,
                    detail: format!("operand has {k} columns, weight expects {}", w.d_in),
                });
            }
        }
        if ws.is_empty() {
            return Ok(Vec::new());
        }
        let width: usize = ws.iter().map(|w| w.d_out).sum();
        let cap = CHUNK_BYTES.min(self.gpu.limits.max_storage_buffer_binding_size / 2) as usize;
        let step = (cap / (4 * k.max(width))).max(1);
        let mut outs: Vec<Vec<u32>> = ws.iter().map(|w| Vec::with_capacity(rows * w.d_out)).collect();
        let data = x.as_slice();
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            let job = self.ring_job(&data[r0 * k..r1 * k], r1 - r0, k, &ws)?;
            self.execute_with(job, true, |views| {
                for (out, v) in outs.iter_mut().zip(views) {
                    out.extend_from_slice(bytemuck::cast_slice::<f32, u32>(v.as_slice()));
                }
            })?;
        }
        Ok(outs)
    }

    /// One submission: `rows` rows of `x` (`k` wide) by every weight of `ws`.
    fn ring_job<'a>(&self, x: &'a [u32], rows: usize, k: usize, ws: &[Arc<GpuRing>]) -> Result<Job<'a>, EngineError> {
        let op = "ring_matmul";
        let mut job = Job {
            op,
            params: Vec::new(),
            dispatches: Vec::new(),
            // Raw words: the upload and read-back copy bytes and never look at them as f32.
            inputs: vec![bytemuck::cast_slice::<u32, f32>(x)],
            outputs: Vec::new(),
            out_len: 0,
            scratch_len: 0,
            repeat: 1,
        };
        let max = self.gpu.limits.max_compute_workgroups_per_dimension as usize;
        for w in ws {
            let tile = self.ring_tile(rows, w.d_out);
            let groups = (ceil_div(w.d_out, tile.bn), if tile.skinny { 1 } else { ceil_div(rows, tile.bm) });
            if groups.0 > max || groups.1 > max {
                return Err(EngineError::Shape {
                    op,
                    detail: format!("{rows}x{} ring product needs more workgroups than a dispatch allows", w.d_out),
                });
            }
            let p = RingParams {
                m: to_u32(op, rows)?,
                n: to_u32(op, w.d_out)?,
                k: to_u32(op, k)?,
                ld: to_u32(op, w.ld)?,
                x_off: 0,
                o_off: to_u32(op, job.out_len)?,
                c_off: to_u32(op, w.d_out * w.ld)?,
                _p0: 0,
            };
            job.outputs.push((job.out_len, rows, w.d_out));
            job.out_len += rows * w.d_out;
            job.params.extend_from_slice(bytemuck::bytes_of(&p));
            job.params.resize(job.params.len().next_multiple_of(PARAMS_BYTES as usize), 0);
            job.dispatches.push(Dispatch {
                pipeline: self.ring_pipeline(RingKey { tile, kernel: self.ring_kernel })?,
                w: WSource::Ring(w.clone()),
                groups: (groups.0 as u32, groups.1 as u32, 1),
            });
        }
        Ok(job)
    }

    /// The ring tile for an `m×n` product: the few-row kernel of `m`'s row class up to
    /// [`SKINNY_ROWS`] rows, else the tiled one the cost model of
    /// [`WgpuEngine::model_tile`] picks among those the kernel and the device can run.
    fn ring_tile(&self, m: usize, n: usize) -> RingTile {
        if m <= SKINNY_ROWS {
            let class = m.next_power_of_two() as u32;
            if let Some(t) = RING_SKINNY_TILES.iter().find(|t| t.bm == class && self.ring_fits(t)) {
                return *t;
            }
        }
        let cost = |t: &RingTile| {
            let wgs = (ceil_div(m, t.bm) * ceil_div(n, t.bn)) as f64;
            let resident = self.parallel * 256.0 / f64::from(t.threads());
            let area = f64::from(t.bm * t.bn);
            let eff = (f64::from(t.tm * t.tn) / 64.0).powf(0.5) * (area / 16384.0).powf(0.15);
            (wgs / resident).ceil() * area / eff
        };
        *RING_TILES
            .iter()
            .filter(|t| t.is_valid(self.ring_kernel) && self.ring_fits(t))
            .min_by(|a, b| cost(a).total_cmp(&cost(b)))
            .unwrap_or(&RING_TILES[RING_TILES.len() - 1])
    }

    fn ring_fits(&self, t: &RingTile) -> bool {
        let lim = &self.gpu.limits;
        let (x, y) = if t.skinny { (t.threads(), 1) } else { (t.bn / t.tn, t.bm / t.tm) };
        t.threads() <= lim.max_compute_invocations_per_workgroup
            && x <= lim.max_compute_workgroup_size_x
            && y <= lim.max_compute_workgroup_size_y
            && t.shared_bytes() <= lim.max_compute_workgroup_storage_size
    }

    fn ring_pipeline(&self, key: RingKey) -> Result<Arc<wgpu::ComputePipeline>, EngineError> {
        let mut cache = self.ring_pipelines.lock().expect("pipeline cache poisoned");
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let label = format!("{} {:?}", key.tile.name(), key.kernel);
        let src = ring_wgsl(&key);
        let p =
            Arc::new(self.gpu.scoped("compile", || compile(&self.gpu.device, &self.pipeline_layout, &label, &src))?);
        cache.insert(key, p.clone());
        Ok(p)
    }
}
