//! `gelo bench kernels`: the sealed path's int8 products on their own, per format, shape and
//! row count, against the machine's copy bandwidth: decode products read each weight byte
//! once, so bytes/s against a parallel copy's says how close to memory speed they run.
//! Weights are random blocks (real formats, finite scales), larger than the caches.
//! `F32` cells time the f32 GEMM (`tensor::cpu::linear`, a weight held `[out, in]` as
//! safetensors keep it) that BERT's products run on, in GFLOP/s against the same product in
//! PyTorch (`scripts/bench/torch_gemm.py`).

use std::time::Instant;

use anyhow::{Result, bail};
use rand::{RngExt, SeedableRng};
use tensor::{
    Matrix, WeightLayout,
    quant::{Isa, QuantFormat, QuantMatrix},
};

#[derive(clap::Args)]
pub struct KernelArgs {
    /// Formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; F32: the f32 GEMM).
    #[arg(long, value_delimiter = ',', default_value = "Q5_0,Q8_0,Q4_K,Q6_K")]
    formats: Vec<String>,
    /// Weight shapes as OUTxIN.
    #[arg(long, value_delimiter = ',', default_value = "4864x896,896x4864,151936x896")]
    shapes: Vec<String>,
    /// Activation row counts.
    #[arg(long, value_delimiter = ',', default_value = "1,8,512")]
    rows: Vec<usize>,
    /// Seconds per cell, at least.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Kernel set (default: the best this CPU runs).
    #[arg(long)]
    isa: Option<String>,
}

fn format(name: &str) -> Result<QuantFormat> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "Q4_0" => QuantFormat::Q4_0,
        "Q4_1" => QuantFormat::Q4_1,
        "Q5_0" => QuantFormat::Q5_0,
        "Q5_1" => QuantFormat::Q5_1,
        "Q8_0" => QuantFormat::Q8_0,
        "Q4_K" => QuantFormat::Q4_K,
        "Q5_K" => QuantFormat::Q5_K,
        "Q6_K" => QuantFormat::Q6_K,
        other => bail!("unknown format {other}"),
    })
}

/// The f32 GEMM's cells: `x · Wᵀ` for a random `[out, in]` weight, every shape and row count.
fn f32_cells(a: &KernelArgs) -> Result<()> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for shape in &a.shapes {
        let (o, i) = parse_shape(shape)?;
        let w: Vec<f32> = (0..o * i).map(|_| rng.random_range(-0.05f32..0.05)).collect();
        for &m in &a.rows {
            let x = Matrix::from_fn(m, i, |r, c| ((r * 31 + c * 7) % 19) as f32 * 0.1 - 0.9);
            let s = time(a.seconds, || drop(tensor::cpu::linear(&x, i, o, WeightLayout::OutIn, &w)));
            let row = |name: &str, s: f64| {
                println!(
                    "| {name} | {o}×{i} | {m} | {:.3} ms | {:.1} | {:.1} |",
                    s * 1e3,
                    (o * i * 4) as f64 / s / 1e9,
                    (m * o * i) as f64 / s / 1e9
                )
            };
            row("F32", s);
            // The sealed path's own f32 product where the CPU runs it: the weight packed once.
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") {
                let p = tensor::cpu::panels::PanelWeight::pack(&w, i, o, WeightLayout::OutIn);
                row("F32 panels", time(a.seconds, || drop(p.product(&x))));
            }
        }
    }
    Ok(())
}

fn parse_shape(shape: &str) -> Result<(usize, usize)> {
    let (o, i) = shape.split_once('x').ok_or_else(|| anyhow::anyhow!("shape {shape}: OUTxIN"))?;
    Ok((o.parse()?, i.parse()?))
}

