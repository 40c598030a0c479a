//! The Vulkan engine against the CPU engine, on whatever Vulkan adapter the machine has
//! (Mesa's lavapipe in CI). Every op, both weight layouts, f32/f16/bf16 storage, odd shapes,
//! the typed errors, and use from several threads at once.
//!
//! One engine is shared by the tests (they run on parallel threads, which also exercises the
//! slot pool); tests that need their own settings or break their device open their own.
//! The ring products of the `dual-lpn` protection are tested in `engine/ring.rs`.

#[path = "engine/ring.rs"]
mod ring;

use std::sync::{Arc, OnceLock};

use half::{bf16, f16};
use kernels::CpuEngine;
use kernels_wgpu::{Plan, WgpuConfig, WgpuEngine, open_engine, shaders::Tile};
use protocol::{Engine, EngineError, Masked, danger};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tensor::{F32_UNIT_ROUNDOFF, Matrix, Precision, Weight, WeightData, WeightId, WeightLayout, cpu};

fn shared() -> &'static WgpuEngine {
    static ENGINE: OnceLock<WgpuEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        WgpuEngine::open("vulkan", WgpuConfig::default())
            .unwrap_or_else(|e| panic!("a Vulkan adapter is required (CI installs lavapipe): {e}"))
    })
}

fn random(rows: usize, cols: usize, seed: u64) -> Matrix {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Matrix::from_fn(rows, cols, |_, _| rng.random_range(-1.0f32..1.0))
}

fn plain(m: &Matrix) -> Masked {
    danger::expose_plaintext(m.clone())
}

fn abs(m: &Matrix) -> Matrix {
    Matrix::from_fn(m.rows(), m.cols(), |r, c| m.get(r, c).abs())
}

/// `W` as a plain `(d_in, d_out)` matrix, from whatever layout it is stored in.
fn dense(w: &Weight) -> Matrix {
    let data = w.data.to_f32();
    Matrix::from_fn(w.d_in, w.d_out, |i, o| data[w.index(i, o)])
}

/// Asserts `got ≈ want` for the product `x · w` element by element: two f32 dot products of
/// length k each differ from the exact one by at most γ_k·(|x|·|w|), so they differ from
/// each other by at most twice that.
fn assert_product(what: &str, got: &Matrix, want: &Matrix, x: &Matrix, w: &Matrix) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let k = x.cols() as f64;
    let bound = cpu::matmul(&abs(x), &abs(w), false);
    for r in 0..got.rows() {
        for c in 0..got.cols() {
            let (g, e) = (got.get(r, c) as f64, want.get(r, c) as f64);
            let tol = 2.0 * k * F32_UNIT_ROUNDOFF * 1.01 * bound.get(r, c) as f64 + 1e-30;
            assert!((g - e).abs() <= tol, "{what}: element ({r},{c}) is {g}, CPU says {e} (tolerance {tol:e})");
        }
    }
}

fn weight(d_in: usize, d_out: usize, layout: WeightLayout, seed: u64) -> Weight {
    let m = random(d_in * d_out, 1, seed);
    Weight::f32(d_in, d_out, layout, m.into_vec())
}

fn id(name: &str) -> WeightId {
    WeightId::new(name)
}

#[test]
fn reports_a_vulkan_device_honestly() {
    let info = shared().info();
    assert_eq!(info.kind, "vulkan");
    assert!(!info.device.is_empty());
    assert!(!info.driver.is_empty());
    // Kernels multiply f32 operands: U-Verify's tolerance must not be widened for them.
    assert_eq!(info.operand_precision, Precision::F32);
}

#[test]
fn matmul_equals_cpu_for_odd_shapes_and_both_layouts() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    for (i, &(d_in, d_out)) in [(5, 3), (70, 65), (200, 129), (1, 7), (64, 64)].iter().enumerate() {
        for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
            let w = weight(d_in, d_out, layout, 100 + i as u64);
            let name = id(&format!("odd.{d_in}x{d_out}.{layout:?}"));
            assert_eq!(gpu.register(name.clone(), w.clone()).unwrap().storage, Precision::F32);
            cpu.register(name.clone(), w.clone()).unwrap();
            for rows in [1, 3, 17, 130] {
                let x = random(rows, d_in, 7 * rows as u64 + i as u64);
                let got = gpu.matmul(&plain(&x), &name).unwrap();
                let want = cpu.matmul(&plain(&x), &name).unwrap();
                assert_product(&format!("{name} rows={rows}"), &got, &want, &x, &dense(&w));
            }
        }
    }
}

