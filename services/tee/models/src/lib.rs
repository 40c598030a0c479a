//! Models for GELO, written once against `protocol::Executor` so the same code runs plain
//! and masked.
//!
//! * Loading: safetensors (f32/f16/bf16) and GGUF ([`tensors`]), tokenizers and chat
//!   templates ([`tokenizer`]), the hub by pinned revision ([`hub`]), and the
//!   attestable [`identity`] of the files.
//! * Architectures, one module per family: [`bert`] encoders; [`decoder`] LLMs, one file
//!   per family ([`decoder::llama`], [`decoder::qwen2`], [`decoder::qwen3`]) over shared
//!   attention, feed-forward, norms and RoPE. Both provision their weights through
//!   `provision`, which imports neither them nor the loader.
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
mod provision;
pub mod random;
pub mod roles;
pub mod sampler;
pub mod tensors;
pub mod tokenizer;

pub use error::{ModelError, Result};
pub use generate::{
    AdmittedRequest, Chunk, Completion, FinishReason, GenerateRequest, GenerationLimits, Limit, Prompt, Refusal,
    TextGenerator,
};
pub use identity::{Manifest, ModelIdentity};
pub use load::{Kind, LoadOptions, ModelFiles, load_embedder, load_generator, load_reranker};
pub use roles::{Embedder, Reranker, Tokenized};
pub use sampler::SamplingParams;
pub use tokenizer::ChatMessage;

/// Runs one forward pass (a batch, a prefill, a decode step) on a worker of rayon's pool
/// (the models' `forward`s do; services wrap their whole pass, sampling included),
/// so the pass's parallel regions (GEMMs, masks, attention) start from inside the pool:
/// the worker that forks a region works on it at once, where a caller outside the pool
/// parks on a latch and is woken again for every region. A service's model thread,
/// asleep between requests, is such a caller. Measured (all-MiniLM-L6-v2, masked, one
/// client, 2 cores): a served pass took 1.14× the in-process one from outside the pool,
/// 1.00–1.03× from inside; SmolLM2's served decode went from 7.6 to 10.9 tok/s.
///
/// Two passes sent here from different threads may nest on one worker (rayon steals the
/// second while the first waits on a region); each service runs one model thread.
pub fn on_pool<R: Send>(pass: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        pass()
    } else {
        // `scope` called from outside the pool runs its body on a pool worker.
        rayon::scope(|_| pass())
    }
}
