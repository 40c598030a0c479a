//! The local end-to-end suite: embedder, reranker, generator and gateway as real `gelo`
//! processes on loopback TCP, talking RA-TLS with mock attestation. Registered as the `e2e`
//! test of the `gelo` package (`cargo test -p gelo --test e2e`), so `CARGO_BIN_EXE_gelo` is
//! the binary under test.
//!
//! - `retrieval`: SciFact through the gateway ranks exactly like the embedder's own BEIR
//!   evaluation (masked, same documents).
//! - `up`: `gelo up`, the CLI (`ingest`, `search`, `query`), a cited answer over gRPC, and the
//!   OpenAI-compatible HTTP API.
//! - `gate`: backends with another model, measurement, root, role or key never get a request.
//! - `failover`: a generator killed mid-answer, the survivor, and the restarted one.
//! - `crash`: the gateway SIGKILLed during ingest keeps every acknowledged document whole;
//!   its store files hold no plaintext and no raw vectors.
//! - `stall`: an embedder stopped by SIGSTOP times out by name and blocks no other call.
//! - `proxy`: the official `openai` client through `gelo proxy` to a gateway on a
//!   non-loopback address; gateways failing the user's policy refused by name, sent nothing.

#[path = "../../services/apps/gelo/tests/support/mod.rs"]
mod support;

mod stack;

mod crash;
mod failover;
mod gate;
mod proxy;
mod retrieval;
mod stall;
mod up;
