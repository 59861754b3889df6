//! DeviceClasses: the selectors and configuration a request's class adds.

use serde::{Deserialize, Serialize};

use super::ObjectMeta;

/// `resource.k8s.io/v1` DeviceClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::DeviceClass")]
pub struct DeviceClass {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// Selectors and configuration.
    pub spec: DeviceClassSpec,
}

/// DeviceClass `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::DeviceClassSpec")]
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
