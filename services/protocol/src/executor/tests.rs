use super::*;
use crate::mask::Family;

#[test]
fn every_pass_samples_fresh_masks_per_sequence() {
    let engine: Arc<dyn Engine> = Arc::new(kernels::CpuEngine::new());
    for kind in [MaskKind::Haar, MaskKind::Hd3] {
        let exec = MaskedExecutor::new(engine.clone(), MaskedConfig { mask: kind, ..Default::default() }).unwrap();
        let p1 = exec.begin(&[5, 5]).unwrap();
        let p1 = unsafe_downcast(&*p1);
        let m1 = p1.dense_masks();
        let p2 = exec.begin(&[5, 5]).unwrap();
        let m2 = unsafe_downcast(&*p2).dense_masks();
        // Two sequences of one pass, and the same sequence in two passes, never share A.
        assert!(m1[0].rel_err(&m1[1]) > 0.5, "{kind:?}");
        assert!(m1[0].rel_err(&m2[0]) > 0.5, "{kind:?}");
    }
}

#[test]
fn auto_resolves_to_a_concrete_family() {
    let engine: Arc<dyn Engine> = Arc::new(kernels::CpuEngine::new());
    let exec = MaskedExecutor::new(engine, MaskedConfig::default()).unwrap();
    exec.provision("w".into(), Weight::f32(64, 64, WeightLayout::InOut, vec![0.5; 64 * 64])).unwrap();
    let fam = exec.family(1);
    assert!(matches!(fam, Family::Haar | Family::Hd3));
}

/// The passes made by `MaskedExecutor::begin` are `MaskedPass`es.
fn unsafe_downcast<'a>(p: &'a (dyn Pass + 'a)) -> &'a MaskedPass<'a> {
    // SAFETY: in this module every pass under test comes from MaskedExecutor::begin.
    unsafe { &*(p as *const dyn Pass as *const MaskedPass<'a>) }
}

#[test]
fn shared_decode_masks_mix_a_decode_steps_rows_under_one_block() {
    let engine: Arc<dyn Engine> = Arc::new(kernels::CpuEngine::new());
    let cfg = MaskedConfig { mask: MaskKind::Haar, decode_masks: DecodeMasks::Shared, ..Default::default() };
    let exec = MaskedExecutor::new(engine, cfg).unwrap();
    let d = 24;
    let w: Vec<f32> = (0..d * d).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
    exec.provision("w".into(), Weight::f32(d, d, WeightLayout::InOut, w.clone())).unwrap();
    // The reference runs on an engine of its own: one engine holds one weight per name.
    let plain = PlaintextExecutor::new(Arc::new(kernels::CpuEngine::new()));
    plain.provision("w".into(), Weight::f32(d, d, WeightLayout::InOut, w)).unwrap();
    let h = Matrix::from_fn(5, d, |r, c| ((r * 5 + c * 3) % 11) as f32 - 5.0);
    // A decode step (every sequence one row): one block of 5 rows under 8 shield rows.
    let mut p = exec.begin(&[1; 5]).unwrap();
    assert_eq!(unsafe_downcast(&*p).dense_masks().iter().map(Matrix::rows).collect::<Vec<_>>(), vec![13]);
    let y = p.linear(&h, &"w".into()).unwrap();
    let mut q = plain.begin(&[1; 5]).unwrap();
    assert!(y.rel_err(&q.linear(&h, &"w".into()).unwrap()) < 1e-5);
    // A pass with a longer sequence keeps one block per sequence.
    let p = exec.begin(&[1, 4]).unwrap();
    assert_eq!(unsafe_downcast(&*p).dense_masks().iter().map(Matrix::rows).collect::<Vec<_>>(), vec![9, 12]);
    // The default is unchanged, and absent from the scheme as before the option.
    let json = serde_json::to_string(&MaskedConfig::default()).unwrap();
    assert!(!json.contains("decode_masks"), "{json}");
    assert!(serde_json::to_string(&cfg).unwrap().contains("\"decode_masks\":\"shared\""));
}
