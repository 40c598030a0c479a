//! cubek's matmul on the cells `gelo bench gpu --sections gemm` measures, on the same GPU:
//! the peer that decides whether the engine keeps its own WGSL kernels (docs/DEPENDENCIES.md).
//!
//! Each cell is `x (m×k) · Wᵀ` with `W` stored `n×k` row-major, as checkpoints store it and as
//! the engine keeps it resident: cubek reads it as a column-major `k×n` right-hand side.
//! cubek's `Strategy::Auto` is a fixed choice (its cyclic tensor-core routine, else the
//! one-unit-per-tile routine), not autotuning; the engine autotunes its plans per cell. So the
//! peer tunes cubek the same way: every routine cubek offers that launches on the device is
//! tried on the cell, and the fastest correct one is its figure (`--routines auto` times
//! `Auto` alone). Per routine:
//!
//! * `per_call_s`: one launch inside a profiling window (device timestamps where the runtime
//!   has them; the JSON says which), median of `--reps`;
//! * `steady_s`: `R` launches back to back in one window of about `--window-ms`, divided by
//!   `R` (the device busy, as the engine's `steady` and PyTorch's CUDA-event timing have it),
//!   median of `--windows`.
//!
//! Each routine's product is checked against a host reference on sampled entries first (into
//! a zeroed output of its own), so a routine that computes something else, or nothing, is
//! left out, not a fast number.
//!
//! Output: one JSON object per line (`--json`), and a markdown table on stdout.
//!
//! usage: cubek-peer [--models qwen3-0.6b,bert-base,qwen3-1.7b] [--m 16,128,512,2056]
//!                   [--dtypes f32,f16] [--routines all|auto] [--reps 7] [--windows 3]
//!                   [--window-ms 3] [--json FILE]

use std::{io::Write, time::Instant};

use cubecl::{
    Device, benchmark::TimingMethod, bytes::Bytes, device::WgpuDeviceKind, frontend::Scalar, prelude::*,
    std::tensor::TensorHandle,
};
use cubek::matmul::{
    definition::{MatmulElems, MatmulGlobalElems},
    launch::launch_ref,
    multi_level,
    strategy::Strategy,
    tiled,
};
use cubek::std::InputBinding;
use half::f16;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error>;

/// `(linear, k, n)` per model: the same table as `gelo bench gpu` and `torch_peer.py`.
fn linears(model: &str) -> Result<Vec<(&'static str, usize, usize)>, Error> {
    Ok(match model {
        "bert-base" => vec![("qkv", 768, 768), ("up", 768, 3072), ("down", 3072, 768)],
        "qwen3-0.6b" => vec![
            ("q", 1024, 2048),
            ("kv", 1024, 1024),
            ("o", 2048, 1024),
            ("gate_up", 1024, 3072),
            ("down", 3072, 1024),
        ],
        "qwen3-1.7b" => vec![("q_o", 2048, 2048), ("kv", 2048, 1024), ("gate_up", 2048, 6144), ("down", 6144, 2048)],
        other => return Err(format!("unknown model `{other}`").into()),
    })
}

struct Args {
    models: Vec<String>,
    m: Vec<usize>,
    dtypes: Vec<String>,
    routines: String,
    timing: Timing,
    json: Option<String>,
}

fn args() -> Result<Args, Error> {
    let mut a = Args {
        models: vec!["qwen3-0.6b".into(), "bert-base".into(), "qwen3-1.7b".into()],
        m: vec![16, 128, 512, 2056],
        dtypes: vec!["f32".into(), "f16".into()],
        routines: "all".into(),
        timing: Timing { reps: 7, windows: 3, window_s: 3e-3 },
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let list = || value.split(',').map(str::to_string).collect::<Vec<_>>();
        match flag.as_str() {
            "--models" => a.models = list(),
            "--m" => a.m = list().iter().map(|s| s.parse()).collect::<Result<_, _>>()?,
            "--dtypes" => a.dtypes = list(),
            "--routines" if value == "all" || value == "auto" => a.routines = value,
            "--reps" => a.timing.reps = value.parse()?,
            "--windows" => a.timing.windows = value.parse()?,
            "--window-ms" => a.timing.window_s = value.parse::<f64>()? * 1e-3,
            "--json" => a.json = Some(value),
            other => return Err(format!("unknown flag `{other}`").into()),
        }
    }
    Ok(a)
}

