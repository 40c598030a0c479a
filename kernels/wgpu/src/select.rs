//! Which Vulkan adapter an engine runs on: the spec strings of the configuration
//! (`vulkan`, `vulkan:N`, `vulkan:<name>`) and the adapter list behind them.

use std::{fmt, str::FromStr};

use protocol::EngineError;

/// Which adapter `vulkan…` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterSpec {
    /// The best adapter present: discrete first, then integrated, virtual, other, and a
    /// software rasterizer (lavapipe) last.
    Best,
    /// The adapter at this position of [`adapters`]'s list.
    Index(usize),
    /// The first adapter whose name contains this text (case-insensitive).
    Name(String),
}

impl FromStr for AdapterSpec {
    type Err = EngineError;

    /// Parses `vulkan`, `vulkan:N` or `vulkan:<name substring>`.
    fn from_str(spec: &str) -> Result<Self, EngineError> {
        let spec = spec.trim();
        let rest = match spec.split_once(':') {
            None if spec.eq_ignore_ascii_case("vulkan") => return Ok(AdapterSpec::Best),
            Some((head, rest)) if head.eq_ignore_ascii_case("vulkan") => rest.trim(),
            _ => {
                return Err(EngineError::NoAdapter(format!(
                    "engine spec `{spec}` is not `cpu`, `vulkan`, `vulkan:N` or `vulkan:<name>`"
                )));
            }
        };
        if rest.is_empty() {
            return Ok(AdapterSpec::Best);
        }
        Ok(match rest.parse::<usize>() {
            Ok(i) => AdapterSpec::Index(i),
            Err(_) => AdapterSpec::Name(rest.to_string()),
        })
    }
}

impl fmt::Display for AdapterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdapterSpec::Best => f.write_str("vulkan"),
            AdapterSpec::Index(i) => write!(f, "vulkan:{i}"),
            AdapterSpec::Name(n) => write!(f, "vulkan:{n}"),
        }
    }
}

/// One Vulkan adapter as the driver describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterSummary {
    /// Position in enumeration order: what `vulkan:N` refers to.
    pub index: usize,
    pub name: String,
    pub device_type: wgpu::DeviceType,
    /// Driver name and version, e.g. `NVIDIA 580.159.04` or `llvmpipe Mesa 22.3.6`.
    pub driver: String,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} ({:?}, {})", self.index, self.name, self.device_type, self.driver)
    }
}

pub(crate) fn summary(index: usize, info: &wgpu::AdapterInfo) -> AdapterSummary {
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    AdapterSummary { index, name: info.name.clone(), device_type: info.device_type, driver }
}

/// A Vulkan-only instance. Other backends (GL, the browser) are never wanted: the engine's
/// evidence says "vulkan", and GL lacks what the kernels need.
pub(crate) fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        // No validation layers unless asked for (WGPU_VALIDATION=1): they cost per-call CPU
        // time and are usually not installed.
        flags: wgpu::InstanceFlags::empty().with_env(),
        // Resource creation fails with a typed out-of-memory error near the driver's budget
        // instead of the driver losing the device.
        memory_budget_thresholds: wgpu::MemoryBudgetThresholds {
            for_resource_creation: Some(95),
            for_device_loss: None,
        },
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

/// The Vulkan adapters of this machine, in enumeration order.
pub fn adapters() -> Vec<AdapterSummary> {
    let instance = instance();
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN))
        .iter()
        .enumerate()
        .map(|(i, a)| summary(i, &a.get_info()))
        .collect()
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Picks the adapter `spec` names, or says which ones exist.
pub(crate) fn pick(
    instance: &wgpu::Instance,
    spec: &AdapterSpec,
) -> Result<(wgpu::Adapter, AdapterSummary), EngineError> {
    let mut all: Vec<(wgpu::Adapter, AdapterSummary)> =
        pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN))
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let s = summary(i, &a.get_info());
                (a, s)
            })
            .collect();
    if all.is_empty() {
        return Err(EngineError::NoAdapter(
            "no Vulkan adapter found: is a Vulkan driver and loader installed \
             (libvulkan1; mesa-vulkan-drivers for lavapipe)?"
                .into(),
        ));
    }
    let listing = || all.iter().map(|(_, s)| s.to_string()).collect::<Vec<_>>().join("; ");
    let found = match spec {
        AdapterSpec::Best => (0..all.len()).min_by_key(|&i| (rank(all[i].1.device_type), i)),
        AdapterSpec::Index(n) => (*n < all.len()).then_some(*n),
        AdapterSpec::Name(name) => {
            let name = name.to_lowercase();
            all.iter().position(|(_, s)| s.name.to_lowercase().contains(&name))
        }
    };
    match found {
        Some(i) => Ok(all.swap_remove(i)),
        None => Err(EngineError::NoAdapter(format!("no Vulkan adapter matches `{spec}`; adapters: {}", listing()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!("vulkan".parse::<AdapterSpec>().unwrap(), AdapterSpec::Best);
        assert_eq!("Vulkan:".parse::<AdapterSpec>().unwrap(), AdapterSpec::Best);
        assert_eq!("vulkan:2".parse::<AdapterSpec>().unwrap(), AdapterSpec::Index(2));
        assert_eq!("vulkan:H200".parse::<AdapterSpec>().unwrap(), AdapterSpec::Name("H200".into()));
        assert!(matches!("cuda".parse::<AdapterSpec>(), Err(EngineError::NoAdapter(_))));
        assert!(matches!("vulkanx:1".parse::<AdapterSpec>(), Err(EngineError::NoAdapter(_))));
    }

    #[test]
    fn discrete_ranks_first_and_software_last() {
        let order = [
            wgpu::DeviceType::DiscreteGpu,
            wgpu::DeviceType::IntegratedGpu,
            wgpu::DeviceType::VirtualGpu,
            wgpu::DeviceType::Other,
            wgpu::DeviceType::Cpu,
        ];
        assert!(order.windows(2).all(|w| rank(w[0]) < rank(w[1])));
    }
}
