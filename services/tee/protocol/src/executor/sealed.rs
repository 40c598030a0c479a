//! The sealed executor: every linear runs on the TEE's own CPU, and the untrusted engine
//! receives nothing derived from a request.
//!
//! This is the default protection. `docs/SECURITY.md` ("What the GPU can learn") shows why:
//! an exact, left-mixed operand keeps the row space and the Gram of its activations, and
//! any scheme whose operand reveals nothing about them makes the TEE do at least the work
//! of the product itself. So the sealed executor is the only scheme we can prove the
//! GPU learns nothing from. Offloading to the GPU is the named, weaker `masked` scheme.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tensor::{Weight, WeightId};

use super::{
    DualLpnConfig, DualLpnExecutor, Executor, IntegrityStatus, MaskedConfig, MaskedExecutor, Pass, PlaintextExecutor,
    Scheme,
};
use crate::{Engine, error::Result};

/// Runs every product on the host CPU, inside the TEE's address space.
///
/// The engine a service was started with is never handed an operand: a sealed executor is
/// built without one.
pub struct SealedExecutor {
    inner: PlaintextExecutor,
}

impl SealedExecutor {
    pub fn new() -> Self {
        SealedExecutor { inner: PlaintextExecutor::host() }
    }
}

impl Default for SealedExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl Executor for SealedExecutor {
    fn provision(&self, id: WeightId, weight: Weight) -> Result<()> {
        self.inner.provision(id, weight)
    }

    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>> {
        self.inner.begin(blocks)
    }

    fn scheme(&self) -> Scheme {
        Scheme { executor: "sealed".into(), masked: None, lpn: None, engine: self.inner.engine_info() }
    }

    fn integrity(&self) -> IntegrityStatus {
        // The products never leave the TEE: there is nothing for U-Verify to check.
        IntegrityStatus::Clean { checked: 0 }
    }
}

/// How a model service protects its requests from the engine: the scheme a deployment
/// names, recorded in the attested scheme by the executor it builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protection {
    /// Every product on the TEE's own CPU; the engine receives nothing from a request.
    #[default]
    Sealed,
    /// Every product on the engine as `U = A·[H; S]` (the [`MaskedExecutor`]): weaker, the
    /// engine can read prompt tokens from the operands' row space and Gram.
    Masked,
    /// Every linear on the engine as an int8 product over `Z_{2^32}` under a dual-LPN mask
    /// (the [`DualLpnExecutor`]): hidden from the engine under dual LPN, but the table rows
    /// the TEE reads reveal the mask to a hypervisor that traces its page accesses.
    DualLpn,
}

impl Protection {
    pub fn as_str(self) -> &'static str {
        match self {
            Protection::Sealed => "sealed",
            Protection::Masked => "masked",
            Protection::DualLpn => "dual-lpn",
        }
    }

    /// The executor of this protection. `engine` is the untrusted device; a sealed
    /// executor never hands it an operand. `masked` configures the masked scheme only.
    pub fn executor(self, engine: Arc<dyn Engine>, masked: MaskedConfig) -> Result<Arc<dyn Executor>> {
        Ok(match self {
            Protection::Sealed => Arc::new(SealedExecutor::new()),
            Protection::Masked => Arc::new(MaskedExecutor::new(engine, masked)?),
            Protection::DualLpn => Arc::new(DualLpnExecutor::new(engine, DualLpnConfig::default())?),
        })
    }
}

impl std::str::FromStr for Protection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sealed" => Ok(Protection::Sealed),
            "masked" => Ok(Protection::Masked),
            "dual-lpn" => Ok(Protection::DualLpn),
            other => Err(format!("unknown protection `{other}` (sealed, masked, dual-lpn)")),
        }
    }
}
