use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use tensor::{Matrix, cpu::matmul_tn};

use super::*;

fn max_orth_err(a: &Matrix) -> f32 {
    let g = matmul_tn(a, a);
    let mut worst = 0.0f32;
    for r in 0..g.rows() {
        for c in 0..g.cols() {
            let want = if r == c { 1.0 } else { 0.0 };
            worst = worst.max((g.get(r, c) - want).abs());
        }
    }
    worst
}

#[test]
fn haar_masks_are_orthogonal() {
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    for s in [1, 2, 3, 9, 64, 137, 520] {
        let a = haar::sample(s, &mut rng);
        let err = max_orth_err(&a);
        assert!(err < 1e-5, "s={s}: max |AᵀA − I| = {err:e}");
    }
}

#[test]
fn hd3_masks_are_orthogonal() {
    let mut rng = ChaCha20Rng::seed_from_u64(12);
    for s in [1, 2, 16, 256, 1024] {
        let a = Hd3::sample(s, &mut rng).dense();
        let err = max_orth_err(&a);
        assert!(err < 1e-5, "s={s}: max |AᵀA − I| = {err:e}");
    }
    for s in [8, 24, 136, 520, 1000] {
        let a = Hd3::sample_blocked(s, &mut rng).dense();
        let err = max_orth_err(&a);
        assert!(err < 1e-5, "blocked s={s}: max |AᵀA − I| = {err:e}");
        // The permutations spread every block over all rows: no output row depends on
        // only one Hadamard block's inputs.
        let dense_rows = (0..s).filter(|&r| a.row(r).iter().filter(|v| v.abs() > 1e-7).count() > s / 2).count();
        assert!(dense_rows > s * 9 / 10, "blocked s={s}: only {dense_rows} well-mixed rows");
    }
}

#[test]
fn apply_then_recover_is_identity_for_both_families() {
    let mut rng = ChaCha20Rng::seed_from_u64(13);
    for family in Family::ALL {
        for (n, k, d) in [(1, 8, 5), (7, 8, 64), (120, 8, 100), (300, 8, 33)] {
            let s = order(family, n, k);
            let mask = BlockMask::sample(family, s, &mut rng);
            let x = Matrix::from_fn(s, d, |r, c| ((r * 7 + c * 3) % 11) as f32 - 5.0);
            let mut u = vec![0.0; s * d];
            mask.apply(&x.as_slice()[..n * d], &x.as_slice()[n * d..], d, &mut u);
            // U must differ from X (a mask that does nothing would pass the roundtrip).
            if s > 1 {
                assert!(u.iter().zip(x.as_slice()).any(|(a, b)| (a - b).abs() > 1e-3));
            }
            let mut out = vec![0.0; n * d];
            mask.recover(&u, d, n, &mut out);
            let back = Matrix::from_vec(n, d, out).unwrap();
            let err = back.rel_err(&x.slice_rows(0, n));
            assert!(err < 1e-5, "{family:?} n={n}: {err:e}");
        }
    }
}

/// Mean and mean square of the entry A₀₀ over many samples. For Haar O(s), A₀₀ is
/// symmetric about 0 with E[A₀₀²] = 1/s; the unfixed Householder Q has A₀₀ = −|z₀₀|/‖z₀‖ < 0.
fn entry_moments(s: usize, trials: usize, fix: bool, rng: &mut ChaCha20Rng) -> (f64, f64) {
    let (mut m1, mut m2) = (0.0, 0.0);
    for _ in 0..trials {
        let a = haar::householder_q(s, rng, fix);
        let v = a.get(0, 0) as f64;
        m1 += v;
        m2 += v * v;
    }
    (m1 / trials as f64, m2 / trials as f64)
}

