//! GELO, the TEE side.
//!
//! Model code runs every linear layer through an [`Executor`]. The default,
//! [`SealedExecutor`], computes every product on the TEE's own CPU: the GPU sees nothing
//! (`docs/SECURITY.md` says why no offload scheme we know is both exact, blind and cheaper).
//! The [`MaskedExecutor`], the named weaker option,
//! stacks `k` high-energy shield rows under the activation block `H`, mixes the stack with
//! a fresh secret orthogonal mask `A` (one per forward pass and sequence), sends only
//! `U = A·[H; S]` to the untrusted engine, recovers `H·W` from `Aᵀ·(U·W)` and strips the
//! shield rows. [`PlaintextExecutor`] is the parity baseline that sends `H` in the clear.
//!
//! Where things live: what may cross to the untrusted device in [`boundary`] (only this
//! crate makes a [`Masked`] operand; [`danger`] is the named way around it), the
//! [`Engine`] contract the devices in `kernels/` implement in [`engine`], mask sampling in
//! [`mask`], shield rows in [`shield`], the integrity check in [`verify`], the masked
//! attention products in [`attention`].

pub mod attention;
pub mod boundary;
pub mod engine;
mod error;
mod executor;
pub mod mask;
pub mod shield;
pub mod verify;

pub use boundary::{Masked, RingMasked, danger};
pub use engine::{Engine, EngineError, EngineInfo, Registered};
pub use error::ProtocolError;
pub use executor::{
    AttentionConfig, DecodeMasks, DualLpnConfig, DualLpnCounts, DualLpnExecutor, Executor, IntegrityStatus,
    MaskedConfig, MaskedExecutor, Pass, PlaintextExecutor, Protection, ProtocolSeconds, Scheme, SealedExecutor,
    noise_weight,
};
pub use mask::MaskKind;
pub use shield::ShieldConfig;
pub use tensor::{Matrix, MatrixView, Precision, Weight, WeightData, WeightId, WeightLayout};
pub use verify::{IntegrityViolation, UVerifyConfig};

use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

/// A ChaCha20 generator seeded from the operating system's entropy source.
pub fn os_seeded_rng() -> ChaCha20Rng {
    ChaCha20Rng::try_from_rng(&mut rand::rngs::SysRng).expect("the OS entropy source failed")
}
