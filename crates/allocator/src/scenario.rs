//! The scenario of `kubedev simulate`: one node, DeviceClasses, ResourceSlices, devices already
//! in use and the claims of one pod. Reading it from a file is `kubedev-inputs`' part; any serde
//! format deserializes it.

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

impl Scenario {
    /// The first `allocatedDevices` entry that is not `driver/pool/device`, if any.
    pub fn malformed_allocated_device(&self) -> Option<&str> {
        self.allocated_devices
            .iter()
            .find(|e| split_device_id(e).is_none())
            .map(String::as_str)
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
