//! The `dual-lpn` condition through the harness's engine: ring products reach the CPU
//! engine through the capturing wrapper (the answers are the quantized plaintext path's, bit
//! for bit), every ring weight is counted, and the engine's log holds what the capture pairs:
//! the public code (`4·d` rows, one weight) at provisioning, then one operand of words per
//! linear call, which is not the int8 rows it carries.

use std::sync::Arc;

use attack::{Condition, Watched};
use kernels::capture::OpKind;
use protocol::Engine;
use tensor::{Matrix, Weight, WeightLayout, ring::RingWeight};

fn weight(d_in: usize, d_out: usize) -> Weight {
    let data = (0..d_in * d_out).map(|k| ((k * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.2).collect();
    Weight::f32(d_in, d_out, WeightLayout::OutIn, data)
}

#[test]
fn dual_lpn_capture_sees_the_code_then_one_masked_operand_per_linear() {
    let engine = Arc::new(Watched::new());
    let exec = Condition::DualLpn.executor(engine.clone() as Arc<dyn Engine>).unwrap();
    assert_eq!(exec.scheme().executor, "dual-lpn");
    assert!(Condition::DualLpn.ring() && !Condition::Default.ring());
    assert_eq!(Condition::parse("dual-lpn"), Some(Condition::DualLpn));
    exec.provision("q".into(), weight(256, 64)).unwrap();
    assert_eq!(engine.registered(), 1, "the ring weight is counted");

    let code = engine.inner.take();
    assert_eq!(code.len(), 1);
    let words = code[0].words.as_ref().unwrap();
    assert_eq!(code[0].op, OpKind::Ring(vec!["q".into()]));
    assert_eq!((words.rows, words.cols), (4 * 256, 256), "the public code: N = 4·d rows");

    let h = Matrix::from_fn(3, 256, |r, c| ((r * 256 + c) as f32 * 0.173).sin() * (1.0 + r as f32));
    let mut pass = exec.begin(&[2, 1]).unwrap();
    let out = pass.linear_many(&h, &["q".into()]).unwrap();
    pass.end();
    let want = RingWeight::quantize(&weight(256, 64)).unwrap().reference(&h);
    assert_eq!(out[0].as_slice(), want.as_slice(), "the wrapper forwarded the product unchanged");

    let seen = engine.inner.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].op, OpKind::Ring(vec!["q".into()]));
    let words = seen[0].words.as_ref().unwrap();
    assert_eq!((words.rows, words.cols), (3, 256));
    let xq: Vec<u32> = tensor::ring::quantize_rows(&h).0.iter().map(|&v| v as i32 as u32).collect();
    let same = words.data.iter().zip(&xq).filter(|(a, b)| a == b).count();
    assert!(same < 8, "{same} of 768 words equal the int8 rows they carry: the mask is missing");
}
