//! candle's `QMatMul` (its CPU k-quant / q8 kernels, rayon-parallel) on the cells of
//! `gelo bench kernels`: weights `OUT×IN` quantized by candle from random values, activations
//! `ROWS×IN`, the fastest of the calls in `--seconds` after one warm-up (as `gelo bench
//! kernels` times). Threads: `RAYON_NUM_THREADS`.
//!
//!     candle-peer [--formats Q4_K,Q6_K,Q8_0,Q5_0] [--shapes 4864x896,...] [--rows 1,8,512] [--seconds S]

use std::time::Instant;

use candle_core::{
    Device, Module, Tensor,
    quantized::{GgmlDType, QMatMul, QTensor},
};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.into())
}

fn dtype(name: &str) -> GgmlDType {
    match name {
        "Q4_0" => GgmlDType::Q4_0,
        "Q4_1" => GgmlDType::Q4_1,
        "Q5_0" => GgmlDType::Q5_0,
        "Q5_1" => GgmlDType::Q5_1,
        "Q8_0" => GgmlDType::Q8_0,
        "Q4_K" => GgmlDType::Q4K,
        "Q5_K" => GgmlDType::Q5K,
        "Q6_K" => GgmlDType::Q6K,
        other => panic!("unknown format {other}"),
    }
}

fn main() -> candle_core::Result<()> {
    let seconds: f64 = arg("--seconds", "0.5").parse().expect("--seconds");
    let dev = Device::Cpu;
    println!("| format | out × in | rows | candle ms | GMAC/s |");
    println!("|---|---|---|---|---|");
    for f in arg("--formats", "Q4_K,Q6_K,Q8_0,Q5_0").split(',') {
        for shape in arg("--shapes", "4864x896,896x4864,151936x896").split(',') {
            let (o, i) = shape.split_once('x').expect("OUTxIN");
            let (o, i): (usize, usize) = (o.parse().unwrap(), i.parse().unwrap());
            let w = Tensor::randn(0f32, 0.02, (o, i), &dev)?;
            let q = QMatMul::from_qtensor(QTensor::quantize(&w, dtype(f))?)?;
            for m in arg("--rows", "1,8,512").split(',').map(|m| m.parse::<usize>().unwrap()) {
                let x = Tensor::randn(0f32, 1.0, (m, i), &dev)?;
                q.forward(&x)?;
                let (t, mut n, mut best) = (Instant::now(), 0, f64::INFINITY);
                while n < 3 || t.elapsed().as_secs_f64() < seconds {
                    let c = Instant::now();
                    q.forward(&x)?;
                    best = best.min(c.elapsed().as_secs_f64());
                    n += 1;
                }
                println!("| {f} | {o}×{i} | {m} | {:.3} | {:.1} |", best * 1e3, (m * o * i) as f64 / best / 1e9);
            }
        }
    }
    Ok(())
}
