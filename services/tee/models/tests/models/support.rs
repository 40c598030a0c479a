use std::{path::PathBuf, sync::Arc};

use kernels::CpuEngine;
use protocol::Engine;
use protocol::{DualLpnConfig, DualLpnExecutor, Executor, MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor};

/// A model from the offline cache; fails loudly when it has not been fetched.
pub fn model(name: &str) -> PathBuf {
    let root = std::env::var_os("GELO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/gelo"));
    let path = root.join("models").join(name);
    assert!(path.exists(), "{} is missing: run scripts/fetch-models.sh", path.display());
    path
}

/// The default protection: every product on the host CPU, quantized weights in int8.
pub fn sealed() -> Arc<dyn Executor> {
    Arc::new(protocol::SealedExecutor::new())
}

pub fn plain() -> Arc<dyn Executor> {
    Arc::new(PlaintextExecutor::new(Arc::new(CpuEngine::new())))
}

pub fn masked() -> Arc<dyn Executor> {
    masked_with(MaskKind::Auto)
}

pub fn masked_with(mask: MaskKind) -> Arc<dyn Executor> {
    let engine: Arc<dyn Engine> = Arc::new(CpuEngine::new());
    Arc::new(MaskedExecutor::new(engine, MaskedConfig { mask, ..Default::default() }).unwrap())
}

/// The dual-LPN protection on the CPU engine.
pub fn dual_lpn() -> Arc<DualLpnExecutor> {
    Arc::new(DualLpnExecutor::new(Arc::new(CpuEngine::new()), DualLpnConfig::default()).unwrap())
}

/// The quantized plaintext path the dual-LPN protection must equal.
pub fn int8_reference() -> Arc<dyn Executor> {
    Arc::new(PlaintextExecutor::int8_reference())
}
