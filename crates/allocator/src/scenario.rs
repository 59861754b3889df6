//! The scenario of `kubedev simulate`: one node, DeviceClasses, ResourceSlices, devices already
//! in use and the claims of one pod. Reading it from a file is `kubedev-inputs`' part; any serde
//! format deserializes it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kubedev_core::Quantity;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::api::{
    DeviceClass, DeviceTaintRule, Node, ResourceClaim, ResourceSlice, apply_device_taint_rules,
};

/// Everything one allocation needs.
///
/// A scenario file has the keys `node`, `deviceClasses`, `resourceSlices`,
/// `deviceTaintRules`, `allocatedDevices`, `allocatedShares` and `claims`, `features` (the scheduler feature gates the scenario is allocated with; of
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
    /// DeviceTaintRules: taints the scheduler adds to the devices they select.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_taint_rules: Vec<DeviceTaintRule>,
    /// Devices already allocated, as `driver/pool/device`.
    pub allocated_devices: Vec<String>,
    /// Shares already allocated from devices that allow multiple allocations (each one
    /// allocation result with a `shareID`), with the capacity each consumed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocated_shares: Vec<AllocatedShare>,
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
    device_taint_rules: Vec<DeviceTaintRule>,
    allocated_devices: Vec<String>,
    allocated_shares: Vec<AllocatedShare>,
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
            device_taint_rules: f.device_taint_rules,
            allocated_devices: f.allocated_devices,
            allocated_shares: f.allocated_shares,
            claims: f.claims,
            features: f.features,
        }
    }
}

/// One share already allocated from a device that allows multiple allocations: an allocation
/// result with a `shareID`, as the scheduler counts it (`allocatedShares` entries).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AllocatedShare {
    /// The device, `driver/pool/device`.
    pub device: String,
    /// The capacity the share consumed, by the name the device gives it (the result's
    /// `consumedCapacity`; empty when it has none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

impl Scenario {
    /// The first `allocatedDevices` or `allocatedShares` device that is not
    /// `driver/pool/device`, if any.
    pub fn malformed_allocated_device(&self) -> Option<&str> {
        self.allocated_devices
            .iter()
            .chain(self.allocated_shares.iter().map(|s| &s.device))
            .find(|e| split_device_id(e).is_none())
            .map(String::as_str)
    }

    /// The slices as the scheduler sees them: with the taints of the DeviceTaintRules added
    /// (borrowed when there are none).
    pub fn slices_as_scheduled(&self) -> Cow<'_, [ResourceSlice]> {
        if self.device_taint_rules.is_empty() {
            return Cow::Borrowed(&self.resource_slices);
        }
        let mut slices = self.resource_slices.clone();
        apply_device_taint_rules(&mut slices, &self.device_taint_rules);
        Cow::Owned(slices)
    }

    /// The shares already allocated, as the allocator takes them
    /// ([`crate::Allocator::with_consumed_capacity`]).
    pub fn consumed_capacity(&self) -> Vec<crate::ConsumedCapacity> {
        self.allocated_shares
            .iter()
            .map(|s| crate::ConsumedCapacity {
                device: s.device.clone(),
                capacity: s
                    .consumed_capacity
                    .iter()
                    .map(|(name, q)| (name.clone(), *q))
                    .collect(),
            })
            .collect()
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
