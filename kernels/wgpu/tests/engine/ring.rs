//! Ring products (`dual-lpn`) on the Vulkan engine: both kernels bit for bit against the
//! CPU's `tensor::ring` product, the typed errors, and a whole `dual-lpn` pass equal to the
//! quantized plaintext path.

use std::sync::{Arc, OnceLock};

use protocol::{
    DualLpnConfig, DualLpnExecutor, Engine, EngineError, Executor, IntegrityStatus, PlaintextExecutor, RingMasked,
    attention::Head, danger,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tensor::{Matrix, Weight, WeightId, WeightLayout, ring::RingWeight};

use kernels_wgpu::{RingKernel, WgpuConfig, WgpuEngine};

/// One engine per ring kernel, shared by the tests of this module.
fn engines() -> [&'static WgpuEngine; 2] {
    static U32: OnceLock<WgpuEngine> = OnceLock::new();
    static DOT4: OnceLock<WgpuEngine> = OnceLock::new();
    let open = |k| {
        WgpuEngine::open("vulkan", WgpuConfig { ring_kernel: Some(k), ..WgpuConfig::default() })
            .unwrap_or_else(|e| panic!("a Vulkan adapter is required (CI installs lavapipe): {e}"))
    };
    [U32.get_or_init(|| open(RingKernel::U32)), DOT4.get_or_init(|| open(RingKernel::Dot4))]
}

/// A ring weight with random int8 columns, its first column holding both extremes.
fn ring_weight(d_in: usize, d_out: usize, seed: u64) -> Arc<RingWeight> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut q: Vec<i8> = (0..d_in * d_out).map(|_| rng.random::<u8>() as i8).collect();
    q[0] = -128;
    q[d_in - 1] = 127;
    Arc::new(RingWeight::from_parts(d_in, d_out, q, vec![1.0; d_out]).unwrap())
}

/// Uniform words (every top bit equally likely), with `u32::MAX` and `2^31` at the start.
fn operand(rows: usize, d: usize, seed: u64) -> RingMasked {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x: Vec<u32> = (0..rows * d).map(|_| rng.random()).collect();
    x[0] = u32::MAX;
    x[rows * d - 1] = 1 << 31;
    danger::expose_ring(rows, d, x)
}

fn id(name: &str) -> WeightId {
    WeightId::new(name)
}

/// Odd widths (d_in ≡ 1, 2, 3 mod 4, below one staged step), 1 to 16 rows on the few-row
/// kernel, more on the tiled ones, and several weights in one call.
#[test]
fn ring_products_equal_the_cpu_product_bit_for_bit() {
    let shapes = [(1, 1, 1), (13, 5, 3), (67, 129, 1), (130, 70, 9), (36, 64, 16), (257, 96, 17), (301, 130, 200)];
    for gpu in engines() {
        let kind = gpu.ring_kernel();
        for (s, &(d_in, d_out, rows)) in shapes.iter().enumerate() {
            let w = ring_weight(d_in, d_out, s as u64);
            let w2 = ring_weight(d_in, d_out + 3, 100 + s as u64);
            let (a, b) = (id(&format!("ring.{kind:?}.{s}.a")), id(&format!("ring.{kind:?}.{s}.b")));
            gpu.register_ring(a.clone(), w.clone()).unwrap();
            gpu.register_ring(b.clone(), w2.clone()).unwrap();
            let x = operand(rows, d_in, 7 + s as u64);
            let got = gpu.ring_matmul_many(&x, &[a.clone(), b.clone()]).unwrap();
            assert_eq!(got.len(), 2);
            for (g, w) in got.iter().zip([&w, &w2]) {
                let want = w.product(x.as_slice(), rows);
                assert_eq!(g.len(), want.len(), "{kind:?} {d_in}x{} by {rows} rows: length", w.d_out);
                let first = g.iter().zip(&want).position(|(u, v)| u != v);
                assert!(first.is_none(), "{kind:?} {d_in}x{} by {rows} rows: word {first:?} differs", w.d_out);
            }
            gpu.unregister(&a).unwrap();
            gpu.unregister(&b).unwrap();
        }
    }
}

