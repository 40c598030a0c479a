//! The tokenizer rebuilt from GGUF metadata against llama.cpp's own tokenizer on the same
//! file (fixtures from scripts/reference/llama_cpp_fixtures.py), and, for Qwen2.5, against
//! the Hugging Face Qwen3 tokenizer.json that shares its vocabulary and merges.

mod common;

use std::path::PathBuf;

use common::{QWEN25, SMOLLM2, model_path, models_dir, read_json};
use gguf::{GgufFile, GgufTokenizer};

fn llama_cpp_fixture(model: &str, file: &str) -> serde_json::Value {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into()))
        .join("../models/tests/fixtures/llama_cpp");
    read_json(dir.join(model).join(file))
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Every fixture string and every generation prompt, with llama.cpp's ids for special-token
/// parsing on and off; all must agree exactly. Returns how many encodings were compared.
fn check_against_llama_cpp(tok: &GgufTokenizer, model: &str) -> usize {
    let fixture = llama_cpp_fixture(model, "tokenization.json");
    let mut compared = 0;
    let mut failures = Vec::new();
    for case in fixture["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        for (parse_special, key) in [(true, "ids_special"), (false, "ids_plain")] {
            let ours = tok.encode(text, false, parse_special).unwrap();
            if ours != ids(&case[key]) {
                failures.push(format!("{text:?} ({key}): ours {ours:?}, llama.cpp {:?}", ids(&case[key])));
            }
            compared += 1;
        }
        // Byte-level BPE is lossless: decoding gives the text back.
        let decoded = tok.tokenizer.decode(&ids(&case["ids_special"]), false).unwrap();
        assert_eq!(decoded, text, "{model}: decode");
    }
    let generation = llama_cpp_fixture(model, "generation.json");
    for p in generation["prompts"].as_array().unwrap() {
        let ours = tok.encode(p["prompt"].as_str().unwrap(), tok.add_bos_token, true).unwrap();
        if ours != ids(&p["prompt_ids"]) {
            failures.push(format!("prompt {}: ours {ours:?}, llama.cpp {:?}", p["id"], ids(&p["prompt_ids"])));
        }
        compared += 1;
    }
    // `encode(.., add_special_tokens = true)` adds BOS exactly when llama.cpp does.
    let bos = &fixture["bos_case"];
    let ours = tok.encode(bos["text"].as_str().unwrap(), true, true).unwrap();
    assert_eq!(ours, ids(&bos["ids_add_bos"]), "{model}: add-special encoding");
    assert!(
        failures.is_empty(),
        "{model}: {} of {compared} encodings differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    compared
}

#[test]
fn smollm2_matches_llama_cpp() {
    let f = GgufFile::open(model_path(SMOLLM2)).unwrap();
    let tok = f.tokenizer().unwrap();
    assert_eq!((tok.bos_token_id, tok.eos_token_id, tok.padding_token_id), (Some(1), Some(2), Some(2)));
    assert!(!tok.add_bos_token);
    assert_eq!(tok.tokenizer.get_vocab_size(true), 49152);
    assert!(tok.chat_template.as_deref().unwrap().contains("<|im_start|>"));
    let n = check_against_llama_cpp(&tok, "smollm2-135m");
    assert!(n >= 60, "{n}");
}

#[test]
fn qwen25_matches_llama_cpp() {
    let f = GgufFile::open(model_path(QWEN25)).unwrap();
    let tok = f.tokenizer().unwrap();
    assert_eq!((tok.bos_token_id, tok.eos_token_id, tok.padding_token_id), (Some(151643), Some(151645), Some(151643)));
    assert!(!tok.add_bos_token);
    assert_eq!(tok.tokenizer.get_vocab_size(true), 151936);
    assert!(tok.chat_template.as_deref().unwrap().contains("<|im_start|>"));
    let n = check_against_llama_cpp(&tok, "qwen2.5-coder-0.5b");
    assert!(n >= 60, "{n}");
}

/// Qwen2.5 and Qwen3 share vocabulary and merges; the HF tokenizer.json is a second,
/// independent reference on ordinary text. Excluded: strings with Qwen3-only added tokens
/// or special-token text (the added vocabularies differ), and non-NFC text (HF normalizes
/// to NFC, llama.cpp and we do not).
#[test]
fn qwen25_matches_hf_qwen3_tokenizer_on_ordinary_text() {
    let f = GgufFile::open(model_path(QWEN25)).unwrap();
    let ours = f.tokenizer().unwrap();
    let hf_path = models_dir().join("qwen3-tokenizer/tokenizer.json");
    assert!(hf_path.is_file(), "{} is missing: run scripts/fetch-models.sh", hf_path.display());
    let hf = tokenizers::Tokenizer::from_file(&hf_path).unwrap();

    let fixture = llama_cpp_fixture("qwen2.5-coder-0.5b", "tokenization.json");
    let mut texts: Vec<String> =
        fixture["cases"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    let generation = llama_cpp_fixture("qwen2.5-coder-0.5b", "generation.json");
    texts.extend(generation["prompts"].as_array().unwrap().iter().map(|p| p["prompt"].as_str().unwrap().to_string()));
    let mut compared = 0;
    for text in texts.iter().filter(|t| !t.contains('<') && !t.contains('\u{301}')) {
        let a = ours.encode(text, false, true).unwrap();
        let b = hf.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(a, b, "{text:?}");
        compared += 1;
    }
    assert!(compared >= 30, "only {compared} texts compared");
}
