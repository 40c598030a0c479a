//! The model services in process, one test binary (one link): what a Generate client sees for
//! a refused request, the health service, and a tampering GPU.

use std::path::PathBuf;

mod generate_requests;
mod health;
mod integrity;

/// Shared with the gateway's integrity test.
#[path = "../support/integrity.rs"]
mod support;

/// A model fetched by scripts/fetch-models.sh; fails (never skips) when it is absent.
fn model(name: &str) -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/gelo"));
    let p = root.join("models").join(name);
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}
