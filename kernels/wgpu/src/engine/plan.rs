//! How each product runs: the [`Plan`] (tile and K splits) chosen by pin, autotuning or the
//! tile cost model, the tuning classes products share, and the timed trials behind tuning.

use std::{sync::Arc, time::Instant};

use protocol::{
    EngineError, Masked,
    engine::{check_operand, dynamic_shape},
};
use tensor::{Matrix, Precision, WeightId, WeightLayout};

use super::{
    WgpuEngine,
    jobs::{Job, ceil_div},
};
use crate::{
    shaders::{self, TILES, Tile, WeightType},
    weights::{self, GpuWeight},
};

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
pub(super) fn splits_evenly(k: usize, s: u32) -> bool {
    let s = s as usize;
    s == 1 || (k.is_multiple_of(s) && (k / s).is_multiple_of(2) && k / s >= 64)
}

/// A class of products that share a tile choice: rows rounded up to a power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TuneKey {
    rows: usize,
    n: usize,
    k: usize,
    out_in: bool,
    wtype: WeightType,
    batch: usize,
}

/// GPU time an autotuning trial aims for, repeating a fast plan's kernels to get there.
const TRIAL_NS: u64 = 1_000_000;
/// At most this many repeats per trial (the shortest kernels take a few microseconds).
const TRIAL_MAX_REPEAT: u64 = 32;
/// Timed runs of every candidate plan, interleaved (the fastest counts).
const TRIAL_ROUNDS: usize = 2;

/// The tuning class of products of `m` rows: `m` itself where a tile of exactly that many
/// rows exists (9: one decode row under the default 8 shield rows; 36 and 72: four and
/// eight of them), else the next power of two.
fn row_class(m: usize) -> usize {
    let tiles = TILES.iter().chain(&shaders::SKINNY_TILES);
    if tiles.map(|t| t.bm as usize).any(|bm| bm == m) { m } else { m.next_power_of_two() }
}

impl WgpuEngine {
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
    pub(super) fn choose_plan<'a>(
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
    ) -> Result<(Matrix, Option<f64>), EngineError> {
        let w = self.weight(id)?;
        check_operand("matmul", x, w.d_in)?;
        let ws = [w];
        let plans = self.many_plans(x, &ws)?;
        let mut job = self.many_job(x, &ws, &plans)?;
        let repeat = repeat.max(1);
        job.repeat = repeat;
        let (mut out, gpu, _) = self.timed_execute(job)?;
        let secs = gpu.map(|ns| ns as f64 * 1e-9 / f64::from(repeat));
        Ok((out.pop().expect("one product"), secs))
    }

    /// Shape class of a dynamic call, for tuning: `None` when the pairs differ in shape.
    pub(super) fn dynamic_key(
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

    pub(super) fn many_plans(&self, x: &Masked, ws: &[Arc<GpuWeight>]) -> Result<Vec<Plan>, EngineError> {
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
}
