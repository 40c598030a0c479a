//! Masked products equal plain products, for both mask families, all lengths, batched or not.

use proptest::prelude::*;
use protocol::{Executor, MaskKind, ShieldConfig, attention::Head};
use tensor::Matrix;

use crate::support::*;

fn check_parity(kind: MaskKind, n: usize, d_in: usize, d_out: usize, seed: u64) {
    let mut r = rng(seed);
    let h = gaussian(n, d_in, &mut r);
    let w = weight(d_in, d_out, &mut r);
    let p = plain();
    let m = masked(kind, ShieldConfig::default());
    p.provision("w".into(), w.clone()).unwrap();
    m.provision("w".into(), w).unwrap();
    let want = run(&p, &h, "w", &[n]);
    let got = run(&m, &h, "w", &[n]);
    let err = got.rel_err(&want);
    assert!(err < 1e-5, "{kind:?} n={n}: relative error {err:e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn masked_equals_plain_for_every_length(n in 1usize..=300, seed in any::<u64>()) {
        let kind = [MaskKind::Haar, MaskKind::Hd3, MaskKind::Hd3Blocked][(seed % 3) as usize];
        check_parity(kind, n, 48, 40, seed);
    }

    #[test]
    fn batched_equals_single(lens in prop::collection::vec(1usize..40, 1..6), seed in any::<u64>()) {
        let kind = [MaskKind::Haar, MaskKind::Hd3, MaskKind::Hd3Blocked][(seed % 3) as usize];
        let mut r = rng(seed);
        let total: usize = lens.iter().sum();
        let h = gaussian(total, 32, &mut r);
        let m = masked(kind, ShieldConfig::default());
        m.provision("w".into(), weight(32, 24, &mut r)).unwrap();
        let batched = run(&m, &h, "w", &lens);
        let mut start = 0;
        for &n in &lens {
            let single = run(&m, &h.slice_rows(start, start + n), "w", &[n]);
            let err = batched.slice_rows(start, start + n).rel_err(&single);
            prop_assert!(err < 1e-5, "block of {} rows: {:e}", n, err);
            start += n;
        }
    }
}

#[test]
fn parity_at_long_lengths() {
    for (n, seed) in [(511, 1), (512, 2), (513, 3), (1024, 4), (2048, 5)] {
        check_parity(MaskKind::Hd3, n, 64, 48, seed);
        check_parity(MaskKind::Hd3Blocked, n, 64, 48, seed);
    }
    // Dense Haar costs O(s³) to sample; two long lengths are enough to cover it.
    for (n, seed) in [(777, 6), (2048, 7)] {
        check_parity(MaskKind::Haar, n, 64, 48, seed);
    }
}

#[test]
fn linear_many_equals_separate_linears() {
    let mut r = rng(9);
    let m = masked(MaskKind::Auto, ShieldConfig::default());
    let p = plain();
    for id in ["q", "k", "v"] {
        let w = weight(40, 24, &mut r);
        m.provision(id.into(), w.clone()).unwrap();
        p.provision(id.into(), w).unwrap();
    }
    let h = gaussian(13, 40, &mut r);
    let ids: Vec<tensor::WeightId> = ["q", "k", "v"].iter().map(|&s| s.into()).collect();
    let mut pass = m.begin(&[13]).unwrap();
    let many = pass.linear_many(&h, &ids).unwrap();
    pass.end();
    for (id, got) in ids.iter().zip(&many) {
        let want = run(&p, &h, id.as_str(), &[13]);
        assert!(got.rel_err(&want) < 1e-5);
    }
}

#[test]
fn engine_side_attention_equals_tee_attention() {
    use protocol::{AttentionConfig, MaskedConfig, MaskedExecutor};
    use std::sync::Arc;
    let mut r = rng(10);
    let (n, dh) = (24, 16);
    let qs: Vec<Matrix> = (0..3).map(|_| gaussian(n, dh, &mut r)).collect();
    let ks: Vec<Matrix> = (0..3).map(|_| gaussian(n, dh, &mut r)).collect();
    let vs: Vec<Matrix> = (0..3).map(|_| gaussian(n, dh, &mut r)).collect();
    let heads: Vec<Head> = (0..3).map(|i| Head { q: &qs[i], k: &ks[i], v: &vs[i] }).collect();
    let scale = 1.0 / (dh as f32).sqrt();
    let reference = plain();
    for causal in [None, Some(0)] {
        let want = reference.begin(&[n]).unwrap().attend(&heads, scale, causal).unwrap();
        for attention in [
            AttentionConfig { out_attn_mult_min_len: Some(8), permuted_min_len: None },
            AttentionConfig { out_attn_mult_min_len: None, permuted_min_len: Some(8) },
        ] {
            let cfg = MaskedConfig { attention, ..Default::default() };
            let exec = MaskedExecutor::new(Arc::new(kernels::CpuEngine::new()), cfg).unwrap();
            let got = exec.begin(&[n]).unwrap().attend(&heads, scale, causal).unwrap();
            for (g, w) in got.iter().zip(&want) {
                let err = g.rel_err(w);
                assert!(err < 1e-4, "{attention:?} causal={causal:?}: {err:e}");
            }
        }
    }
}

/// A batch's heads may have several key lengths (one call for every sequence of a BERT
/// batch): under every attention lever, split by length or not, each head's answer has its
/// own shape and value, in the heads' order.
#[test]
fn mixed_length_heads_are_answered_in_order_under_every_lever() {
    use protocol::{AttentionConfig, MaskedConfig, MaskedExecutor};
    use std::sync::Arc;
    let mut r = rng(11);
    let dh = 8;
    let lens = [24, 5, 24, 12, 3];
    let qs: Vec<Matrix> = lens.iter().map(|&n| gaussian(n, dh, &mut r)).collect();
    let ks: Vec<Matrix> = lens.iter().map(|&n| gaussian(n, dh, &mut r)).collect();
    let vs: Vec<Matrix> = lens.iter().map(|&n| gaussian(n, dh, &mut r)).collect();
    let heads: Vec<Head> = (0..lens.len()).map(|i| Head { q: &qs[i], k: &ks[i], v: &vs[i] }).collect();
    let scale = 1.0 / (dh as f32).sqrt();
    let total: usize = lens.iter().sum();
    let want = plain().begin(&[total]).unwrap().attend(&heads, scale, None).unwrap();
    for attention in [
        AttentionConfig { out_attn_mult_min_len: Some(10), permuted_min_len: None },
        AttentionConfig { out_attn_mult_min_len: None, permuted_min_len: Some(16) },
        AttentionConfig::default(),
    ] {
        let cfg = MaskedConfig { attention, ..Default::default() };
        let exec = MaskedExecutor::new(Arc::new(kernels::CpuEngine::new()), cfg).unwrap();
        let got = exec.begin(&[total]).unwrap().attend(&heads, scale, None).unwrap();
        assert_eq!(got.len(), lens.len());
        for ((g, w), &n) in got.iter().zip(&want).zip(&lens) {
            assert_eq!(g.shape(), (n, dh), "{attention:?}");
            let err = g.rel_err(w);
            assert!(err < 1e-4, "{attention:?} n={n}: {err:e}");
        }
    }
}
