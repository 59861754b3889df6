//! ResourceSlices: pools, devices with their attributes, capacities, counters and taints.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{NodeSelector, ObjectMeta, RawQuantity};

/// `resource.k8s.io/v1` ResourceSlice.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::ResourceSlice")]
pub struct ResourceSlice {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// The slice's contents.
    pub spec: ResourceSliceSpec,
}

/// ResourceSlice `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ResourceSliceSpec {
    /// Driver name, also the default attribute domain.
    pub driver: String,
    /// The pool this slice belongs to.
    pub pool: ResourcePool,
    /// Devices are local to this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Devices are reachable from the nodes this selector matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// Devices are reachable from every node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    /// Each device says which nodes can reach it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_device_node_selection: Option<bool>,
    /// The devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    /// Counter sets shared by devices of the pool (partitionable devices).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
    /// The attribute that names the kind of partition a device of the slice is
    /// (`DRAPartitionableDevicesType`); allocation does not use it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_type_attribute: Option<String>,
    /// Node operations the kubelet skips for the slice's devices (`NodePrepareResources`,
    /// `NodeUnprepareResources` or `*`; `DRAOptionalNodeOperations`): with that gate on, its
    /// devices are allocated only on a node that declares the feature, and results carry the
    /// list.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skip_node_operations: Vec<String>,
}

/// Pool identity and version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ResourcePool {
    /// Pool name, unique per driver.
    pub name: String,
    /// Only slices with the highest generation count.
    pub generation: i64,
    /// How many slices the pool has in this generation.
    pub resource_slice_count: i64,
}

/// A named set of counters that devices consume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CounterSet {
    /// Counter set name, unique in the pool.
    pub name: String,
    /// Counter name → amount.
    pub counters: BTreeMap<String, Counter>,
}

/// One counter amount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Counter {
    /// The amount.
    pub value: RawQuantity,
}

/// A device (flat in v1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Device {
    /// Device name, unique in the pool.
    pub name: String,
    /// Attributes: qualified name → typed value; bare names belong to the driver's domain.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities: qualified name → value and request policy.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// Counters this device consumes when allocated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    /// Per-device node name (with `perDeviceNodeSelection`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Per-device node selector (with `perDeviceNodeSelection`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// Per-device "all nodes" (with `perDeviceNodeSelection`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_nodes: Option<bool>,
    /// Taints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
    /// The device must be bound to the scheduled node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binds_to_node: Option<bool>,
    /// Conditions that must become true before binding.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub binding_conditions: Vec<String>,
    /// Conditions that signal a binding failure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub binding_failure_conditions: Vec<String>,
    /// The device can be shared by several allocations (consumable capacity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
}

/// A typed attribute value: exactly one field should be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceAttribute {
    /// Integer value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// Boolean value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// String value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Semantic version value (SemVer 2.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Integer values (a list-type attribute, `DRAListTypeAttributes`, Kubernetes 1.36).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ints: Option<Vec<i64>>,
    /// Boolean values (a list-type attribute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bools: Option<Vec<bool>>,
    /// String values (a list-type attribute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strings: Option<Vec<String>>,
    /// Semantic version values (a list-type attribute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<String>>,
}

/// A capacity of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceCapacity {
    /// Total amount.
    pub value: RawQuantity,
    /// How shares of a multi-allocatable device are sized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<CapacityRequestPolicy>,
}

/// Request policy of a consumable capacity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CapacityRequestPolicy {
    /// Amount consumed when a request does not name this capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<RawQuantity>,
    /// Allowed amounts, ascending.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<RawQuantity>,
    /// Allowed range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<CapacityRequestPolicyRange>,
}

/// `min`, optional `max` and `step` of a request policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CapacityRequestPolicyRange {
    /// Minimum amount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<RawQuantity>,
    /// Maximum amount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<RawQuantity>,
    /// Granularity above `min`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<RawQuantity>,
}

/// Counters a device consumes from one counter set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceCounterConsumption {
    /// Counter set name in the same pool.
    pub counter_set: String,
    /// Counter name → amount.
    pub counters: BTreeMap<String, Counter>,
}

/// A device taint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::DeviceTaint")]
pub struct DeviceTaint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `NoExecute` or `None`.
    pub effect: String,
}
