use std::path::PathBuf;

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
    #[error("invalid model configuration: {0}")]
    Config(String),
    #[error("GGUF: {0}")]
    Gguf(#[from] gguf::Error),
    #[error("hub: {0}")]
    Hub(String),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
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
