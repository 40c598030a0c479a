//! Flags shared by the tools that run a model (`gelo embed`, `generate`, `eval`): which
//! engine, plain or masked, and how; and opening an engine, for them and the model services.

use std::sync::Arc;

use anyhow::{Context, Result};
use protocol::Engine;
use protocol::{DecodeMasks, Executor, MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor, Protection};

/// Engine and protocol flags with an explicit `--masked` (tools default to the plaintext
/// baseline so a plain/masked pair of runs is two commands).
#[derive(clap::Args, Clone, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Run through the GELO mask (otherwise the plaintext baseline).
    #[arg(long)]
    pub masked: bool,
}

impl ExecArgs {
    pub fn executor(&self) -> Result<Arc<dyn Executor>> {
        self.protocol.executor(self.masked, self.protocol.engine()?)
    }
}

/// The untrusted engine and the protocol settings.
#[derive(clap::Args, Clone, Debug)]
pub struct ProtocolArgs {
    /// Protection of a service's requests: `sealed` (default: products on the TEE's CPU,
    /// the engine sees nothing) or `masked` (products on the engine under GELO masks;
    /// measurably weaker, see docs/SECURITY.md).
    #[arg(long, env = "GELO_PROTECTION", default_value = "sealed")]
    pub protection: Protection,
    /// Untrusted engine: `cpu`, `vulkan`, `vulkan:N` (adapter index) or `vulkan:NAME`.
    #[arg(long, env = "GELO_ENGINE", default_value = "cpu")]
    pub engine: String,
    /// Mask family: haar, hd3, hd3-blocked, auto.
    #[arg(long, env = "GELO_MASK", default_value = "auto")]
    pub mask: MaskKind,
    /// Shield rows per sequence (0 disables them).
    #[arg(long, env = "GELO_SHIELD_ROWS", default_value_t = 8)]
    pub shield_rows: usize,
    /// Shield row energy, in mean activation row norms.
    #[arg(long, env = "GELO_SHIELD_ENERGY", default_value_t = 4.0)]
    pub shield_energy: f32,
    /// Decode-step masks: `per-sequence` (each sequence's row under its own shield rows) or
    /// `shared` (a step's rows mixed under one mask and one set of shield rows: faster at
    /// batched decode, and measurably weaker there against the attack harness's
    /// nearest-neighbour attack; see docs/SECURITY.md).
    #[arg(long, env = "GELO_DECODE_MASKS", default_value = "per-sequence")]
    pub decode_masks: DecodeMasks,
    /// U-Verify probes per weight under `masked` (0: off, which the default policy
    /// refuses). Each probe misses a wrong product with probability 1/6.
    #[arg(long, env = "GELO_VERIFY_PROBES", default_value_t = 2)]
    pub verify_probes: usize,
    /// Host memory (MiB) a Vulkan engine may keep in recycled buffers of masked operands
    /// and results (0: none).
    #[arg(long, env = "GELO_ENGINE_RECYCLE_MIB", default_value_t = 1024)]
    pub engine_recycle_mib: usize,
}

/// Opens the untrusted engine `name` (`cpu`, `vulkan`, `vulkan:N`, `vulkan:NAME`); a Vulkan
/// engine may keep `recycle_mib` MiB of host buffers.
pub fn open_engine(name: &str, recycle_mib: usize) -> Result<Arc<dyn Engine>> {
    let cfg = kernels_wgpu::WgpuConfig { recycle_bytes: recycle_mib << 20, ..Default::default() };
    kernels_wgpu::open_engine_with(name, cfg).with_context(|| format!("opening engine `{name}`"))
}

impl ProtocolArgs {
    pub fn engine(&self) -> Result<Arc<dyn Engine>> {
        open_engine(&self.engine, self.engine_recycle_mib)
    }

    pub fn masked_config(&self) -> MaskedConfig {
        server::config::masked_config(
            self.mask,
            self.shield_rows,
            self.shield_energy,
            self.verify_probes,
            self.decode_masks,
        )
    }

    /// The executor these flags describe, on `engine` (tools: masked or the plaintext
    /// baseline, whatever `--protection` says).
    pub fn executor(&self, masked: bool, engine: Arc<dyn Engine>) -> Result<Arc<dyn Executor>> {
        tracing::info!(engine = %engine.info().device, masked, "engine ready");
        Ok(if masked {
            Arc::new(MaskedExecutor::new(engine, self.masked_config())?)
        } else {
            Arc::new(PlaintextExecutor::new(engine))
        })
    }
}
