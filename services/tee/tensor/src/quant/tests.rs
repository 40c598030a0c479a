//! Every kernel set against the f64 product of the dequantized operands, for every format
//! with kernels: the integer path must be exact up to f32 accumulation, and the only error
//! against the unquantized activations is their int8 rounding.

use half::f16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const FORMATS: [QuantFormat; 8] = [
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q8_0,
    QuantFormat::Q4_K,
    QuantFormat::Q5_K,
    QuantFormat::Q6_K,
];

/// Random blocks: random bits everywhere, then finite scales (and mins) where the format
/// keeps them, so every bit pattern of the value fields is exercised.
fn random_weight(format: QuantFormat, rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> QuantMatrix {
    let (n, size) = format.geometry();
    let mut bytes: Vec<u8> = (0..rows * cols / n * size).map(|_| rng.random()).collect();
    let scale_at: &[usize] = match format {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K => &[0, 2],
        QuantFormat::Q6_K => &[208],
        _ => unreachable!(),
    };
    for block in bytes.chunks_exact_mut(size) {
        for &at in scale_at {
            let v: f32 = rng.random_range(-0.05..0.05);
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
        }
    }
    QuantMatrix::new(format, rows, cols, bytes.into()).unwrap()
}

fn random_x(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Matrix {
    // Mostly small values with a few large ones per row, as activations have.
    Matrix::from_fn(rows, cols, |_, c| {
        let v: f32 = rng.random_range(-1.0..1.0);
        if c % 97 == 5 { v * 20.0 } else { v }
    })
}

/// `x · Ŵᵀ` in f64 (`x` as given, `Ŵ` dequantized) and `Σ|x||Ŵ|` per output.
fn reference(w: &[f32], x: &[f32], m: usize, rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; m * rows];
    let mut mag = vec![0.0; m * rows];
    for j in 0..m {
        for o in 0..rows {
            for i in 0..cols {
                let (a, b) = (x[j * cols + i] as f64, w[o * cols + i] as f64);
                out[j * rows + o] += a * b;
                mag[j * rows + o] += (a * b).abs();
            }
        }
    }
    (out, mag)
}

/// What every kernel computes, in f64: per group of the weight's scales,
/// `s·dx·Σ q·x + mb·sum`, `sum` the activations' kept block sum where they keep one per
/// group, else `dx·Σx`; and `Σ|terms|` per output.
fn decomposed(w: &QuantMatrix, xq: &QuantRows) -> (Vec<f64>, Vec<f64>) {
    let (be, bb) = w.format().geometry();
    let g = portable::group(w.format());
    let (m, rows) = (xq.rows(), w.rows());
    let (mut out, mut mag) = (vec![0.0; m * rows], vec![0.0; m * rows]);
    let (mut q, mut sc, mut mb) = ([0u8; 256], [0f32; 16], [0f32; 16]);
    for o in 0..rows {
        let row = &w.bytes()[o * w.row_bytes()..(o + 1) * w.row_bytes()];
        for (bi, blk) in row.chunks_exact(bb).enumerate() {
            portable::unpack_block(w.format(), blk, &mut q[..be], &mut sc, &mut mb);
            for gi in 0..be / g {
                let k0 = bi * be + gi * g;
                for j in 0..m {
                    let x = xq.row(j);
                    let dx = x.d[k0 / xq.block] as f64;
                    let (mut idot, mut isum) = (0i64, 0i64);
                    for t in 0..g {
                        idot += q[gi * g + t] as i64 * x.qs[k0 + t] as i64;
                        isum += x.qs[k0 + t] as i64;
                    }
                    let sum = if xq.block == g { x.sums[k0 / g] as f64 } else { dx * isum as f64 };
                    let (a, b) = (sc[gi] as f64 * dx * idot as f64, mb[gi] as f64 * sum);
                    out[j * rows + o] += a + b;
                    mag[j * rows + o] += a.abs() + b.abs();
                }
            }
        }
    }
    (out, mag)
}

#[test]
fn unpacked_blocks_are_the_dequantized_values() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for format in FORMATS {
        let w = random_weight(format, 3, format.block_elements() * 2, &mut rng);
        let want = w.dequantize();
        let (be, bb) = format.geometry();
        let g = portable::group(format);
        let (mut q, mut sc, mut mb) = ([0u8; 256], [0f32; 16], [0f32; 16]);
        for (bi, blk) in w.bytes().chunks_exact(bb).enumerate() {
            portable::unpack_block(format, blk, &mut q[..be], &mut sc, &mut mb);
            for t in 0..be {
                let v = sc[t / g] * q[t] as f32 + mb[t / g];
                let r = want[bi * be + t];
                assert!((v - r).abs() <= 1e-6 * (r.abs() + mb[t / g].abs()) + 1e-9, "{format} [{bi}:{t}]: {v} vs {r}");
            }
        }
    }
}

