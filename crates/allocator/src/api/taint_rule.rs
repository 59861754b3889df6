//! DeviceTaintRules: taints an administrator adds to devices without changing their slices.

use serde::{Deserialize, Serialize};

use super::{DeviceTaint, ObjectMeta, ResourceSlice};

/// `resource.k8s.io/v1` DeviceTaintRule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "super::input::DeviceTaintRule")]
pub struct DeviceTaintRule {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// The devices and the taint.
    pub spec: DeviceTaintRuleSpec,
}

/// DeviceTaintRule `spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceTaintRuleSpec {
    /// The devices the taint applies to; without one, none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceTaintSelector>,
    /// The taint added to each selected device.
    pub taint: DeviceTaint,
}

/// Which devices a DeviceTaintRule taints: every field that is set must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DeviceTaintSelector {
    /// The driver of the devices' slices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The pool of the devices' slices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The devices' name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

impl DeviceTaintSelector {
    /// Whether a rule with this selector could taint devices of `slice`.
    fn selects_slice(&self, slice: &ResourceSlice) -> bool {
        self.driver.as_ref().is_none_or(|d| *d == slice.spec.driver)
            && self
                .pool
                .as_ref()
                .is_none_or(|p| *p == slice.spec.pool.name)
    }
}

/// Adds the taints of `rules` to the devices they select, as the scheduler sees the slices
/// (each selected device gets each matching rule's taint after its own, in the rules' order);
/// `slices` comes back unchanged when no rule selects a device of it.
pub fn apply_device_taint_rules(slices: &mut [ResourceSlice], rules: &[DeviceTaintRule]) {
    if rules.is_empty() {
        return;
    }
    for slice in slices {
        for rule in rules {
            let Some(selector) = &rule.spec.device_selector else {
                continue;
            };
            if !selector.selects_slice(slice) {
                continue;
            }
            for device in &mut slice.spec.devices {
                if selector.device.as_ref().is_none_or(|d| *d == device.name) {
                    device.taints.push(rule.spec.taint.clone());
                }
            }
        }
    }
}
