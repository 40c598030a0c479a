//! Header and metadata of the two real model files the project runs: the numbers a decoder
//! needs must come out exactly as llama.cpp reads them.

mod common;

use common::{QWEN25, SMOLLM2, model_path};
use gguf::{GgmlType, GgufFile, names};

#[test]
fn smollm2_header_and_hparams() {
    let f = GgufFile::open(model_path(SMOLLM2)).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.metadata().len(), 33);

    let h = f.llm_hparams().unwrap();
    assert_eq!(h.block_count, 30);
    assert_eq!(h.context_length, 8192);
    assert_eq!(h.embedding_length, 576);
    assert_eq!(h.feed_forward_length, 1536);
    assert_eq!((h.head_count, h.head_count_kv), (9, 3));
    assert_eq!((h.key_length, h.value_length, h.rope_dimension_count), (64, 64, 64));
    assert_eq!(h.rope_freq_base, 100_000.0);
    assert_eq!(h.rms_norm_eps, 1e-5);
    assert_eq!(h.vocab_size, 49152);
    assert!(h.tied_embeddings, "SmolLM2 has no output.weight");

    let m = f.metadata();
    assert_eq!(m.get_str("general.name").unwrap(), "Smollm2 135M 8k Lc100K Mix1 Ep2");
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(m.get_str_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    assert_eq!(m.get_u32("general.file_type").unwrap(), 3); // MOSTLY_Q4_1

    let embd = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!((embd.dtype, embd.ne.clone(), embd.shape()), (GgmlType::Q8_0, vec![576, 49152], vec![49152, 576]));
    let k = f.tensor_info("blk.0.attn_k.weight").unwrap();
    assert_eq!((k.dtype, k.shape()), (GgmlType::Q4_1, vec![192, 576]));
    assert_eq!(f.tensor_info("output_norm.weight").unwrap().shape(), vec![576]);
}

#[test]
fn qwen25_header_and_hparams() {
    let f = GgufFile::open(model_path(QWEN25)).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture().unwrap(), "qwen2");
    assert_eq!(f.tensors().len(), 291);

    let h = f.llm_hparams().unwrap();
    assert_eq!(h.block_count, 24);
    assert_eq!(h.context_length, 32768);
    assert_eq!(h.embedding_length, 896);
    assert_eq!(h.feed_forward_length, 4864);
    assert_eq!((h.head_count, h.head_count_kv), (14, 2));
    assert_eq!(h.key_length, 64);
    assert_eq!(h.rope_freq_base, 1_000_000.0);
    assert_eq!(h.rms_norm_eps, 1e-6);
    // No qwen2.vocab_size key: the embedding's rows, which include 271 padding entries.
    assert_eq!(h.vocab_size, 151936);
    assert!(!h.tied_embeddings, "this file ships a separate Q8_0 output.weight");

    let count = |t: GgmlType| f.tensors().iter().filter(|i| i.dtype == t).count();
    assert_eq!(
        [GgmlType::F32, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K].map(count),
        [121, 133, 13, 12, 12]
    );
    let q_bias = f.tensor_info("blk.0.attn_q.bias").unwrap();
    assert_eq!((q_bias.dtype, q_bias.shape()), (GgmlType::F32, vec![896]));
    assert_eq!(f.tensor_info("output.weight").unwrap().shape(), vec![151936, 896]);
}

/// Every tensor of both files has an HF name and a dequantizer, so a loader needs no
/// special cases.
#[test]
fn every_tensor_maps_to_hf_and_dequantizes() {
    for file in [SMOLLM2, QWEN25] {
        let f = GgufFile::open(model_path(file)).unwrap();
        for t in f.tensors() {
            let hf = names::gguf_to_hf(&t.name).unwrap_or_else(|| panic!("{file}: {} has no HF name", t.name));
            assert_eq!(names::hf_to_gguf(&hf).as_deref(), Some(t.name.as_str()));
            assert!(t.dtype.can_dequantize(), "{file}: {} is {}", t.name, t.dtype);
        }
    }
}

/// `tensor_f32_hf` returns HF row order: for llama Q/K that is the converter's permute
/// undone, for everything else the GGUF data unchanged.
#[test]
fn hf_view_unpermutes_llama_qk_only() {
    let f = GgufFile::open(model_path(SMOLLM2)).unwrap();
    let gguf_q = f.tensor_f32("blk.3.attn_q.weight").unwrap();
    let hf_q = f.tensor_f32_hf("model.layers.3.self_attn.q_proj.weight").unwrap();
    assert_ne!(gguf_q, hf_q);
    assert_eq!(names::permute_qk_rows(&hf_q, 9, 576).unwrap(), gguf_q);
    let gguf_k = f.tensor_f32("blk.3.attn_k.weight").unwrap();
    let hf_k = f.tensor_f32_hf("model.layers.3.self_attn.k_proj.weight").unwrap();
    assert_eq!(names::permute_qk_rows(&hf_k, 3, 576).unwrap(), gguf_k);
    assert_eq!(
        f.tensor_f32_hf("model.layers.3.self_attn.v_proj.weight").unwrap(),
        f.tensor_f32("blk.3.attn_v.weight").unwrap()
    );
    let err = f.tensor_f32_hf("lm_head.weight").unwrap_err().to_string();
    assert!(err.contains("output.weight"), "{err}");

    let f = GgufFile::open(model_path(QWEN25)).unwrap();
    assert_eq!(
        f.tensor_f32_hf("model.layers.0.self_attn.q_proj.bias").unwrap(),
        f.tensor_f32("blk.0.attn_q.bias").unwrap()
    );
}
