//! Models for GELO, written once against `protocol::Executor` so the same code runs plain
//! and masked.
//!
//! * Loading: safetensors (f32/f16/bf16) and GGUF ([`tensors`]), tokenizers and chat
//!   templates ([`tokenizer`]), the hub by pinned revision ([`hub`]), and the
//!   attestable [`identity`] of the files.
//! * Architectures: [`bert`] encoders, [`decoder`] LLMs (Llama, Qwen2, Qwen3).
//! * Roles: [`roles::Embedder`], [`roles::Reranker`], [`generate::TextGenerator`].
//! * Evaluation: [`beir`].

pub mod beir;
pub mod bert;
pub mod decoder;
mod error;
pub mod generate;
#[cfg(feature = "hub")]
pub mod hub;
pub mod identity;
mod load;
pub mod ops;
pub mod random;
pub mod roles;
pub mod sampler;
pub mod tensors;
pub mod tokenizer;

pub use error::{ModelError, Result};
pub use generate::{Chunk, Completion, FinishReason, GenerateRequest, Prompt, TextGenerator};
pub use identity::{Manifest, ModelIdentity};
pub use load::{load_embedder, load_generator, load_reranker, Kind, LoadOptions, ModelFiles};
pub use roles::{Embedder, Reranker};
pub use sampler::SamplingParams;
pub use tokenizer::ChatMessage;
