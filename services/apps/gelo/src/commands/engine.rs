//! The engine and protocol flags ([`ProtocolFlags`]), of the model services and of the tools
//! that run a model (`gelo embed`, `generate`, `eval`, through [`ExecArgs`]); and opening an
//! engine, for both. The flags' defaults and variables are those of
//! `server::config::ProtocolConfig`, which both read them into.

use std::sync::Arc;

use anyhow::{Context, Result};
use protocol::{DecodeMasks, Engine, Executor, MaskKind, MaskedExecutor, PlaintextExecutor, Protection};
use serde::Serialize;
use server::config::ProtocolConfig;

use super::config::{ConfigFile, checked, sources};

/// The untrusted engine and the protocol settings, every one optional here: a flag not given
/// leaves the value to `GELO_<FLAG>` (or a service's `--config` file) or the default
/// (`server::config::ProtocolConfig`).
#[derive(clap::Args, Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ProtocolFlags {
    /// Protection of a service's requests: `sealed` (products on the TEE's CPU, the engine
    /// sees nothing), `masked` (products on the engine under GELO masks; measurably
    /// weaker, see docs/SECURITY.md) or `dual-lpn` (int8 products on the engine under
    /// dual-LPN masks: hidden from the engine under that assumption, not from a hypervisor
    /// tracing the TEE's page accesses; see docs/SECURITY.md). A tool given it runs that
    /// protection's executor.
    #[arg(long, value_parser = checked::<Protection>)]
    pub protection: Option<String>,
    /// Untrusted engine: `cpu`, `vulkan`, `vulkan:N` (adapter index) or `vulkan:NAME`.
    #[arg(long)]
    pub engine: Option<String>,
    /// Mask family: haar, hd3, hd3-blocked, auto.
    #[arg(long, value_parser = checked::<MaskKind>)]
    pub mask: Option<String>,
    /// Shield rows per sequence (0 disables them).
    #[arg(long)]
    pub shield_rows: Option<usize>,
    /// Shield row energy, in mean activation row norms.
    #[arg(long)]
    pub shield_energy: Option<f32>,
    /// Decode-step masks: `per-sequence` (each sequence's row under its own shield rows) or
    /// `shared` (a step's rows mixed under one mask and one set of shield rows: faster at
    /// batched decode, and measurably weaker there against the attack harness's
    /// nearest-neighbour attack; see docs/SECURITY.md).
    #[arg(long, value_parser = checked::<DecodeMasks>)]
    pub decode_masks: Option<String>,
    /// U-Verify probes per weight under `masked` (0: off, which the default policy
    /// refuses). Each probe misses a wrong product with probability 1/6.
    #[arg(long)]
    pub verify_probes: Option<usize>,
    /// Host memory (MiB) a Vulkan engine may keep in recycled buffers of masked operands
    /// and results (0: none).
    #[arg(long)]
    pub engine_recycle_mib: Option<usize>,
}

/// A tool's engine and protocol flags. Without `--protection` a tool runs the plaintext
/// baseline on its engine (or, with `--masked`, the masked scheme), so a plain/masked pair
/// of runs is two commands; with it, the executor a service of that protection builds.
#[derive(clap::Args, Clone, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub protocol: ProtocolFlags,
    /// Run through the GELO mask (otherwise the plaintext baseline).
    #[arg(long)]
    pub masked: bool,
}

impl ExecArgs {
    /// The settings: these flags over `GELO_*` over the defaults (no config file).
    pub fn config(&self) -> Result<ProtocolConfig> {
        ProtocolConfig::load(&sources(&ConfigFile::default(), &self.protocol)?)
    }

    /// The executor these flags describe: masked or the plaintext baseline, on their engine.
    pub fn executor(&self) -> Result<Arc<dyn Executor>> {
        self.executor_for(&self.config()?)
    }

