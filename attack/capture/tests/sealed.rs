//! The production default protection, gated: real models run on exactly the executor a
//! service builds by default, over an engine that records every operand, and the engine
//! must receive nothing — no operand, no weight — while the answers stay those of the
//! plaintext baseline: equal for f32 weights, and for quantized weights (multiplied in int8
//! by the sealed executor, in f32 by the baseline) the same logits up to that rounding. `attack/run.sh` runs this before the attacks; the attacks' conditions are
//! the weaker, opt-in masked schemes (docs/SECURITY.md).

use std::{path::PathBuf, sync::Arc};

use attack::Watched;
use kernels::CpuEngine;
use models::{GenerateRequest, Prompt, load_embedder, load_generator};
use protocol::Engine;
use protocol::{Executor, MaskedConfig, PlaintextExecutor, Protection};

fn model(name: &str) -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gelo"));
    let path = root.join("models").join(name);
    assert!(path.exists(), "{} is missing: run scripts/fetch-models.sh", path.display());
    path
}

fn default_executor() -> (Arc<Watched>, Arc<dyn Executor>) {
    let engine = Arc::new(Watched::new());
    let exec = Protection::default().executor(engine.clone() as Arc<dyn Engine>, MaskedConfig::default()).unwrap();
    (engine, exec)
}

fn pearson(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().map(|&v| v as f64).sum::<f64>() / n, b.iter().map(|&v| v as f64).sum::<f64>() / n);
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64 - ma, y as f64 - mb);
        cov += x * y;
        va += x * x;
        vb += y * y;
    }
    cov / (va * vb).sqrt()
}

fn assert_blind(engine: &Watched, what: &str) {
    let seen = engine.inner.take();
    assert!(seen.is_empty(), "{what}: the engine received {} operands under the default protection", seen.len());
    assert_eq!(engine.registered(), 0, "{what}: weights were registered with the engine");
}

#[test]
fn default_protection_is_sealed_and_recorded_in_the_scheme() {
    let (_, exec) = default_executor();
    assert_eq!(Protection::default(), Protection::Sealed);
    assert_eq!(exec.scheme().executor, "sealed");
    assert!(exec.scheme().masked.is_none());
}

#[test]
fn minilm_embedding_under_the_default_reaches_no_engine() {
    let (engine, exec) = default_executor();
    let texts = ["Patient 4711 was diagnosed with type 2 diabetes.", "Account 0042-1337 was closed on Friday."];
    let sealed = load_embedder(&model("all-minilm-l6-v2"), exec, &Default::default()).unwrap().embed(&texts).unwrap();
    assert_blind(&engine, "MiniLM");
    let plain = PlaintextExecutor::new(Arc::new(CpuEngine::new()));
    let want =
        load_embedder(&model("all-minilm-l6-v2"), Arc::new(plain), &Default::default()).unwrap().embed(&texts).unwrap();
    for (a, b) in sealed.iter().zip(&want) {
        let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-5, "sealed embedding differs from plaintext by {err}");
    }
}

#[test]
fn smollm2_prefill_decode_and_lm_head_under_the_default_reach_no_engine() {
    let (engine, exec) = default_executor();
    let g = load_generator(&model("smollm2-135m-instruct.gguf"), exec, &Default::default()).unwrap();
    let req = GenerateRequest::greedy(Prompt::Raw("The patient's record number is 88231 and her diagnosis".into()), 12);
    let sealed = g.generate(&req, |_| true).unwrap();
    assert_blind(&engine, "SmolLM2");
    assert_eq!(sealed.tokens.len(), 12);
    // Every step's logits (prefill, decode, LM head) against the f32 baseline's on the same
    // tokens: the int8 activations move them by a small fraction of their spread.
    let plain = PlaintextExecutor::new(Arc::new(CpuEngine::new()));
    let want = load_generator(&model("smollm2-135m-instruct.gguf"), Arc::new(plain), &Default::default()).unwrap();
    let prompt = g.tokenizer.encode("The patient's record number is 88231 and her diagnosis", true).unwrap();
    let (mut ca, mut cb) = (g.decoder.new_cache(), want.decoder.new_cache());
    let mut feed = prompt;
    for &next in &sealed.tokens {
        let a = g.decoder.logits(&g.decoder.forward(&mut [&mut ca], &[&feed]).unwrap()).unwrap();
        let b = want.decoder.logits(&want.decoder.forward(&mut [&mut cb], &[&feed]).unwrap()).unwrap();
        let r = pearson(a.row(0), b.row(0));
        assert!(r > 0.999, "sealed logits correlate with plaintext's at only {r}");
        feed = vec![next];
    }
}
