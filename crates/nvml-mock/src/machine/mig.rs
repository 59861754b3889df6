//! MIG in a machine file: a GPU's mode and the instances it starts with, and the GPU-instance
//! profile tables of each GPU model.

use serde::{Deserialize, Serialize};

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