    /// The executor `cfg` (this command's [`ExecArgs::config`]) describes.
    pub fn executor_for(&self, cfg: &ProtocolConfig) -> Result<Arc<dyn Executor>> {
        let engine = open_engine(cfg)?;
        tracing::info!(engine = %engine.info().device, masked = self.masked, "engine ready");
        if self.protocol.protection.is_some() {
            if self.masked && cfg.protection != Protection::Masked {
                anyhow::bail!("--masked contradicts --protection {}", cfg.protection.as_str());
            }
            return Ok(cfg.protection.executor(engine, cfg.masked_config())?);
        }
        Ok(if self.masked {
            Arc::new(MaskedExecutor::new(engine, cfg.masked_config())?)
        } else {
            Arc::new(PlaintextExecutor::new(engine))
        })
    }
}

/// Opens the untrusted engine `cfg` names (`cpu`, `vulkan`, `vulkan:N`, `vulkan:NAME`); a
/// Vulkan engine may keep `engine-recycle-mib` MiB of host buffers.
pub fn open_engine(cfg: &ProtocolConfig) -> Result<Arc<dyn Engine>> {
    let name = &cfg.engine;
    let wgpu = kernels_wgpu::WgpuConfig { recycle_bytes: cfg.engine_recycle_mib << 20, ..Default::default() };
    kernels_wgpu::open_engine_with(name, wgpu).with_context(|| format!("opening engine `{name}`"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Tool {
        #[command(flatten)]
        exec: ExecArgs,
    }

    fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<ProtocolConfig> {
        let tool = Tool::try_parse_from(std::iter::once("tool").chain(args.iter().copied()))?;
        let no_file = ConfigFile::default();
        let mut layers = sources(&no_file, &tool.exec.protocol)?;
        layers.env = env.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        ProtocolConfig::load(&layers)
    }

    #[test]
    fn a_tool_reads_its_flags_over_gelo_variables_over_the_defaults() {
        let env = [("GELO_SHIELD_ROWS", "5"), ("GELO_ENGINE", "vulkan:0"), ("GELO_MASK", "haar")];
        let cfg = resolve(&["--shield-rows", "7", "--decode-masks", "shared", "--masked"], &env).unwrap();
        assert_eq!(cfg.shield_rows, 7, "flag over env");
        assert_eq!((cfg.engine.as_str(), cfg.mask), ("vulkan:0", MaskKind::Haar), "env over default");
        assert_eq!(cfg.decode_masks, DecodeMasks::Shared);
        assert_eq!((cfg.verify_probes, cfg.engine_recycle_mib), (2, 1024), "defaults");
        assert_eq!(resolve(&[], &[]).unwrap(), ProtocolConfig::default());
    }

    #[test]
    fn a_tool_given_a_protection_runs_that_protections_executor() {
        let exec = |args: &[&str]| {
            let tool = Tool::try_parse_from(std::iter::once("tool").chain(args.iter().copied())).unwrap();
            tool.exec.executor().map(|e| e.scheme().executor)
        };
        assert_eq!(exec(&[]).unwrap(), "plaintext");
        assert_eq!(exec(&["--masked"]).unwrap(), "masked");
        assert_eq!(exec(&["--protection", "sealed"]).unwrap(), "sealed");
        assert_eq!(exec(&["--protection", "dual-lpn"]).unwrap(), "dual-lpn");
        assert_eq!(exec(&["--protection", "masked", "--masked"]).unwrap(), "masked");
        assert!(exec(&["--protection", "sealed", "--masked"]).is_err(), "contradictory flags");
    }

    #[test]
    fn a_tool_refuses_a_bad_value_naming_its_flag_or_variable() {
        assert!(resolve(&["--mask", "round"], &[]).is_err(), "clap checks a flag's value");
        let err = resolve(&[], &[("GELO_VERIFY_PROBES", "two")]).unwrap_err().to_string();
        assert!(err.contains("GELO_VERIFY_PROBES"), "{err}");
    }

    /// Flags not given serialize to nothing, so they cannot hide a variable.
    #[test]
    fn absent_flags_are_left_out() {
        let tool = Tool::try_parse_from(["tool", "--engine", "cpu"]).unwrap();
        let no_file = ConfigFile::default();
        let layers = sources(&no_file, &tool.exec.protocol).unwrap();
        assert_eq!(layers.flags, serde_json::json!({ "engine": "cpu" }));
    }
}