#[test]
fn haar_sampler_is_haar_and_the_unfixed_qr_is_not() {
    let mut rng = ChaCha20Rng::seed_from_u64(14);
    let (s, trials) = (6, 4000);
    // Under Haar, Var(A₀₀) = 1/s, so the sample mean has standard error sqrt(1/(s·trials)).
    let se = (1.0 / (s * trials) as f64).sqrt();
    let (mean, sq) = entry_moments(s, trials, true, &mut rng);
    assert!(mean.abs() < 4.0 * se, "Haar mean {mean} vs se {se}");
    assert!((sq - 1.0 / s as f64).abs() < 0.02, "E[A00²] = {sq}");
    let (mean_unfixed, _) = entry_moments(s, trials, false, &mut rng);
    assert!(mean_unfixed < -10.0 * se, "unfixed QR must be detected: mean {mean_unfixed}");

    // Eigenvalue phases of a Haar rotation spread over (0, π); test symmetry of the trace:
    // E[tr A] = 0 for Haar O(s), but the unfixed Q is biased.
    let tr = |fix: bool, rng: &mut ChaCha20Rng| {
        (0..2000)
            .map(|_| {
                let a = haar::householder_q(s, rng, fix);
                (0..s).map(|i| a.get(i, i) as f64).sum::<f64>()
            })
            .sum::<f64>()
            / 2000.0
    };
    // Var(tr A) = 1 for Haar O(s), s ≥ 2.
    let t_fixed = tr(true, &mut rng);
    assert!(t_fixed.abs() < 4.0 / (2000f64).sqrt(), "Haar trace mean {t_fixed}");
    let t_unfixed = tr(false, &mut rng);
    assert!(t_unfixed.abs() > 10.0 / (2000f64).sqrt(), "unfixed trace mean {t_unfixed}");
}

#[test]
fn scrub_erases_mask_material() {
    let mut rng = ChaCha20Rng::seed_from_u64(15);
    for family in Family::ALL {
        let mut m = BlockMask::sample(family, 16, &mut rng);
        assert!(m.dense().as_slice().iter().any(|&v| v != 0.0));
        m.scrub();
        assert!(m.dense().as_slice().iter().all(|&v| v == 0.0), "{family:?}");
    }
}

#[test]
fn cost_model_prefers_hd3_for_long_blocks_and_haar_for_decode() {
    // The decisions at the rates the 2-core development machine measures when quiet (2.9e11
    // flop/s GEMM, 1.2e10 butterflies/s, 1.7e9 flop/s QR), not at this run's: under a
    // parallel test run a preempted measurement moved a decision this test pinned.
    let measured = CostModel::measured();
    for rate in [measured.tee_gemm, measured.fwht, measured.qr] {
        assert!(rate.is_finite() && rate > 0.0, "{measured:?}");
    }
    let cm = CostModel { tee_gemm: 2.9e11, fwht: 1.2e10, qr: 1.7e9 };
    // Decode: n = 1 → Haar s = 9 vs HD₃ s = 16: HD₃ doubles the engine rows for nothing.
    assert_eq!(cm.choose(1, 8, (2048, 6144), 112, 1e13), Family::Haar);
    // Long prefill: dense Haar costs O(s²·d) in the TEE; HD₃ is O(s·log s·d).
    assert_ne!(cm.choose(2040, 8, (1024, 3072), 112, 1e11), Family::Haar);
    // Just past a power of two the blocked form avoids doubling the engine's rows (whether
    // it also beats Haar there depends on the CPU's GEMM rate against its butterflies).
    let at = |f| cm.cost(f, 128, 8, (768, 3072), 48, 1e11);
    assert!(at(Family::Hd3Blocked) < at(Family::Hd3));
    assert_ne!(cm.choose(128, 8, (768, 3072), 48, 1e11), Family::Hd3);
}

/// Shield factors folded into a dense mask's columns give the product of the mask with the
/// scaled rows, for every family (structured ones scale a copy) and at decode's shape.
#[test]
fn scaled_application_equals_applying_prescaled_rows() {
    let mut rng = ChaCha20Rng::seed_from_u64(21);
    for (family, n, k, d) in
        [(Family::Haar, 1, 8, 37), (Family::Haar, 5, 3, 64), (Family::Hd3, 1, 8, 37), (Family::Hd3Blocked, 3, 9, 16)]
    {
        let s = order(family, n, k);
        let mask = BlockMask::sample(family, s, &mut rng);
        let h: Vec<f32> = (0..n * d).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let g: Vec<f32> = (0..(s - n) * d).map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0).collect();
        let factors: Vec<f32> = (0..s - n).map(|j| 0.5 + j as f32).collect();
        let scaled: Vec<f32> = g.chunks(d).zip(&factors).flat_map(|(row, &f)| row.iter().map(move |v| v * f)).collect();
        let (mut want, mut got) = (vec![0.0f32; s * d], vec![1.0f32; s * d]);
        mask.apply(&h, &scaled, d, &mut want);
        mask.apply_scaled(&h, &g, &factors, d, &mut got);
        let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-4, "{family:?} n {n} k {k}: max error {err:e}");
    }
}

