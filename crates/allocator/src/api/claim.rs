//! ResourceClaims: requests, their alternatives, tolerations, capacity, constraints and
//! configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{DeviceSelector, ObjectMeta, OpaqueDeviceConfiguration, RawQuantity};

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

/// `resource.k8s.io/v1` ResourceClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::ResourceClaim")]
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
