//! The crate's one error type. Every variant names the key or tensor at fault, so a user with a
//! damaged or unexpected file learns what is wrong without a debugger.

use std::path::PathBuf;

use crate::dtype::GgmlType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("not a GGUF file: magic bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),

    #[error("unsupported GGUF version {0} (this reader handles versions 2 and 3)")]
    UnsupportedVersion(u32),

    /// The file ends before the structure that `what` describes.
    #[error("file truncated: {what} at byte {offset} needs {needed} bytes, {available} left")]
    Truncated { what: String, offset: usize, needed: u64, available: usize },

    /// A metadata entry is present but cannot be decoded (bad type tag, invalid UTF-8, ...).
    #[error("metadata key `{key}`: {reason}")]
    BadMetadata { key: String, reason: String },

    #[error("metadata key `{0}` is missing")]
    MissingKey(String),

    #[error("metadata key `{key}` holds {found}, expected {expected}")]
    KeyType { key: String, expected: &'static str, found: String },

    #[error("tensor `{0}` is not in the file")]
    MissingTensor(String),

    /// A tensor info is inconsistent: unknown type, overflowing shape, data outside the file...
    #[error("tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },

    #[error("tensor `{name}` has type {dtype}, which this crate cannot dequantize")]
    UnsupportedType { name: String, dtype: GgmlType },

    /// A byte buffer handed to [`crate::dequantize`] that does not fit the type.
    #[error("cannot dequantize {len} bytes as {dtype}: {reason}")]
    Dequantize { dtype: GgmlType, len: usize, reason: String },

    /// The metadata does not describe a tokenizer this crate can rebuild.
    #[error("tokenizer from GGUF metadata: {0}")]
    Tokenizer(String),
}
