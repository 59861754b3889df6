//! GPU sharing per claim, chosen by the claim's (or its class's) opaque configuration:
//!
//! ```yaml
//! apiVersion: gpu.kubedev.io/v1alpha1
//! kind: GpuConfig
//! sharing:
//!   strategy: MPS                      # or TimeSlicing
//!   timeSlicingConfig: {interval: Long}  # Default, Short, Medium, Long (TimeSlicing only)
//!   mpsConfig:                         # MPS only
//!     defaultActiveThreadPercentage: 50
//!     defaultPinnedDeviceMemoryLimit: 10Gi
//!     defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}   # by GPU UUID or index in the claim
//! ```
//!
//! - **Time-slicing** sets each whole GPU's compute mode to `DEFAULT` and its compute time-slice
//!   (0 = Default … 3 = Long) with `nvidia-smi` (NVML has no call for the time-slice); unprepare
//!   puts both back to the default. MIG devices cannot be time-sliced.
//! - **MPS** starts one MPS control daemon per claim for the claim's MPS devices
//!   (`CUDA_VISIBLE_DEVICES` = their UUIDs), its pipe and log directories under
//!   `<state>/mps/<claim UID>/`; whole GPUs are set to `EXCLUSIVE_PROCESS`. The daemon gets the
//!   active-thread percentage and pinned-memory limits; containers get the pipe directory at
//!   `/tmp/nvidia-mps` and `CUDA_MPS_PIPE_DIRECTORY`. Unprepare (also after a crash) sends the
//!   daemon `quit`, kills it if it lingers, removes its directories and puts the compute mode
//!   back to `DEFAULT`.
//!
//! Every configuration is checked before anything on the host changes; errors name the entry
//! and the field.

use std::collections::BTreeMap;

use kubedev_core::{
    AllocatedDevice, ConfigError, Quantity, ValidateConfig, config_kind, effective_config,
};
use serde::Deserialize;

mod tools;

pub(crate) use tools::Sharing;

/// The API version of the configuration objects.
pub const CONFIG_API_VERSION: &str = "gpu.kubedev.io/v1alpha1";
/// Where containers find the MPS pipe directory.
pub const MPS_CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// A GPU configuration object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// Must be [`CONFIG_API_VERSION`].
    pub api_version: String,
    /// Must be `GpuConfig`.
    pub kind: String,
    /// How the claim's GPUs are shared; none: not shared.
    #[serde(default)]
    pub sharing: Option<GpuSharing>,
}

/// How a claim's GPUs are shared by its containers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSharing {
    /// The strategy.
    pub strategy: Strategy,
    /// Settings of `TimeSlicing`.
    #[serde(default)]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Settings of `MPS`.
    #[serde(default)]
    pub mps_config: Option<MpsConfig>,
}

/// A sharing strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Strategy {
    /// Containers take turns on the GPU.
    TimeSlicing,
    /// Containers run at once through an MPS control daemon.
    #[serde(rename = "MPS")]
    Mps,
}

/// Time-slicing settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    /// The time-slice length (default `Default`).
    #[serde(default)]
    pub interval: Option<Interval>,
}

/// A compute time-slice length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum Interval {
    /// The driver's default.
    #[default]
    Default,
    /// Short.
    Short,
    /// Medium.
    Medium,
    /// Long.
    Long,
}

impl Interval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn value(self) -> u32 {
        match self {
            Interval::Default => 0,
            Interval::Short => 1,
            Interval::Medium => 2,
            Interval::Long => 3,
        }
    }
}

/// MPS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    /// The share of each GPU's threads a client may use, 0 to 100.
    #[serde(default)]
    pub default_active_thread_percentage: Option<i64>,
    /// The pinned device memory a client may use on each GPU (at least 1Mi).
    #[serde(default)]
    pub default_pinned_device_memory_limit: Option<Quantity>,
    /// Per GPU (by UUID, or by index among the claim's MPS GPUs sorted by UUID), overriding
    /// the default limit.
    #[serde(default)]
    pub default_per_device_pinned_memory_limit: BTreeMap<String, Quantity>,
}

const MIB: i64 = 1024 * 1024;

/// A limit in whole MiB as MPS takes it (`10240M`); `None` when under 1 MiB.
fn mib(q: &Quantity) -> Option<String> {
    q.value()
        .filter(|v| *v >= MIB)
        .map(|v| format!("{}M", v / MIB))
}

impl ValidateConfig for GpuConfig {
    fn validate(&self) -> Result<(), String> {
        if self.api_version != CONFIG_API_VERSION {
            return Err(format!(
                "apiVersion: {:?} is not supported; expected {CONFIG_API_VERSION:?}",
                self.api_version
            ));
        }
        let Some(s) = &self.sharing else {
            return Ok(());
        };
        match s.strategy {
            Strategy::TimeSlicing if s.mps_config.is_some() => {
                return Err("sharing.mpsConfig: not allowed with strategy TimeSlicing".into());
            }
            Strategy::Mps if s.time_slicing_config.is_some() => {
                return Err("sharing.timeSlicingConfig: not allowed with strategy MPS".into());
            }
            _ => {}
        }
        if let Some(m) = &s.mps_config {
            if let Some(p) = m.default_active_thread_percentage
                && !(0..=100).contains(&p)
            {
                return Err(format!(
                    "sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got {p}"
                ));
            }
            if let Some(q) = &m.default_pinned_device_memory_limit
                && mib(q).is_none()
            {
                return Err(format!(
                    "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got {q}"
                ));
            }
            for (k, q) in &m.default_per_device_pinned_memory_limit {
                if mib(q).is_none() {
                    return Err(format!(
                        "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{k}: must be at \
                         least 1Mi, got {q}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The sharing that applies to `device`: its effective configuration's. Entries of another
/// kind are errors (this driver knows only `GpuConfig`).
pub fn device_sharing(device: &AllocatedDevice) -> Result<Option<GpuSharing>, ConfigError> {
    for c in &device.config {
        match config_kind(&c.parameters) {
            Some("GpuConfig") => {}
            other => {
                return Err(ConfigError::new(
                    c.location(),
                    format!(
                        "kind: {} is not a kind this driver knows; expected \"GpuConfig\"",
                        other.map_or("(none)".to_string(), |k| format!("{k:?}"))
                    ),
                ));
            }
        }
    }
    let config: Option<GpuConfig> = effective_config(&device.config, |_| true)?;
    Ok(config.and_then(|c| c.sharing))
}

/// One allocated device as sharing sees it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The UUID CUDA knows it by (a GPU's or a MIG device's).
    pub(crate) uuid: String,
    /// A whole GPU (compute mode and time-slice apply), not a MIG device.
    pub(crate) whole_gpu: bool,
    /// Its sharing.
    pub(crate) sharing: Option<GpuSharing>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
