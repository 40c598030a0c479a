//! U-Verify catches tampering at the rate its bound predicts and never flags honest work.

use std::sync::Arc;

use protocol::Engine;
use protocol::{
    Executor, IntegrityStatus, MaskKind, MaskedConfig, MaskedExecutor, ProtocolError, ShieldConfig, UVerifyConfig,
};
use rand::RngExt;
use tensor::{Matrix, WeightId};

use crate::support::*;

fn verifying(engine: Arc<dyn Engine>, kind: MaskKind, cfg: UVerifyConfig) -> MaskedExecutor {
    MaskedExecutor::new(engine, MaskedConfig { mask: kind, verify: Some(cfg), ..Default::default() }).unwrap()
}

fn pass(exec: &MaskedExecutor, h: &Matrix) -> Result<Matrix, ProtocolError> {
    let mut p = exec.begin(&[h.rows()])?;
    let y = p.linear(h, &WeightId::new("w"));
    p.end();
    y
}

#[test]
fn honest_products_never_fail() {
    let mut r = rng(21);
    let engine: Arc<dyn Engine> = Arc::new(kernels::CpuEngine::new());
    for (i, kind) in [MaskKind::Haar, MaskKind::Hd3].into_iter().enumerate() {
        let exec = verifying(engine.clone(), kind, UVerifyConfig { probes: 4, range: 3 });
        // A wide inner dimension and a large dynamic range stress the rounding bound.
        let (d_in, d_out) = (1536, 96);
        let w = weight(d_in, d_out, &mut r);
        let id = format!("w{i}");
        exec.provision(id.as_str().into(), w).unwrap();
        for trial in 0..300 {
            let n = 1 + trial % 40;
            let scale = [1e-3f32, 1.0, 1e3][trial % 3];
            let mut h = hidden_like(n, d_in, &mut r);
            h.as_mut_slice().iter_mut().for_each(|v| *v *= scale);
            let mut p = exec.begin(&[n]).unwrap();
            p.linear(&h, &WeightId::new(&id)).expect("an honest product failed U-Verify");
            p.end();
        }
        match exec.integrity() {
            IntegrityStatus::Clean { checked } => assert_eq!(checked, 300),
            other => panic!("{other:?}"),
        }
    }
}

/// Runs `trials` independent sessions (fresh probes each) against a tampering engine and
/// returns how many tampered products went unnoticed.
fn misses(trials: usize, tamper: impl Fn(&mut rand_chacha::ChaCha8Rng) -> Tamper, cfg: UVerifyConfig) -> usize {
    let mut r = rng(22);
    let (d_in, d_out, n) = (16, 12, 3);
    let w = weight(d_in, d_out, &mut r);
    let mut missed = 0;
    for _ in 0..trials {
        let engine = Arc::new(TamperingEngine::new());
        let exec = verifying(engine.clone(), MaskKind::Haar, cfg);
        exec.provision("w".into(), w.clone()).unwrap();
        *engine.tamper.lock().unwrap() = Some(tamper(&mut r));
        let h = gaussian(n, d_in, &mut r);
        match pass(&exec, &h) {
            Ok(_) => missed += 1,
            Err(ProtocolError::Integrity(_)) => {
                assert!(matches!(exec.integrity(), IntegrityStatus::Compromised { failures: 1, .. }));
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    missed
}

#[test]
fn a_single_wrong_element_is_always_caught() {
    let cfg = UVerifyConfig { probes: 2, range: 3 };
    let missed =
        misses(2_000, |r| Tamper::Element { row: r.random_range(0..11), col: r.random_range(0..12), delta: 5.0 }, cfg);
    // Probe entries are never 0, so E·r = δ·r_col ≠ 0 for every probe.
    assert_eq!(missed, 0);
}

#[test]
fn rank_one_tampering_is_caught_at_the_rate_the_bound_predicts() {
    let cfg = UVerifyConfig { probes: 2, range: 3 };
    let trials = 10_000;
    let missed = misses(
        trials,
        |r| {
            let a = r.random_range(0..12);
            let b = (a + r.random_range(1..12)) % 12;
            Tamper::RankOne { row: r.random_range(0..11), a, b, delta: 5.0 }
        },
        cfg,
    );
    // E = δ·e_row·(e_a − e_b)ᵀ escapes a probe iff r_a = r_b: probability 1/(2L) per probe,
    // so (2L)^−k overall — the Schwartz–Zippel bound is tight for this perturbation.
    let p = cfg.miss_bound();
    let expected = p * trials as f64;
    let sd = (trials as f64 * p * (1.0 - p)).sqrt();
    let rate = missed as f64 / trials as f64;
    eprintln!("rank-1 tamper: {missed}/{trials} undetected ({rate:.4}), bound {p:.4}");
    assert!((missed as f64 - expected).abs() < 5.0 * sd, "miss count {missed}, expected {expected:.0} ± {sd:.0}");
}

#[test]
fn a_scaled_output_is_caught() {
    let cfg = UVerifyConfig { probes: 2, range: 3 };
    assert_eq!(misses(1_000, |_| Tamper::Scale(1.01), cfg), 0);
}

#[test]
fn more_probes_shrink_the_miss_rate() {
    let cfg = UVerifyConfig { probes: 4, range: 3 };
    let trials = 4_000;
    let missed = misses(trials, |_| Tamper::RankOne { row: 0, a: 1, b: 2, delta: 5.0 }, cfg);
    // Bound 6^−4 ≈ 7.7e−4: about 3 expected; far fewer than the k = 2 rate would give.
    assert!(missed <= 15, "{missed} misses with k = 4");
}

#[test]
fn a_failure_poisons_the_session_and_redraws_probes() {
    let engine = Arc::new(TamperingEngine::new());
    let exec = verifying(engine.clone(), MaskKind::Hd3, UVerifyConfig::default());
    let mut r = rng(23);
    exec.provision("w".into(), weight(32, 16, &mut r)).unwrap();
    let h = gaussian(4, 32, &mut r);
    assert!(pass(&exec, &h).is_ok());
    *engine.tamper.lock().unwrap() = Some(Tamper::Element { row: 0, col: 3, delta: 1.0 });
    let err = pass(&exec, &h).unwrap_err();
    assert!(matches!(err, ProtocolError::Integrity(_)), "{err}");
    assert!(err.to_string().contains("weight `w`"));
    match exec.integrity() {
        IntegrityStatus::Compromised { failures, .. } => assert_eq!(failures, 1),
        other => panic!("{other:?}"),
    }
    // Honest again: the redrawn probes verify fine; the engine stays flagged.
    *engine.tamper.lock().unwrap() = None;
    assert!(pass(&exec, &h).is_ok());
    assert!(matches!(exec.integrity(), IntegrityStatus::Compromised { .. }));
    let _ = ShieldConfig::default();
}
