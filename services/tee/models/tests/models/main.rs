//! Model tests on real weights (fetched by scripts/fetch-models.sh), in one binary.

mod generation;
mod llama_cpp;
mod loading;
mod minilm;
mod qwen3;
mod support;
