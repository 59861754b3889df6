//! One GPU of a machine file: identity, memory, PCI, and the NVML values of its brand and
//! architecture.

use serde::{Deserialize, Serialize};

use super::Mig;

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