#[test]
fn matmul_many_returns_every_product_of_one_upload() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    let d_in = 96;
    let ws = [
        (id("many.q"), weight(d_in, 96, WeightLayout::OutIn, 1)),
        (id("many.k"), weight(d_in, 33, WeightLayout::OutIn, 2)),
        (id("many.v"), weight(d_in, 40, WeightLayout::InOut, 3)),
    ];
    for (name, w) in &ws {
        gpu.register(name.clone(), w.clone()).unwrap();
        cpu.register(name.clone(), w.clone()).unwrap();
    }
    let ids: Vec<WeightId> = ws.iter().map(|(n, _)| n.clone()).collect();
    let x = random(11, d_in, 4);
    let got = gpu.matmul_many(&plain(&x), &ids).unwrap();
    let want = cpu.matmul_many(&plain(&x), &ids).unwrap();
    assert_eq!(got.len(), 3);
    for ((g, e), (name, w)) in got.iter().zip(&want).zip(&ws) {
        assert_product(name.as_str(), g, e, &x, &dense(w));
    }
    assert!(gpu.matmul_many(&plain(&x), &[]).unwrap().is_empty());
    // Lent out of the mapped read-back: the same products, bit for bit, once, in order.
    let mut lent = Vec::new();
    gpu.matmul_many_with(&plain(&x), &ids, &mut |zs| {
        lent.extend(zs.iter().map(|z| (z.shape(), z.as_slice().to_vec())))
    })
    .unwrap();
    let returned: Vec<_> = got.iter().map(|g| (g.shape(), g.as_slice().to_vec())).collect();
    assert_eq!(lent, returned);
    let mut calls = 0;
    gpu.matmul_many_with(&plain(&x), &[], &mut |zs| {
        assert!(zs.is_empty());
        calls += 1;
    })
    .unwrap();
    assert_eq!(calls, 1);
    let unknown = gpu.matmul_many_with(&plain(&x), &[id("many.none")], &mut |_| panic!("no products to lend"));
    assert!(matches!(unknown, Err(EngineError::UnknownWeight(_))), "{unknown:?}");
}

#[test]
fn every_plan_computes_the_same_product() {
    // Its own engine: pinning a tile must not change what the shared one runs.
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let cpu = CpuEngine::new();
    // Several K slices, and edges in every dimension for the largest tile.
    let (m, d_in, d_out) = (133, 83, 141);
    let mut ws = Vec::new();
    for (layout, data) in [
        (WeightLayout::InOut, "f32"),
        (WeightLayout::OutIn, "f32"),
        (WeightLayout::OutIn, "f16"),
        (WeightLayout::InOut, "bf16"),
    ] {
        let w = weight(d_in, d_out, layout, 9);
        let w = match data {
            "f16" => Weight { data: WeightData::F16(w.data.to_f32().iter().map(|&v| f16::from_f32(v)).collect()), ..w },
            "bf16" => {
                Weight { data: WeightData::Bf16(w.data.to_f32().iter().map(|&v| bf16::from_f32(v)).collect()), ..w }
            }
            _ => w,
        };
        let name = id(&format!("tiles.{layout:?}.{data}"));
        gpu.register(name.clone(), w.clone()).unwrap();
        cpu.register(name.clone(), w.clone()).unwrap();
        ws.push((name, w));
    }
    let x = random(m, d_in, 10);
    let ids: Vec<WeightId> = ws.iter().map(|(n, _)| n.clone()).collect();
    let want = cpu.matmul_many(&plain(&x), &ids).unwrap();
    // Every tile unsplit, and split-K plans (83 = K is prime: splits fall back to one slice).
    let mut plans: Vec<Plan> = gpu.tiles().iter().map(|&t| Plan::new(t)).collect();
    plans.push(Plan { tile: *gpu.tiles().last().unwrap(), splits: 4 });
    for plan in plans {
        gpu.pin(Some(plan)).unwrap();
        let got = gpu.matmul_many(&plain(&x), &ids).unwrap();
        for ((g, e), (name, w)) in got.iter().zip(&want).zip(&ws) {
            assert_product(&format!("{} plan {}", name, plan.name()), g, e, &x, &dense(w));
        }
    }
}

