use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::{Precision, Weight, WeightData, WeightError, WeightTable};

fn random(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| rng.random_range(-1.0f32..1.0))
}

fn naive(a: &Matrix, b: &Matrix) -> Matrix {
    Matrix::from_fn(a.rows(), b.cols(), |r, c| {
        (0..a.cols()).map(|i| a.get(r, i) as f64 * b.get(i, c) as f64).sum::<f64>() as f32
    })
}

/// Both layouts, few rows (the streaming path) and many (the blocked GEMM), odd shapes.
#[test]
fn linear_matches_naive_for_both_layouts_and_odd_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for &(m, k, n) in &[(1, 1, 1), (3, 5, 7), (1, 384, 1536), (17, 65, 129), (64, 256, 96)] {
        let x = random(m, k, &mut rng);
        let w = random(k, n, &mut rng);
        let want = naive(&x, &w);
        let io = linear(&x, k, n, WeightLayout::InOut, w.as_slice());
        let oi = linear(&x, k, n, WeightLayout::OutIn, w.transpose().as_slice());
        assert!(io.rel_err(&want) < 1e-6, "in-out ({m},{k},{n})");
        assert!(oi.rel_err(&want) < 1e-6, "out-in ({m},{k},{n})");
    }
}

#[test]
fn matmul_and_its_transposed_forms_agree_with_naive() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let a = random(5, 9, &mut rng);
    let b = random(9, 4, &mut rng);
    let want = naive(&a, &b);
    assert!(matmul(&a, &b, false).rel_err(&want) < 1e-6);
    assert!(matmul(&a, &b.transpose(), true).rel_err(&want) < 1e-6);
    assert!(matmul_tn(&a.transpose(), &b).rel_err(&want) < 1e-6);
}

#[test]
fn table_widens_half_precision_exactly_and_types_its_errors() {
    let table = WeightTable::default();
    let vals: Vec<half::f16> = (0..12).map(|i| half::f16::from_f32(i as f32 * 0.125)).collect();
    let w = Weight { d_in: 3, d_out: 4, layout: WeightLayout::InOut, data: WeightData::F16(vals.into()) };
    assert_eq!(w.data.precision(), Precision::F16);
    table.insert("h".into(), &w).unwrap();
    let x = Matrix::from_vec(1, 3, vec![1.0, 0.0, 0.0]).unwrap();
    assert_eq!(table.get(&"h".into()).unwrap().product(&x).as_slice(), &[0.0, 0.125, 0.25, 0.375]);
    assert_eq!(table.insert("h".into(), &w), Err(WeightError::Duplicate("h".into())));
    assert!(matches!(
        table.insert("bad".into(), &Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 7])),
        Err(WeightError::Shape(_))
    ));
    assert!(matches!(
        table.insert("empty".into(), &Weight::f32(0, 2, WeightLayout::InOut, vec![])),
        Err(WeightError::Shape(_))
    ));
    table.remove(&"h".into()).unwrap();
    assert_eq!(table.remove(&"h".into()), Err(WeightError::Unknown("h".into())));
    assert!(table.get(&"h".into()).is_err());
}

#[test]
fn softmax_rows_sum_to_one_and_handle_large_values() {
    let mut rows = [[1000.0f32, 1000.0, -1000.0], [0.0, 1.0, 2.0]];
    for row in &mut rows {
        softmax_in_place(row, 1.0);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
    assert!((rows[0][0] - 0.5).abs() < 1e-6 && rows[0][2] == 0.0);
}

/// The vectorized softmax against an f64 one: every length around the 16-lane blocks,
/// masked (−∞) entries exactly 0, scores wide enough to reach f32's range.
#[test]
fn softmax_agrees_with_f64_at_every_length() {
    for len in [1usize, 2, 15, 16, 17, 31, 33, 128, 1000] {
        let row: Vec<f32> = (0..len)
            .map(|i| if i % 7 == 3 { f32::NEG_INFINITY } else { ((i * 37 % 101) as f32 - 50.0) * 0.9 })
            .collect();
        let scale = 0.5f32;
        let mut got = row.clone();
        softmax_in_place(&mut got, scale);
        let max = row.iter().map(|&v| f64::from(v * scale)).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&v| (f64::from(v * scale) - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (i, (&g, &w)) in got.iter().zip(&e).enumerate() {
            let w = w / sum;
            assert!((f64::from(g) - w).abs() <= 1e-6 * w.max(1e-3), "len {len}, entry {i}: {g} vs {w}");
            if row[i] == f32::NEG_INFINITY {
                assert_eq!(g, 0.0, "a masked entry is exactly 0");
            }
        }
    }
}

/// A parallel copy appends exactly what a plain one does, below and above its threshold,
/// after what the buffer already held.
#[test]
fn parallel_extend_appends_like_extend_from_slice() {
    for len in [0, 5, PAR_COPY_MIN - 1, PAR_COPY_MIN, 3 * PAR_COPY_MIN + 17] {
        let src: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
        let mut want = vec![-1.0f32, -2.0];
        want.extend_from_slice(&src);
        let mut got = vec![-1.0f32, -2.0];
        extend_parallel(&mut got, &src);
        assert_eq!(got, want, "len {len}");
    }
}
