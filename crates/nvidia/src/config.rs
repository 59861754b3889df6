//! The backend's configuration.

use kubedev_core::factory::InvalidValue;
use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::driver::LibraryLayout;
use crate::error::NvidiaError;

/// How MIG (Multi-Instance GPU) is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MigStrategy {
    /// MIG is ignored: every GPU is one device, whatever its MIG mode.
    #[default]
    None,
    /// The GPU and compute instances that exist (made by an administrator) are devices; a GPU
    /// with MIG enabled is not offered whole.
    Static,
    /// KEP-4815 partitionable devices: on each GPU with MIG enabled, every placement of every
    /// MIG profile is a device that consumes the GPU's shared counters (memory slices, engines,
    /// memory), and the whole GPU is a device that consumes all of them. Preparing a placement
    /// creates its GPU and compute instance; unpreparing destroys them.
    Partitionable,
}

/// Configuration of the NVIDIA backend.
///
/// In YAML or JSON the fields are camelCase and unknown fields are rejected:
///
/// ```
/// let config: kubedev_nvidia::NvidiaConfig = serde_json::from_str(
///     r#"{"migStrategy": "partitionable", "ignoredXids": [13, 31], "healthRecheckSeconds": 30}"#,
/// )?;
/// assert_eq!(config.replicas, 1);
/// config.validate()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvidiaConfig {
    /// The NVML library to load (`libnvidia-ml.so.1`); by default the system's, found the way
    /// the dynamic loader finds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library_path: Option<PathBuf>,
    /// How MIG is offered.
    #[serde(default)]
    pub mig_strategy: MigStrategy,
    /// Xid errors that do not make a device unhealthy (application errors, not hardware
    /// faults). Default: 13, 31, 43, 45, 68, 109.
    #[serde(default = "default_ignored_xids")]
    pub ignored_xids: BTreeSet<u64>,
    /// How long after its last Xid error a device that answers NVML again is healthy again, in
    /// seconds (at least 1). Default 60.
    #[serde(default = "default_recheck")]
    pub health_recheck_seconds: u64,
    /// How often the health watcher polls each GPU for "GPU lost" and re-checks unhealthy
    /// devices, in milliseconds (at least 10). Default 5000.
    #[serde(default = "default_poll_ms")]
    pub health_poll_millis: u64,
    /// Time-slicing: each GPU (and each static MIG device) is advertised this many times, as
    /// `<device>-replica-<n>`, so that many containers share it. Default 1 (no sharing). Cannot
    /// be combined with the `partitionable` MIG strategy.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// The `nvidia-smi` that GPU sharing runs to set compute modes and time-slices (NVML has no
    /// call for the compute time-slice). Default: `nvidia-smi`, found on `PATH`.
    #[serde(default = "default_smi")]
    pub nvidia_smi_path: PathBuf,
    /// The MPS control program that GPU sharing starts a daemon of per claim. Default:
    /// `nvidia-cuda-mps-control`, found on `PATH`.
    #[serde(default = "default_mps_control")]
    pub mps_control_path: PathBuf,
    /// Where the driver's user-space files (libraries, tools, firmware) are on the host: `/` on
    /// plain installs, `/run/nvidia/driver` where the GPU Operator's driver container installs
    /// them, `/usr/local/nvidia` on some cloud images. A host path (read through `hostRoot`).
    #[serde(default = "default_driver_root")]
    pub driver_root: PathBuf,
    /// Where the device nodes are on the host (`<devRoot>/dev/nvidia0`): by default the driver
    /// root when it holds `dev/nvidiactl`, else `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_root: Option<PathBuf>,
    /// Where the driver's libraries and tools go in a container.
    #[serde(default)]
    pub library_layout: LibraryLayout,
    /// NVIDIA's `nvidia-cdi-hook` on the host: when set, specs run its `create-symlinks` and
    /// `update-ldcache` in each container so every image's loader finds the libraries. Default:
    /// no hooks (the libraries are mounted under their SONAMEs instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi_hook_path: Option<PathBuf>,
}

fn default_driver_root() -> PathBuf {
    PathBuf::from("/")
}

fn default_smi() -> PathBuf {
    PathBuf::from("nvidia-smi")
}

fn default_mps_control() -> PathBuf {
    PathBuf::from("nvidia-cuda-mps-control")
}

/// The Xids that are application errors, not device faults (NVIDIA's usual list).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The largest replica count accepted (a node publishes at most a few thousand devices).
pub const MAX_REPLICAS: u32 = 64;

fn default_ignored_xids() -> BTreeSet<u64> {
    DEFAULT_IGNORED_XIDS.into_iter().collect()
}