#[test]
fn every_few_row_tile_reads_aligned_and_ragged_checkpoint_weights() {
    // The few-row kernel's 16-byte path (4 f32 or 8 16-bit values per load, several loads
    // ahead) and its scalar fallback: K = 520 is whole words with a ragged last step of the
    // unrolled loop, K = 83 is no whole word at all; 1 and 9 rows (a masked decode linear).
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let cpu = CpuEngine::new();
    let skinny: Vec<Tile> = gpu.tiles().iter().copied().filter(|t| t.skinny).collect();
    assert!(skinny.len() >= 10, "few-row tiles offered: {skinny:?}");
    for k in [520, 83] {
        let mut ws = Vec::new();
        for data in ["f32", "f16", "bf16"] {
            let w = weight(k, 37, WeightLayout::OutIn, 31);
            let data_w = match data {
                "f16" => WeightData::F16(w.data.to_f32().iter().map(|&v| f16::from_f32(v)).collect()),
                "bf16" => WeightData::Bf16(w.data.to_f32().iter().map(|&v| bf16::from_f32(v)).collect()),
                _ => w.data.clone(),
            };
            let w = Weight { data: data_w, ..w };
            let name = id(&format!("few.{k}.{data}"));
            gpu.register(name.clone(), w.clone()).unwrap();
            cpu.register(name.clone(), w.clone()).unwrap();
            ws.push((name, w));
        }
        let ids: Vec<WeightId> = ws.iter().map(|(n, _)| n.clone()).collect();
        for rows in [1, 9] {
            let x = random(rows, k, 32);
            let want = cpu.matmul_many(&plain(&x), &ids).unwrap();
            for &tile in &skinny {
                gpu.pin(Some(Plan::new(tile))).unwrap();
                let got = gpu.matmul_many(&plain(&x), &ids).unwrap();
                for ((g, e), (name, w)) in got.iter().zip(&want).zip(&ws) {
                    assert_product(&format!("{name} rows={rows} {}", tile.name()), g, e, &x, &dense(w));
                }
            }
        }
    }
}

#[test]
fn a_spinning_wait_returns_every_product() {
    // Polling without sleeping (the default on hardware GPUs; lavapipe defaults to blocking)
    // must collect both mapping callbacks of every call, short and long.
    let gpu = WgpuEngine::open(
        "vulkan",
        WgpuConfig { spin_wait: Some(std::time::Duration::from_millis(1)), ..WgpuConfig::default() },
    )
    .unwrap();
    let cpu = CpuEngine::new();
    let w = weight(300, 70, WeightLayout::OutIn, 41);
    gpu.register(id("spin.w"), w.clone()).unwrap();
    cpu.register(id("spin.w"), w.clone()).unwrap();
    for rows in [1, 9, 700] {
        let x = random(rows, 300, 42);
        let got = gpu.matmul(&plain(&x), &id("spin.w")).unwrap();
        let want = cpu.matmul(&plain(&x), &id("spin.w")).unwrap();
        assert_product(&format!("spin rows={rows}"), &got, &want, &x, &dense(&w));
    }
    assert_eq!(gpu.stats().calls, 3);
}

#[test]
fn split_k_plans_sum_their_slices() {
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let cpu = CpuEngine::new();
    let mut ws = Vec::new();
    for (layout, data) in [(WeightLayout::OutIn, "f32"), (WeightLayout::InOut, "f32"), (WeightLayout::OutIn, "f16")] {
        let w = weight(512, 70, layout, 11);
        let w = if data == "f16" {
            Weight { data: WeightData::F16(w.data.to_f32().iter().map(|&v| f16::from_f32(v)).collect()), ..w }
        } else {
            w
        };
        let name = id(&format!("split.{layout:?}.{data}"));
        gpu.register(name.clone(), w.clone()).unwrap();
        cpu.register(name.clone(), w.clone()).unwrap();
        ws.push((name, w));
    }
    let ids: Vec<WeightId> = ws.iter().map(|(n, _)| n.clone()).collect();
    for rows in [1, 16] {
        let x = random(rows, 512, 12);
        let want = cpu.matmul_many(&plain(&x), &ids).unwrap();
        // The smallest FMA tile and the few-row tile of the most rows.
        let fma = *gpu.tiles().iter().rfind(|t| !t.coop && !t.skinny).unwrap();
        let skinny = *gpu.tiles().iter().rfind(|t| t.skinny).unwrap();
        for (tile, splits) in [fma, skinny].into_iter().flat_map(|t| [2, 4, 8].map(|s| (t, s))) {
            gpu.pin(Some(Plan { tile, splits })).unwrap();
            // Two products in one call: their scratch regions must not overlap.
            let got = gpu.matmul_many(&plain(&x), &ids).unwrap();
            for ((g, e), (name, w)) in got.iter().zip(&want).zip(&ws) {
                assert_product(&format!("{name} rows={rows} {} k/{splits}", tile.name()), g, e, &x, &dense(w));
            }
        }
    }
}

