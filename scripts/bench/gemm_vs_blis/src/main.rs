//! f32 GEMM, the `gemm` crate (as `tensor::cpu::sgemm` calls it) against BLIS's
//! `cblas_sgemm`, on the TEE's own product shapes. Row-major `C = A·B`, A m×k, B k×n.
//!
//! usage: gemm-vs-blis <gemm|blis|engine> <threads>
//!   gemm:   threads 1 → `Parallelism::None`, n > 1 → `Parallelism::Rayon(n)` on a pool of n.
//!   blis:   the thread count is BLIS's (`BLIS_NUM_THREADS`, read at BLIS's init); the
//!           argument must equal it (checked), so run one process per thread count.
//!   engine: `kernels::CpuEngine::matmul` on a rayon pool of n (feature `engine`), for the
//!           shapes of at most 32 rows, where it does not call `gemm`.
//! Prints one tab-separated line per shape:
//!   lib threads layout m k n reps median_s gflops rel_diff
//! where layout is nn (B k×n row-major) or nt (B stored n×k, the models' `OutIn` weights,
//! used transposed; few-row shapes only), and rel_diff = max|C_x − C_y| / max|C| over the
//! one-thread gemm, BLIS and the timed library's results.

use std::time::{Duration, Instant};

const SHAPES: &[(usize, usize, usize)] = &[
    // BERT-base / MiniLM prefill (n = 256 tokens)
    (256, 384, 384),
    (256, 384, 1536),
    (256, 1536, 384),
    (2048, 768, 768), // a batch of 8 × 256, BERT-base
    (256, 64, 256),   // attention scores, one head
    // Qwen2.5-0.5B decode
    (1, 896, 896),
    (1, 896, 4864),
    (1, 4864, 896),
    (8, 896, 4864), // a batch of 8
];

const MIN_REPS: usize = 20;
const MIN_TIME: Duration = Duration::from_millis(200);

