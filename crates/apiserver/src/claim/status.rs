//! The status this driver reports for its allocated devices: conditions (`Ready` when
//! prepared) and their merge into a claim's `status.devices`, keeping other drivers' entries and
//! unchanged transition times.

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kubedev_core::{DeviceRef, DriverName, NetworkData, PreparedDevice};

/// The status of a condition: `True`, `False` or `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// It does not.
    False,
    /// Cannot tell.
    Unknown,
}

impl ConditionStatus {
    fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// One condition of a prepared device (a `metav1.Condition` without the timestamps, which are
/// managed here).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCondition {
    /// The condition type, e.g. `Ready`.
    pub kind: String,
    /// Its status.
    pub status: ConditionStatus,
    /// A CamelCase reason, e.g. `Prepared`.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
}

impl DeviceCondition {
    /// A condition.
    pub fn new(
        kind: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        DeviceCondition {
            kind: kind.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The status this driver reports for one allocated device (an entry of `status.devices`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceStatus {
    /// The device.
    pub device: DeviceRef,
    /// Its share ID, for a shared device.
    pub share_id: Option<String>,
    /// Conditions (at most 8).
    pub conditions: Vec<DeviceCondition>,
    /// Driver-specific data.
    pub data: Option<serde_json::Value>,
    /// The network interface the device is.
    pub network: Option<NetworkData>,
}

impl DeviceStatus {
    /// A device that is prepared: condition `Ready` is `True` with reason `Prepared`.
    pub fn ready(device: DeviceRef, share_id: Option<String>) -> Self {
        DeviceStatus {
            device,
            share_id,
            conditions: vec![DeviceCondition::new(
                "Ready",
                ConditionStatus::True,
                "Prepared",
                "the device is prepared for the claim",
            )],
            data: None,
            network: None,
        }
    }

    /// The status of a device a backend prepared: `Ready`, with the backend's data and network
    /// interface.
    pub fn prepared(device: &PreparedDevice) -> Self {
        DeviceStatus {
            data: device.status_data.clone(),
            network: device.network.clone(),
            ..DeviceStatus::ready(device.device.device.clone(), device.device.share_id.clone())
        }
    }
}

/// Replaces this driver's entries for the given devices in `entries`.
pub(crate) fn merge_device_status(
    entries: &mut Vec<res::AllocatedDeviceStatus>,
    driver: &DriverName,
    devices: &[DeviceStatus],
    now: Timestamp,
) {
    for status in devices {
        let same = |e: &res::AllocatedDeviceStatus| {
            e.driver == driver.as_str()
                && e.pool == status.device.pool.as_str()
                && e.device == status.device.device.as_str()
                && e.share_id == status.share_id
        };
        let previous = entries.iter().position(same).map(|i| entries.remove(i));
        let old_conditions = previous
            .as_ref()
            .and_then(|p| p.conditions.clone())
            .unwrap_or_default();
        let conditions: Vec<Condition> = status
            .conditions
            .iter()
            .map(|c| {
                let kept = old_conditions
                    .iter()
                    .find(|o| o.type_ == c.kind && o.status == c.status.as_str())
                    .map(|o| o.last_transition_time.clone());
                Condition {
                    type_: c.kind.clone(),
                    status: c.status.as_str().to_owned(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    observed_generation: None,
                    last_transition_time: kept.unwrap_or(Time(now)),
                }
            })
            .collect();
        entries.push(res::AllocatedDeviceStatus {
            driver: driver.to_string(),
            pool: status.device.pool.to_string(),
            device: status.device.device.to_string(),
            share_id: status.share_id.clone(),
            conditions: (!conditions.is_empty()).then_some(conditions),
            data: status.data.clone().map(RawExtension),
            network_data: match &status.network {
                Some(n) => Some(res::NetworkDeviceData {
                    interface_name: n.interface_name.clone(),
                    ips: (!n.ips.is_empty()).then(|| n.ips.clone()),
                    hardware_address: n.hardware_address.clone(),
                }),
                None => previous.and_then(|p| p.network_data),
            },
        });
    }
}
