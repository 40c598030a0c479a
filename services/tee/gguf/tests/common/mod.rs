//! Shared helpers for the integration tests: where the fetched models live and how to read
//! the committed fixtures.
#![allow(dead_code)]

pub mod builder;

use std::path::PathBuf;

pub const SMOLLM2: &str = "smollm2-135m-instruct.gguf";
pub const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// `${GELO_CACHE:-$HOME/.cache/gelo}/models`, where scripts/fetch-models.sh puts them.
pub fn models_dir() -> PathBuf {
    let cache = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/gelo"));
    cache.join("models")
}

/// Path of a fetched model file; fails (never skips) when it is absent.
pub fn model_path(file: &str) -> PathBuf {
    let path = models_dir().join(file);
    assert!(path.is_file(), "model file {} is missing: run scripts/fetch-models.sh", path.display());
    path
}

/// A committed fixture, found from the package folder cargo (or nextest) gives the running
/// test: a test binary built in another checkout that shares the target dir carries that
/// checkout's path in `env!`, and cargo reuses it here when the sources are older.
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into()))
        .join("tests/fixtures")
        .join(name)
}

pub fn read_json(path: PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `|a - b| <= rel · max(|b|, floor)`: relative, with a floor so values that are exactly
/// zero in the reference do not demand exact zeros.
pub fn close(a: f64, b: f64, rel: f64, floor: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(floor)
}
