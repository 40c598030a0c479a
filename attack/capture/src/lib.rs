//! GELO attack harness, capture side.
//!
//! Runs a prompt corpus through a real model under each protection condition
//! ([`Condition`]), with a [`kernels::capture::CapturingEngine`] in the engine's place: it
//! records every operand the untrusted device receives. A [`record::Recorder`] on the
//! trusted side keeps the plaintext those operands were made from, for scoring only. The
//! attacks themselves are in Python next to this crate (`attack/*.py`); `attack/run.sh`
//! runs the whole harness.

pub mod capture;
pub mod condition;
pub mod npy;
pub mod record;

pub use capture::{Options, Prompt, Site, Watched, capture};
pub use condition::Condition;
