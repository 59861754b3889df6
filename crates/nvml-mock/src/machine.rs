//! The machine description file: what the mock library pretends the host has.
//!
//! See the crate documentation for the format. [`Machine::load`] reads and validates a file;
//! the library calls it when NVML is initialised.

mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML index; defaults to the position in the list and must equal it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// `GPU-…` UUID, unique in the machine.
    pub uuid: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// Product name, e.g. `"NVIDIA A100-SXM4-40GB"`.
    pub name: String,
    /// Brand reported by `nvmlDeviceGetBrand`.
    pub brand: Brand,
    /// Architecture reported by `nvmlDeviceGetArchitecture`.
    pub architecture: Architecture,
    /// CUDA compute capability as `"major.minor"`.
    pub compute_capability: String,
    /// Total memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Memory reserved by the driver in MiB.
    #[serde(rename = "memoryReservedMiB", default)]
    pub memory_reserved_mib: u64,
    /// Memory in use in MiB.
    #[serde(rename = "memoryUsedMiB", default)]
    pub memory_used_mib: u64,
    /// PCI identity.
    pub pci: Pci,
    /// NUMA node; absent means NVML cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Start as fallen off the bus.
    #[serde(default)]
    pub lost: bool,
    /// Event type bits this GPU supports; default single/double-bit ECC, P-state, Xid, clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supported_event_types: Option<u64>,
    /// MIG support; absent means the GPU is not MIG-capable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Mig>,
}

/// PCI identity of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pci {
    /// Bus id `dddddddd:bb:dd.f` (a 4-digit domain is accepted too).
    pub bus_id: String,
    /// `(device << 16) | vendor`, e.g. `0x20B010DE`.
    pub device_id: u32,
    /// `(subsystem device << 16) | subsystem vendor`.
    #[serde(default)]
    pub subsystem_id: u32,
}

/// Brand values of `nvmlBrandType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Brand {
    Unknown,
    Quadro,
    Tesla,
    Nvs,
    Grid,
    Geforce,
    Titan,
    NvidiaVapps,
    NvidiaVpc,
    NvidiaVcs,
    NvidiaVws,
    NvidiaCloudGaming,
    QuadroRtx,
    NvidiaRtx,
    Nvidia,
    GeforceRtx,
    TitanRtx,
}

impl Brand {
    /// The `nvmlBrandType_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            Brand::Unknown => 0,
            Brand::Quadro => 1,
            Brand::Tesla => 2,
            Brand::Nvs => 3,
            Brand::Grid => 4,
            Brand::Geforce => 5,
            Brand::Titan => 6,
            Brand::NvidiaVapps => 7,
            Brand::NvidiaVpc => 8,
            Brand::NvidiaVcs => 9,
            Brand::NvidiaVws => 10,
            Brand::NvidiaCloudGaming => 11,
            Brand::QuadroRtx => 12,
            Brand::NvidiaRtx => 13,
            Brand::Nvidia => 14,
            Brand::GeforceRtx => 15,
            Brand::TitanRtx => 16,
        }
    }
}

/// Architecture values of `nvmlDeviceArchitecture_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

impl Architecture {
    /// The `nvmlDeviceArchitecture_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            Architecture::Kepler => 2,
            Architecture::Maxwell => 3,
            Architecture::Pascal => 4,
            Architecture::Volta => 5,
            Architecture::Turing => 6,
            Architecture::Ampere => 7,
            Architecture::Ada => 8,
            Architecture::Hopper => 9,
            Architecture::Blackwell => 10,
        }
    }
}

/// MIG mode of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigState {
    /// MIG disabled.
    Disabled,
    /// MIG enabled.
    Enabled,
}

/// MIG capability, mode and pre-existing instances of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mig {
    /// Current mode.
    pub current: MigState,
    /// Pending mode (after the next GPU reset); default = current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<MigState>,
    /// Name of the profile table in `migProfileSets`.
    pub profiles: String,
    /// GPU instances that exist at start (MIG must be enabled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<GpuInstance>,
}

/// A GPU-instance profile table of one GPU model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigProfileSet {
    /// Memory slices of the GPU (8 on A100/H100); placements are ranges of them.
    pub memory_slices: u32,
    /// Compute slices of the GPU (7 on A100/H100).
    pub compute_slices: u32,
    /// The profiles.
    pub gpu_instance_profiles: Vec<GpuInstanceProfile>,
}