/// A small block's `U`, unmasked with the dense `Aᵀ`, is `[H; S]` with every shield row at
/// norm `energy ×` the mean row norm of `H`; its recovery returns `H`; a prepared shield
/// product serves one linear only; with energy 0 the shield rows are zero. Both product
/// paths (rank-one updates for few rows, a GEMM for more) and every family.
#[test]
fn small_blocks_mask_with_prepared_shields_and_recover_exactly() {
    let mut rng = ChaCha20Rng::seed_from_u64(22);
    for (family, n, k, d) in [
        (Family::Haar, 1, 8, 37),
        (Family::Hd3, 1, 8, 64),
        (Family::Haar, 3, 8, 20),
        (Family::Hd3Blocked, 8, 8, 33),
        (Family::Haar, 13, 3, 16),
    ] {
        let s = order(family, n, k);
        let mask = BlockMask::sample(family, s, &mut rng);
        let a = mask.dense();
        let (lead, mut small) = small::split(&mask, n).expect("small");
        let h: Vec<f32> = (0..n * d).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let mean_norm =
            h.chunks(d).map(|r| r.iter().map(|v| (v * v) as f64).sum::<f64>().sqrt()).sum::<f64>() / n as f64;
        let mut shields: Vec<Vec<f32>> = Vec::new();
        for prepared in [true, false, true] {
            if prepared {
                small.prepare(d, &mut rng);
                assert!(small.is_ready(d));
            }
            let mut u = vec![f32::NAN; s * d];
            small.apply(&lead, &h, d, 4.0, &mut rng, &mut u);
            assert!(!small.is_ready(d), "a prepared product is used once");
            // X = Aᵀ·U.
            let x = tensor::cpu::matmul_tn(&a, &Matrix::from_vec(s, d, u.clone()).unwrap());
            let top = x.slice_rows(0, n);
            assert!(
                top.rel_err(&Matrix::from_vec(n, d, h.clone()).unwrap()) < 1e-5,
                "{family:?} n {n}: activation rows"
            );
            for r in n..s {
                let norm = x.row(r).iter().map(|v| (v * v) as f64).sum::<f64>().sqrt();
                assert!((norm / (4.0 * mean_norm) - 1.0).abs() < 1e-4, "{family:?} n {n}: shield row norm {norm}");
            }
            let rows = x.slice_rows(n, s).as_slice().to_vec();
            assert!(
                shields.iter().all(|old| old.iter().zip(&rows).any(|(p, q)| (p - q).abs() > 1e-3)),
                "fresh shield rows every linear"
            );
            shields.push(rows);
            let mut back = vec![0.0f32; n * d];
            lead.recover(&u, d, &mut back);
            let back = Matrix::from_vec(n, d, back).unwrap();
            assert!(back.rel_err(&Matrix::from_vec(n, d, h.clone()).unwrap()) < 1e-5, "{family:?} n {n}: recovery");
        }
        let mut u = vec![f32::NAN; s * d];
        small.apply(&lead, &h, d, 0.0, &mut rng, &mut u);
        let x = tensor::cpu::matmul_tn(&a, &Matrix::from_vec(s, d, u).unwrap());
        assert!(x.slice_rows(n, s).as_slice().iter().all(|v| v.abs() < 1e-5), "energy 0: zero shield rows");
    }
    let big = BlockMask::sample(Family::Hd3, 128, &mut rng);
    assert!(small::split(&big, 100).is_none());
}
