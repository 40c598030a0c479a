//! Provisioning weights on an executor, shared by every architecture.
//!
//! Its own module so that the architectures ([`crate::bert`], [`crate::decoder`]) can
//! provision their linears without reaching into the loader, which imports them.

use protocol::Executor;
use tensor::{Weight, WeightId, WeightLayout};

use crate::{error::Result, tensors::Tensors};

/// Provisions a weight; an id that is already provisioned is reused. Ids carry the model's
/// identity tag, so the same id means the same bytes: loading one model for two roles on
/// one executor shares its weights instead of failing.
pub(crate) fn provision_shared(exec: &dyn Executor, id: &WeightId, w: Weight) -> Result<()> {
    match exec.provision(id.clone(), w) {
        Err(protocol::ProtocolError::DuplicateWeight(_)) => Ok(()),
        other => Ok(other?),
    }
}

/// Provisions the checkpoint's `{name}.weight` (`d_out × d_in`, PyTorch's layout) under
/// `{tag}/{name}` and returns its id.
pub(crate) fn linear(
    exec: &dyn Executor,
    t: &Tensors,
    tag: &str,
    name: &str,
    d_in: usize,
    d_out: usize,
) -> Result<WeightId> {
    let data = t.weight(&format!("{name}.weight"), &[d_out, d_in])?;
    let id = WeightId::new(format!("{tag}/{name}"));
    provision_shared(exec, &id, Weight { d_in, d_out, layout: WeightLayout::OutIn, data })?;
    Ok(id)
}
