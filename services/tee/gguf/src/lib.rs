//! `gguf`: reads GGUF model files (llama.cpp's format) for GELO's model loaders.
//!
//! - [`GgufFile`]: header, metadata and tensor infos over a memory map, with every count,
//!   length and offset checked, so a truncated or corrupt file is an [`Error`] naming the
//!   key or tensor, never a panic.
//! - [`GgufFile::tensor_f32`]: ggml dequantization (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
//!   Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K), bit-exact with ggml's reference code.
//! - [`names`]: GGUF ↔ Hugging Face tensor names and the `llama` Q/K RoPE row order;
//!   [`GgufFile::tensor_f32_hf`] serves tensors by HF name in HF layout.
//! - [`GgufFile::llm_hparams`]: decoder hyper-parameters; [`GgufFile::tokenizer`]: a
//!   `tokenizers::Tokenizer` rebuilt from metadata that matches llama.cpp's tokenization.

mod dequant;
mod dtype;
mod error;
mod file;
mod hparams;
mod metadata;
pub mod names;
mod parse;
mod tokenizer;

pub use dequant::{dequantize, dequantize_into};
pub use dtype::{GgmlType, QK_K};
pub use error::{Error, Result};
pub use file::{GgufFile, TensorInfo};
pub use hparams::LlmHparams;
pub use metadata::{Array, Metadata, Value};
pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
pub use tokenizer::GgufTokenizer;
