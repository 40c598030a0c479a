//! Qwen3 (Qwen3, Qwen3-Embedding, Qwen3-Reranker): the Llama block with a per-head RMSNorm
//! of queries and keys before RoPE (`q_norm`, `k_norm`), which every checkpoint must have.

use super::family::{Family, Presence};

/// HF `model_type` / GGUF architecture `qwen3`.
pub const QWEN3: Family = Family { name: "qwen3", qkv_bias: Presence::Optional, qk_norm: Presence::Required };