#[test]
fn every_path_computes_the_integer_decomposition() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for format in FORMATS {
        let cols = if format.block_elements() == QK_K { 512 } else { 96 };
        let rows = 37;
        let w = random_weight(format, rows, cols, &mut rng);
        for m in [1, 2, 3, 4, 5, 9, 16, 23, 70] {
            let x = random_x(m, cols, &mut rng);
            let kind = if m >= packed_min_rows() { packed_kind(format) } else { stream_kind(format) };
            let (want, mag) = decomposed(&w, &QuantRows::new(x.as_slice(), m, cols, kind));
            for isa in Isa::available() {
                let got = w.product_on(&x, isa);
                for (k, (&g, (&r, &s))) in got.as_slice().iter().zip(want.iter().zip(&mag)).enumerate() {
                    let err = (g as f64 - r).abs();
                    assert!(err <= 1e-5 * s + 1e-6, "{format} {} m={m} [{k}]: {g} vs {r} (scale {s})", isa.name());
                }
            }
        }
    }
}

#[test]
fn the_only_error_is_the_activation_rounding() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for format in FORMATS {
        let cols = if format.block_elements() == QK_K { 768 } else { 160 };
        for m in [3, 20] {
            let rows = 19;
            let w = random_weight(format, rows, cols, &mut rng);
            let wf = w.dequantize();
            let x = random_x(m, cols, &mut rng);
            let (exact, mag) = reference(&wf, x.as_slice(), m, rows, cols);
            let kind = if m >= packed_min_rows() { packed_kind(format) } else { stream_kind(format) };
            let xq = QuantRows::new(x.as_slice(), m, cols, kind);
            let got = w.product(&x);
            for j in 0..m {
                for o in 0..rows {
                    // Each activation is off by at most half its block's step, plus the f16
                    // rounding of Q8_0/Q8_1 scales (2⁻¹¹ of up to 127 steps); Q8_1's sums
                    // are rounded to f16 too, which the weights' mins multiply.
                    let bound: f64 = (0..cols)
                        .map(|i| {
                            let step = xq.d[(j * cols + i) / xq.block].abs() as f64;
                            wf[o * cols + i].abs() as f64 * step * (0.5 + 127.0 / 2048.0)
                        })
                        .sum::<f64>();
                    let sums_slack = if kind == ActKind::Q8_1 { 2f64.powi(-10) * mag[j * rows + o] } else { 0.0 };
                    let err = (got.get(j, o) as f64 - exact[j * rows + o]).abs();
                    assert!(
                        err <= bound * 1.0001 + sums_slack + 1e-5 * mag[j * rows + o],
                        "{format} m={m} ({j},{o}): {err} > {bound}"
                    );
                }
            }
        }
    }
}

#[test]
fn rows_are_dequantized_and_selected_as_stored() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let w = random_weight(QuantFormat::Q5_0, 10, 64, &mut rng);
    let all = w.dequantize();
    let mut row = vec![0.0; 64];
    w.dequantize_row(7, &mut row);
    assert_eq!(row, all[7 * 64..8 * 64]);
    let picked = w.select_rows(&[7, 2]).unwrap();
    assert_eq!(picked.dequantize(), [&all[7 * 64..8 * 64], &all[2 * 64..3 * 64]].concat());
    assert!(w.select_rows(&[10]).is_err());
}

#[test]
fn malformed_weights_are_refused() {
    let ok = vec![0u8; 2 * 22].into();
    assert!(QuantMatrix::new(QuantFormat::Q5_0, 2, 32, ok).is_ok());
    assert!(QuantMatrix::new(QuantFormat::Q5_0, 2, 33, vec![0u8; 2 * 22].into()).is_err());
    assert!(QuantMatrix::new(QuantFormat::Q5_0, 2, 32, vec![0u8; 43].into()).is_err());
    assert!(QuantMatrix::new(QuantFormat::Q3_K, 1, 256, vec![0u8; 110].into()).is_err());
    assert!(QuantMatrix::new(QuantFormat::Q4_K, 0, 256, vec![0u8; 0].into()).is_err());
}

#[test]
fn many_rows_split_over_the_pool_agree_with_one_thread() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let w = random_weight(QuantFormat::Q4_K, 3000, 256, &mut rng);
    let x = random_x(2, 256, &mut rng);
    let got = w.product(&x);
    let xq = QuantRows::new(x.as_slice(), 2, 256, ActKind::Q8K);
    let rb = w.row_bytes();
    for j in 0..2 {
        for o in (0..3000).step_by(97) {
            let one = portable::dot(w.format(), &w.bytes()[o * rb..(o + 1) * rb], xq.row(j), ActKind::Q8K);
            assert!((got.get(j, o) - one).abs() <= 1e-4 * one.abs().max(1e-3), "({j},{o})");
        }
    }
}

#[test]
fn products_of_one_input_equal_the_single_products() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let ws = [
        random_weight(QuantFormat::Q4_K, 40, 512, &mut rng),
        random_weight(QuantFormat::Q5_0, 9, 512, &mut rng),
        random_weight(QuantFormat::Q6_K, 300, 512, &mut rng),
        random_weight(QuantFormat::Q4_K, 17, 512, &mut rng),
    ];
    let refs: Vec<&QuantMatrix> = ws.iter().collect();
    for m in [1, 3, 20] {
        let x = random_x(m, 512, &mut rng);
        for isa in Isa::available() {
            for (w, got) in ws.iter().zip(products_on(&refs, &x, isa)) {
                assert_eq!(got.as_slice(), w.product_on(&x, isa).as_slice(), "{} m={m} {}", w.format(), isa.name());
            }
        }
    }
}
