//! Bad input gets a typed error, never a panic.

use std::sync::Arc;

use kernels::CpuEngine;
use protocol::{
    Executor, MaskKind, MaskedConfig, MaskedExecutor, ProtocolError, ShieldConfig, UVerifyConfig, attention::Head,
};
use tensor::{Matrix, Weight, WeightId, WeightLayout};

use crate::support::*;

fn executors() -> Vec<Box<dyn Executor>> {
    vec![
        Box::new(plain()),
        Box::new(masked(MaskKind::Haar, ShieldConfig::default())),
        Box::new(masked(MaskKind::Hd3, ShieldConfig::default())),
        Box::new(masked(MaskKind::Hd3Blocked, ShieldConfig::default())),
        Box::new(masked(MaskKind::Auto, ShieldConfig::off())),
    ]
}

#[test]
fn every_bad_input_has_its_own_error() {
    for exec in executors() {
        let exec = exec.as_ref();
        exec.provision("w".into(), Weight::f32(4, 3, WeightLayout::InOut, vec![0.5; 12])).unwrap();
        // Provisioning.
        assert!(matches!(
            exec.provision("w".into(), Weight::f32(4, 3, WeightLayout::InOut, vec![0.5; 12])),
            Err(ProtocolError::DuplicateWeight(_))
        ));
        assert!(matches!(
            exec.provision("short".into(), Weight::f32(4, 3, WeightLayout::InOut, vec![0.5; 11])),
            Err(ProtocolError::Engine(protocol::EngineError::Shape { .. }))
        ));
        // Passes over nothing.
        assert!(matches!(exec.begin(&[]).err(), Some(ProtocolError::EmptyPass)));
        assert!(matches!(exec.begin(&[3, 0]).err(), Some(ProtocolError::EmptyPass)));

        let mut pass = exec.begin(&[2]).unwrap();
        let good = Matrix::from_fn(2, 4, |r, c| (r + c) as f32);
        assert!(matches!(pass.linear(&good, &WeightId::new("nope")), Err(ProtocolError::UnknownWeight(_))));
        assert!(matches!(pass.linear(&Matrix::zeros(3, 4), &"w".into()), Err(ProtocolError::Shape { .. })));
        assert!(matches!(pass.linear(&Matrix::zeros(2, 5), &"w".into()), Err(ProtocolError::Shape { .. })));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut h = good.clone();
            h.set(1, 2, bad);
            assert!(matches!(pass.linear(&h, &"w".into()), Err(ProtocolError::NonFinite { .. })));
        }
        let (q, k, v) = (Matrix::zeros(2, 4), Matrix::zeros(2, 5), Matrix::zeros(2, 4));
        let heads = [Head { q: &q, k: &k, v: &v }];
        assert!(matches!(pass.attend(&heads, 1.0, None), Err(ProtocolError::Shape { .. })));
        // A non-finite query, or a key or value that arrived with it (the last rows of a
        // cache one decode step grew by one row), is refused.
        let (q, kv) = (Matrix::zeros(1, 4), Matrix::zeros(3, 4));
        for (which, row) in [(0, 0), (1, 2), (2, 2)] {
            let (mut q, mut k, mut v) = (q.clone(), kv.clone(), kv.clone());
            [&mut q, &mut k, &mut v][which].set(row, 1, f32::NAN);
            let heads = [Head { q: &q, k: &k, v: &v }];
            let got = pass.attend(&heads, 1.0, Some(2));
            assert!(matches!(got, Err(ProtocolError::NonFinite { op: "attend" })), "operand {which}: {got:?}");
        }
        // The pass still works after refusing bad input.
        assert_eq!(pass.linear(&good, &"w".into()).unwrap().shape(), (2, 3));
        pass.end();
    }
}

#[test]
fn invalid_configurations_are_refused() {
    let engine = Arc::new(CpuEngine::new());
    let bad_verify = MaskedConfig { verify: Some(UVerifyConfig { probes: 0, range: 3 }), ..Default::default() };
    assert!(matches!(MaskedExecutor::new(engine.clone(), bad_verify), Err(ProtocolError::Config(_))));
    let bad_energy = MaskedConfig { shield: ShieldConfig { rows: 8, energy: f32::NAN }, ..Default::default() };
    assert!(matches!(MaskedExecutor::new(engine, bad_energy), Err(ProtocolError::Config(_))));
}
