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
