//! `gelo bench protocol`: masked/plain wall time of transformer-block linears on the CPU
//! engine, at the layer shapes of BERT-base, Qwen3-0.6B and Qwen3-1.7B; `gelo bench
//! engine`: raw engine products for a range of row counts. The shapes, provisioning and
//! pass timing here are shared with the GPU benchmark.

use std::{sync::Arc, time::Instant};

use anyhow::Result;
use kernels::CpuEngine;
use protocol::Engine;
use protocol::{Executor, MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor, UVerifyConfig};
use tensor::{Matrix, Weight, WeightId, WeightLayout};

#[derive(clap::Args)]
pub struct ProtocolArgs {
    /// Shapes: bert-base, qwen3-0.6b, qwen3-1.7b.
    #[arg(long, value_delimiter = ',', default_value = "bert-base,qwen3-0.6b,qwen3-1.7b")]
    shapes: Vec<String>,
    /// Rows per pass.
    #[arg(long, value_delimiter = ',', default_value = "32,128,512,2048")]
    n: Vec<usize>,
    /// Blocks per forward pass (one mask is sampled per pass).
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Masks to compare: haar, hd3, auto.
    #[arg(long, value_delimiter = ',', default_value = "haar,hd3,auto")]
    masks: Vec<MaskKind>,
    /// Also run every masked cell with U-Verify (k probes, L = 3).
    #[arg(long, default_value_t = 2)]
    verify_probes: usize,
}

/// Offload groups of one block: (input width, [output widths sharing that input]).
pub(crate) struct Shape {
    pub(crate) name: &'static str,
    pub(crate) groups: Vec<(usize, Vec<usize>)>,
}

pub(crate) fn shape(name: &str) -> Result<Shape> {
    let (name, d, q, kv, ff, gated) = match name {
        "bert-base" => ("bert-base", 768, 768, 768, 3072, false),
        "qwen3-0.6b" => ("qwen3-0.6b", 1024, 2048, 1024, 3072, true),
        "qwen3-1.7b" => ("qwen3-1.7b", 2048, 2048, 1024, 6144, true),
        other => anyhow::bail!("unknown shape {other}"),
    };
    let ffn_in = if gated { vec![ff, ff] } else { vec![ff] };
    Ok(Shape { name, groups: vec![(d, vec![q, kv, kv]), (q, vec![d]), (d, ffn_in), (ff, vec![d])] })
}

