//! Llama (SmolLM2, and Llama-architecture models in general): the plain block, no QK-norm.
//!
//! Q/K/V carry biases only in checkpoints trained with `attention_bias`; they are used when
//! the checkpoint has them, as llama.cpp does.

use super::family::{Family, Presence};

/// HF `model_type` / GGUF architecture `llama`.
pub const LLAMA: Family = Family {
    name: "llama",
    qkv_bias: Presence::Optional,
    // Not part of Llama; kept optional so a checkpoint carrying it loads as before.
    qk_norm: Presence::Optional,
};