/// Deterministic values in [-1, 1): the cells need no particular distribution, only operands
/// the check can recompute.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The element type of a cell: `f32`, or `f16` operands and output with f32 accumulation.
#[derive(Clone, Copy)]
enum Dtype {
    F32,
    F16,
}

impl Dtype {
    fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "f32" => Ok(Dtype::F32),
            "f16" => Ok(Dtype::F16),
            other => Err(format!("unknown dtype `{other}` (f32, f16)").into()),
        }
    }

    fn elem(self) -> ElemType {
        match self {
            Dtype::F32 => f32::elem_type_native(),
            Dtype::F16 => f16::elem_type_native(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        }
    }

    /// Host values rounded to this type (what the device holds), and their bytes.
    fn upload(self, v: &[f32]) -> (Vec<f32>, Bytes) {
        match self {
            Dtype::F32 => (v.to_vec(), Bytes::from_elems(v.to_vec())),
            Dtype::F16 => {
                let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                (h.iter().map(|x| x.to_f32()).collect(), Bytes::from_elems(h))
            }
        }
    }

    /// Values from read-back bytes (little-endian, whatever their alignment).
    fn download(self, b: &[u8]) -> Vec<f32> {
        match self {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }
}

/// Every routine cubek 0.3.1 offers without extra configuration (blueprints inferred), and
/// `Auto` (first: `--routines auto` keeps it alone). Routines the device cannot run (TMA,
/// tensor cores for f32) refuse at launch.
fn strategies() -> Vec<Strategy> {
    use multi_level::Strategy as M;
    vec![
        Strategy::Auto,
        M::SimpleCyclicCmma(Default::default()).into(),
        M::SimpleCyclicMma(Default::default()).into(),
        M::SimpleStridedCmma(Default::default()).into(),
        M::SimpleTilewiseCmma(Default::default()).into(),
        M::SimpleAsyncCyclicCmma(Default::default()).into(),
        M::DoubleCyclicCmma(Default::default()).into(),
        M::DoubleCyclicMma(Default::default()).into(),
        M::DoubleTilewiseCmma(Default::default()).into(),
        M::DoubleHybridCmma(Default::default()).into(),
        M::OrderedDoubleCmma(Default::default()).into(),
        M::SpecializedStridedCmma(Default::default()).into(),
        M::SimpleUnit(Default::default()).into(),
        M::DoubleUnit(Default::default()).into(),
        M::SimpleVecMat(Default::default()).into(),
        M::DoubleVecMat(Default::default()).into(),
        M::GemvUnitPerpendicular(Default::default()).into(),
        M::Gemm(Default::default()).into(),
        M::Naive.into(),
        tiled::Strategy::Cmma(Default::default()).into(),
        tiled::Strategy::CpuGemm(Default::default()).into(),
    ]
}

/// One GEMM cell's resident operands on the device.
struct Cell {
    m: usize,
    k: usize,
    n: usize,
    dtype: Dtype,
    x: TensorHandle,
    /// `W` (`n×k` row-major) viewed as the `k×n` right-hand side, column-major.
    w: TensorHandle,
    host_x: Vec<f32>,
    host_w: Vec<f32>,
}

impl Cell {
    fn new(client: &Client, m: usize, k: usize, n: usize, dtype: Dtype, seed: u64) -> Self {
        let (host_x, xb) = dtype.upload(&values(m * k, seed));
        let (host_w, wb) = dtype.upload(&values(n * k, seed + 1));
        let x = TensorHandle::new_contiguous(vec![1, m, k], client.create(xb), dtype.elem());
        let w = TensorHandle::new(client.create(wb), vec![1, k, n], vec![n * k, 1, k], dtype.elem());
        Cell { m, k, n, dtype, x, w, host_x, host_w }
    }

    /// A zeroed output.
    fn output(&self, client: &Client) -> TensorHandle {
        let (_, zeros) = self.dtype.upload(&vec![0.0; self.m * self.n]);
        TensorHandle::new_contiguous(vec![1, self.m, self.n], client.create(zeros), self.dtype.elem())
    }

    /// One launch of `strategy` into `out`; the element types it settled on. A routine that
    /// panics on this device counts as refusing.
    fn launch(&self, client: &Client, strategy: &Strategy, out: &TensorHandle) -> Result<MatmulElems, Error> {
        let e = self.dtype.elem();
        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: e, rhs: e, out: e });
        let launched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            launch_ref(
                strategy,
                client,
                InputBinding::Normal(self.x.clone().binding(), e),
                InputBinding::Normal(self.w.clone().binding(), e),
                out.clone().binding(),
                &mut dtypes,
            )
        }))
        .map_err(|_| "panicked")?;
        launched.map_err(|err| format!("{err:?}"))?;
        Ok(dtypes)
    }

    /// Largest error of sampled entries against a host f64 reference, relative to the
    /// largest reference magnitude among them.
    fn check(&self, client: &Client, out: &TensorHandle) -> Result<f64, Error> {
        let got = self.dtype.download(&client.read_one(out.handle.clone())?);
        if got.len() < self.m * self.n {
            return Err(format!("read back {} values, expected {}", got.len(), self.m * self.n).into());
        }
        let (mut worst, mut scale) = (0f64, 0f64);
        for (i, j) in (0..64).map(|t| ((t * 7919) % self.m, (t * 104_729) % self.n)) {
            let want: f64 =
                (0..self.k).map(|p| self.host_x[i * self.k + p] as f64 * self.host_w[j * self.k + p] as f64).sum();
            worst = worst.max((got[i * self.n + j] as f64 - want).abs());
            scale = scale.max(want.abs());
        }
        Ok(worst / scale.max(1e-30))
    }

    /// Seconds of `launches` launches in one profiling window.
    fn profiled(
        &self,
        client: &Client,
        s: &Strategy,
        out: &TensorHandle,
        launches: usize,
    ) -> Result<(f64, TimingMethod), Error> {
        let (result, duration) = client
            .profile(
                || (0..launches).try_for_each(|_| self.launch(client, s, out).map(drop).map_err(|e| e.to_string())),
                "cubek-peer",
            )
            .map_err(|e| format!("profile: {e:?}"))?;
        result?;
        let method = duration.timing_method();
        let ticks = cubecl::future::block_on(duration.resolve()).ok_or("the profile returned no ticks")?;
        Ok((ticks.duration().as_secs_f64(), method))
    }

    /// Checks and times one routine; `None` where it refuses or computes something else.
    fn measure(&self, client: &Client, s: &Strategy, t: &Timing) -> Result<Option<Measured>, Error> {
        let out = self.output(client);
        let t0 = Instant::now();
        let Ok(elems) = self.launch(client, s, &out) else { return Ok(None) };
        cubecl::future::block_on(client.sync())?;
        let first_s = t0.elapsed().as_secs_f64();
        let err = self.check(client, &out)?;
        let limit = match self.dtype {
            Dtype::F32 => 1e-3,
            Dtype::F16 => 2e-2,
        };
        if err.is_nan() || err > limit {
            eprintln!(
                "{s}: m={} k={} n={} {}: relative error {err:e} over {limit:e}, left out",
                self.m,
                self.k,
                self.n,
                self.dtype.name()
            );
            return Ok(None);
        }
        for _ in 0..3 {
            self.launch(client, s, &out)?;
        }
        cubecl::future::block_on(client.sync())?;
        let per_call =
            median((0..t.reps).map(|_| self.profiled(client, s, &out, 1).map(|t| t.0)).collect::<Result<_, _>>()?);
        // About a window's worth of work, at least 4 launches.
        let launches = ((t.window_s / per_call.max(1e-7)) as usize).clamp(4, 2000);
        let mut timing = TimingMethod::System;
        let mut steady = Vec::new();
        for _ in 0..t.windows {
            let (t, how) = self.profiled(client, s, &out, launches)?;
            steady.push(t / launches as f64);
            timing = how;
        }
        Ok(Some(Measured { name: s.to_string(), per_call, steady: median(steady), timing, first_s, err, elems }))
    }
}