/// The tiles sized for masked decode steps (9 rows a sequence) at the row counts they are
/// for, whole and split along `K`, and at a count one row past them.
#[test]
fn masked_decode_tiles_compute_nine_rows_per_sequence() {
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let cpu = CpuEngine::new();
    let w = weight(512, 70, WeightLayout::OutIn, 13);
    gpu.register(id("nine.w"), w.clone()).unwrap();
    cpu.register(id("nine.w"), w.clone()).unwrap();
    let tiles: Vec<Tile> = gpu.tiles().iter().copied().filter(|t| !t.coop && !t.skinny && t.bm % 9 == 0).collect();
    assert!(tiles.iter().any(|t| t.bm == 72) && tiles.iter().any(|t| t.bm == 36), "{tiles:?}");
    for rows in [9, 36, 37, 72, 73] {
        let x = random(rows, 512, rows as u64);
        let want = cpu.matmul(&plain(&x), &id("nine.w")).unwrap();
        for &tile in &tiles {
            for splits in [1, 4] {
                gpu.pin(Some(Plan { tile, splits })).unwrap();
                let got = gpu.matmul(&plain(&x), &id("nine.w")).unwrap();
                assert_product(&format!("rows={rows} {} k/{splits}", tile.name()), &got, &want, &x, &dense(&w));
            }
        }
    }
}

#[test]
fn steady_kernel_runs_repeat_the_product_without_changing_it() {
    // Repeating a call's kernels in one submission (how plans are timed on a busy device)
    // must leave the product of one run: split plans re-sum fresh partials each time.
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let cpu = CpuEngine::new();
    let w = weight(256, 50, WeightLayout::OutIn, 21);
    gpu.register(id("steady.w"), w.clone()).unwrap();
    cpu.register(id("steady.w"), w.clone()).unwrap();
    let x = random(3, 256, 22);
    let want = cpu.matmul(&plain(&x), &id("steady.w")).unwrap();
    let tile = *gpu.tiles().last().unwrap();
    for splits in [1, 4] {
        gpu.pin(Some(Plan { tile, splits })).unwrap();
        let (got, secs) = gpu.steady_kernel_seconds(&plain(&x), &id("steady.w"), 5).unwrap();
        assert_product(&format!("steady k/{splits}"), &got, &want, &x, &dense(&w));
        if gpu.has_gpu_timestamps() {
            let s = secs.expect("timed where the device has timestamps");
            assert!(s > 0.0 && s < 1.0, "seconds per run {s}");
        } else {
            assert!(secs.is_none());
        }
    }
    let bad = random(3, 255, 23);
    assert!(matches!(gpu.steady_kernel_seconds(&plain(&bad), &id("steady.w"), 2), Err(EngineError::Shape { .. })));
}

#[test]
fn recycled_buffers_stay_within_the_configured_bytes() {
    // Read-backs come from, and products given back go to, the engine's pool, up to
    // `recycle_bytes`; 0 keeps nothing.
    let w = weight(64, 2048, WeightLayout::OutIn, 31);
    let x = random(40, 64, 32);
    let cpu = CpuEngine::new();
    cpu.register(id("recycle.w"), w.clone()).unwrap();
    let want = cpu.matmul(&plain(&x), &id("recycle.w")).unwrap();
    for (cap, keeps) in [(0usize, false), (1 << 20, true)] {
        let gpu = WgpuEngine::open("vulkan", WgpuConfig { recycle_bytes: cap, ..WgpuConfig::default() }).unwrap();
        gpu.register(id("recycle.w"), w.clone()).unwrap();
        for _ in 0..3 {
            let got = gpu.matmul(&plain(&x), &id("recycle.w")).unwrap();
            assert_product("recycled read-back", &got, &want, &x, &dense(&w));
            gpu.recycle(got.into_vec());
            assert!(gpu.recycled_bytes() <= cap, "{} bytes held, cap {cap}", gpu.recycled_bytes());
        }
        assert_eq!(gpu.recycled_bytes() > 0, keeps, "cap {cap}");
    }
}

