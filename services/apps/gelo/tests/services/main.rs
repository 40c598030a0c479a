//! The model services as real processes over real TCP and RA-TLS (mock attestation), and
//! the `gelo attest` tools as a user runs them.

#[path = "../support/mod.rs"]
mod support;

mod attest_cli;
mod bad_input;
mod embedder;
mod generator;
mod limits;
mod metrics;
mod otlp;
mod reranker;
