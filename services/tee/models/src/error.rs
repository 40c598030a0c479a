//! The models' errors: [`ModelError`] for anything loading or running a model can fail
//! with, and [`Refusal`] for a generation request that breaks a rule of
//! [`TextGenerator::admit`](crate::TextGenerator::admit).

use std::{fmt, path::PathBuf};

use protocol::ProtocolError;

/// Everything loading or running a model can fail with. Messages name the file, tensor or
/// limit involved; they never carry prompt or document text.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("tensor `{name}` has unsupported dtype {dtype}")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("unknown model architecture `{0}`")]
    UnknownArchitecture(String),
    #[error("model identity mismatch: expected {expected}, the files hash to {actual}")]
    IdentityMismatch { expected: String, actual: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{tokens} tokens exceed the model's context of {limit}")]
    ContextTooLong { tokens: usize, limit: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The caller stopped a generation before its end (its callback returned false).
    #[error("generation cancelled by the caller")]
    Cancelled,
    /// A generation request broke a rule of [`TextGenerator::admit`](crate::TextGenerator::admit).
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("GGUF: {0}")]
    Gguf(#[from] gguf::Error),
    #[error("hub: {0}")]
    Hub(String),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

/// Why [`TextGenerator::admit`](crate::TextGenerator::admit) refused a generation request:
/// one variant per rule. The messages are what gRPC clients see (the service passes them
/// on as they are), so they name the request's fields as the API spells them, and they
/// never carry prompt text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A chat prompt without messages.
    #[error("messages is empty (or set raw_prompt)")]
    NoMessages,
    /// A chat message whose role is not `system`, `user` or `assistant`.
    #[error("messages[{index}].role must be system, user or assistant")]
    UnknownRole { index: usize },
    /// A chat prompt whose messages are all blank.
    #[error("every message is empty")]
    EmptyMessages,
    /// `max_tokens` is 0.
    #[error("max_tokens must be at least 1")]
    NoOutputTokens,
    /// A count over its limit.
    #[error("{what}: {got} exceeds the limit of {limit}")]
    TooLarge { what: Limit, got: usize, limit: usize },
    /// A stop string longer than the limit, in bytes.
    #[error("a stop string is longer than {limit} bytes")]
    StopTooLong { limit: usize },
    /// `stop_repeated_words` is neither 0 (off) nor within `min..=max`.
    #[error("stop_repeated_words must be 0 (off) or {min} to {max}, got {got}")]
    StopRepeatedWords { got: usize, min: usize, max: usize },
    /// A sampling parameter outside its range. The message keeps the `invalid request:`
    /// prefix it has always had.
    #[error("invalid request: {param} must be within {range}")]
    Sampling { param: &'static str, range: &'static str },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A prompt token id the model does not have.
    #[error("token id out of the vocabulary")]
    UnknownToken,
}

/// What a [`Refusal::TooLarge`] counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `max_tokens` against the service's output limit.
    OutputTokens,
    /// The number of stop strings.
    StopStrings,
    /// The prompt's tokens against the service's prompt limit (at most the context).
    PromptTokens,
    /// The prompt's tokens plus `max_tokens` against the model's context window.
    Context,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::OutputTokens => "max_tokens",
            Limit::StopStrings => "stop strings",
            Limit::PromptTokens => "prompt tokens",
            Limit::Context => "prompt tokens + max_tokens",
        })
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&bytes).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })
}
