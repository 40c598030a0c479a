//! The Qwen3 code path (per-head QK-norm, head_dim ≠ hidden/heads, f32 and bf16, tied and
//! untied heads) and the BERT cross-encoder head, on tiny random-weight checkpoints, against
//! Hugging Face transformers (scripts/reference/hf_reference.py ran it on the GPU machine;
//! the checkpoints are regenerated bit-identically by scripts/fetch-models.sh).

use std::path::PathBuf;

use models::{LoadOptions, load_embedder, load_generator, load_reranker};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::support::*;

#[derive(Deserialize)]
struct Reference {
    models: std::collections::HashMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct LmRef {
    sha256: String,
    subset: Vec<usize>,
    prompts: Vec<PromptRef>,
    embeddings: Vec<EmbedRef>,
    instruction: String,
}

#[derive(Deserialize)]
struct PromptRef {
    ids: Vec<u32>,
    last_top: Vec<(usize, f64)>,
    last_subset: Vec<f64>,
    first_subset: Vec<f64>,
}

#[derive(Deserialize)]
struct EmbedRef {
    text: String,
    instructed: bool,
    ids: Vec<u32>,
    embedding: Vec<f64>,
}

#[derive(Deserialize)]
struct CeRef {
    sha256: String,
    pairs: Vec<PairRef>,
}

#[derive(Deserialize)]
struct PairRef {
    query: String,
    document: String,
    ids: Vec<u32>,
    logit: f64,
}

fn reference() -> Reference {
    let p = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into()))
        .join("tests/fixtures/hf/hf_reference.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn checked(name: &str, sha: &str) -> PathBuf {
    let dir = model(&format!("tiny/{name}"));
    let got = hex::encode(Sha256::digest(std::fs::read(dir.join("model.safetensors")).unwrap()));
    assert_eq!(got, sha, "{name}: the regenerated checkpoint differs from the one transformers ran on");
    dir
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).powi(2)).sum::<f64>().sqrt();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    num / den
}

fn check_lm(name: &str) {
    let r: LmRef = serde_json::from_value(reference().models[name].clone()).unwrap();
    let dir = checked(name, &r.sha256);
    for (label, exec) in [("plain", plain()), ("masked", masked())] {
        let g = load_generator(&dir, exec.clone(), &LoadOptions::default()).unwrap();
        for p in &r.prompts {
            let text_ids = g.tokenizer.encode(&decode_check(&g, &p.ids), true).unwrap();
            assert_eq!(text_ids, p.ids, "{name}: tokenization differs from transformers");
            for (ids, want_subset) in [(&p.ids[..], &p.last_subset), (&p.ids[..1], &p.first_subset)] {
                let mut cache = g.decoder.new_cache();
                let last = g.decoder.forward(&mut [&mut cache], &[ids]).unwrap();
                let logits = g.decoder.logits(&last).unwrap();
                let row = logits.row(0);
                let got: Vec<f32> = r.subset.iter().map(|&i| row[i]).collect();
                let err = rel_err(&got, want_subset);
                assert!(err < 1e-4, "{name} {label}: logits relative error {err:e}");
            }
            // The reference's top-64 at the last position, exactly.
            let mut cache = g.decoder.new_cache();
            let last = g.decoder.forward(&mut [&mut cache], &[&p.ids]).unwrap();
            let logits = g.decoder.logits(&last).unwrap();
            let got: Vec<f32> = p.last_top.iter().map(|&(i, _)| logits.row(0)[i]).collect();
            let want: Vec<f64> = p.last_top.iter().map(|&(_, v)| v).collect();
            assert!(rel_err(&got, &want) < 1e-4, "{name} {label}: top logits");
        }
        // Qwen3-Embedding-style: last-token pooling of the final hidden state, L2-normalized.
        let e = load_embedder(&dir, exec, &LoadOptions::default()).unwrap();
        for er in &r.embeddings {
            let text =
                if er.instructed { e.with_instruction(&r.instruction, &er.text).unwrap() } else { er.text.clone() };
            assert_eq!(e.count_tokens(&text).unwrap(), er.ids.len(), "{name}: embedding input length");
            let v = e.embed(&[text.as_str()]).unwrap().remove(0);
            let err = rel_err(&v, &er.embedding);
            assert!(err < 1e-4, "{name} {label}: embedding relative error {err:e} (instructed: {})", er.instructed);
        }
    }
}

/// The prompt text whose ids the reference used (round-trips through our decoder).
fn decode_check(g: &models::TextGenerator, ids: &[u32]) -> String {
    g.tokenizer.decode(ids, false).unwrap()
}

#[test]
fn qwen3_tiny_f32_tied_matches_transformers() {
    check_lm("qwen3-tiny");
}

#[test]
fn qwen3_tiny_bf16_untied_matches_transformers() {
    check_lm("qwen3-tiny-bf16");
}

#[test]
fn bert_cross_encoder_matches_transformers() {
    let r: CeRef = serde_json::from_value(reference().models["bert-ce-tiny"].clone()).unwrap();
    let dir = checked("bert-ce-tiny", &r.sha256);
    for (label, exec) in [("plain", plain()), ("masked", masked())] {
        let ce = load_reranker(&dir, exec, &LoadOptions::default()).unwrap();
        let pairs: Vec<(&str, &str)> = r.pairs.iter().map(|p| (p.query.as_str(), p.document.as_str())).collect();
        for p in &r.pairs {
            assert_eq!(ce.count_tokens(&p.query, &p.document).unwrap(), p.ids.len());
        }
        let got = ce.score_pairs(&pairs).unwrap();
        let want: Vec<f64> = r.pairs.iter().map(|p| p.logit).collect();
        let err = rel_err(&got, &want);
        assert!(err < 1e-4, "{label}: cross-encoder logits {got:?} vs {want:?} ({err:e})");
    }
}