fn default_recheck() -> u64 {
    60
}

fn default_poll_ms() -> u64 {
    5000
}

fn default_replicas() -> u32 {
    1
}

impl Default for NvidiaConfig {
    fn default() -> Self {
        NvidiaConfig {
            library_path: None,
            mig_strategy: MigStrategy::None,
            ignored_xids: default_ignored_xids(),
            health_recheck_seconds: default_recheck(),
            health_poll_millis: default_poll_ms(),
            replicas: default_replicas(),
            nvidia_smi_path: default_smi(),
            mps_control_path: default_mps_control(),
            driver_root: default_driver_root(),
            dev_root: None,
            library_layout: LibraryLayout::Host,
            cdi_hook_path: None,
        }
    }
}

impl NvidiaConfig {
    /// Checks the values serde cannot: errors name the field and the value.
    pub fn validate(&self) -> Result<(), NvidiaError> {
        let bad = |field: &str, value: String, reason: &str| {
            NvidiaError::Config(InvalidValue::new(field, value, reason))
        };
        if self.replicas == 0 || self.replicas > MAX_REPLICAS {
            return Err(bad(
                "replicas",
                self.replicas.to_string(),
                &format!("must be between 1 and {MAX_REPLICAS}"),
            ));
        }
        if self.replicas > 1 && self.mig_strategy == MigStrategy::Partitionable {
            return Err(bad(
                "replicas",
                self.replicas.to_string(),
                "time-slicing replicas cannot be combined with migStrategy partitionable \
                 (a replica of a GPU that consumes its counters could only be allocated once)",
            ));
        }
        if self.health_recheck_seconds == 0 {
            return Err(bad(
                "healthRecheckSeconds",
                "0".into(),
                "must be at least 1",
            ));
        }
        if self.health_poll_millis < 10 {
            return Err(bad(
                "healthPollMillis",
                self.health_poll_millis.to_string(),
                "must be at least 10",
            ));
        }
        if let Some(p) = &self.library_path
            && p.as_os_str().is_empty()
        {
            return Err(bad("libraryPath", "\"\"".into(), "must not be empty"));
        }
        for (field, path) in [
            ("driverRoot", Some(&self.driver_root)),
            ("devRoot", self.dev_root.as_ref()),
            ("cdiHookPath", self.cdi_hook_path.as_ref()),
        ] {
            if let Some(p) = path
                && !p.is_absolute()
            {
                return Err(bad(
                    field,
                    format!("{:?}", p.display().to_string()),
                    "must be an absolute host path",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_camel_case() {
        let c: NvidiaConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, NvidiaConfig::default());
        assert_eq!(
            c.ignored_xids.iter().copied().collect::<Vec<_>>(),
            DEFAULT_IGNORED_XIDS
        );
        assert_eq!(c.mig_strategy, MigStrategy::None);
        let c: NvidiaConfig = serde_json::from_str(
            r#"{"libraryPath": "/x/libnvidia-ml.so.1", "migStrategy": "static",
                "ignoredXids": [], "healthRecheckSeconds": 5, "replicas": 4}"#,
        )
        .unwrap();
        assert_eq!(c.mig_strategy, MigStrategy::Static);
        assert!(c.ignored_xids.is_empty());
        assert_eq!(c.replicas, 4);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_fields_and_bad_values_are_named() {
        let err = serde_json::from_str::<NvidiaConfig>(r#"{"migstrategy": "none"}"#).unwrap_err();
        assert!(err.to_string().contains("migstrategy"), "{err}");
        let err =
            serde_json::from_str::<NvidiaConfig>(r#"{"migStrategy": "dynamic"}"#).unwrap_err();
        assert!(err.to_string().contains("dynamic"), "{err}");
        for (json, needle) in [
            (r#"{"replicas": 0}"#, "replicas"),
            (r#"{"replicas": 65}"#, "65"),
            (
                r#"{"replicas": 2, "migStrategy": "partitionable"}"#,
                "partitionable",
            ),
            (r#"{"healthRecheckSeconds": 0}"#, "healthRecheckSeconds"),
            (r#"{"healthPollMillis": 1}"#, "healthPollMillis"),
            (r#"{"libraryPath": ""}"#, "libraryPath"),
            (r#"{"driverRoot": "run/nvidia/driver"}"#, "driverRoot"),
            (r#"{"devRoot": ""}"#, "devRoot"),
            (r#"{"cdiHookPath": "nvidia-cdi-hook"}"#, "cdiHookPath"),
        ] {
            let c: NvidiaConfig = serde_json::from_str(json).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }
}
