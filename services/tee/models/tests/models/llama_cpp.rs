//! GGUF decoders against llama.cpp on the same files (fixtures from
//! scripts/reference/llama_cpp_fixtures.py): first-step logits, greedy continuations, and
//! masked == plain. The sealed executor multiplies quantized weights in int8, as llama.cpp
//! does; the plain executor on the CPU engine multiplies their exact f32 dequantization.

use std::{path::PathBuf, sync::Arc};

use models::{TextGenerator, load_generator, sampler::argmax};
use protocol::Executor;
use serde::Deserialize;

use crate::support::*;

#[derive(Deserialize)]
struct Fixture {
    prompts: Vec<FixturePrompt>,
}

#[derive(Deserialize)]
struct FixturePrompt {
    id: String,
    prompt_ids: Vec<u32>,
    first_step: FirstStep,
    greedy_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct FirstStep {
    logits_file: String,
    argmax: u32,
}

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into()))
        .join("tests/fixtures/llama_cpp")
        .join(name)
}

fn fixture(name: &str) -> Fixture {
    serde_json::from_slice(&std::fs::read(fixture_dir(name).join("generation.json")).unwrap()).unwrap()
}

fn f16_logits(name: &str, file: &str) -> Vec<f32> {
    std::fs::read(fixture_dir(name).join(file))
        .unwrap()
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
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

/// Greedy decoding straight on the decoder (not stopped at EOS, like the fixtures), with
/// the first-step logits and the top-2 gap of every step.
fn greedy(g: &TextGenerator, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let mut cache = g.decoder.new_cache();
    let mut last = g.decoder.forward(&mut [&mut cache], &[prompt]).unwrap();
    let (mut ids, mut gaps, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..steps {
        let logits = g.decoder.logits(&last).unwrap();
        let row = logits.row(0);
        if step == 0 {
            first = row.to_vec();
        }
        let best = argmax(row);
        let second = row
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as u32 != best)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        gaps.push(row[best as usize] - second);
        ids.push(best);
        if step + 1 < steps {
            last = g.decoder.forward(&mut [&mut cache], &[&[best]]).unwrap();
        }
    }
    (ids, gaps, first)
}

#[derive(Deserialize)]
struct F32Fixture {
    prompts: Vec<F32Prompt>,
}

#[derive(Deserialize)]
struct F32Prompt {
    id: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

/// Greedy agreement with llama.cpp on an all-F32 re-encoding of the same weights (exact
/// dequantization): llama.cpp then computes in f32 as we do, so only implementation
/// differences remain. The acceptance bar: ≥ 6 of 8 continuations agree for 32 tokens, and
/// every divergence is at a near-tie of our logits.
fn compare_with_llama_cpp_f32(file: &str, name: &str) -> usize {
    let g = load_generator(&model(file), plain(), &Default::default()).unwrap();
    let fx: F32Fixture =
        serde_json::from_slice(&std::fs::read(fixture_dir(name).join("generation_f32.json")).unwrap()).unwrap();
    let mut agree = 0;
    for p in &fx.prompts {
        let (ids, gaps, _) = greedy(&g, &p.prompt_ids, 32);
        match ids.iter().zip(&p.greedy_ids).position(|(a, b)| a != b) {
            None => agree += 1,
            Some(step) => {
                assert!(gaps[step] < 0.3, "{name}/{} (f32): diverged at step {step}, top-2 gap {}", p.id, gaps[step])
            }
        }
    }
    eprintln!("{name}: {agree}/{} greedy continuations equal llama.cpp (F32 weights) for 32 tokens", fx.prompts.len());
    assert!(agree >= 6, "{name}: only {agree} agree with llama.cpp on F32 weights");
    agree
}

/// How often our next token is llama.cpp's when both continue llama.cpp's own greedy text
/// (teacher forcing): `(agreeing steps, steps)` over 32 steps of every prompt. A free-running
/// continuation stops counting at its first near-tie flip, so 8 prompts make a coarse
/// measure; 256 forced steps make a stable one. Every disagreement must be a near-tie of our
/// logits (our top logit less than `tie` above llama.cpp's choice).
fn forced_agreement(g: &TextGenerator, fx: &Fixture, name: &str, tie: f32) -> (usize, usize) {
    let (mut agree, mut total) = (0, 0);
    for p in &fx.prompts {
        let mut cache = g.decoder.new_cache();
        let mut last = g.decoder.forward(&mut [&mut cache], &[&p.prompt_ids]).unwrap();
        for (step, &want) in p.greedy_ids.iter().take(32).enumerate() {
            let logits = g.decoder.logits(&last).unwrap();
            let row = logits.row(0);
            let best = argmax(row);
            total += 1;
            if best == want {
                agree += 1;
            } else {
                let gap = row[best as usize] - row[want as usize];
                assert!(gap < tie, "{name}/{}: step {step} chose {best} over llama.cpp's {want} by {gap}", p.id);
            }
            last = g.decoder.forward(&mut [&mut cache], &[&[want]]).unwrap();
        }
    }
    (agree, total)
}

/// Against llama.cpp on the quantized file itself: logits correlate (≥ `min_r`) and every
/// divergence of the greedy continuations is at a near-tie of our logits (a top-2 gap below
/// `tie(spread)`, `spread` the standard deviation of llama.cpp's first-step logits: a random
/// model's are nearly flat). Returns the teacher-forced agreement ([`forced_agreement`]).
fn compare_with_llama_cpp_on(
    path: &std::path::Path,
    name: &str,
    exec: Arc<dyn Executor>,
    min_r: f64,
    tie: impl Fn(f32) -> f32,
) -> (usize, usize) {
    let g = load_generator(path, exec, &Default::default()).unwrap();
    let fx = fixture(name);
    let mut agree = 0;
    let mut spreads = Vec::new();
    for p in &fx.prompts {
        let (ids, gaps, first) = greedy(&g, &p.prompt_ids, 32);
        let reference = f16_logits(name, &p.first_step.logits_file);
        let r = pearson(&first, &reference);
        assert!(r >= min_r, "{name}/{}: first-step logit correlation {r}", p.id);
        let spread = std_dev(&reference);
        spreads.push(spread);
        let diverge = ids.iter().zip(&p.greedy_ids).position(|(a, b)| a != b);
        match diverge {
            None => agree += 1,
            Some(step) => {
                // A divergence is acceptable only where our own logits nearly tie.
                assert!(
                    gaps[step] < tie(spread),
                    "{name}/{}: diverged at step {step} with a top-2 gap of {} (logit spread {spread})",
                    p.id,
                    gaps[step]
                );
            }
        }
        eprintln!(
            "{name}/{}: r = {r:.5}, argmax {} vs {}, first divergence {diverge:?}",
            p.id,
            first_argmax(&first),
            p.first_step.argmax
        );
    }
    eprintln!(
        "{name}: {agree}/{} greedy continuations equal llama.cpp (quantized activations) for 32 tokens",
        fx.prompts.len()
    );
    let spread = spreads.iter().copied().fold(f32::INFINITY, f32::min);
    let (forced, steps) = forced_agreement(&g, &fx, name, tie(spread));
    eprintln!("{name}: next token equals llama.cpp's at {forced}/{steps} teacher-forced steps");
    (forced, steps)
}

fn std_dev(v: &[f32]) -> f32 {
    let n = v.len() as f64;
    let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n).sqrt() as f32
}

/// [`compare_with_llama_cpp_on`] for a trained model from the model cache: r ≥ `min_r`,
/// divergences at gaps below 0.3. Against the engine's f32 products r ≥ 0.999; the sealed
/// path rounds activations to int8 as llama.cpp does, but its inputs already differ from
/// llama.cpp's (whose KV cache is f16), so the two roundings add: r ≥ 0.998.
fn compare_with_llama_cpp(file: &str, name: &str, exec: Arc<dyn Executor>, min_r: f64) -> (usize, usize) {
    compare_with_llama_cpp_on(&model(file), name, exec, min_r, |_| 0.3)
}

fn first_argmax(v: &[f32]) -> u32 {
    argmax(v)
}

/// The sealed path (int8 products, as llama.cpp's) against the engine's f32 products of the
/// dequantized weights (what the sealed path computed before it kept the blocks): its next
/// token must equal llama.cpp's as often under teacher forcing, to within three near-ties
/// of 256 steps (measured 2026-12-06: Qwen2.5 250 and 250, SmolLM2 249 and 250; 2026-12-07,
/// after the softmax took the project's vectorized `exp`: SmolLM2 247 and 250 — both sides
/// round activations to int8 from inputs that already differ, so near-ties flip with any
/// change of rounding anywhere in the pass; later that day, with queries, keys and values
/// at f16 precision as llama.cpp's cache holds them: Qwen2.5 251 and 250, SmolLM2 251 and
/// 250).
fn sealed_agrees_no_less_than_f32(file: &str, name: &str) {
    let (f32_agree, steps) = compare_with_llama_cpp(file, name, plain(), 0.999);
    let (int8_agree, _) = compare_with_llama_cpp(file, name, sealed(), 0.998);
    assert!(int8_agree + 3 >= f32_agree, "{name}: sealed agrees at {int8_agree}/{steps} steps, f32 at {f32_agree}");
}

#[test]
fn smollm2_matches_llama_cpp() {
    sealed_agrees_no_less_than_f32("smollm2-135m-instruct.gguf", "smollm2-135m");
    compare_with_llama_cpp_f32("smollm2-135m-instruct.gguf", "smollm2-135m");
}

#[test]
fn qwen25_matches_llama_cpp() {
    sealed_agrees_no_less_than_f32("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b");
    compare_with_llama_cpp_f32("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b");
}

/// Random-weight Qwen3 GGUFs written by llama.cpp's quantizer (Q4_K_M: Q4_K and Q6_K blocks,
/// a Q6_K embedding; and Q8_0), committed with llama.cpp's outputs: GELO's Qwen3 GGUF path,
/// on the sealed int8 kernels and on the engine's f32 products. A random model's logits are
/// nearly flat, so agreement is judged against their spread.
#[test]
fn qwen3_tiny_matches_llama_cpp() {
    for name in ["qwen3-tiny-q4_k_m", "qwen3-tiny-q8_0"] {
        let path = fixture_dir("qwen3-tiny").join(format!("{name}.gguf"));
        for exec in [sealed(), plain()] {
            compare_with_llama_cpp_on(&path, name, exec, 0.99, |spread| 0.5 * spread);
        }
    }
}

fn masked_equals_plain(file: &str, name: &str, prompts: usize) {
    let plain_g = load_generator(&model(file), plain(), &Default::default()).unwrap();
    let masked_g = load_generator(&model(file), masked(), &Default::default()).unwrap();
    for p in fixture(name).prompts.iter().take(prompts) {
        let (a, _, _) = greedy(&plain_g, &p.prompt_ids, 64);
        let (b, _, _) = greedy(&masked_g, &p.prompt_ids, 64);
        assert_eq!(a, b, "{name}/{}: masked greedy differs from plain", p.id);
    }
}

#[test]
fn smollm2_masked_greedy_equals_plain_for_64_tokens() {
    masked_equals_plain("smollm2-135m-instruct.gguf", "smollm2-135m", 8);
}

#[test]
fn qwen25_masked_greedy_equals_plain_for_64_tokens() {
    masked_equals_plain("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b", 2);
}

/// The dual-LPN protection's greedy tokens are its int8 reference's (exactness), on
/// SmolLM2 with its 2 GB of tables.
#[test]
fn smollm2_dual_lpn_greedy_equals_its_int8_reference() {
    let file = "smollm2-135m-instruct.gguf";
    let exec = dual_lpn();
    let lpn = load_generator(&model(file), exec.clone(), &Default::default()).unwrap();
    eprintln!("smollm2 dual-lpn: {} bytes of tables and codes", exec.table_bytes_held());
    let reference = load_generator(&model(file), int8_reference(), &Default::default()).unwrap();
    for p in fixture("smollm2-135m").prompts.iter().take(2) {
        let (a, _, _) = greedy(&lpn, &p.prompt_ids, 16);
        let (b, _, _) = greedy(&reference, &p.prompt_ids, 16);
        assert_eq!(a, b, "{}: dual-lpn differs from its int8 reference", p.id);
    }
}

/// What the dual-LPN scheme's rounding (int8 per activation row and per weight column)
/// costs in agreement with llama.cpp, teacher-forced over 256 steps. Measured 2026-12-07:
/// SmolLM2 236 and Qwen2.5 248 of 256 with an f32 attention cache, 237 and 242 with the f16
/// one a GGUF model now gets, where the sealed path (int8 per block of 32, as llama.cpp's)
/// gives 251 and 251 (`sealed_agrees_no_less_than_f32`); near-ties flip with any change of
/// rounding, so the floors sit a few steps under those measurements, and docs/SECURITY.md
/// records them.
#[test]
fn dual_lpn_rounding_agreement_with_llama_cpp() {
    for (file, name, floor) in [
        ("smollm2-135m-instruct.gguf", "smollm2-135m", 232),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b", 238),
    ] {
        let g = load_generator(&model(file), int8_reference(), &Default::default()).unwrap();
        let (agree, steps) = forced_agreement(&g, &fixture(name), name, f32::INFINITY);
        eprintln!("{name}: int8 per row: {agree}/{steps} teacher-forced steps equal llama.cpp's");
        assert!(agree >= floor, "{name}: int8 per row agrees at {agree}/{steps}, below {floor}");
    }
}
