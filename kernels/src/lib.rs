//! The untrusted engines: the devices the TEE hands masked operands to.
//!
//! An engine implements the protocol crate's [`protocol::Engine`] contract: it holds public
//! weights and multiplies whatever [`protocol::Masked`] operands it is given, and nothing
//! else ever reaches it. This crate holds the CPU engine (CI's device and the parity
//! baseline), engine decorators that time ([`timing`]) or record ([`capture`]) what the
//! device sees, and the recycled-buffer pool the engines share ([`pool`]); the Vulkan GPU
//! engine is `kernels/wgpu`. Nothing here knows about masks, tokens or models.

pub mod capture;
mod cpu;
pub mod pool;
pub mod timing;

pub use cpu::CpuEngine;