#[test]
fn bad_ring_input_is_a_typed_error() {
    let gpu = engines()[0];
    let name = id("ring.errors");
    let w = ring_weight(12, 5, 1);
    gpu.register_ring(name.clone(), w.clone()).unwrap();
    assert_eq!(gpu.register_ring(name.clone(), w.clone()), Err(EngineError::DuplicateWeight(name.clone())));
    let wide = operand(2, 13, 1);
    assert!(matches!(
        gpu.ring_matmul_many(&wide, std::slice::from_ref(&name)),
        Err(EngineError::Shape { op: "ring_matmul", .. })
    ));
    let empty = danger::expose_ring(0, 12, Vec::new());
    assert_eq!(
        gpu.ring_matmul_many(&empty, std::slice::from_ref(&name)).err(),
        Some(EngineError::Empty("ring_matmul"))
    );
    let x = operand(2, 12, 2);
    let nope = id("ring.errors.nope");
    assert_eq!(gpu.ring_matmul_many(&x, &[name.clone(), nope.clone()]).err(), Some(EngineError::UnknownWeight(nope)));
    // An f32 weight is not a ring weight.
    let f = id("ring.errors.f32");
    gpu.register(f.clone(), Weight::f32(12, 5, WeightLayout::OutIn, vec![0.5; 60])).unwrap();
    assert_eq!(gpu.ring_matmul_many(&x, std::slice::from_ref(&f)).err(), Some(EngineError::UnknownWeight(f.clone())));
    gpu.unregister(&f).unwrap();
    gpu.unregister(&name).unwrap();
    assert_eq!(gpu.unregister(&name), Err(EngineError::UnknownWeight(name.clone())));
    assert_eq!(
        gpu.ring_matmul_many(&x, std::slice::from_ref(&name)).err(),
        Some(EngineError::UnknownWeight(name.clone()))
    );
    // The id is free again.
    gpu.register_ring(name.clone(), w.clone()).unwrap();
    assert_eq!(gpu.ring_matmul_many(&x, std::slice::from_ref(&name)).unwrap()[0], w.product(x.as_slice(), 2));
    gpu.unregister(&name).unwrap();
}

/// A small random transformer layer stack (width 256, the smallest the scheme's parameters
/// cover), run through a pass of each executor: `dual-lpn` on the Vulkan engine, and the
/// quantized plaintext path on the host. Every linear's output must be equal bit for bit,
/// so everything computed from them is too.
#[test]
fn a_dual_lpn_pass_on_the_vulkan_engine_equals_the_int8_reference() {
    const D: usize = 256;
    const FF: usize = 384;
    let blocks = [5, 3];
    let gpu: Arc<dyn Engine> =
        Arc::new(WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap_or_else(|e| panic!("a Vulkan adapter: {e}")));
    let lpn = Arc::new(DualLpnExecutor::new(gpu, DualLpnConfig::default()).unwrap());
    let reference = PlaintextExecutor::int8_reference();
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let names = ["q", "k", "v", "o", "up", "down"];
    for layer in 0..2 {
        for name in names {
            let (d_in, d_out) = match name {
                "up" => (D, FF),
                "down" => (FF, D),
                _ => (D, D),
            };
            let data: Vec<f32> = (0..d_in * d_out).map(|_| rng.random_range(-0.1f32..0.1)).collect();
            let w = Weight::f32(d_in, d_out, WeightLayout::OutIn, data);
            let wid = id(&format!("l{layer}.{name}"));
            lpn.provision(wid.clone(), w.clone()).unwrap();
            reference.provision(wid, w).unwrap();
        }
    }
    let h = Matrix::from_fn(8, D, |r, c| ((r * D + c) as f32 * 0.37).sin() * (1.0 + r as f32));
    let got = forward(lpn.as_ref(), &blocks, &h);
    let want = forward(&reference, &blocks, &h);
    assert_eq!(got.as_slice(), want.as_slice(), "dual-lpn on Vulkan must equal the quantized plaintext path");
    assert!(got.as_slice().iter().all(|v| v.is_finite()) && got.as_slice().iter().any(|&v| v != 0.0));
    let c = lpn.counts();
    assert_eq!(c.rows, 2 * 4 * 8, "four masked inputs a layer, eight rows each");
    assert_eq!(lpn.integrity(), IntegrityStatus::Clean { checked: 2 * 6 * 8 });
}

/// Two layers: attention per sequence (one head), then a ReLU MLP, with residuals.
fn forward(exec: &dyn Executor, blocks: &[usize], h: &Matrix) -> Matrix {
    let mut pass = exec.begin(blocks).unwrap();
    let mut h = h.clone();
    for layer in 0..2 {
        let w = |n: &str| id(&format!("l{layer}.{n}"));
        let qkv = pass.linear_many(&h, &[w("q"), w("k"), w("v")]).unwrap();
        let mut ctx = Vec::new();
        let mut r0 = 0;
        for &n in blocks {
            let rows = |m: &Matrix| Matrix::from_fn(n, m.cols(), |r, c| m.get(r0 + r, c));
            let (q, k, v) = (rows(&qkv[0]), rows(&qkv[1]), rows(&qkv[2]));
            let out = pass.attend(&[Head { q: &q, k: &k, v: &v }], 1.0 / 16.0, Some(0)).unwrap();
            ctx.extend_from_slice(out[0].as_slice());
            r0 += n;
        }
        let ctx = Matrix::from_vec(h.rows(), h.cols(), ctx).unwrap();
        let o = pass.linear(&ctx, &w("o")).unwrap();
        let h1 = Matrix::from_fn(h.rows(), h.cols(), |r, c| h.get(r, c) + o.get(r, c));
        let up = pass.linear(&h1, &w("up")).unwrap();
        let act = Matrix::from_fn(up.rows(), up.cols(), |r, c| up.get(r, c).max(0.0));
        let down = pass.linear(&act, &w("down")).unwrap();
        h = Matrix::from_fn(h.rows(), h.cols(), |r, c| h1.get(r, c) + down.get(r, c));
    }
    pass.end();
    h
}
