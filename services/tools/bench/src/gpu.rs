//! `gelo bench gpu`: the Vulkan engine on one GPU, in one process.
//!
//! Sections (`--sections`):
//! * `gemm`: engine GEMM throughput per weight shape of Qwen3-0.6B, BGE-base and
//!   Qwen3-1.7B, for several row counts, with f32 and f16 weights. Kernel time comes from
//!   GPU timestamps, per call and "steady" (the kernels repeated back to back in one
//!   submission, as the PyTorch peer's timing loop keeps its GPU busy); call time adds the
//!   upload of `x`, the read-back and the driver.
//! * `tiles`: every tile at every GEMM cell, to see what autotuning chooses among.
//! * `roundtrip`: the decode-shape call (upload + product + read-back) at m = 1 and 16,
//!   from one thread and from several at once.
//! * `blocks`: a transformer block's linears plain vs masked (GELO) through
//!   `protocol::MaskedExecutor` on this engine, with where the masked time goes.
//! * `ring`: the ring products of `dual-lpn` (`x·W_q mod 2^32`, int8 weights) per linear
//!   shape and row count, with each ring kernel (`u32`, `dot4`), checked bit for bit.
//!
//! Whole-model forwards (masked BERT-base / Qwen3-0.6B embedding at batch 32, Qwen3-1.7B
//! decode) are `gelo bench model`.
//!
//! `scripts/gpu/torch_peer.py` measures the same cells through PyTorch on the same GPU;
//! `scripts/gpu/report.py` joins both JSON files into the tables of `docs/BENCHMARKS.md`.

use std::{fs::File, io::Write, path::PathBuf, sync::Arc, time::Instant};

use anyhow::{Context, Result};
use kernels_wgpu::{CallStats, Plan, RingKernel, WgpuConfig, WgpuEngine};
use protocol::{Engine, Masked, danger};
use protocol::{MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor};
use serde_json::{Value, json};
use tensor::{Matrix, Precision, Weight, WeightData, WeightId, WeightLayout, ring::RingWeight};

use crate::linears as bench;

#[derive(clap::Args)]
pub struct Args {
    /// Engine: `vulkan`, `vulkan:N` or `vulkan:<name substring>`.
    #[arg(long, default_value = "vulkan")]
    engine: String,
    /// What to run: gemm, tiles, roundtrip, blocks, ring.
    #[arg(long, value_delimiter = ',', default_value = "gemm,roundtrip,blocks")]
    sections: Vec<String>,
    /// Models whose layer shapes are measured: qwen3-0.6b, bert-base, qwen3-1.7b, qwen3-1.7b-lm-head.
    #[arg(long, value_delimiter = ',', default_value = "qwen3-0.6b,bert-base,qwen3-1.7b")]
    models: Vec<String>,
    /// Rows of the GEMM operand.
    #[arg(long, value_delimiter = ',', default_value = "16,128,512,2056")]
    m: Vec<usize>,
    /// Weight storage in the GEMM sections: f32, f16.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    weights: Vec<String>,
    /// Timed repetitions per GEMM cell (the median is reported).
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// Rows per sequence in the block section.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512")]
    n: Vec<usize>,
    /// Blocks per forward pass in the block section.
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Threads issuing decode calls at once in the round-trip section.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Write every measurement here as one JSON object per line.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the GPU busy this long before each section, so that it is measured at its
    /// working clocks rather than ramping up from idle (skipped on software adapters).
    #[arg(long, default_value_t = 2000)]
    warmup_ms: u64,
    /// Let the engine use the matrix units (cooperative matrices, f16 operands) where the
    /// device has them.
    #[arg(long)]
    tensor_cores: bool,
}

/// `(name, k, n)` of each distinct linear of a model's block (`x·W`, `W` of `k×n`).
fn linears(model: &str) -> Result<Vec<(&'static str, usize, usize)>> {
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
        // The decode step's largest product (tied embeddings, 151,936 tokens); its own
        // name so the peer tables, which lack it, still join.
        "qwen3-1.7b-lm-head" => vec![("lm_head", 2048, 151_936)],
        other => anyhow::bail!("unknown model shape {other}"),
    })
}

