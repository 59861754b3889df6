//! The scenario file format of `kubedev simulate`: one node, DeviceClasses, ResourceSlices,
//! devices already in use and the claims of one pod.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::api::{DeviceClass, Node, ResourceClaim, ResourceSlice};

/// Everything one allocation needs. Other top-level keys of a scenario file are ignored, so a
/// file can carry its own description and expectations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Scenario {
    /// The node being scheduled.
    pub node: Node,
    /// All DeviceClasses.
    pub device_classes: Vec<DeviceClass>,
    /// All ResourceSlices of the cluster.
    pub resource_slices: Vec<ResourceSlice>,
    /// Devices already allocated, as `driver/pool/device`.
    pub allocated_devices: Vec<String>,
    /// The claims to allocate together (as for one pod).
    pub claims: Vec<ResourceClaim>,
}

/// Why a scenario could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("read scenario file {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a valid JSON scenario.
    #[error("parse scenario {origin} as JSON: {message}")]
    Json {
        /// File name or `<input>`.
        origin: String,
        /// Parser message with line and column.
        message: String,
    },
    /// The text is not a valid YAML scenario.
    #[error("parse scenario {origin} as YAML: {message}")]
    Yaml {
        /// File name or `<input>`.
        origin: String,
        /// Parser message with location.
        message: String,
    },
    /// An `allocatedDevices` entry is not `driver/pool/device`.
    #[error("allocatedDevices entry {entry:?} is not driver/pool/device")]
    AllocatedDevice {
        /// The entry as written.
        entry: String,
    },
}

impl Scenario {
    /// Reads a scenario from a YAML or JSON file (JSON when the first non-blank character is
    /// `{`).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Reads a scenario from YAML or JSON text.
    pub fn from_text(text: &str) -> Result<Scenario, ScenarioError> {
        Self::parse(text, "<input>")
    }

    fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| ScenarioError::Json {
                origin: origin.to_string(),
                message: e.to_string(),
            })?
        } else {
            // Cluster-sized scenarios (thousands of slices) exceed the default event and
            // node budgets; the depth limit stays, it is what protects the stack.
            let mut budget = serde_saphyr::Budget::default();
            budget.max_events = 50_000_000;
            budget.max_nodes = 20_000_000;
            budget.max_total_scalar_bytes = 256 << 20;
            let mut options = serde_saphyr::Options::default();
            options.budget = Some(budget);
            serde_saphyr::from_str_with_options(text, options).map_err(|e| ScenarioError::Yaml {
                origin: origin.to_string(),
                message: e.to_string(),
            })?
        };
        for entry in &scenario.allocated_devices {
            split_device_id(entry).ok_or_else(|| ScenarioError::AllocatedDevice {
                entry: entry.clone(),
            })?;
        }
        Ok(scenario)
    }
}

/// Splits an `allocatedDevices` entry, `driver/pool/device`. Pool names may contain `/`, so the
/// driver is everything before the first `/` and the device everything after the last.
pub fn split_device_id(id: &str) -> Option<(&str, &str, &str)> {
    let first = id.find('/')?;
    let last = id.rfind('/')?;
    if first == last {
        return None;
    }
    let (driver, pool, device) = (&id[..first], &id[first + 1..last], &id[last + 1..]);
    if driver.is_empty() || pool.is_empty() || device.is_empty() {
        return None;
    }
    Some((driver, pool, device))
}