/// One GPU-instance profile (`nvmlGpuInstanceProfileInfo_t` plus its placements).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuInstanceProfile {
    /// Name without the `MIG ` prefix, e.g. `1g.5gb`.
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*` value (what `nvmlDeviceGetGpuInstanceProfileInfo` takes).
    pub profile: u32,
    /// Profile id (what create takes), e.g. 19 for 1g.5gb.
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    /// Maximum instances of this profile.
    pub instance_count: u32,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Copy engines.
    #[serde(default)]
    pub copy_engine_count: u32,
    /// Video decoders.
    #[serde(default)]
    pub decoder_count: u32,
    /// Video encoders.
    #[serde(default)]
    pub encoder_count: u32,
    /// JPEG engines.
    #[serde(default)]
    pub jpeg_count: u32,
    /// Optical-flow accelerators.
    #[serde(default)]
    pub ofa_count: u32,
    /// Peer-to-peer supported.
    #[serde(default)]
    pub p2p: bool,
    /// Where instances may be placed.
    pub placements: Placements,
}

/// Possible placements of a profile: memory-slice ranges `[start, start + size)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Placements {
    /// Start slices.
    pub starts: Vec<u32>,
    /// Memory slices each placement spans.
    pub size: u32,
}

/// A GPU instance that exists when NVML starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuInstance {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Placement start (memory slice).
    pub start: u32,
    /// GPU-instance id; default derived from the placement as NVML does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Compute instances inside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compute_instances: Vec<ComputeInstance>,
}

/// A compute instance that exists when NVML starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComputeInstance {
    /// Compute slices; default: all of the GPU instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<u32>,
    /// Compute-instance id; default the smallest free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// `MIG-…` UUID of the MIG device; default derived from the parent UUID and ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// Common-ancestor levels between GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// Level of pairs no group names.
    #[serde(default = "TopologyLevel::system")]
    pub default: TopologyLevel,
    /// Groups of GPUs whose pairs share a level; later groups override earlier ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<TopologyGroup>,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            default: TopologyLevel::System,
            groups: Vec::new(),
        }
    }
}

/// GPUs whose every pair has `level` as common ancestor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologyGroup {
    /// GPU indices.
    pub gpus: Vec<u32>,
    /// Their common-ancestor level.
    pub level: TopologyLevel,
}

/// `nvmlGpuTopologyLevel_t` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum TopologyLevel {
    Internal,
    Single,
    Multiple,
    Hostbridge,
    Node,
    System,
}

impl TopologyLevel {
    fn system() -> Self {
        TopologyLevel::System
    }

    /// The `nvmlGpuTopologyLevel_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            TopologyLevel::Internal => 0,
            TopologyLevel::Single => 10,
            TopologyLevel::Multiple => 20,
            TopologyLevel::Hostbridge => 30,
            TopologyLevel::Node => 40,
            TopologyLevel::System => 50,
        }
    }
}

/// NVLink wiring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvLink {
    /// NVLink version of active links.
    pub version: u32,
    /// Links each GPU has (queries at or above it report an inactive link up to 18).
    pub max_links: u32,
    /// NVSwitch PCI bus ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<String>,
    /// GPUs wired to the switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched: Option<SwitchedLinks>,
    /// Direct GPU-to-GPU links, numbered after the switched ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<LinkPair>,
}

/// GPUs whose first `links_per_gpu` links go round-robin to the NVSwitches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchedLinks {
    /// GPU indices.
    pub gpus: Vec<u32>,
    /// Links of each GPU that go to switches.
    pub links_per_gpu: u32,
}

/// Direct links between two GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkPair {
    /// The two GPU indices.
    pub gpus: [u32; 2],
    /// Number of links between them.
    pub links: u32,
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_both_domain_widths() {
        assert_eq!(parse_bus_id("00000000:07:00.0"), Some((0, 7, 0, 0)));
        assert_eq!(parse_bus_id("0000:BD:1f.7"), Some((0, 0xbd, 0x1f, 7)));
        assert_eq!(parse_bus_id("07:00.0"), Some((0, 7, 0, 0)));
        assert_eq!(parse_bus_id("0000:07:00"), None);
        assert_eq!(parse_bus_id("0000:107:00.0"), None);
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
    }

    #[test]
    fn json_machine_files_load_like_yaml() {
        let yaml = Machine::load(&crate::machine_path("dgx-a100")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dgx.json");
        std::fs::write(&path, serde_json::to_vec(&yaml).unwrap()).unwrap();
        assert_eq!(Machine::load(&path).unwrap(), yaml);
    }

    #[test]
    fn invalid_machines_name_the_field() {
        let text = "driverVersion: '1'\ncudaDriverVersion: 12000\ngpus:\n  - uuid: nope\n    minor: 0\n    name: x\n    brand: nvidia\n    architecture: ampere\n    computeCapability: '8.0'\n    memoryMiB: 1\n    pci: { busId: '0000:01:00.0', deviceId: 1 }\n";
        let err = Machine::from_yaml(text).unwrap_err().to_string();
        assert!(err.contains("gpus[0].uuid"), "{err}");
        let text = text.replace("nope", "GPU-1").replace("8.0", "eight");
        let err = Machine::from_yaml(&text).unwrap_err().to_string();
        assert!(err.contains("computeCapability"), "{err}");
    }
}
