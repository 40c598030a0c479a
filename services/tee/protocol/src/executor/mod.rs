//! The executors: what model code calls for every linear layer and attention product.
//!
//! This module holds what every executor shares: the [`Executor`] and [`Pass`] traits, the
//! attested [`Scheme`], [`IntegrityStatus`] and the input checks every pass makes. The
//! executors live beside it: [`PlaintextExecutor`] (the parity baseline) in `plaintext`,
//! [`SealedExecutor`] and [`Protection`] in `sealed`, [`MaskedExecutor`] and its
//! [`MaskedConfig`] in `masked`, [`DualLpnExecutor`] in `lpn`.

use tensor::{Matrix, Weight, WeightId};

use crate::EngineInfo;
use serde::{Deserialize, Serialize};

mod lpn;
mod masked;
mod plaintext;
mod sealed;
#[cfg(test)]
mod test_engine;
pub use lpn::{DualLpnConfig, DualLpnCounts, DualLpnExecutor, noise_weight};
pub use masked::{AttentionConfig, DecodeMasks, MaskedConfig, MaskedExecutor, ProtocolSeconds};
pub use plaintext::PlaintextExecutor;
pub use sealed::{Protection, SealedExecutor};

use crate::{
    attention::{Causal, Head},
    error::{ProtocolError, Result},
};

/// What an executor does, as the attestation's `scheme_identity` commits to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scheme {
    /// `plaintext`, `sealed`, `masked` or `dual-lpn`.
    pub executor: String,
    pub masked: Option<MaskedConfig>,
    /// The dual-LPN scheme's settings (absent from the JSON of every other executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lpn: Option<DualLpnConfig>,
    pub engine: EngineInfo,
}

/// Whether the engine has ever returned a product that failed U-Verify.
#[derive(Clone, Debug, PartialEq)]
pub enum IntegrityStatus {
    /// No failure seen (or U-Verify is off: see [`Scheme`]).
    Clean { checked: u64 },
    /// The engine returned wrong products; it must not be trusted with further work.
    Compromised { checked: u64, failures: u64, last: String },
}

/// The TEE's view of the GPU. Model code is written against this trait only, so the same
/// code runs plain and masked.
pub trait Executor: Send + Sync {
    /// Registers a public weight with the engine (and, when verifying, draws its probes).
    fn provision(&self, id: WeightId, weight: Weight) -> Result<()>;

    /// Opens a forward pass over sequences of `blocks[i]` rows each. Every sequence gets
    /// its own mask; the mask is dropped and scrubbed when the pass ends.
    fn begin(&self, blocks: &[usize]) -> Result<Box<dyn Pass + '_>>;

    fn scheme(&self) -> Scheme;

    fn integrity(&self) -> IntegrityStatus;
}

/// One forward pass.
pub trait Pass {
    /// Rows of each sequence, as given to [`Executor::begin`].
    fn blocks(&self) -> &[usize];

    /// `h·W` for `h` with one row per activation (all sequences stacked).
    fn linear(&mut self, h: &Matrix, id: &WeightId) -> Result<Matrix> {
        let mut out = self.linear_many(h, std::slice::from_ref(id))?;
        Ok(out.pop().expect("one id, one product"))
    }

    /// `h·W` for several weights sharing the input (one mask application, one transfer).
    fn linear_many(&mut self, h: &Matrix, ids: &[WeightId]) -> Result<Vec<Matrix>>;

    /// `softmax(scale·Q·Kᵀ + causal)·V` for the heads of one sequence. Queries, and the
    /// last `q.rows()` rows of keys and values (those that arrive with them), must be
    /// finite (`NonFinite` otherwise); earlier rows are a cache checked when they arrived.
    fn attend(&mut self, heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>>;

    /// [`Pass::attend`] for several sequences (`seqs[i]`: one sequence's heads and its causal
    /// offset), answered per sequence in order. Where attention runs in the TEE, the heads
    /// of all sequences run in parallel.
    fn attend_sequences(&mut self, seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
        seqs.iter().map(|(heads, causal)| self.attend(heads, scale, *causal)).collect()
    }

    /// Ends the pass, scrubbing its mask material.
    fn end(self: Box<Self>);
}

/// A linear's input against the pass and every weight it goes to; its values are checked
/// once however many products share it.
fn check_input(op: &'static str, h: &Matrix, blocks: &[usize], d_ins: impl IntoIterator<Item = usize>) -> Result<()> {
    let rows: usize = blocks.iter().sum();
    if h.rows() != rows {
        return Err(ProtocolError::Shape {
            op,
            detail: format!("input has {} rows, the pass was opened for {rows}", h.rows()),
        });
    }
    for d_in in d_ins {
        if h.cols() != d_in {
            return Err(ProtocolError::Shape {
                op,
                detail: format!("input has {} columns, the weight expects {d_in}", h.cols()),
            });
        }
    }
    if !h.is_finite() {
        return Err(ProtocolError::NonFinite { op });
    }
    Ok(())
}

fn check_blocks(blocks: &[usize]) -> Result<()> {
    if blocks.is_empty() || blocks.contains(&0) {
        return Err(ProtocolError::EmptyPass);
    }
    Ok(())
}

/// Attention on the TEE's own CPU (the plaintext and dual-LPN executors' passes), after the
/// checks every pass makes.
fn attend_in_tee(heads: &[Head<'_>], scale: f32, causal: Causal) -> Result<Vec<Matrix>> {
    check_heads(heads)?;
    Ok(crate::attention::attend_all(heads, scale, causal))
}

/// [`attend_in_tee`] for several sequences, their heads in parallel.
fn attend_sequences_in_tee(seqs: &[(&[Head<'_>], Causal)], scale: f32) -> Result<Vec<Vec<Matrix>>> {
    seqs.iter().try_for_each(|(heads, _)| check_heads(heads))?;
    Ok(crate::attention::attend_sequences(seqs, scale))
}

fn check_heads(heads: &[Head<'_>]) -> Result<()> {
    for h in heads {
        let ok = h.q.cols() == h.k.cols() && h.k.rows() == h.v.rows() && h.q.rows() > 0 && h.k.rows() > 0;
        if !ok {
            return Err(ProtocolError::Shape {
                op: "attend",
                detail: format!("q {:?}, k {:?}, v {:?}", h.q.shape(), h.k.shape(), h.v.shape()),
            });
        }
        // Keys and values that arrive with these queries are the last `q.rows()` rows; the
        // rows before them are a cache that was checked on the pass it arrived in. Scanning
        // the whole cache on every step made a decode step's check grow with the context
        // (88 MB a step for Qwen3-1.7B at B = 8 and 48 positions).
        let fresh = h.k.rows() - h.q.rows().min(h.k.rows());
        if !(h.q.is_finite() && h.k.rows_finite(fresh) && h.v.rows_finite(fresh)) {
            return Err(ProtocolError::NonFinite { op: "attend" });
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Dims {
    d_in: usize,
    d_out: usize,
}