#[test]
fn f16_storage_is_within_1e3_relative() {
    let gpu =
        WgpuEngine::open("vulkan", WgpuConfig { f32_weights_as: Precision::F16, ..WgpuConfig::default() }).unwrap();
    let cpu = CpuEngine::new();
    let (d_in, d_out) = (129, 67);
    for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
        let w = weight(d_in, d_out, layout, 21);
        let name = id(&format!("f16.{layout:?}"));
        assert_eq!(gpu.register(name.clone(), w.clone()).unwrap().storage, Precision::F16);
        // The same weight rounded to f16 on the CPU: equal within f32 accumulation error.
        let rounded = Weight { data: WeightData::F32(w.data.rounded_to(Precision::F16)), ..w.clone() };
        cpu.register(name.clone(), rounded.clone()).unwrap();
        let x = random(3, d_in, 22);
        let got = gpu.matmul(&plain(&x), &name).unwrap();
        let want = cpu.matmul(&plain(&x), &name).unwrap();
        assert_product(name.as_str(), &got, &want, &x, &dense(&rounded));
        // And the unrounded product within 1e-3 relative.
        let exact = cpu::matmul(&x, &dense(&w), false);
        let rel = got.rel_err(&exact);
        assert!(rel < 1e-3, "f16 storage off by {rel:e}");
        assert!(rel > 0.0, "f16 storage should round something");
    }
}

#[test]
fn bf16_checkpoints_are_widened_exactly() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    let (d_in, d_out) = (77, 45);
    let src = random(d_in * d_out, 1, 31).into_vec();
    let data: Arc<[bf16]> = src.iter().map(|&v| bf16::from_f32(v)).collect();
    let w = Weight { d_in, d_out, layout: WeightLayout::OutIn, data: WeightData::Bf16(data) };
    let name = id("bf16.checkpoint");
    assert_eq!(gpu.register(name.clone(), w.clone()).unwrap().storage, Precision::Bf16);
    cpu.register(name.clone(), w.clone()).unwrap();
    let x = random(5, d_in, 32);
    let got = gpu.matmul(&plain(&x), &name).unwrap();
    let want = cpu.matmul(&plain(&x), &name).unwrap();
    assert_product(name.as_str(), &got, &want, &x, &dense(&w));
}

/// Stored as f16 (what a tensor-core engine does with them), bf16 checkpoints multiply as
/// their f16 roundings do, and the registration says so.
#[test]
fn bf16_checkpoints_stored_as_f16_multiply_as_their_roundings() {
    let gpu = WgpuEngine::open("vulkan", WgpuConfig { bf16_weights_as: Some(Precision::F16), ..WgpuConfig::default() })
        .unwrap();
    let cpu = CpuEngine::new();
    let (d_in, d_out) = (77, 45);
    let src = random(d_in * d_out, 1, 33).into_vec();
    // Every value in f16's subnormal range (below 2⁻¹⁴), where its grid of 2⁻²⁴ is coarser
    // than bf16's bits: rounding moves the products by percents, far beyond f32 error.
    let data: Arc<[bf16]> = src.iter().map(|&v| bf16::from_f32(v * 1e-6)).collect();
    let w = Weight { d_in, d_out, layout: WeightLayout::OutIn, data: WeightData::Bf16(data.clone()) };
    let name = id("bf16.as.f16");
    assert_eq!(gpu.register(name.clone(), w.clone()).unwrap().storage, Precision::F16);
    let rounded =
        Weight { data: WeightData::F16(data.iter().map(|v| f16::from_f32(v.to_f32())).collect()), ..w.clone() };
    assert_ne!(dense(&rounded), dense(&w), "some value must round");
    cpu.register(name.clone(), rounded.clone()).unwrap();
    let x = random(5, d_in, 34);
    let got = gpu.matmul(&plain(&x), &name).unwrap();
    let want = cpu.matmul(&plain(&x), &name).unwrap();
    assert_product(name.as_str(), &got, &want, &x, &dense(&rounded));
    // Not the bf16 values: the product of those is visibly different.
    let unrounded = cpu::matmul(&x, &dense(&w), false);
    let off = got.rel_err(&unrounded);
    assert!(off > 1e-3, "the engine multiplied the unrounded bf16 values ({off:e})");
}

