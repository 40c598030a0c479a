//! The model services in process, one test binary (one link): what a Generate client sees for
//! a refused request, the health service, and a tampering GPU.

mod generate_requests;
mod health;
mod integrity;

/// Shared with the gateway's integrity test.
#[path = "../support/integrity.rs"]
mod support;
