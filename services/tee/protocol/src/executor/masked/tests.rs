use super::*;
use crate::{
    executor::{PlaintextExecutor, test_engine::HostEngine},
    mask::Family,
};

#[test]
fn every_pass_samples_fresh_masks_per_sequence() {
    let engine: Arc<dyn Engine> = Arc::new(HostEngine::default());
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
    let engine: Arc<dyn Engine> = Arc::new(HostEngine::default());
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
    let engine: Arc<dyn Engine> = Arc::new(HostEngine::default());
    let cfg = MaskedConfig { mask: MaskKind::Haar, decode_masks: DecodeMasks::Shared, ..Default::default() };
    let exec = MaskedExecutor::new(engine, cfg).unwrap();
    let d = 24;
    let w: Vec<f32> = (0..d * d).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
    exec.provision("w".into(), Weight::f32(d, d, WeightLayout::InOut, w.clone())).unwrap();
    // The reference runs on an engine of its own: one engine holds one weight per name.
    let plain = PlaintextExecutor::new(Arc::new(HostEngine::default()));
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
    // The rule the executor follows, public for the attack harness's capture.
    assert_eq!(DecodeMasks::Shared.mask_blocks(&[1; 5]), vec![5]);
    assert_eq!(DecodeMasks::Shared.mask_blocks(&[1, 4]), vec![1, 4]);
    assert_eq!(DecodeMasks::Shared.mask_blocks(&[1]), vec![1]);
    assert_eq!(DecodeMasks::PerSequence.mask_blocks(&[1; 5]), vec![1; 5]);
    // The default is unchanged, and absent from the scheme as before the option.
    let json = serde_json::to_string(&MaskedConfig::default()).unwrap();
    assert!(!json.contains("decode_masks"), "{json}");
    assert!(serde_json::to_string(&cfg).unwrap().contains("\"decode_masks\":\"shared\""));
}

/// Decode passes (small blocks with shield products prepared during the previous engine
/// call) give the plaintext products, pass after pass and across input widths, for one and
/// several sequences, per-sequence and shared masks, both families.
#[test]
fn decode_passes_with_prepared_shields_match_plaintext() {
    let (d1, d2) = (24, 40);
    let weight = |i: usize, o: usize, seed: usize| {
        (0..i * o).map(|x| (((x * 7 + seed) % 13) as f32 - 6.0) / 10.0).collect::<Vec<f32>>()
    };
    let plain = PlaintextExecutor::new(Arc::new(HostEngine::default()));
    plain.provision("a".into(), Weight::f32(d1, d2, WeightLayout::InOut, weight(d1, d2, 1))).unwrap();
    plain.provision("b".into(), Weight::f32(d2, d1, WeightLayout::InOut, weight(d2, d1, 2))).unwrap();
    for (mask, decode_masks) in [
        (MaskKind::Haar, DecodeMasks::PerSequence),
        (MaskKind::Hd3, DecodeMasks::PerSequence),
        (MaskKind::Haar, DecodeMasks::Shared),
    ] {
        let exec = MaskedExecutor::new(
            Arc::new(HostEngine::default()),
            MaskedConfig { mask, decode_masks, ..Default::default() },
        )
        .unwrap();
        exec.provision("a".into(), Weight::f32(d1, d2, WeightLayout::InOut, weight(d1, d2, 1))).unwrap();
        exec.provision("b".into(), Weight::f32(d2, d1, WeightLayout::InOut, weight(d2, d1, 2))).unwrap();
        for (step, blocks) in [vec![1usize], vec![1, 1, 1], vec![1], vec![1, 1, 1]].into_iter().enumerate() {
            let rows = blocks.len();
            let mut p = exec.begin(&blocks).unwrap();
            assert!(unsafe_downcast(&*p).small.iter().all(Option::is_some), "decode blocks are small");
            let mut q = plain.begin(&blocks).unwrap();
            let mut h = Matrix::from_fn(rows, d1, |r, c| ((r * 5 + c * 3 + step) % 11) as f32 - 5.0);
            for _ in 0..3 {
                let y = p.linear(&h, &"a".into()).unwrap();
                let want = q.linear(&h, &"a".into()).unwrap();
                assert!(y.rel_err(&want) < 1e-5, "{mask:?} {decode_masks:?} step {step}: a");
                if step > 0 {
                    // Both widths are known from the first pass: while `a` ran, the shield
                    // products for the next linears were prepared.
                    let small = &unsafe_downcast(&*p).small;
                    assert!(
                        small.iter().flatten().all(|b| b.is_ready(d1) && b.is_ready(d2)),
                        "{mask:?} {decode_masks:?} step {step}"
                    );
                }
                let z = p.linear(&want, &"b".into()).unwrap();
                let want = q.linear(&want, &"b".into()).unwrap();
                assert!(z.rel_err(&want) < 1e-5, "{mask:?} {decode_masks:?} step {step}: b");
                h = Matrix::from_fn(rows, d1, |r, c| want.get(r, c) / 100.0);
            }
        }
        assert_eq!(*exec.widths.lock().unwrap(), vec![d1, d2], "widths carried from pass to pass");
    }
}