#[test]
fn dynamic_products_equal_cpu() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    for (i, &(m, k, n)) in [(1, 1, 1), (3, 65, 17), (40, 33, 129)].iter().enumerate() {
        let a = random(m, k, 40 + i as u64);
        for transpose_b in [false, true] {
            let b = if transpose_b { random(n, k, 50 + i as u64) } else { random(k, n, 60 + i as u64) };
            let got = gpu.matmul_dynamic(&plain(&a), &plain(&b), transpose_b).unwrap();
            let want = cpu.matmul_dynamic(&plain(&a), &plain(&b), transpose_b).unwrap();
            let dense_b = if transpose_b { b.transpose() } else { b.clone() };
            assert_product(&format!("dynamic {m}x{k}x{n} t={transpose_b}"), &got, &want, &a, &dense_b);
        }
    }
}

#[test]
fn batched_dynamic_products_equal_single_ones() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    for transpose_b in [false, true] {
        // Equal shapes (one batched dispatch) and mixed shapes (one dispatch each).
        for shapes in [vec![(9, 24, 13); 5], vec![(9, 24, 13), (1, 5, 70), (33, 64, 2)]] {
            let mats: Vec<(Matrix, Matrix)> = shapes
                .iter()
                .enumerate()
                .map(|(i, &(m, k, n))| {
                    let b = if transpose_b { random(n, k, 80 + i as u64) } else { random(k, n, 90 + i as u64) };
                    (random(m, k, 70 + i as u64), b)
                })
                .collect();
            let masked: Vec<(Masked, Masked)> = mats.iter().map(|(a, b)| (plain(a), plain(b))).collect();
            let pairs: Vec<(&Masked, &Masked)> = masked.iter().map(|(a, b)| (a, b)).collect();
            let got = gpu.matmul_dynamic_batched(&pairs, transpose_b).unwrap();
            assert_eq!(got.len(), pairs.len());
            for (i, (g, (a, b))) in got.iter().zip(&mats).enumerate() {
                let want = cpu.matmul_dynamic(&plain(a), &plain(b), transpose_b).unwrap();
                let dense_b = if transpose_b { b.transpose() } else { b.clone() };
                assert_product(&format!("pair {i} t={transpose_b}"), g, &want, a, &dense_b);
            }
        }
    }
    assert!(gpu.matmul_dynamic_batched(&[], false).unwrap().is_empty());
}

