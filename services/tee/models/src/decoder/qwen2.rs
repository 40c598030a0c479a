//! Qwen2 and Qwen2.5 (Qwen2.5-Coder): the Llama block with biases on Q, K and V.
//!
//! The biases are read when present (every released Qwen2 checkpoint has them); a
//! checkpoint without them loads bias-free, as it always has here.

use super::family::{Family, Presence};

/// HF `model_type` / GGUF architecture `qwen2`.
pub const QWEN2: Family = Family { name: "qwen2", qkv_bias: Presence::Optional, qk_norm: Presence::Optional };
