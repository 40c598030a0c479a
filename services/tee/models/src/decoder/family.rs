//! What sets one decoder family apart from another, as data: each family's file
//! ([`super::llama`], [`super::qwen2`], [`super::qwen3`]) defines one [`Family`], looked up
//! by name once when a checkpoint's config is read. The shared model code reads its fields
//! and never compares architecture names.

use std::fmt;

use crate::{
    error::{ModelError, Result},
    tensors::Tensors,
};

use super::{llama, qwen2, qwen3};

/// Whether a family's checkpoints carry an optional part of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Every checkpoint has it: loading fails, naming the tensor, when it is missing.
    Required,
    /// Used when the checkpoint has it.
    Optional,
}

impl Presence {
    /// Whether the part is loaded, `tensor` being its first tensor.
    pub(super) fn resolve(self, t: &Tensors, tensor: &str) -> Result<bool> {
        match (self, t.has(tensor)) {
            (_, true) => Ok(true),
            (Presence::Optional, false) => Ok(false),
            (Presence::Required, false) => Err(ModelError::MissingTensor(tensor.to_string())),
        }
    }
}

/// A decoder family: its name and the parts of the shared block its checkpoints carry.
/// Everything else (RMSNorm pre-norm blocks, RoPE, grouped-query attention, SwiGLU, tied or
/// untied LM head) is common to all of them, and the sizes come from the config.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    /// The HF `model_type` and GGUF `general.architecture`.
    pub name: &'static str,
    /// Biases of `q_proj`, `k_proj` and `v_proj` (`self_attn.q_proj.bias`, …).
    pub qkv_bias: Presence,
    /// Per-head RMSNorm of queries and keys before RoPE (`self_attn.q_norm.weight`,
    /// `self_attn.k_norm.weight`).
    pub qk_norm: Presence,
}

/// Every decoder family the crate runs.
pub const FAMILIES: [&Family; 3] = [&llama::LLAMA, &qwen2::QWEN2, &qwen3::QWEN3];

impl Family {
    /// The family named `name` (an HF `model_type` or GGUF architecture).
    pub fn by_name(name: &str) -> Result<&'static Family> {
        FAMILIES.into_iter().find(|f| f.name == name).ok_or_else(|| ModelError::UnknownArchitecture(name.to_string()))
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Serialized as its name (`"qwen3"`), as the config's `arch` string was.
impl serde::Serialize for Family {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}
