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

mod allocation;
mod claim;
mod class;
mod input;
mod metadata;
mod node;
mod quantity;
mod slice;
mod taint_rule;

pub use allocation::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};
pub use claim::{
    CapacityRequirements, DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceRequest,
    DeviceSubRequest, DeviceToleration, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
pub use class::{
    CelDeviceSelector, DeviceClass, DeviceClassConfiguration, DeviceClassSpec, DeviceSelector,
    OpaqueDeviceConfiguration,
};
/// The string type of names in allocation results and node selector requirements: a `str`
/// that holds up to 24 bytes without a heap allocation.
pub use compact_str::CompactString;
pub use metadata::ObjectMeta;
pub use node::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
pub use quantity::RawQuantity;
pub use slice::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
pub use taint_rule::{
    DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector, apply_device_taint_rules,
};
