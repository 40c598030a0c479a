//! A call as the device sees it ([`Job`]): its dispatches, parameter blocks, operands and
//! result places, built for products by resident weights, dynamic products and the row
//! softmax; and the GEMM pipelines, compiled on first use.

use std::sync::Arc;

use protocol::{
    EngineError, Masked,
    engine::{check_operand, dynamic_shape},
};
use tensor::{Matrix, WeightId, WeightLayout};

use super::{
    WgpuEngine, compile,
    plan::{Plan, splits_evenly},
    ring::GpuRing,
};
use crate::{
    shaders::{self, GemmKey, GemmParams, PARAMS_BYTES, REDUCE_THREADS, ReduceParams, SoftmaxParams, Tile, WeightType},
    weights::GpuWeight,
};

/// Which buffer a GEMM reads `W` from: a resident weight, a resident int8 weight of the
/// ring products, or the call's own operands.
#[derive(Clone)]
pub(super) enum WSource {
    Weight(Arc<GpuWeight>),
    Ring(Arc<GpuRing>),
    Input,
}

impl WSource {
    pub(super) fn key(&self) -> u64 {
        match self {
            WSource::Weight(w) => w.serial,
            WSource::Ring(w) => w.serial,
            WSource::Input => 0,
        }
    }
}

pub(super) struct Dispatch {
    pub(super) pipeline: Arc<wgpu::ComputePipeline>,
    pub(super) w: WSource,
    pub(super) groups: (u32, u32, u32),
}

/// One call as the device sees it.
pub(super) struct Job<'a> {
    pub(super) op: &'static str,
    pub(super) params: Vec<u8>,
    pub(super) dispatches: Vec<Dispatch>,
    pub(super) inputs: Vec<&'a [f32]>,
    /// `(offset, rows, cols)` of each result in the output buffer, in elements.
    pub(super) outputs: Vec<(usize, usize, usize)>,
    /// Elements of results, read back.
    pub(super) out_len: usize,
    /// Elements of split-K partials after the results, never read back.
    pub(super) scratch_len: usize,
    /// Times the dispatches run back to back in the one pass (1 for a call; more only to
    /// time kernels on a busy device: every dispatch overwrites what it writes, so the
    /// results are those of one run).
    pub(super) repeat: u32,
}

pub(super) fn to_u32(op: &'static str, v: usize) -> Result<u32, EngineError> {
    u32::try_from(v).map_err(|_| EngineError::Shape {
        op,
        detail: format!("an offset of {v} elements exceeds what one call can address"),
    })
}

pub(super) fn ceil_div(a: usize, b: u32) -> usize {
    a.div_ceil(b as usize)
}

impl WgpuEngine {
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

    pub(super) fn dynamic_call(
        &self,
        pairs: &[(&Masked, &Masked)],
        transpose_b: bool,
    ) -> Result<Vec<Matrix>, EngineError> {
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

    /// The job of `x · W` for every weight, `tiles[i]` for the i-th.
    /// The plan of each product of `x` by `ws` (tuning classes seen for the first time).
    /// The job of `x · W_id` for every id, `None` for no ids.
    pub(super) fn products_job<'a>(&self, x: &'a Masked, ids: &[WeightId]) -> Result<Option<Job<'a>>, EngineError> {
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

    pub(super) fn many_job<'a>(
        &self,
        x: &'a Masked,
        ws: &[Arc<GpuWeight>],
        plans: &[Plan],
    ) -> Result<Job<'a>, EngineError> {
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

    /// The job of a row softmax of `x`, scaled by `scale`.
    pub(super) fn softmax_job<'a>(&self, x: &'a Masked, scale: f32) -> Result<Job<'a>, EngineError> {
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
        Ok(Job {
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
        })
    }
}
