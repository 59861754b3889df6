//! The subset of `resource.k8s.io/v1` (and `core/v1` node selection) objects the allocator
//! reads and writes, with exactly the Kubernetes JSON / YAML field names.
//!
//! A key that is not a field of the Kubernetes object is an error naming the key (a typo must
//! not silently change what is simulated). Fields Kubernetes has but allocation does not use
//! (`apiVersion`, `kind`, the rest of `metadata`, a claim's `status`, a taint's `timeAdded`, a
//! class's `extendedResourceName`) are accepted and ignored, so full objects read from a
//! cluster deserialize. Quantities and version strings are kept as written here; the allocator
//! parses them when it prepares a device, so a malformed value is reported against the device
//! that carries it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Metadata of an object: only what the allocator uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "input::ObjectMeta")]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, empty for cluster-scoped objects.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `metadata.labels`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A Kubernetes quantity as written in an object (`"80Gi"`, `7`, `"1.5"`), parsed later.
///
/// Deserializes from a string or a number, as the API server accepts both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawQuantity(pub String);

impl RawQuantity {
    /// The quantity text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RawQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for RawQuantity {
    fn from(s: &str) -> Self {
        RawQuantity(s.to_string())
    }
}

impl Serialize for RawQuantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity string or number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A node as the allocator sees it: its name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Node {
    /// Node name (`metadata.name`).
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
}

/// `core/v1` NodeSelector: terms are ORed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelector {
    /// The terms; a node matches when any term matches.
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// One term of a node selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// Requirements on node fields (`metadata.name`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

/// A key, an operator (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`) and values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeSelectorRequirement {
    /// Label key or field name.
    pub key: String,
    /// Operator.
    pub operator: String,
    /// Values the operator compares with.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// `resource.k8s.io/v1` ResourceSlice.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "input::ResourceSlice")]
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
#[serde(rename_all = "camelCase", from = "input::DeviceTaint")]
pub struct DeviceTaint {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `NoExecute` or `None`.
    pub effect: String,
}

/// A toleration of device taints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceToleration {
    /// Taint key; empty with `Exists` matches every key.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// `Equal` (default) or `Exists`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// Value compared with `Equal`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Effect; empty matches every effect.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub effect: String,
    /// How long a `NoExecute` taint is tolerated (not used by allocation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// `resource.k8s.io/v1` DeviceClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "input::DeviceClass")]
pub struct DeviceClass {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// Selectors and configuration.
    pub spec: DeviceClassSpec,
}

/// DeviceClass `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "input::DeviceClassSpec")]
pub struct DeviceClassSpec {
    /// Every selector must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// Configuration copied into allocation results.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceClassConfiguration>,
}

/// A selector; only CEL exists today.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceSelector {
    /// A CEL selector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cel: Option<CelDeviceSelector>,
}

/// A CEL expression over the `device` variable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CelDeviceSelector {
    /// The expression, which must evaluate to a bool.
    pub expression: String,
}

/// Class configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceClassConfiguration {
    /// Opaque driver configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opaque: Option<OpaqueDeviceConfiguration>,
}

/// Driver-specific parameters, copied as they are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct OpaqueDeviceConfiguration {
    /// Driver the parameters are for.
    pub driver: String,
    /// Parameters (any JSON).
    pub parameters: serde_json::Value,
}

/// `resource.k8s.io/v1` ResourceClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "input::ResourceClaim")]
pub struct ResourceClaim {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// What the claim asks for.
    pub spec: ResourceClaimSpec,
}

/// ResourceClaim `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ResourceClaimSpec {
    /// Device requests, constraints and configuration.
    pub devices: DeviceClaim,
}

/// ResourceClaim `spec.devices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceClaim {
    /// Requests, all of which must be satisfied.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<DeviceRequest>,
    /// Constraints across requests.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<DeviceConstraint>,
    /// Configuration for requests.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceClaimConfiguration>,
}

/// One request: `exactly` or `firstAvailable`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceRequest {
    /// Request name, unique in the claim.
    pub name: String,
    /// A request for devices of one class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exactly: Option<ExactDeviceRequest>,
    /// Alternatives tried in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub first_available: Vec<DeviceSubRequest>,
}

/// A request for devices of one class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ExactDeviceRequest {
    /// The DeviceClass.
    pub device_class_name: String,
    /// Additional selectors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` (default) or `All`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    /// Number of devices for `ExactCount` (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Admin access: devices in use may be taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    /// Tolerated taints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity requested from shareable devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

/// One alternative of a `firstAvailable` request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceSubRequest {
    /// Subrequest name, unique in the request.
    pub name: String,
    /// The DeviceClass.
    pub device_class_name: String,
    /// Additional selectors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` (default) or `All`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    /// Number of devices for `ExactCount` (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Tolerated taints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity requested from shareable devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityRequirements>,
}

/// Requested capacity amounts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CapacityRequirements {
    /// Capacity name → amount.
    pub requests: BTreeMap<String, RawQuantity>,
}

