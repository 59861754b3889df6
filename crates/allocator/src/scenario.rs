//! The scenario file format of `kubedev simulate`: one node, DeviceClasses, ResourceSlices,
//! devices already in use and the claims of one pod.

use std::path::Path;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::api::{DeviceClass, Node, ResourceClaim, ResourceSlice};

/// Everything one allocation needs.
///
/// A scenario file has the keys `node`, `deviceClasses`, `resourceSlices`, `allocatedDevices`
/// and `claims`, `features` (the scheduler feature gates the scenario is allocated with; of
/// those that change allocation, only `DRAListTypeAttributes` is off unless named, as in
/// Kubernetes 1.36), plus two that are not read: `description` and `expect` (a file's own
/// description and expectations). Any other key, at the top or inside an object, is an error
/// naming the key and its line: a typo must not silently leave something out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "ScenarioFile")]
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
    /// Scheduler feature gates that are on (see [`crate::Features::from_gates`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// A scenario file as written: the scenario and the keys left for the reader.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "description and expect are read only to be accepted"
)]
struct ScenarioFile {
    node: Node,
    device_classes: Vec<DeviceClass>,
    resource_slices: Vec<ResourceSlice>,
    allocated_devices: Vec<String>,
    claims: Vec<ResourceClaim>,
    description: IgnoredAny,
    expect: IgnoredAny,
    features: Vec<String>,
}

impl From<ScenarioFile> for Scenario {
    fn from(f: ScenarioFile) -> Self {
        Scenario {
            node: f.node,
            device_classes: f.device_classes,
            resource_slices: f.resource_slices,
            allocated_devices: f.allocated_devices,
            claims: f.claims,
            features: f.features,
        }
    }
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
    #[error("{origin}: {message}")]
    Json {
        /// The file name (`scenario text` for [`Scenario::from_text`]).
        origin: String,
        /// What is wrong, starting with the line (`line N: ...`).
        message: String,
    },
    /// The text is not a valid YAML scenario.
    #[error("{origin}: {message}")]
    Yaml {
        /// The file name (`scenario text` for [`Scenario::from_text`]).
        origin: String,
        /// What is wrong, starting with the line (`line N: ...`).
        message: String,
    },
    /// An `allocatedDevices` entry is not `driver/pool/device`.
    #[error("{origin}: allocatedDevices entry {0} is not driver/pool/device", kubedev_core::echo::echo(.entry))]
    AllocatedDevice {
        /// The file name (`scenario text` for [`Scenario::from_text`]).
        origin: String,
        /// The entry as written.
        entry: String,
    },
}

/// What errors call text given to [`Scenario::from_text`].
const TEXT_ORIGIN: &str = "scenario text";

impl Scenario {
    /// Reads a scenario from a YAML or JSON file (JSON when the first non-blank character is
    /// `{`). Errors name the file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Reads a scenario from YAML or JSON text. Errors call it `scenario text`.
    pub fn from_text(text: &str) -> Result<Scenario, ScenarioError> {
        Self::parse(text, TEXT_ORIGIN)
    }

    fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| ScenarioError::Json {
                origin: origin.to_string(),
                message: json_message(&e),
            })?
        } else {
            let (options, budget) = crate::yaml::large_input(256 << 20);
            serde_saphyr::from_str_with_options(text, options).map_err(|e| ScenarioError::Yaml {
                origin: origin.to_string(),
                message: crate::yaml::describe_error(&e, &budget),
            })?
        };
        for entry in &scenario.allocated_devices {
            split_device_id(entry).ok_or_else(|| ScenarioError::AllocatedDevice {
                origin: origin.to_string(),
                entry: entry.clone(),
            })?;
        }
        Ok(scenario)
    }
}

/// `line N: ...` for a JSON error, in the words used for YAML.
fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let text = full.strip_suffix(&suffix).unwrap_or(&full);
    let text = match text.strip_prefix("unknown field `") {
        Some(rest) => match rest.split_once("`, expected ") {
            Some((key, expected)) => format!(
                "unknown key `{key}`; the keys allowed here are {}",
                expected.replace("one of ", "").replace('`', "")
            ),
            None => text.to_string(),
        },
        None => text.to_string(),
    };
    if e.line() > 0 {
        format!("line {}: {text}", e.line())
    } else {
        text
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = "node:\n  name: node-1\nclaims:\n- metadata:\n    name: c\n  spec:\n    devices:\n      requests:\n      - name: r\n        exactly:\n          deviceClassName: gpu\n";

    #[test]
    fn an_unknown_top_level_key_is_an_error_naming_it_and_its_line() {
        let text = GOOD.replace("claims:", "claim:");
        let err = Scenario::parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 3: unknown key `claim`; the keys allowed here are "),
            "{err}"
        );
        assert!(err.contains("claims"), "{err}");
    }

    #[test]
    fn an_unknown_key_inside_an_object_is_an_error() {
        let text = GOOD.replace("deviceClassName", "deviceClass");
        let err = Scenario::parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 11: unknown key `deviceClass`"),
            "{err}"
        );
        let text = GOOD.replace("  name: node-1\n", "  name: node-1\n  label: {a: b}\n");
        let err = Scenario::parse(&text, "s.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("s.yaml: line 3: unknown key `label`"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_fields_allocation_does_not_use_are_accepted() {
        let text = format!(
            "description: a claim read from a cluster\nexpect: {{allocatable: true}}\nfeatures: [DRAPartitionableDevices]\n{}",
            GOOD.replace(
                "- metadata:\n    name: c\n",
                "- apiVersion: resource.k8s.io/v1\n  kind: ResourceClaim\n  metadata:\n    name: c\n    resourceVersion: \"7\"\n    creationTimestamp: \"2025-01-01T00:00:00Z\"\n    annotations: {a: b}\n  status: {reservedFor: []}\n",
            )
        );
        let s = Scenario::parse(&text, "s.yaml").unwrap();
        assert_eq!(s.claims[0].metadata.name, "c");
    }

    #[test]
    fn a_duplicate_key_names_the_file_and_line() {
        let text = format!("{GOOD}node:\n  name: node-2\n");
        let err = Scenario::parse(&text, "s.yaml").unwrap_err().to_string();
        assert_eq!(err, "s.yaml: line 12: key `node` appears twice");
    }

    #[test]
    fn json_errors_use_the_same_words() {
        let err = Scenario::parse("{\"node\": {\"name\": \"n\"},\n \"claim\": []}", "s.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("s.json: line 2: unknown key `claim`; the keys allowed here are node,"),
            "{err}"
        );
    }

    #[test]
    fn text_is_called_scenario_text() {
        let err = Scenario::from_text("node: {name: n}\nclaim: []\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("scenario text: line 2: "), "{err}");
        assert!(!err.contains("<input>"), "{err}");
    }
}
