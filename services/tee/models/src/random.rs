//! Models at real shapes with random weights, for benchmarks (no files needed): the tensor
//! names and shapes a checkpoint of each architecture would have.

use std::{collections::HashMap, sync::Arc};

use protocol::Executor;

use crate::{
    bert::{Bert, BertConfig},
    decoder::{Decoder, DecoderConfig, Presence, qwen3::QWEN3},
    error::Result,
    tensors::Tensors,
};

/// BERT-base (BGE-base) shapes.
pub fn bert_base() -> BertConfig {
    BertConfig {
        vocab_size: 30522,
        hidden_size: 768,
        num_hidden_layers: 12,
        num_attention_heads: 12,
        intermediate_size: 3072,
        hidden_act: "gelu".into(),
        max_position_embeddings: 512,
        type_vocab_size: 2,
        layer_norm_eps: 1e-12,
        id2label: None,
    }
}

fn qwen3(hidden: usize, inter: usize, layers: usize, heads: usize, kv: usize) -> DecoderConfig {
    DecoderConfig {
        arch: &QWEN3,
        vocab_size: 151_936,
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_positions: 32_768,
        tie_embeddings: true,
        kv: crate::decoder::KvPrecision::F32,
    }
}

/// Qwen3-0.6B (and Qwen3-Embedding-0.6B) shapes.
pub fn qwen3_0_6b() -> DecoderConfig {
    qwen3(1024, 3072, 28, 16, 8)
}

/// Qwen3-1.7B shapes.
pub fn qwen3_1_7b() -> DecoderConfig {
    qwen3(2048, 6144, 28, 16, 8)
}

/// A config by name: `bert-base`, `qwen3-0.6b`, `qwen3-1.7b`.
pub enum Arch {
    Bert(BertConfig),
    Decoder(DecoderConfig),
}

pub fn by_name(name: &str) -> Option<Arch> {
    match name {
        "bert-base" | "bge-base" => Some(Arch::Bert(bert_base())),
        "qwen3-0.6b" => Some(Arch::Decoder(qwen3_0_6b())),
        "qwen3-1.7b" => Some(Arch::Decoder(qwen3_1_7b())),
        _ => None,
    }
}

pub fn bert(cfg: BertConfig, exec: Arc<dyn Executor>, seed: u64) -> Result<Bert> {
    let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
    let mut s: HashMap<String, Vec<usize>> = HashMap::new();
    s.insert("embeddings.word_embeddings.weight".into(), vec![cfg.vocab_size, d]);
    s.insert("embeddings.position_embeddings.weight".into(), vec![cfg.max_position_embeddings, d]);
    s.insert("embeddings.token_type_embeddings.weight".into(), vec![cfg.type_vocab_size, d]);
    for n in ["weight", "bias"] {
        s.insert(format!("embeddings.LayerNorm.{n}"), vec![d]);
    }
    for i in 0..cfg.num_hidden_layers {
        let l = format!("encoder.layer.{i}");
        for (name, d_in, d_out) in [
            ("attention.self.query", d, d),
            ("attention.self.key", d, d),
            ("attention.self.value", d, d),
            ("attention.output.dense", d, d),
            ("intermediate.dense", d, ff),
            ("output.dense", ff, d),
        ] {
            s.insert(format!("{l}.{name}.weight"), vec![d_out, d_in]);
            s.insert(format!("{l}.{name}.bias"), vec![d_out]);
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            s.insert(format!("{l}.{norm}.weight"), vec![d]);
            s.insert(format!("{l}.{norm}.bias"), vec![d]);
        }
    }
    Bert::load(&Tensors::random(s, seed), cfg, exec, &format!("random-bert-{seed}"))
}

pub fn decoder(cfg: DecoderConfig, exec: Arc<dyn Executor>, seed: u64) -> Result<Decoder> {
    let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut s: HashMap<String, Vec<usize>> = HashMap::new();
    s.insert("model.embed_tokens.weight".into(), vec![cfg.vocab_size, d]);
    s.insert("model.norm.weight".into(), vec![d]);
    for i in 0..cfg.num_layers {
        let l = format!("model.layers.{i}");
        s.insert(format!("{l}.input_layernorm.weight"), vec![d]);
        s.insert(format!("{l}.post_attention_layernorm.weight"), vec![d]);
        for (name, d_in, d_out) in [
            ("self_attn.q_proj", d, qd),
            ("self_attn.k_proj", d, kvd),
            ("self_attn.v_proj", d, kvd),
            ("self_attn.o_proj", qd, d),
            ("mlp.gate_proj", d, ff),
            ("mlp.up_proj", d, ff),
            ("mlp.down_proj", ff, d),
        ] {
            s.insert(format!("{l}.{name}.weight"), vec![d_out, d_in]);
        }
        if cfg.arch.qk_norm == Presence::Required {
            s.insert(format!("{l}.self_attn.q_norm.weight"), vec![hd]);
            s.insert(format!("{l}.self_attn.k_norm.weight"), vec![hd]);
        }
    }
    Decoder::load(&Tensors::random(s, seed), cfg, exec, &format!("random-decoder-{seed}"))
}