/// A constraint across the devices of some requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceConstraint {
    /// Requests the constraint applies to; empty means all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// All devices must have this attribute with the same value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub match_attribute: Option<String>,
    /// All devices must have this attribute with different values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distinct_attribute: Option<String>,
}

/// Claim configuration for some requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceClaimConfiguration {
    /// Requests (or `request/subrequest`) it applies to; empty means all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// Opaque driver configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opaque: Option<OpaqueDeviceConfiguration>,
}

/// `status.allocation` of a ResourceClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllocationResult {
    /// Chosen devices and configuration.
    pub devices: DeviceAllocationResult,
    /// Nodes from which the devices are reachable; absent when all nodes are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
}

/// Devices part of an allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceAllocationResult {
    /// One entry per allocated device, in allocation order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<DeviceRequestAllocationResult>,
    /// Configuration from the classes and the claim.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceAllocationConfiguration>,
}

/// One allocated device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceRequestAllocationResult {
    /// `request` or `request/subrequest`.
    pub request: String,
    /// Driver name.
    pub driver: String,
    /// Pool name.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Set (to true) for admin-access requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    /// The request's tolerations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Copied from the device.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub binding_conditions: Vec<String>,
    /// Copied from the device.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub binding_failure_conditions: Vec<String>,
    /// Identifies this share of a multi-allocatable device (`shareID` in the API).
    #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity consumed by this share.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// Configuration entry of an allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceAllocationConfiguration {
    /// `FromClass` or `FromClaim`.
    pub source: String,
    /// Requests it applies to; empty means all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// Opaque driver configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opaque: Option<OpaqueDeviceConfiguration>,
}

/// What the objects with Kubernetes fields that allocation does not use are read as: those
/// fields are named (so any other key is an error) and dropped.
mod input {
    use super::*;

    /// `metadata`: every ObjectMeta field of Kubernetes.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct ObjectMeta {
        name: String,
        namespace: String,
        uid: String,
        labels: BTreeMap<String, String>,
        annotations: IgnoredAny,
        creation_timestamp: IgnoredAny,
        deletion_grace_period_seconds: IgnoredAny,
        deletion_timestamp: IgnoredAny,
        finalizers: IgnoredAny,
        generate_name: IgnoredAny,
        generation: IgnoredAny,
        managed_fields: IgnoredAny,
        owner_references: IgnoredAny,
        resource_version: IgnoredAny,
        self_link: IgnoredAny,
    }

    impl From<ObjectMeta> for super::ObjectMeta {
        fn from(m: ObjectMeta) -> Self {
            super::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                labels: m.labels,
            }
        }
    }

    /// A ResourceSlice with its type fields.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct ResourceSlice {
        api_version: IgnoredAny,
        kind: IgnoredAny,
        metadata: super::ObjectMeta,
        spec: ResourceSliceSpec,
    }

    impl From<ResourceSlice> for super::ResourceSlice {
        fn from(s: ResourceSlice) -> Self {
            super::ResourceSlice {
                metadata: s.metadata,
                spec: s.spec,
            }
        }
    }

    /// A DeviceClass with its type fields.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct DeviceClass {
        api_version: IgnoredAny,
        kind: IgnoredAny,
        metadata: super::ObjectMeta,
        spec: super::DeviceClassSpec,
    }

    impl From<DeviceClass> for super::DeviceClass {
        fn from(c: DeviceClass) -> Self {
            super::DeviceClass {
                metadata: c.metadata,
                spec: c.spec,
            }
        }
    }

    /// DeviceClass `spec` with `extendedResourceName`, which only the scheduler's
    /// extended-resource path reads.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct DeviceClassSpec {
        selectors: Vec<DeviceSelector>,
        config: Vec<DeviceClassConfiguration>,
        extended_resource_name: IgnoredAny,
    }

    impl From<DeviceClassSpec> for super::DeviceClassSpec {
        fn from(s: DeviceClassSpec) -> Self {
            super::DeviceClassSpec {
                selectors: s.selectors,
                config: s.config,
            }
        }
    }

    /// A ResourceClaim with its type fields and status.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct ResourceClaim {
        api_version: IgnoredAny,
        kind: IgnoredAny,
        metadata: super::ObjectMeta,
        spec: ResourceClaimSpec,
        status: IgnoredAny,
    }

    impl From<ResourceClaim> for super::ResourceClaim {
        fn from(c: ResourceClaim) -> Self {
            super::ResourceClaim {
                metadata: c.metadata,
                spec: c.spec,
            }
        }
    }

    /// A device taint with `timeAdded`, which allocation does not use.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default, deny_unknown_fields)]
    #[allow(dead_code, reason = "fields read only to be accepted")]
    pub(super) struct DeviceTaint {
        key: String,
        value: String,
        effect: String,
        time_added: IgnoredAny,
    }

    impl From<DeviceTaint> for super::DeviceTaint {
        fn from(t: DeviceTaint) -> Self {
            super::DeviceTaint {
                key: t.key,
                value: t.value,
                effect: t.effect,
            }
        }
    }
}
