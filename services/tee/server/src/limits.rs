//! Request limits. Over a limit is `INVALID_ARGUMENT` (the request itself is too big) or
//! `RESOURCE_EXHAUSTED` (the service is too busy), always with the limit named.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::Status;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Limits {
    /// Texts per Embed request.
    pub max_texts: usize,
    /// Documents per Rerank request.
    pub max_documents: usize,
    /// Tokens per text or (query, document) pair; `None`: the model's maximum.
    pub max_tokens_per_text: Option<usize>,
    /// Prompt tokens per Generate request; `None`: the model's context.
    pub max_prompt_tokens: Option<usize>,
    pub max_output_tokens: usize,
    pub max_stop_strings: usize,
    /// Encoded request size (bytes).
    pub max_request_bytes: usize,
    /// Requests waiting for the model before new ones are refused.
    pub max_queue: usize,
    /// Sequences decoded together by the generator.
    pub max_batch_sequences: usize,
    /// How long the batcher waits to fill a batch.
    pub batch_window: Duration,
    /// Tokens per batched forward pass (embedder, reranker).
    pub batch_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // The generation bounds' defaults are the models' (`GenerationLimits`).
        let generation = models::GenerationLimits::default();
        Limits {
            max_texts: 256,
            max_documents: 256,
            max_tokens_per_text: None,
            max_prompt_tokens: None,
            max_output_tokens: generation.max_output_tokens,
            max_stop_strings: generation.max_stop_strings,
            max_request_bytes: 16 << 20,
            max_queue: 1024,
            max_batch_sequences: 16,
            batch_window: Duration::from_millis(5),
            batch_tokens: 16_384,
        }
    }
}

/// `INVALID_ARGUMENT` naming the limit.
pub fn too_large(what: &str, got: usize, limit: usize) -> Status {
    Status::invalid_argument(format!("{what}: {got} exceeds the limit of {limit}"))
}

/// `RESOURCE_EXHAUSTED` naming the limit.
pub fn overloaded(what: &str, limit: usize) -> Status {
    Status::resource_exhausted(format!("{what} is full (limit {limit}); retry later"))
}
