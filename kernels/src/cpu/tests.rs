use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::danger::expose_plaintext;

fn random(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| rng.random_range(-1.0f32..1.0))
}

fn naive(a: &Matrix, b: &Matrix) -> Matrix {
    Matrix::from_fn(a.rows(), b.cols(), |r, c| {
        (0..a.cols()).map(|i| a.get(r, i) as f64 * b.get(i, c) as f64).sum::<f64>() as f32
    })
}

#[test]
fn matmul_matches_naive_for_both_layouts_and_odd_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let engine = CpuEngine::new();
    for &(m, k, n) in &[(1, 1, 1), (3, 5, 7), (1, 384, 1536), (17, 65, 129), (64, 256, 96)] {
        let x = random(m, k, &mut rng);
        let w = random(k, n, &mut rng);
        let want = naive(&x, &w);
        let id_io = WeightId::new(format!("io{m}x{k}x{n}"));
        let id_oi = WeightId::new(format!("oi{m}x{k}x{n}"));
        engine.register(id_io.clone(), Weight::f32(k, n, WeightLayout::InOut, w.as_slice().to_vec())).unwrap();
        engine.register(id_oi.clone(), Weight::f32(k, n, WeightLayout::OutIn, w.transpose().into_vec())).unwrap();
        let got = engine.matmul_many(&expose_plaintext(x.clone()), &[id_io, id_oi]).unwrap();
        for g in got {
            assert!(g.matrix().rel_err(&want) < 1e-6, "({m},{k},{n})");
        }
    }
}

#[test]
fn half_precision_storage_is_widened_exactly() {
    let engine = CpuEngine::new();
    let vals: Vec<half::f16> = (0..12).map(|i| half::f16::from_f32(i as f32 * 0.125)).collect();
    let w = Weight { d_in: 3, d_out: 4, layout: WeightLayout::InOut, data: crate::WeightData::F16(vals.into()) };
    let reg = engine.register("h".into(), w).unwrap();
    assert_eq!(reg.storage, Precision::F32);
    let x = Matrix::from_vec(1, 3, vec![1.0, 0.0, 0.0]).unwrap();
    let y = engine.matmul(&expose_plaintext(x), &"h".into()).unwrap();
    assert_eq!(y.matrix().as_slice(), &[0.0, 0.125, 0.25, 0.375]);
}

#[test]
fn dynamic_product_and_transpose() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let engine = CpuEngine::new();
    let a = random(5, 9, &mut rng);
    let b = random(9, 4, &mut rng);
    let want = naive(&a, &b);
    let got = engine.matmul_dynamic(&expose_plaintext(a.clone()), &expose_plaintext(b.clone()), false).unwrap();
    assert!(got.matrix().rel_err(&want) < 1e-6);
    let got_t = engine.matmul_dynamic(&expose_plaintext(a), &expose_plaintext(b.transpose()), true).unwrap();
    assert!(got_t.matrix().rel_err(&want) < 1e-6);
}

#[test]
fn softmax_rows_sum_to_one_and_handle_large_values() {
    let engine = CpuEngine::new();
    let x = Matrix::from_vec(2, 3, vec![1000.0, 1000.0, -1000.0, 0.0, 1.0, 2.0]).unwrap();
    let y = engine.softmax_rows(&expose_plaintext(x), 1.0).unwrap().into_matrix();
    for r in 0..2 {
        let s: f32 = y.row(r).iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
    }
    assert!((y.get(0, 0) - 0.5).abs() < 1e-6 && y.get(0, 2) == 0.0);
}

#[test]
fn bad_input_gives_typed_errors() {
    let engine = CpuEngine::new();
    let x = expose_plaintext(Matrix::zeros(2, 3));
    assert_eq!(engine.matmul(&x, &"nope".into()).unwrap_err(), EngineError::UnknownWeight("nope".into()));
    engine.register("w".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 8])).unwrap();
    assert!(matches!(engine.matmul(&x, &"w".into()), Err(EngineError::Shape { .. })));
    assert!(matches!(
        engine.register("w".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 8])),
        Err(EngineError::DuplicateWeight(_))
    ));
    assert!(matches!(
        engine.register("bad".into(), Weight::f32(4, 2, WeightLayout::InOut, vec![0.0; 7])),
        Err(EngineError::Shape { .. })
    ));
    let empty = expose_plaintext(Matrix::zeros(0, 4));
    assert_eq!(engine.matmul(&empty, &"w".into()).unwrap_err(), EngineError::Empty("matmul"));
    assert!(matches!(
        engine.matmul_dynamic(&x, &expose_plaintext(Matrix::zeros(2, 2)), false),
        Err(EngineError::Shape { .. })
    ));
    engine.unregister(&"w".into()).unwrap();
    assert!(engine.unregister(&"w".into()).is_err());
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
