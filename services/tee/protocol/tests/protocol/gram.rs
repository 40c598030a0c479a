//! What the engine sees: the Gram leak without shield rows, and freshness across passes.

use std::sync::Arc;

use kernels::{CpuEngine, capture::CapturingEngine};
use protocol::Engine;
use protocol::{Executor, MaskKind, MaskedConfig, MaskedExecutor, ShieldConfig};
use tensor::{Matrix, cpu::matmul_tn};

use crate::support::*;

fn captured_operand(kind: MaskKind, shield: ShieldConfig, h: &Matrix) -> Matrix {
    let engine = Arc::new(CapturingEngine::new(CpuEngine::new()));
    let dyn_engine: Arc<dyn Engine> = engine.clone();
    let exec = MaskedExecutor::new(dyn_engine, MaskedConfig { mask: kind, shield, ..Default::default() }).unwrap();
    exec.provision("w".into(), weight(h.cols(), 8, &mut rng(1))).unwrap();
    run(&exec, h, "w", &[h.rows()]);
    let mut seen = engine.take();
    assert_eq!(seen.len(), 1);
    seen.pop().unwrap().operand
}

#[test]
fn without_shield_rows_the_engine_sees_the_gram_matrix_and_with_them_it_does_not() {
    let h = hidden_like(16, 64, &mut rng(2));
    let gram = matmul_tn(&h, &h);
    for kind in [MaskKind::Haar, MaskKind::Hd3, MaskKind::Hd3Blocked] {
        // No shield: UᵀU = HᵀAᵀAH = HᵀH exactly (up to rounding) — the leak.
        let u = captured_operand(kind, ShieldConfig::off(), &h);
        let leak = matmul_tn(&u, &u).rel_err(&gram);
        assert!(leak < 1e-4, "{kind:?}: expected the Gram leak, got distance {leak}");
        // The operand itself is not H.
        assert!(u.slice_rows(0, 16).rel_err(&h) > 0.5);
        // Default shield (8 rows at 4× the mean row norm): UᵀU = HᵀH + SᵀS, far from HᵀH.
        let u = captured_operand(kind, ShieldConfig::default(), &h);
        let shielded = matmul_tn(&u, &u).rel_err(&gram);
        assert!(shielded > 1.0, "{kind:?}: shield rows should dominate the Gram, distance {shielded}");
    }
}

#[test]
fn identical_inputs_in_two_passes_give_unrelated_operands() {
    let h = hidden_like(12, 32, &mut rng(3));
    for kind in [MaskKind::Haar, MaskKind::Hd3, MaskKind::Hd3Blocked] {
        let a = captured_operand(kind, ShieldConfig::off(), &h);
        let b = captured_operand(kind, ShieldConfig::off(), &h);
        assert!(a.rel_err(&b) > 0.5, "{kind:?}: two passes reused a mask");
    }
}
