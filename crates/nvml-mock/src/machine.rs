//! The machine description file: what the mock library pretends the host has.
//!
//! See the crate documentation for the format. [`Machine::load`] reads and validates a file;
//! the library calls it when NVML is initialised. The parts of a machine live in modules of
//! their own, re-exported here: the GPUs ([`Gpu`]), MIG ([`Mig`], [`MigProfileSet`]) and how
//! the GPUs are connected ([`Topology`], [`NvLink`]); [`Machine::validate`] checks a whole one.

mod gpu;
mod mig;
mod topology;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use gpu::{Architecture, Brand, Gpu, Pci};
pub use mig::{
    ComputeInstance, GpuInstance, GpuInstanceProfile, Mig, MigProfileSet, MigState, Placements,
};
pub use topology::{LinkPair, NvLink, SwitchedLinks, Topology, TopologyGroup, TopologyLevel};

/// Why a machine file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MachineError {
    /// The file could not be read.
    #[error("cannot read machine file {path}: {source}")]
    Read {
        /// The machine file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML/JSON for the machine format.
    #[error("cannot parse machine file {path}: {message}")]
    Parse {
        /// The machine file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The file parses but describes an impossible machine.
    #[error("invalid machine {path}: {message}")]
    Invalid {
        /// The machine file (empty when validated from a string).
        path: PathBuf,
        /// What is wrong, naming the field and value.
        message: String,
    },
}

/// A whole machine: driver, GPUs, MIG tables, topology, NVLink and initial events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    /// Driver version string, e.g. `"550.54.15"`.
    pub driver_version: String,
    /// CUDA driver version in NVML's integer form (`1000 * major + 10 * minor`).
    pub cuda_driver_version: i32,
    /// NVML library version string; default `"12.<driverVersion>"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_version: Option<String>,
    /// Control file (JSON lines) tailed for runtime events; env `NVML_MOCK_CONTROL` overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<PathBuf>,
    /// When set, `nvmlInit` fails with this NVML return code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_error: Option<u32>,
    /// CPUs of each NUMA node, for the CPU affinity calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa: Vec<NumaNode>,
    /// Named GPU-instance profile tables referenced by `gpus[].mig.profiles`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_profile_sets: BTreeMap<String, MigProfileSet>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// Common-ancestor levels between GPU pairs.
    #[serde(default)]
    pub topology: Topology,
    /// NVLink wiring; absent means no GPU has NVLink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<NvLink>,
    /// Xid events delivered before any from the control file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<XidEvent>,
}

/// The CPUs of one NUMA node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NumaNode {
    /// NUMA node number.
    pub node: u32,
    /// CPU list in the kernel's format, e.g. `"0-63,128-191"`.
    pub cpus: String,
}

/// An Xid critical error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct XidEvent {
    /// The Xid.
    pub xid: u64,
    /// GPU index.
    pub gpu: u32,
    /// GPU-instance id for a MIG-scoped Xid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi: Option<u32>,
    /// Compute-instance id for a MIG-scoped Xid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<u32>,
}

impl Machine {
    /// Reads, parses (JSON when the name ends in `.json`, else YAML) and validates a machine file.
    pub fn load(path: &Path) -> Result<Machine, MachineError> {
        let text = std::fs::read_to_string(path).map_err(|source| MachineError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let json = path.extension().is_some_and(|e| e == "json");
        let machine = Machine::parse(&text, json).map_err(|message| MachineError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        machine
            .validate()
            .map_err(|message| MachineError::Invalid {
                path: path.to_path_buf(),
                message,
            })?;
        Ok(machine)
    }

    /// Parses and validates a machine from YAML text.
    pub fn from_yaml(text: &str) -> Result<Machine, MachineError> {
        let machine = Machine::parse(text, false).map_err(|message| MachineError::Parse {
            path: PathBuf::new(),
            message,
        })?;
        machine
            .validate()
            .map_err(|message| MachineError::Invalid {
                path: PathBuf::new(),
                message,
            })?;
        Ok(machine)
    }

    fn parse(text: &str, json: bool) -> Result<Machine, String> {
        if json {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            serde_saphyr::from_str(text).map_err(|e| e.to_string())
        }
    }

    /// NVML version string.
    pub fn nvml_version_string(&self) -> String {
        self.nvml_version
            .clone()
            .unwrap_or_else(|| format!("12.{}", self.driver_version))
    }
}

/// Parses `"8.0"` into `(8, 0)`.
pub fn parse_compute_capability(text: &str) -> Option<(i32, i32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Parses a PCI bus id `domain:bus:device.function` (hex) into its numbers.
pub fn parse_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let mut parts = text.trim().split(':');
    let (domain, bus, rest) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(r), None) => (d, b, r),
        (Some(b), Some(r), None, None) => ("0", b, r),
        _ => return None,
    };
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, max: u32| {
        let v = u32::from_str_radix(s, 16).ok()?;
        (!s.is_empty() && v <= max).then_some(v)
    };
    Some((
        hex(domain, u32::MAX)?,
        hex(bus, 0xff)?,
        hex(device, 0x1f)?,
        hex(function, 7)?,
    ))
}

/// Parses a kernel CPU list (`"0-3,8,10-11"`) into CPU numbers.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let v = part.parse::<u32>().ok()?;
                (v, v)
            }
        };
        if lo > hi || hi >= 65536 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests;
