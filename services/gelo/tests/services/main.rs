//! The model services as real processes over real TCP and RA-TLS (mock attestation).

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod embedder;
mod generator;
mod reranker;