#[cfg(feature = "gemm")]
#[allow(clippy::too_many_arguments)]
fn gemm_f32(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], bt: bool, c: &mut [f32], par: gemm::Parallelism) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // B is k×n row-major, or (bt) n×k row-major and used transposed.
    let (b_cs, b_rs) = if bt { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: the slices hold the row-major operands the strides describe; `c` is exclusive.
    // Argument order and strides as in services/tee/tensor/src/cpu/mod.rs (`sgemm_impl`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(feature = "blis")]
mod blis;

/// Deterministic values in [−1, 1).
fn fill(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[cfg_attr(not(all(feature = "gemm", feature = "blis")), allow(dead_code))]
/// Warm-up, then the median of max(20, enough for 0.2 s) timed calls.
fn measure(mut f: impl FnMut()) -> (usize, f64) {
    let t0 = Instant::now();
    let mut warm = 0;
    while warm < 3 || t0.elapsed() < Duration::from_millis(50) {
        f();
        warm += 1;
    }
    let per = t0.elapsed().as_secs_f64() / warm as f64;
    let reps = MIN_REPS.max((MIN_TIME.as_secs_f64() / per).ceil() as usize);
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (reps, times[reps / 2])
}

/// The CPU engine's own weight product (`Engine::matmul`), which for at most
/// `tensor::cpu::SMALL_M` rows streams the weight instead of calling `gemm`.
#[cfg(feature = "engine")]
mod engine {
    use kernels::CpuEngine;
    use protocol::{Engine, Masked, danger::expose_plaintext};
    use tensor::{Matrix, Weight, WeightId, WeightLayout};

    pub struct Product {
        engine: CpuEngine,
        id: WeightId,
        x: Masked,
    }

    impl Product {
        /// `x·W` for `x` m×k and the weight as `b` holds it: k×n (`InOut`) or n×k (`OutIn`).
        pub fn new(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], bt: bool) -> Self {
            let engine = CpuEngine::new();
            let id = WeightId::from("w");
            let layout = if bt { WeightLayout::OutIn } else { WeightLayout::InOut };
            engine.register(id.clone(), Weight::f32(k, n, layout, b.to_vec())).unwrap();
            let x = expose_plaintext(Matrix::from_vec(m, k, a.to_vec()).unwrap());
            Product { engine, id, x }
        }

        pub fn run(&self) -> Matrix {
            self.engine.matmul(&self.x, &self.id).unwrap()
        }
    }
}

#[cfg(all(feature = "gemm", feature = "blis"))]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: gemm-vs-blis <gemm|blis|engine> <threads>";
    let lib = args.get(1).expect(usage).clone();
    let threads: usize = args.get(2).expect(usage).parse().expect(usage);
    let (version, arch, blis_threads) = blis::describe();
    let par = match lib.as_str() {
        "gemm" | "engine" => {
            rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().unwrap();
            if threads == 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(threads) }
        }
        "blis" => {
            // BLIS's default (unset env) is one thread, reported as -1.
            let got = if blis_threads < 1 { 1 } else { blis_threads as usize };
            assert_eq!(got, threads, "set BLIS_NUM_THREADS={threads} for this process");
            gemm::Parallelism::None
        }
        _ => panic!("{usage}"),
    };
    #[cfg(not(feature = "engine"))]
    assert!(lib != "engine", "built without the `engine` feature");
    eprintln!("# BLIS {version}, sub-configuration {arch}, BLIS threads {blis_threads}");
    // "nn": B is k×n row-major. "nt": B is stored n×k (a weight in the models' `OutIn`
    // layout) and used transposed; measured for the few-row (decode) shapes.
    for bt in [false, true] {
        for &(m, k, n) in SHAPES {
            if m > 32 && (bt || lib == "engine") {
                continue;
            }
            let a = fill(m * k, 1);
            let b = fill(k * n, 2);
            let mut c_gemm = vec![0.0f32; m * n];
            let mut c_blis = vec![0.0f32; m * n];
            gemm_f32(m, k, n, &a, &b, bt, &mut c_gemm, gemm::Parallelism::None);
            blis::sgemm(m, k, n, &a, &b, bt, &mut c_blis);
            let max_c = c_gemm.iter().fold(0.0f32, |x, v| x.max(v.abs()));
            let max_d = c_gemm.iter().zip(&c_blis).fold(0.0f32, |x, (p, q)| x.max((p - q).abs()));
            let rel = max_d / max_c;
            assert!(rel < 1e-4, "{m}x{k}x{n}: results differ, {rel:e}");
            let mut c = vec![0.0f32; m * n];
            let (reps, t) = match lib.as_str() {
                "gemm" => measure(|| gemm_f32(m, k, n, &a, &b, bt, &mut c, par)),
                "blis" => measure(|| blis::sgemm(m, k, n, &a, &b, bt, &mut c)),
                #[cfg(feature = "engine")]
                _ => {
                    let p = engine::Product::new(m, k, n, &a, &b, bt);
                    let r = measure(|| {
                        std::hint::black_box(p.run());
                    });
                    c.copy_from_slice(p.run().as_slice());
                    r
                }
                #[cfg(not(feature = "engine"))]
                _ => unreachable!(),
            };
            // The timed calls computed the same product.
            let dev = c.iter().zip(&c_blis).fold(0.0f32, |x, (p, q)| x.max((p - q).abs())) / max_c;
            assert!(dev < 1e-4, "{lib} {m}x{k}x{n}: differs from BLIS by {dev:e}");
            let rel = rel.max(dev);
            let gflops = 2.0 * (m * k * n) as f64 / t / 1e9;
            let layout = if bt { "nt" } else { "nn" };
            println!("{lib}\t{threads}\t{layout}\t{m}\t{k}\t{n}\t{reps}\t{t:.4e}\t{gflops:.1}\t{rel:.1e}");
        }
    }
}

/// Single-library builds exist to measure binary size: one product, so the code is linked.
#[cfg(not(all(feature = "gemm", feature = "blis")))]
fn main() {
    let (m, k, n) = (64, 64, 64);
    let (a, b) = (fill(m * k, 1), fill(k * n, 2));
    #[allow(unused_mut)]
    let mut c = vec![0.0f32; m * n];
    #[cfg(feature = "gemm")]
    gemm_f32(m, k, n, &a, &b, false, &mut c, gemm::Parallelism::Rayon(0));
    #[cfg(feature = "blis")]
    blis::sgemm(m, k, n, &a, &b, false, &mut c);
    println!("{}", c.iter().sum::<f32>() + a[0] + b[0]);
}