#[test]
fn softmax_rows_equals_cpu_including_masked_entries() {
    let gpu = shared();
    let cpu = CpuEngine::new();
    for (rows, cols) in [(1, 1), (3, 7), (50, 300), (2, 1000)] {
        let mut x = random(rows, cols, (rows * cols) as u64);
        for r in 0..rows {
            x.as_mut_slice()[r * cols..(r + 1) * cols].iter_mut().for_each(|v| *v *= 8.0);
        }
        if cols > 2 {
            x.set(0, 1, f32::NEG_INFINITY);
        }
        let got = gpu.softmax_rows(&plain(&x), 0.125).unwrap();
        let want = cpu.softmax_rows(&plain(&x), 0.125).unwrap();
        assert_eq!(got.shape(), want.shape());
        for (g, e) in got.as_slice().iter().zip(want.as_slice()) {
            assert!((g - e).abs() <= 1e-6 + 1e-5 * e.abs(), "softmax {rows}x{cols}: {g} vs {e}");
        }
        for r in 0..rows {
            let s: f32 = got.row(r).iter().sum();
            assert!((s - 1.0).abs() < 1e-4, "row {r} sums to {s}");
        }
    }
    // A fully masked row gives zeros, as on the CPU.
    let x =
        Matrix::from_vec(2, 3, vec![f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, 2.0, 3.0]).unwrap();
    let got = gpu.softmax_rows(&plain(&x), 1.0).unwrap();
    assert_eq!(got.row(0), &[0.0, 0.0, 0.0]);
    let want = cpu.softmax_rows(&plain(&x), 1.0).unwrap();
    for (g, e) in got.row(1).iter().zip(want.row(1)) {
        assert!((g - e).abs() < 1e-6);
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let gpu = shared();
    let w = weight(8, 4, WeightLayout::InOut, 1);
    let name = id("errors.w");
    gpu.register(name.clone(), w.clone()).unwrap();
    assert_eq!(gpu.register(name.clone(), w.clone()), Err(EngineError::DuplicateWeight(name.clone())));
    let short = Weight::f32(8, 4, WeightLayout::InOut, vec![0.0; 31]);
    assert!(matches!(gpu.register(id("errors.short"), short), Err(EngineError::Shape { .. })));
    assert!(matches!(gpu.matmul(&plain(&random(2, 7, 1)), &name), Err(EngineError::Shape { op: "matmul", .. })));
    assert_eq!(gpu.matmul(&plain(&Matrix::zeros(0, 8)), &name).err(), Some(EngineError::Empty("matmul")));
    assert_eq!(
        gpu.matmul(&plain(&random(2, 8, 1)), &id("errors.nope")).err(),
        Some(EngineError::UnknownWeight(id("errors.nope")))
    );
    assert!(matches!(
        gpu.matmul_dynamic(&plain(&random(2, 3, 1)), &plain(&random(4, 5, 2)), false),
        Err(EngineError::Shape { op: "matmul_dynamic", .. })
    ));
    assert_eq!(gpu.softmax_rows(&plain(&Matrix::zeros(3, 0)), 1.0).err(), Some(EngineError::Empty("softmax_rows")));
    gpu.unregister(&name).unwrap();
    assert_eq!(gpu.unregister(&name), Err(EngineError::UnknownWeight(name.clone())));
    assert_eq!(gpu.matmul(&plain(&random(2, 8, 1)), &name).err(), Some(EngineError::UnknownWeight(name.clone())));
    // The id is free again, and the engine still works.
    gpu.register(name.clone(), w).unwrap();
    gpu.matmul(&plain(&random(2, 8, 1)), &name).unwrap();
}

#[test]
fn engine_specs_select_or_explain() {
    assert_eq!(open_engine("cpu").unwrap().info().kind, "cpu");
    assert_eq!(open_engine("vulkan").unwrap().info().kind, "vulkan");
    assert_eq!(open_engine("vulkan:0").unwrap().info().kind, "vulkan");
    let name = shared().info().device;
    let by_name = open_engine(&format!("vulkan:{}", &name[..name.len().min(6)].to_lowercase())).unwrap();
    assert_eq!(by_name.info().device, name);
    // A miss lists the adapters that do exist.
    match open_engine("vulkan:no-such-gpu") {
        Err(EngineError::NoAdapter(msg)) => assert!(msg.contains(&name), "{msg}"),
        other => panic!("expected NoAdapter, got {:?}", other.map(|e| e.info())),
    }
    assert!(matches!(open_engine("vulkan:99"), Err(EngineError::NoAdapter(_))));
    assert!(matches!(open_engine("cuda"), Err(EngineError::NoAdapter(_))));
    assert!(!kernels_wgpu::adapters().is_empty());
}

#[test]
fn out_of_budget_weights_are_refused_with_a_typed_error() {
    let gpu =
        WgpuEngine::open("vulkan", WgpuConfig { memory_budget: Some(64 << 10), ..WgpuConfig::default() }).unwrap();
    gpu.register(id("budget.a"), weight(64, 128, WeightLayout::OutIn, 1)).unwrap(); // 32 KiB
    assert_eq!(gpu.resident_bytes(), 32 << 10);
    let err = gpu.register(id("budget.b"), weight(64, 160, WeightLayout::OutIn, 2)).unwrap_err();
    assert!(matches!(err, EngineError::OutOfMemory(_)), "{err:?}");
    // Freeing makes room.
    gpu.unregister(&id("budget.a")).unwrap();
    assert_eq!(gpu.resident_bytes(), 0);
    gpu.register(id("budget.b"), weight(64, 160, WeightLayout::OutIn, 2)).unwrap();
}

#[test]
fn a_lost_device_keeps_reporting_device_lost() {
    let gpu = WgpuEngine::open("vulkan", WgpuConfig::default()).unwrap();
    let w = weight(16, 8, WeightLayout::OutIn, 1);
    gpu.register(id("lost.w"), w.clone()).unwrap();
    let x = random(4, 16, 2);
    gpu.matmul(&plain(&x), &id("lost.w")).unwrap();
    gpu.lose_device();
    for _ in 0..2 {
        assert!(matches!(gpu.matmul(&plain(&x), &id("lost.w")), Err(EngineError::DeviceLost(_))));
        assert!(matches!(gpu.register(id("lost.v"), w.clone()), Err(EngineError::DeviceLost(_))));
        assert!(matches!(gpu.softmax_rows(&plain(&x), 1.0), Err(EngineError::DeviceLost(_))));
        assert!(matches!(gpu.matmul_dynamic(&plain(&x), &plain(&x), true), Err(EngineError::DeviceLost(_))));
    }
    // Description still works: a service reports what it lost.
    assert_eq!(gpu.info().kind, "vulkan");
}

#[test]
fn concurrent_callers_each_get_their_own_product() {
    let gpu = shared();
    let cpu = Arc::new(CpuEngine::new());
    let w = weight(48, 40, WeightLayout::OutIn, 5);
    gpu.register(id("threads.w"), w.clone()).unwrap();
    cpu.register(id("threads.w"), w.clone()).unwrap();
    let dense_w = dense(&w);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (cpu, dense_w) = (cpu.clone(), &dense_w);
            s.spawn(move || {
                for i in 0..8u64 {
                    let rows = 1 + ((t * 8 + i) % 13) as usize;
                    let x = random(rows, 48, 1000 + t * 100 + i);
                    let got = gpu.matmul(&plain(&x), &id("threads.w")).unwrap();
                    let want = cpu.matmul(&plain(&x), &id("threads.w")).unwrap();
                    assert_product(&format!("thread {t} call {i}"), &got, &want, &x, dense_w);
                }
            });
        }
    });
}

