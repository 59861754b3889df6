//! `status.allocation`: what the allocator writes for a claim.

use std::collections::BTreeMap;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use super::{DeviceToleration, NodeSelector, OpaqueDeviceConfiguration};

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
    pub request: CompactString,
    /// Driver name.
    pub driver: CompactString,
    /// Pool name.
    pub pool: CompactString,
    /// Device name.
    pub device: CompactString,
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
    /// Node operations the kubelet skips for this device, copied from its slice.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skip_node_operations: Vec<String>,
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