fn random_matrix(rows: usize, cols: usize, seed: u64) -> Matrix {
    // A cheap LCG: the values only need to be varied and of unit scale.
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    Matrix::from_fn(rows, cols, |_, _| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

fn weight(k: usize, n: usize, storage: &str, seed: u64) -> Result<Weight> {
    let data = random_matrix(n, k, seed).into_vec();
    let data = match storage {
        "f32" => WeightData::F32(data.into()),
        "f16" => WeightData::F16(data.iter().map(|&v| half::f16::from_f32(v * 0.05)).collect()),
        "bf16" => WeightData::Bf16(data.iter().map(|&v| half::bf16::from_f32(v * 0.05)).collect()),
        other => anyhow::bail!("unknown weight storage {other}"),
    };
    // PyTorch / GGUF order, as checkpoints arrive.
    Ok(Weight { d_in: k, d_out: n, layout: WeightLayout::OutIn, data })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct Out {
    json: Option<File>,
}

impl Out {
    fn record(&mut self, v: Value) -> Result<()> {
        if let Some(f) = &mut self.json {
            writeln!(f, "{v}")?;
            f.flush()?;
        }
        Ok(())
    }
}

/// Timings of one benchmark cell: medians over the timed calls, plus the spread of the
/// kernel time and where the call time went (means).
struct Timing {
    gpu: f64,
    gpu_min: f64,
    gpu_max: f64,
    wall: f64,
    host: f64,
    wait: f64,
    readback: f64,
}

/// Steady-state kernel time of `x · W[id]` (median of five submissions, each repeating the
/// kernels for about 5 ms of GPU time; `per_call` is one run's kernel time, to size them).
/// NaN without GPU timestamps.
fn steady_seconds(engine: &WgpuEngine, x: &Masked, id: &WeightId, per_call: f64) -> Result<f64> {
    if !per_call.is_finite() {
        return Ok(f64::NAN);
    }
    let repeat = (5e-3 / per_call.max(1e-7)).clamp(3.0, 64.0) as u32;
    let mut runs = Vec::with_capacity(5);
    for _ in 0..5 {
        match engine.steady_kernel_seconds(x, id, repeat)?.1 {
            Some(s) => runs.push(s),
            None => return Ok(f64::NAN),
        }
    }
    Ok(median(&mut runs))
}

/// Times `call` `reps` times after one warm-up.
fn time_calls(engine: &WgpuEngine, reps: usize, mut call: impl FnMut() -> Result<()>) -> Result<Timing> {
    call()?;
    let (mut gpu, mut wall) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let start = engine.stats();
    for _ in 0..reps {
        let before = engine.stats();
        let t = Instant::now();
        call()?;
        wall.push(t.elapsed().as_secs_f64());
        let after = engine.stats();
        if after.gpu_timed_calls > before.gpu_timed_calls {
            gpu.push((after.gpu_ns - before.gpu_ns) as f64 * 1e-9);
        }
    }
    let end = engine.stats();
    let calls = (end.calls - start.calls).max(1) as f64;
    let mean = |a: u64, b: u64| (a - b) as f64 * 1e-9 / calls;
    let (g, lo, hi) =
        if gpu.is_empty() { (f64::NAN, f64::NAN, f64::NAN) } else { (median(&mut gpu), gpu[0], gpu[gpu.len() - 1]) };
    Ok(Timing {
        gpu: g,
        gpu_min: lo,
        gpu_max: hi,
        wall: median(&mut wall),
        host: mean(end.host_ns, start.host_ns),
        wait: mean(end.wait_ns, start.wait_ns),
        readback: mean(end.readback_ns, start.readback_ns),
    })
}

pub fn run(a: Args) -> Result<()> {
    let cfg = WgpuConfig { tensor_cores: a.tensor_cores, ..WgpuConfig::default() };
    let engine = Arc::new(WgpuEngine::open(&a.engine, cfg)?);
    let info = engine.info();
    let host_threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "engine: {} | driver {} | memory {} MiB | GPU timestamps: {} | host threads: {host_threads}",
        info.device,
        info.driver,
        info.memory_bytes.map_or("?".into(), |b| (b >> 20).to_string()),
        engine.has_gpu_timestamps()
    );
    let mut out = Out { json: a.json.as_ref().map(File::create).transpose().context("--json")? };
    out.record(json!({"section": "engine", "device": info.device, "driver": info.driver,
        "memory_bytes": info.memory_bytes, "timestamps": engine.has_gpu_timestamps(), "host_threads": host_threads,
        "operand_precision": format!("{:?}", info.operand_precision)}))?;
    if a.tensor_cores && info.operand_precision != Precision::F16 {
        println!("tensor cores: not available on this adapter (no usable cooperative matrices); FMA kernels only");
    }
    for section in &a.sections {
        warm_up(&engine, a.warmup_ms)?;
        let t = Instant::now();
        match section.as_str() {
            "gemm" => gemm(&engine, &a, &mut out, false)?,
            "tiles" => gemm(&engine, &a, &mut out, true)?,
            "roundtrip" => roundtrip(&engine, &a, &mut out)?,
            "blocks" => blocks(&a, &mut out)?,
            "ring" => ring(&a, &mut out)?,
            other => anyhow::bail!("unknown section {other} (gemm, tiles, roundtrip, blocks, ring)"),
        }
        eprintln!("section {section}: {:.1} s", t.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Ring products (`dual-lpn`): `x·W_q mod 2^32` with each ring kernel (an engine of its
/// own) at every linear shape and row count; GPU and call time, each cell checked bit for
/// bit against the CPU's product on its first rows.
fn ring(a: &Args, out: &mut Out) -> Result<()> {
    println!("\n### Ring products (dual-lpn): `x (m×k, u32) · W_q (k×n, int8) mod 2^32`, W_q resident\n");
    println!("| model | linear | k×n | m | kernel | GPU µs | Top/s (GPU) | call µs | Top/s (call) | exact |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut inexact = 0;
    for kernel in [RingKernel::U32, RingKernel::Dot4] {
        let cfg = WgpuConfig { tensor_cores: a.tensor_cores, ring_kernel: Some(kernel), ..WgpuConfig::default() };
        let engine = WgpuEngine::open(&a.engine, cfg)?;
        warm_up(&engine, a.warmup_ms)?;
        for model in &a.models {
            for (name, k, n) in linears(model)? {
                let id = WeightId::new(format!("ring.{model}.{name}"));
                let w = Arc::new(RingWeight::quantize(&weight(k, n, "f32", (k * 31 + n) as u64)?)?);
                engine.register_ring(id.clone(), w.clone())?;
                let ids = std::slice::from_ref(&id);
                for &m in &a.m {
                    let mut s = m as u32 | 1;
                    let words: Vec<u32> = (0..m * k)
                        .map(|_| {
                            s ^= s << 13;
                            s ^= s >> 17;
                            s ^= s << 5;
                            s
                        })
                        .collect();
                    let head = m.min(8);
                    let want = w.product(&words[..head * k], head);
                    let x = danger::expose_ring(m, k, words);
                    let tm = time_calls(&engine, a.reps, || {
                        engine.ring_matmul_many(&x, ids)?;
                        Ok(())
                    })?;
                    let got = engine.ring_matmul_many(&x, ids)?.pop().unwrap_or_default();
                    let exact = got.get(..head * n) == Some(&want[..]);
                    inexact += usize::from(!exact);
                    let ops = 2.0 * (m * k * n) as f64;
                    println!(
                        "| {model} | {name} | {k}×{n} | {m} | {kernel:?} | {:.1} | {:.2} | {:.1} | {:.2} | {exact} |",
                        tm.gpu * 1e6,
                        ops / tm.gpu * 1e-12,
                        tm.wall * 1e6,
                        ops / tm.wall * 1e-12
                    );
                    out.record(json!({"section": "ring", "model": model, "linear": name, "m": m, "k": k, "n": n,
                        "kernel": format!("{kernel:?}"), "gpu_s": tm.gpu, "call_s": tm.wall, "host_s": tm.host,
                        "wait_s": tm.wait, "readback_s": tm.readback, "exact": exact}))?;
                }
                engine.unregister(&id)?;
            }
        }
    }
    anyhow::ensure!(inexact == 0, "{inexact} ring cells differ from the CPU's product");
    Ok(())
}

/// Sustained GEMMs for `ms` milliseconds: an idle GPU sits at low clocks, and the engine's
/// calls, separated by host work, do not by themselves keep it boosted.
fn warm_up(engine: &WgpuEngine, ms: u64) -> Result<()> {
    if ms == 0 || engine.adapter().device_type == kernels_wgpu::DeviceType::Cpu {
        return Ok(());
    }
    let id = WeightId::new("bench.warmup");
    engine.register(id.clone(), weight(2048, 2048, "f32", 1)?)?;
    let x = danger::expose_plaintext(random_matrix(2048, 2048, 2));
    let t = Instant::now();
    while t.elapsed().as_millis() < u128::from(ms) {
        engine.matmul(&x, &id)?;
    }
    engine.unregister(&id)?;
    Ok(())
}

fn gemm(engine: &WgpuEngine, a: &Args, out: &mut Out, sweep: bool) -> Result<()> {
    println!(
        "\n### Engine GEMM{}: `x (m×k) · W (k×n)`, W resident (OutIn), x uploaded per call\n",
        if sweep { ", every tile" } else { "" }
    );
    println!("Every cell is checked: `rel err` compares the first rows with the CPU engine.\n");
    println!(
        "| model | linear | k×n | m | weights | plan | GPU µs | TFLOP/s (GPU) | steady GPU µs | TFLOP/s (steady) | call µs | TFLOP/s (call) | rel err |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worst = 0.0f64;
    for model in &a.models {
        for (name, k, n) in linears(model)? {
            for storage in &a.weights {
                let id = WeightId::new(format!("gemm.{model}.{name}.{storage}"));
                let w = weight(k, n, storage, (k * 31 + n) as u64)?;
                let w_nk = Matrix::from_vec(n, k, w.data.to_f32().to_vec())?;
                engine.register(id.clone(), w)?;
                for &m in &a.m {
                    let xm = random_matrix(m, k, m as u64);
                    let head = xm.slice_rows(0, m.min(8));
                    let reference = tensor::cpu::matmul(&head, &w_nk, true);
                    let x = danger::expose_plaintext(xm);
                    let plans: Vec<Option<Plan>> = if sweep {
                        let mut v = Vec::new();
                        for &t in engine.tiles() {
                            // A few-row tile only for its own row class.
                            if t.skinny && t.bm as usize != m.next_power_of_two() {
                                continue;
                            }
                            v.push(Some(Plan::new(t)));
                            if m <= 512 {
                                let most = if t.bm <= 32 { 8 } else { 4 };
                                v.extend(
                                    [2, 4, 8]
                                        .into_iter()
                                        .filter(|&s| s <= most)
                                        .map(|splits| Some(Plan { tile: t, splits })),
                                );
                            }
                        }
                        v
                    } else {
                        vec![None]
                    };
                    for pinned in plans {
                        engine.pin(pinned)?;
                        let tm = time_calls(engine, a.reps, || {
                            engine.matmul(&x, &id)?;
                            Ok(())
                        })?;
                        let prec = if storage == "f16" { Precision::F16 } else { Precision::F32 };
                        let plan = pinned
                            .or_else(|| engine.tuned_plan(m, k, n, WeightLayout::OutIn, prec))
                            .unwrap_or_else(|| Plan::new(engine.model_tile(m, n, 1)));
                        let got = engine.matmul(&x, &id)?.slice_rows(0, head.rows());
                        let err = got.rel_err(&reference);
                        worst = worst.max(err);
                        let (g, w) = (tm.gpu, tm.wall);
                        let steady = steady_seconds(engine, &x, &id, g)?;
                        let flop = 2.0 * (m * k * n) as f64;
                        println!(
                            "| {model} | {name} | {k}×{n} | {m} | {storage} | {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {err:.1e} |",
                            plan.name(),
                            g * 1e6,
                            flop / g * 1e-12,
                            steady * 1e6,
                            flop / steady * 1e-12,
                            w * 1e6,
                            flop / w * 1e-12
                        );
                        out.record(
                            json!({"section": if sweep {"tiles"} else {"gemm"}, "model": model, "linear": name,
                            "m": m, "k": k, "n": n, "weights": storage, "tile": plan.name(),
                            "gpu_s": g, "gpu_min_s": tm.gpu_min, "gpu_max_s": tm.gpu_max, "call_s": w,
                            "host_s": tm.host, "wait_s": tm.wait, "readback_s": tm.readback,
                            "gpu_steady_s": steady, "tflops_steady": flop / steady * 1e-12,
                            "tflops_gpu": flop / g * 1e-12, "tflops_call": flop / w * 1e-12, "rel_err": err}),
                        )?;
                    }
                    engine.pin(None)?;
                }
                engine.unregister(&id)?;
            }
        }
    }
    // f32 products of length ≤ 6144 agree with the CPU far below 1e-4, f16 operands (tensor
    // cores) near 1e-3; anything above is a wrong kernel, not rounding.
    let bound = if engine.info().operand_precision == Precision::F16 { 1e-2 } else { 1e-4 };
    anyhow::ensure!(worst < bound, "engine products differ from the CPU engine: worst relative error {worst:e}");
    Ok(())
}

fn roundtrip(engine: &Arc<WgpuEngine>, a: &Args, out: &mut Out) -> Result<()> {
    let (k, n) = (2048, 4096);
    println!("\n### Decode-shape round trip: upload x (m×{k}) + product with resident W ({k}×{n}) + read back\n");
    println!("| m | weights | threads | median µs | p10 µs | p90 µs | GPU µs | calls/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for storage in ["f32", "f16"] {
        let id = WeightId::new(format!("decode.{storage}"));
        engine.register(id.clone(), weight(k, n, storage, 7)?)?;
        for m in [1usize, 16] {
            let x = danger::expose_plaintext(random_matrix(m, k, 3));
            for _ in 0..20 {
                engine.matmul(&x, &id)?;
            }
            // One caller: latency distribution.
            let reps = 300;
            let mut lat = Vec::with_capacity(reps);
            engine.reset_stats();
            for _ in 0..reps {
                let t = Instant::now();
                engine.matmul(&x, &id)?;
                lat.push(t.elapsed().as_secs_f64());
            }
            let st = engine.stats();
            let gpu = gpu_per_call(&st);
            let total: f64 = lat.iter().sum();
            let (med, p10, p90) = (median(&mut lat), percentile(&mut lat, 0.1), percentile(&mut lat, 0.9));
            println!(
                "| {m} | {storage} | 1 | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                med * 1e6,
                p10 * 1e6,
                p90 * 1e6,
                gpu * 1e6,
                reps as f64 / total
            );
            out.record(json!({"section": "roundtrip", "m": m, "k": k, "n": n, "weights": storage, "threads": 1,
                "median_s": med, "p10_s": p10, "p90_s": p90, "gpu_s": gpu, "calls_per_s": reps as f64 / total,
                "host_s": st.host_ns as f64 * 1e-9 / st.calls as f64, "wait_s": st.wait_ns as f64 * 1e-9 / st.calls as f64,
                "readback_s": st.readback_ns as f64 * 1e-9 / st.calls as f64}))?;
            // Several callers at once: do uploads, kernels and read-backs overlap?
            let per = 150;
            engine.reset_stats();
            let t = Instant::now();
            let lats: Vec<Vec<f64>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..a.threads)
                    .map(|_| {
                        s.spawn(|| -> Result<Vec<f64>> {
                            let mut l = Vec::with_capacity(per);
                            for _ in 0..per {
                                let t = Instant::now();
                                engine.matmul(&x, &id)?;
                                l.push(t.elapsed().as_secs_f64());
                            }
                            Ok(l)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("bench thread panicked")).collect::<Result<Vec<_>>>()
            })?;
            let elapsed = t.elapsed().as_secs_f64();
            let mut all: Vec<f64> = lats.into_iter().flatten().collect();
            let st = engine.stats();
            let calls = all.len() as f64;
            let (med, p10, p90) = (median(&mut all), percentile(&mut all, 0.1), percentile(&mut all, 0.9));
            println!(
                "| {m} | {storage} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                a.threads,
                med * 1e6,
                p10 * 1e6,
                p90 * 1e6,
                gpu_per_call(&st) * 1e6,
                calls / elapsed
            );
            out.record(json!({"section": "roundtrip", "m": m, "k": k, "n": n, "weights": storage, "threads": a.threads,
                "median_s": med, "p10_s": p10, "p90_s": p90, "gpu_s": gpu_per_call(&st), "calls_per_s": calls / elapsed}))?;
        }
        engine.unregister(&id)?;
    }
    Ok(())
}

fn gpu_per_call(st: &CallStats) -> f64 {
    if st.gpu_timed_calls == 0 {
        return f64::NAN;
    }
    st.gpu_ns as f64 * 1e-9 / st.gpu_timed_calls as f64
}

fn blocks(a: &Args, out: &mut Out) -> Result<()> {
    println!("\n### Block linears plain vs masked (GELO, Auto mask, k = 8 shield rows), Vulkan engine\n");
    println!(
        "Per block (QKV, O, gate+up, down); masked time split into engine calls (upload, kernels, read-back) and TEE CPU work (mask, shield, recover).\n"
    );
    println!("| model | n | plain ms | masked ms | ratio | engine ms | of which GPU kernels ms | TEE CPU ms |");
    println!("|---|---|---|---|---|---|---|---|");
    let reps = 5;
    for model in &a.models {
        let shape = bench::shape(model)?;
        // Separate devices, so the two executors' weight ids do not collide.
        let plain_engine = Arc::new(WgpuEngine::open(&a.engine, WgpuConfig::default())?);
        let masked_engine = Arc::new(WgpuEngine::open(&a.engine, WgpuConfig::default())?);
        let plain = PlaintextExecutor::new(plain_engine.clone() as Arc<dyn Engine>);
        let masked = MaskedExecutor::new(
            masked_engine.clone() as Arc<dyn Engine>,
            MaskedConfig { mask: MaskKind::Auto, ..Default::default() },
        )?;
        let plain_ids = bench::provision(&plain, &shape)?;
        let masked_ids = bench::provision(&masked, &shape)?;
        for &n in &a.n {
            let t_plain = bench::time_pass(&plain, &shape, &plain_ids, n, a.blocks, reps)?;
            // Warm the masked path first (Auto calibrates the engine, autotuning runs), so
            // the stats below cover steady-state passes only.
            bench::time_pass(&masked, &shape, &masked_ids, n, a.blocks, 1)?;
            masked_engine.reset_stats();
            let t0 = Instant::now();
            let t_masked = bench::time_pass(&masked, &shape, &masked_ids, n, a.blocks, reps)?;
            let wall = t0.elapsed();
            let st = masked_engine.stats();
            // time_pass runs one warm-up and `reps` timed passes of `blocks` blocks each.
            let blocks_run = ((reps + 1) * a.blocks) as f64;
            let engine_s = (st.host_ns + st.wait_ns + st.readback_ns) as f64 * 1e-9 / blocks_run;
            let gpu_s = st.gpu_ns as f64 * 1e-9 / blocks_run;
            let tee_s = wall.as_secs_f64() / blocks_run - engine_s;
            println!(
                "| {model} | {n} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} |",
                t_plain * 1e3,
                t_masked * 1e3,
                t_masked / t_plain,
                engine_s * 1e3,
                gpu_s * 1e3,
                tee_s * 1e3
            );
            out.record(json!({"section": "blocks", "model": model, "n": n, "plain_s": t_plain, "masked_s": t_masked,
                "ratio": t_masked / t_plain, "engine_s": engine_s, "gpu_s": gpu_s, "tee_s": tee_s,
                "bytes_up_per_block": st.bytes_up as f64 / blocks_run, "bytes_down_per_block": st.bytes_down as f64 / blocks_run}))?;
        }
    }
    Ok(())
}