#[test]
fn autotuning_picks_a_tile_once_per_class_and_keeps_results_exact() {
    let gpu = WgpuEngine::open("vulkan", WgpuConfig { autotune: Some(true), ..WgpuConfig::default() }).unwrap();
    let cpu = CpuEngine::new();
    let w = weight(40, 72, WeightLayout::OutIn, 3);
    gpu.register(id("tune.w"), w.clone()).unwrap();
    cpu.register(id("tune.w"), w.clone()).unwrap();
    for rows in [5, 7, 8] {
        let x = random(rows, 40, rows as u64);
        let got = gpu.matmul(&plain(&x), &id("tune.w")).unwrap();
        let want = cpu.matmul(&plain(&x), &id("tune.w")).unwrap();
        assert_product(&format!("tuned rows={rows}"), &got, &want, &x, &dense(&w));
    }
    // 5, 7 and 8 rows share the class of 8: tuned once.
    let tuned = gpu.tuned_plans();
    assert_eq!(tuned.len(), 1, "{tuned:?}");
    assert_eq!((tuned[0].0, tuned[0].1, tuned[0].2), (8, 72, 40));
    // A masked decode step of 4 or 8 sequences (9 rows each) is a class of its own, tuned
    // among tiles of exactly its rows; 40 rows go to the class of 64.
    for rows in [36, 72, 40] {
        let x = random(rows, 40, rows as u64);
        let got = gpu.matmul(&plain(&x), &id("tune.w")).unwrap();
        let want = cpu.matmul(&plain(&x), &id("tune.w")).unwrap();
        assert_product(&format!("tuned rows={rows}"), &got, &want, &x, &dense(&w));
    }
    let classes: Vec<usize> = gpu.tuned_plans().iter().map(|t| t.0).collect();
    assert_eq!(classes, [8, 36, 64, 72], "{:?}", gpu.tuned_plans());
    let (a, b) = (random(6, 9, 1), random(11, 9, 2));
    let got = gpu.matmul_dynamic(&plain(&a), &plain(&b), true).unwrap();
    let want = cpu.matmul_dynamic(&plain(&a), &plain(&b), true).unwrap();
    assert_product("tuned dynamic", &got, &want, &a, &b.transpose());
    assert_eq!(gpu.tuned_plans().len(), 5);
}
