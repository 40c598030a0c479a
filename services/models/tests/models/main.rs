//! Model tests on real weights (fetched by scripts/fetch-models.sh), in one binary.

mod loading;
mod minilm;
mod support;
