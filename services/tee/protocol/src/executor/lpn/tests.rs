use std::sync::Arc;

use tensor::{Matrix, Weight, WeightId, WeightLayout, ring::RingWeight};

use super::*;
use crate::{Engine, EngineError, EngineInfo, Masked, Registered, executor::test_engine::HostEngine};

fn weight(d_in: usize, d_out: usize, seed: usize) -> Weight {
    let data = (0..d_in * d_out).map(|k| (((k + seed) * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.2).collect();
    Weight::f32(d_in, d_out, WeightLayout::OutIn, data)
}

fn input(rows: usize, d: usize, seed: f32) -> Matrix {
    Matrix::from_fn(rows, d, |r, c| ((r * d + c) as f32 * 0.173 + seed).sin() * (1.0 + r as f32))
}

fn executor(engine: Arc<dyn Engine>, cfg: DualLpnConfig) -> DualLpnExecutor {
    let exec = DualLpnExecutor::new(engine, cfg).unwrap();
    exec.provision("q".into(), weight(256, 96, 1)).unwrap();
    exec.provision("k".into(), weight(256, 40, 2)).unwrap();
    exec.provision("down".into(), weight(300, 256, 3)).unwrap();
    exec
}

#[test]
fn products_equal_the_quantized_plaintext_path_bit_for_bit() {
    let exec = executor(Arc::new(HostEngine::default()), DualLpnConfig::default());
    let blocks = [3, 1, 5];
    let h = input(9, 256, 0.3);
    let mut pass = exec.begin(&blocks).unwrap();
    let outs = pass.linear_many(&h, &["q".into(), "k".into()]).unwrap();
    for (out, (d_out, seed)) in outs.iter().zip([(96, 1), (40, 2)]) {
        let want = RingWeight::quantize(&weight(256, d_out, seed)).unwrap().reference(&h);
        assert_eq!(out.as_slice(), want.as_slice());
    }
    let h2 = input(9, 300, 1.1);
    let down = pass.linear(&h2, &"down".into()).unwrap();
    assert_eq!(down.as_slice(), RingWeight::quantize(&weight(300, 256, 3)).unwrap().reference(&h2).as_slice());
    pass.end();

    // The counts are the analysis' formulas: t·d to mask, t·d_out to unmask, per row.
    let c = exec.counts();
    let t = noise_weight(256).unwrap() as u64;
    assert_eq!(c.rows, 18);
    assert_eq!(c.mask_macs, 9 * t * 256 + 9 * t * 300);
    assert_eq!(c.unmask_macs, 9 * t * (96 + 40) + 9 * t * 256);
    assert_eq!(c.table_bytes, 4 * (9 * t * (256 + 136) + 9 * t * (300 + 256)));
    assert_eq!(c.engine_macs, 9 * 256 * 136 + 9 * 300 * 256);
    assert_eq!(c.codes_drawn, 2, "one code per input width");
    assert_eq!(exec.integrity(), IntegrityStatus::Clean { checked: 27 });
    let held = 4 * (4 * 256 * 256 + 4 * 300 * 300 + 4 * 256 * 136 + 4 * 300 * 256 + 4 * 392 + 4 * 812);
    assert_eq!(exec.table_bytes_held(), held);
}

#[test]
fn fresh_codes_after_the_row_budget_and_still_exact() {
    let exec = executor(Arc::new(HostEngine::default()), DualLpnConfig { probes: 2, rows_per_code: 8 });
    let w = RingWeight::quantize(&weight(256, 96, 1)).unwrap();
    for round in 0..4 {
        let h = input(3, 256, round as f32);
        let mut pass = exec.begin(&[3]).unwrap();
        assert_eq!(pass.linear(&h, &"q".into()).unwrap().as_slice(), w.reference(&h).as_slice(), "round {round}");
        pass.end();
    }
    // 12 rows at 8 a code: the first code, then one redraw of both widths.
    assert_eq!(exec.counts().codes_drawn, 2 + 2);
    let mut pass = exec.begin(&[9]).unwrap();
    assert!(matches!(pass.linear(&input(9, 256, 0.0), &"q".into()), Err(ProtocolError::Config(_))));
}

/// The host engine as an attacker or a lesser device may run it: optionally without ring
/// products, corrupting ring products of a given row count, or recording their operands.
#[derive(Default)]
struct Device {
    inner: HostEngine,
    no_ring: bool,
    /// `(rows, at, delta)`: adds `delta` to word `at` of every ring product with `rows` rows.
    tamper: Option<(usize, usize, u32)>,
    seen: std::sync::Mutex<Vec<u32>>,
}

impl Engine for Device {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }
    fn register(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        self.inner.register(id, weight)
    }
    fn unregister(&self, id: &WeightId) -> Result<(), EngineError> {
        self.inner.unregister(id)
    }
    fn matmul_many(&self, x: &Masked, ids: &[WeightId]) -> Result<Vec<Matrix>, EngineError> {
        self.inner.matmul_many(x, ids)
    }
    fn matmul_dynamic(&self, a: &Masked, b: &Masked, transpose_b: bool) -> Result<Matrix, EngineError> {
        self.inner.matmul_dynamic(a, b, transpose_b)
    }
    fn softmax_rows(&self, x: &Masked, scale: f32) -> Result<Matrix, EngineError> {
        self.inner.softmax_rows(x, scale)
    }
    fn register_ring(&self, id: WeightId, weight: Arc<RingWeight>) -> Result<(), EngineError> {
        if self.no_ring {
            return Err(EngineError::Unsupported("ring products"));
        }
        self.inner.register_ring(id, weight)
    }
    fn ring_matmul_many(&self, x: &RingMasked, ids: &[WeightId]) -> Result<Vec<Vec<u32>>, EngineError> {
        if x.rows() < 1024 {
            self.seen.lock().unwrap().extend_from_slice(x.as_slice());
        }
        let mut out = self.inner.ring_matmul_many(x, ids)?;
        if let Some((rows, at, delta)) = self.tamper
            && x.rows() == rows
        {
            for y in &mut out {
                y[at] = y[at].wrapping_add(delta);
            }
        }
        Ok(out)
    }
}

#[test]
fn wrong_products_are_caught_by_freivalds_or_the_range_check() {
    // Odd errors, errors in the high bits only, and the top bit alone: the probes catch the
    // first two kinds, the range check the last.
    for delta in [1u32, 0x0001_0000, 3 << 24, 1 << 31] {
        let engine = Device { tamper: Some((2, 5, delta)), ..Device::default() };
        let exec = DualLpnExecutor::new(Arc::new(engine), DualLpnConfig::default()).unwrap();
        exec.provision("q".into(), weight(256, 96, 1)).unwrap();
        let mut pass = exec.begin(&[2]).unwrap();
        let err = pass.linear(&input(2, 256, 0.5), &"q".into()).unwrap_err();
        assert!(matches!(err, ProtocolError::Integrity(_)), "delta {delta:#x}: {err}");
        assert!(matches!(exec.integrity(), IntegrityStatus::Compromised { failures: 1, .. }));
    }
}

#[test]
fn a_wrong_table_is_refused_at_provisioning() {
    let engine = Arc::new(Device { tamper: Some((4 * 256, 77, 9)), ..Device::default() });
    let exec = DualLpnExecutor::new(engine.clone(), DualLpnConfig::default()).unwrap();
    assert!(matches!(exec.provision("q".into(), weight(256, 96, 1)), Err(ProtocolError::Integrity(_))));
    // The weight is not left registered on the engine.
    assert!(engine.ring_matmul_many(&RingMasked::new(1, 256, vec![0; 256]), &["q".into()]).is_err());
}

#[test]
fn bad_input_gets_typed_errors() {
    let exec = DualLpnExecutor::new(Arc::new(HostEngine::default()), DualLpnConfig::default()).unwrap();
    assert!(matches!(exec.provision("narrow".into(), weight(100, 8, 0)), Err(ProtocolError::Config(_))));
    exec.provision("q".into(), weight(256, 96, 1)).unwrap();
    assert!(matches!(exec.provision("q".into(), weight(256, 96, 1)), Err(ProtocolError::DuplicateWeight(_))));
    let mut pass = exec.begin(&[2]).unwrap();
    assert!(matches!(pass.linear(&input(2, 256, 0.0), &"nope".into()), Err(ProtocolError::UnknownWeight(_))));
    assert!(matches!(pass.linear(&input(3, 256, 0.0), &"q".into()), Err(ProtocolError::Shape { .. })));
    let mut nan = input(2, 256, 0.0);
    nan.set(1, 3, f32::NAN);
    assert!(matches!(pass.linear(&nan, &"q".into()), Err(ProtocolError::NonFinite { .. })));
    assert!(matches!(exec.begin(&[]), Err(ProtocolError::EmptyPass)));
    assert!(
        DualLpnExecutor::new(Arc::new(HostEngine::default()), DualLpnConfig { probes: 1, rows_per_code: 0 }).is_err()
    );
}

#[test]
fn an_engine_without_ring_products_is_refused_by_name() {
    let exec = DualLpnExecutor::new(Arc::new(Device { no_ring: true, ..Device::default() }), DualLpnConfig::default())
        .unwrap();
    let err = exec.provision("q".into(), weight(256, 96, 1)).unwrap_err();
    assert_eq!(err, ProtocolError::Engine(EngineError::Unsupported("ring products")));
}

#[test]
fn the_scheme_names_dual_lpn_and_its_settings() {
    let exec = DualLpnExecutor::new(Arc::new(HostEngine::default()), DualLpnConfig::default()).unwrap();
    let json = serde_json::to_value(exec.scheme()).unwrap();
    assert_eq!(json["executor"], "dual-lpn");
    assert_eq!(json["lpn"]["probes"], 4);
    assert_eq!(json["lpn"]["rows_per_code"], 1 << 20);
    let sealed = serde_json::to_value(super::super::SealedExecutor::new().scheme()).unwrap();
    assert!(sealed.get("lpn").is_none(), "other executors' attested JSON is unchanged");
    assert_eq!("dual-lpn".parse::<super::super::Protection>().unwrap().as_str(), "dual-lpn");
    // Miss bounds: 2^-9 a probe at d = 384, 2^-7 at 1536, 2^-4 at 12,288.
    let cfg = DualLpnConfig::default();
    assert_eq!(cfg.miss_bound(384), 2f64.powi(-36));
    assert_eq!(cfg.miss_bound(1536), 2f64.powi(-28));
    assert_eq!(cfg.miss_bound(12_288), 2f64.powi(-16));
}

/// What the engine receives, against uniform words: a chi-square test on each byte of
/// the words, which the raw int8 rows fail by a wide margin and the masked rows pass.
#[test]
fn masked_operands_are_indistinguishable_from_uniform_by_byte_statistics() {
    let engine = Arc::new(Device::default());
    let exec = DualLpnExecutor::new(engine.clone(), DualLpnConfig::default()).unwrap();
    exec.provision("q".into(), weight(256, 96, 1)).unwrap();
    // The most structured inputs there are: constant rows and all-zero rows.
    let h = Matrix::from_fn(64, 256, |r, _| if r % 2 == 0 { 1.0 } else { 0.0 });
    let mut pass = exec.begin(&[64]).unwrap();
    pass.linear(&h, &"q".into()).unwrap();
    let seen = engine.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 64 * 256);
    // 99.9th percentile of chi-square with 255 degrees of freedom: 339.
    for byte in 0..4 {
        assert!(chi_square_bytes(&seen, byte) < 339.0, "byte {byte} of the masked words is not uniform");
    }
    let plain: Vec<u32> = tensor::ring::quantize_rows(&h).0.iter().map(|&v| v as i32 as u32).collect();
    assert!(chi_square_bytes(&plain, 0) > 10_000.0, "the control must be told apart");
}

fn chi_square_bytes(words: &[u32], byte: usize) -> f64 {
    let mut counts = [0u64; 256];
    for w in words {
        counts[((w >> (8 * byte)) & 0xff) as usize] += 1;
    }
    let e = words.len() as f64 / 256.0;
    counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum()
}