pub(crate) fn provision(exec: &dyn Executor, shape: &Shape) -> Result<Vec<Vec<WeightId>>> {
    let mut ids = Vec::new();
    for (g, (d_in, outs)) in shape.groups.iter().enumerate() {
        let mut group = Vec::new();
        for (j, &d_out) in outs.iter().enumerate() {
            let id = WeightId::new(format!("g{g}.{j}"));
            let data: Vec<f32> =
                (0..d_in * d_out).map(|i| ((i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0) * 1e-5).collect();
            exec.provision(id.clone(), Weight::f32(*d_in, d_out, WeightLayout::OutIn, data))?;
            group.push(id);
        }
        ids.push(group);
    }
    Ok(ids)
}

/// One forward pass of `blocks` blocks of the shape's linears on `n` rows; returns seconds
/// per block.
fn one_pass(
    exec: &dyn Executor,
    shape: &Shape,
    ids: &[Vec<WeightId>],
    inputs: &[Matrix],
    n: usize,
    blocks: usize,
) -> Result<f64> {
    let t = Instant::now();
    let mut pass = exec.begin(&[n])?;
    for _ in 0..blocks {
        for (x, group) in inputs.iter().zip(ids) {
            pass.linear_many(x, group)?;
        }
    }
    pass.end();
    debug_assert_eq!(inputs.len(), shape.groups.len());
    Ok(t.elapsed().as_secs_f64() / blocks as f64)
}

fn inputs(shape: &Shape, n: usize) -> Vec<Matrix> {
    shape
        .groups
        .iter()
        .map(|(d_in, _)| Matrix::from_fn(n, *d_in, |r, c| (((r * 131 + c * 7) % 251) as f32 - 125.0) / 125.0))
        .collect()
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds per block of one warm-up and `reps` timed passes, run on rayon's pool as
/// the models' passes are (`models::on_pool`).
pub(crate) fn time_pass(
    exec: &dyn Executor,
    shape: &Shape,
    ids: &[Vec<WeightId>],
    n: usize,
    blocks: usize,
    reps: usize,
) -> Result<f64> {
    let x = inputs(shape, n);
    models::on_pool(|| {
        one_pass(exec, shape, ids, &x, n, blocks)?; // warm-up
        Ok(median((0..reps).map(|_| one_pass(exec, shape, ids, &x, n, blocks)).collect::<Result<Vec<_>>>()?))
    })
}

/// Times several executors on the same passes in turn (one warm-up each, then `reps`
/// rounds of one pass each), so drift of the machine hits them alike; medians per executor.
fn time_interleaved(
    cells: &[(&dyn Executor, &[Vec<WeightId>])],
    shape: &Shape,
    n: usize,
    blocks: usize,
    reps: usize,
) -> Result<Vec<f64>> {
    let x = inputs(shape, n);
    for (exec, ids) in cells {
        one_pass(*exec, shape, ids, &x, n, blocks)?;
    }
    let mut times = vec![Vec::with_capacity(reps); cells.len()];
    for _ in 0..reps {
        for (t, (exec, ids)) in times.iter_mut().zip(cells) {
            t.push(one_pass(*exec, shape, ids, &x, n, blocks)?);
        }
    }
    Ok(times.into_iter().map(median).collect())
}

pub fn protocol(a: ProtocolArgs) -> Result<()> {
    println!(
        "| shape | n | plain ms/block | mask | masked ms/block | ratio | + U-Verify k={} ms | ratio | U-Verify adds |",
        a.verify_probes
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for name in &a.shapes {
        let shape = shape(name)?;
        let engine: Arc<dyn Engine> = Arc::new(CpuEngine::new());
        let plain = PlaintextExecutor::new(engine.clone());
        let plain_ids = provision(&plain, &shape)?;
        let mut masked = Vec::new();
        for &mask in &a.masks {
            for verify in [None, Some(UVerifyConfig { probes: a.verify_probes, range: 3 })] {
                if verify.is_some() && a.verify_probes == 0 {
                    continue;
                }
                let cfg = MaskedConfig { mask, verify, ..Default::default() };
                // Each executor gets its own engine so weight ids do not collide.
                let exec = MaskedExecutor::new(Arc::new(CpuEngine::new()), cfg)?;
                let ids = provision(&exec, &shape)?;
                masked.push((mask, verify.is_some(), exec, ids));
            }
        }
        for &n in &a.n {
            let reps = if n >= 1024 { a.reps.min(3) } else { a.reps };
            for &mask in &a.masks {
                let cell = |v: bool| masked.iter().find(|(m, vv, _, _)| *m == mask && *vv == v);
                let (_, _, exec, ids) = cell(false).expect("configured");
                let mut cells: Vec<(&dyn Executor, &[Vec<WeightId>])> = vec![(&plain, &plain_ids), (exec, ids)];
                if let Some((_, _, exec_v, ids_v)) = cell(true) {
                    cells.push((exec_v, ids_v));
                }
                let t = time_interleaved(&cells, &shape, n, a.blocks, reps)?;
                let (tv, rv, added) = match t.get(2) {
                    Some(tv) => (
                        format!("{:.2}", tv * 1e3),
                        format!("{:.3}", tv / t[0]),
                        format!("{:+.1}%", 100.0 * (tv / t[1] - 1.0)),
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                println!(
                    "| {} | {n} | {:.2} | {mask:?} | {:.2} | {:.3} | {tv} | {rv} | {added} |",
                    shape.name,
                    t[0] * 1e3,
                    t[1] * 1e3,
                    t[1] / t[0]
                );
            }
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct EngineArgs {
    /// Engine spec (cpu, vulkan, vulkan:N).
    #[arg(long, default_value = "cpu")]
    engine: String,
    #[arg(long, default_value_t = 576)]
    d_in: usize,
    #[arg(long, default_value_t = 1536)]
    d_out: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,2,8,9,16,32,128")]
    m: Vec<usize>,
    #[arg(long, default_value_t = 50)]
    reps: usize,
}

pub fn engine(a: EngineArgs) -> Result<()> {
    let engine = kernels_wgpu::open_engine(&a.engine)?;
    let data: Vec<f32> = (0..a.d_in * a.d_out).map(|i| ((i % 97) as f32 - 48.0) * 1e-3).collect();
    let id = WeightId::new("w");
    engine.register(id.clone(), Weight::f32(a.d_in, a.d_out, WeightLayout::OutIn, data))?;
    println!("| m | µs/product | GFLOP/s |");
    println!("|---|---|---|");
    for &m in &a.m {
        let x = protocol::danger::expose_plaintext(Matrix::from_fn(m, a.d_in, |r, c| ((r + c) % 13) as f32 * 0.1));
        engine.matmul(&x, &id)?;
        let t = Instant::now();
        for _ in 0..a.reps {
            engine.matmul(&x, &id)?;
        }
        let s = t.elapsed().as_secs_f64() / a.reps as f64;
        println!("| {m} | {:.1} | {:.1} |", s * 1e6, 2.0 * (m * a.d_in * a.d_out) as f64 / s / 1e9);
    }
    Ok(())
}