/// How each routine is timed.
struct Timing {
    reps: usize,
    windows: usize,
    window_s: f64,
}

struct Measured {
    name: String,
    per_call: f64,
    steady: f64,
    timing: TimingMethod,
    first_s: f64,
    err: f64,
    elems: MatmulElems,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let a = args()?;
    let mut out = match &a.json {
        Some(path) => Some(std::fs::File::create(path)?),
        None => None,
    };
    let mut record = |row: Value| -> Result<(), Error> {
        if let Some(f) = out.as_mut() {
            writeln!(f, "{row}")?;
        }
        Ok(())
    };
    // The discrete GPU on Vulkan (SPIR-V with the `spirv` feature, else WGSL); a software
    // rasterizer (lavapipe) only where there is none, to check the peer itself.
    let device = Device::vulkan(WgpuDeviceKind::DiscreteGpu(0))
        .or_else(|_| Device::vulkan(WgpuDeviceKind::Cpu))
        .map_err(|e| format!("no Vulkan device for cubecl: {e:?}"))?;
    let client = device.client();
    let runtime = client.name();
    println!("cubecl 0.11.3 / cubek 0.3.1 on {runtime} ({device:?})");
    record(json!({"section": "engine", "device": format!("{device:?}"), "runtime": runtime,
                  "cubecl": "0.11.3", "cubek": "0.3.1"}))?;
    println!(
        "\n| model | linear | k×n | m | dtype | routine | per call µs | steady µs | steady TFLOP/s \
         | Auto steady µs | timing | rel. err |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let dtypes = a.dtypes.iter().map(|d| Dtype::parse(d)).collect::<Result<Vec<_>, _>>()?;
    let mut candidates = strategies();
    if a.routines == "auto" {
        candidates.truncate(1);
    }
    let mut seed = 1;
    for model in &a.models {
        for (linear, k, n) in linears(model)? {
            for &dtype in &dtypes {
                for &m in &a.m {
                    seed += 2;
                    let cell = Cell::new(&client, m, k, n, dtype, seed);
                    let mut tried = Vec::new();
                    for s in &candidates {
                        if let Some(r) = cell.measure(&client, s, &a.timing)? {
                            tried.push(r);
                        }
                    }
                    let Some(best) = tried.iter().min_by(|a, b| a.steady.total_cmp(&b.steady)) else {
                        return Err(format!("{model} {linear} m={m} {}: no cubek routine ran", dtype.name()).into());
                    };
                    let auto = tried.iter().find(|r| r.name == Strategy::Auto.to_string()).map(|r| r.steady);
                    let flop = 2.0 * (m * k * n) as f64;
                    println!(
                        "| {model} | {linear} | {k}×{n} | {m} | {} | {} | {:.1} | {:.1} | {:.2} | {} | {} | {:.1e} |",
                        dtype.name(),
                        best.name,
                        best.per_call * 1e6,
                        best.steady * 1e6,
                        flop / best.steady * 1e-12,
                        auto.map_or("-".into(), |t| format!("{:.1}", t * 1e6)),
                        best.timing,
                        best.err
                    );
                    let e = &best.elems;
                    let routines: serde_json::Map<_, _> =
                        tried.iter().map(|r| (r.name.clone(), json!(r.steady))).collect();
                    record(json!({
                        "section": "gemm", "runtime": runtime, "model": model, "linear": linear,
                        "m": m, "k": k, "n": n, "dtype": dtype.name(), "routine": best.name,
                        "per_call_s": best.per_call, "steady_s": best.steady,
                        "tflops_steady": flop / best.steady * 1e-12,
                        "tflops_per_call": flop / best.per_call * 1e-12,
                        "auto_steady_s": auto, "timing": best.timing.to_string(),
                        "first_launch_s": best.first_s, "rel_err": best.err,
                        "register": format!("{}/{}/{}", e.lhs_register, e.rhs_register, e.acc_register),
                        "stage": format!("{}/{}", e.lhs_stage, e.rhs_stage),
                        "routines": routines,
                    }))?;
                }
            }
        }
    }
    Ok(())
}