/// Random blocks with finite f16 scales at the offsets each format keeps them.
fn random_weight(f: QuantFormat, rows: usize, cols: usize) -> Result<QuantMatrix> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let (n, size) = f.geometry();
    let mut bytes: Vec<u8> = (0..rows * cols / n * size).map(|_| rng.random()).collect();
    let at: &[usize] = match f {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q6_K => &[208],
        _ => &[0, 2],
    };
    let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for b in bytes.chunks_exact_mut(size) {
        for &o in at {
            b[o..o + 2].copy_from_slice(&scale);
        }
    }
    Ok(QuantMatrix::new(f, rows, cols, bytes.into())?)
}

/// Runs `f` for at least `seconds` (after one call) and returns the fastest call's seconds:
/// on a shared VM the slow calls measure the neighbours.
fn time(seconds: f64, mut f: impl FnMut()) -> f64 {
    f();
    let (t, mut n, mut best) = (Instant::now(), 0u32, f64::INFINITY);
    while n < 3 || t.elapsed().as_secs_f64() < seconds {
        let c = Instant::now();
        f();
        best = best.min(c.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

/// GB/s of a copy of 1 GiB split over the compute pool (read + write counted once each).
fn copy_bandwidth(seconds: f64) -> f64 {
    let n = 1 << 28;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let ptr = tensor::pool::SyncPtr(dst.as_mut_ptr());
    let s = time(seconds, || {
        tensor::pool::global().for_ranges(n, 1 << 16, &|r| {
            // SAFETY: each task writes its own range of `dst`.
            let d = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r.start), r.len()) };
            d.copy_from_slice(&src[r]);
        })
    });
    (2 * n * 4) as f64 / s / 1e9
}

/// Microseconds a region of one [`TASK`]-long task per thread takes on the compute pool,
/// against `TASK` had every thread started at once: the rest is what every parallel region
/// of a forward pass pays on top of its work (the hand-off to the workers, their joining,
/// the caller's wait). A decode step runs hundreds of regions.
fn region_cost(seconds: f64) -> f64 {
    const REGIONS: usize = 1000;
    const TASK: std::time::Duration = std::time::Duration::from_micros(5);
    let pool = tensor::pool::global();
    let s = time(seconds, || {
        for _ in 0..REGIONS {
            pool.run(pool.threads(), &|_| {
                let t = Instant::now();
                while t.elapsed() < TASK {
                    std::hint::spin_loop();
                }
            });
        }
    });
    s / REGIONS as f64 * 1e6
}

pub fn run(a: KernelArgs) -> Result<()> {
    let isa = match &a.isa {
        Some(name) => *Isa::available()
            .iter()
            .find(|i| i.name() == name)
            .ok_or_else(|| anyhow::anyhow!("{name} not available"))?,
        None => Isa::detected(),
    };
    let threads = tensor::pool::global().threads();
    println!("copy bandwidth ({threads} threads): {:.1} GB/s", copy_bandwidth(a.seconds));
    println!("a region of one 5 µs task a thread ({threads} threads): {:.2} µs", region_cost(a.seconds));
    println!("| format | out × in | rows | {} threads, {} | GB/s of weights | GMAC/s |", threads, isa.name());
    println!("|---|---|---|---|---|---|");
    for f in &a.formats {
        if f.eq_ignore_ascii_case("F32") {
            f32_cells(&a)?;
            continue;
        }
        let f = format(f)?;
        for shape in &a.shapes {
            let (o, i) = parse_shape(shape)?;
            let w = random_weight(f, o, i)?;
            for &m in &a.rows {
                let x = Matrix::from_fn(m, i, |r, c| ((r * 31 + c * 7) % 19) as f32 * 0.1 - 0.9);
                let s = time(a.seconds, || drop(w.product_on(&x, isa)));
                println!(
                    "| {f} | {o}×{i} | {m} | {:.3} ms | {:.1} | {:.1} |",
                    s * 1e3,
                    w.bytes().len() as f64 / s / 1e9,
                    (m * o * i) as f64 / s / 1e9
                );
            }
        }
    }
    Ok(())
}
