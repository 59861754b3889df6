//! The backend's configuration and its validation.

use kubedev_core::factory::InvalidValue;
use serde::{Deserialize, Serialize};

use kubedev_core::ExtendedResourceName;

use crate::error::VfioError;
use crate::naming::normalize_type_name;

/// Configuration of the VFIO backend.
///
/// ```yaml
/// pciDevices:
///   - selector: "10de:2236"
///     resourceName: nvidia.com/GA102GL_A10
/// bindOnPrepare: false
/// mediatedDevices:
///   - mdevNameSelector: "GRID T4-1B"
///     resourceName: nvidia.com/GRID_T4-1B
/// desiredMdevTypes:
///   - parentSelectors: ["10de:1eb8"]
///     types: ["nvidia-222"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VfioConfig {
    /// PCI functions to offer, by vendor and device ID. A function is offered when it matches a
    /// selector and is bound to `vfio-pci` (or, with `bindOnPrepare`, bound to anything).
    #[serde(default)]
    pub pci_devices: Vec<PciSelector>,
    /// Bind selected functions to `vfio-pci` when they are prepared and give them back to their
    /// original driver when they are unprepared. The original driver is recorded in the state
    /// directory before anything changes, so an unprepare after a crash restores it.
    #[serde(default)]
    pub bind_on_prepare: bool,
    /// How long a driver (re)bind or an mdev create/remove may take to show in sysfs and
    /// `/dev/vfio`, in milliseconds (default 5000).
    #[serde(default = "default_settle_timeout_ms")]
    pub settle_timeout_ms: u64,
    /// Offer NVIDIA vGPU virtual functions (driver `nvidia`, not a physical function,
    /// `nvidia/current_vgpu_type` non-zero). Default true.
    #[serde(default = "default_true")]
    pub include_vgpu_vfs: bool,
    /// The resource name of vGPU virtual functions that no PCI selector matches (default
    /// `nvidia.com/vgpu`).
    #[serde(default = "default_vgpu_resource_name")]
    pub vgpu_resource_name: String,
    /// Mediated devices to offer, by type name. Instances of other types are not offered.
    #[serde(default)]
    pub mediated_devices: Vec<MdevSelector>,
    /// The mdev types the type manager keeps created (see [`crate::mdev::MdevTypeManager`]). Empty: the
    /// type manager changes nothing.
    #[serde(default)]
    pub desired_mdev_types: Vec<DesiredMdevTypes>,
}

impl Default for VfioConfig {
    fn default() -> Self {
        VfioConfig {
            pci_devices: Vec::new(),
            bind_on_prepare: false,
            settle_timeout_ms: default_settle_timeout_ms(),
            include_vgpu_vfs: true,
            vgpu_resource_name: default_vgpu_resource_name(),
            mediated_devices: Vec::new(),
            desired_mdev_types: Vec::new(),
        }
    }
}

fn default_settle_timeout_ms() -> u64 {
    5000
}

fn default_true() -> bool {
    true
}

fn default_vgpu_resource_name() -> String {
    "nvidia.com/vgpu".to_owned()
}

/// One PCI selector: a vendor:device pair and the resource name its functions are offered as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PciSelector {
    /// `vendor:device` as 4-digit hex IDs, e.g. `10de:2236` (case does not matter).
    pub selector: String,
    /// The resource name, e.g. `nvidia.com/GA102GL_A10`: the device-plugin extended resource,
    /// the `resourceName` attribute in DRA, and the `<NAME>` of `PCI_RESOURCE_<NAME>`. Default
    /// `pci.kubedev.io/<vendor>-<device>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
}

/// One mediated-device selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MdevSelector {
    /// The type name as the kernel shows it (`mdev_type/name`, e.g. `GRID T4-1B`) or the type
    /// directory name (e.g. `nvidia-222`); spaces and underscores compare equal.
    pub mdev_name_selector: String,
    /// The resource name, e.g. `nvidia.com/GRID_T4-1B`.
    pub resource_name: String,
}

/// The mdev types wanted on a set of parent devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesiredMdevTypes {
    /// Parent models (`vendor:device`) this entry is for; empty means every parent. A parent
    /// takes the first entry that matches it.
    #[serde(default)]
    pub parent_selectors: Vec<String>,
    /// Type directory names (e.g. `nvidia-222`) or type names (e.g. `GRID T4-1B`), spread
    /// round-robin over the matching parents, one type per parent.
    pub types: Vec<String>,
}

/// A vendor:device pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VendorDevice {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
}

impl VendorDevice {
    /// Parses `vvvv:dddd` (hex, 1 to 4 digits each, any case).
    pub fn parse(s: &str) -> Option<Self> {
        let (v, d) = s.trim().split_once(':')?;
        let hex = |x: &str| {
            if x.is_empty() || x.len() > 4 || !x.bytes().all(|b| b.is_ascii_hexdigit()) {
                None
            } else {
                u16::from_str_radix(x, 16).ok()
            }
        };
        Some(VendorDevice {
            vendor: hex(v)?,
            device: hex(d)?,
        })
    }
}

impl std::fmt::Display for VendorDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04x}:{:04x}", self.vendor, self.device)
    }
}

/// A validated PCI selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PciRule {
    pub(crate) ids: VendorDevice,
    pub(crate) resource: String,
}

/// A validated mdev selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MdevRule {
    /// Normalised (spaces → `_`).
    pub(crate) name: String,
    pub(crate) resource: String,
}

/// A validated desired-types entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredRule {
    pub(crate) parents: Vec<VendorDevice>,
    pub(crate) types: Vec<String>,
}

/// The configuration, checked and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    pub(crate) pci: Vec<PciRule>,
    pub(crate) mdev: Vec<MdevRule>,
    pub(crate) desired: Vec<DesiredRule>,
    pub(crate) vgpu_resource: String,
}

/// The longest resource name: it is also published as a string attribute.
const MAX_RESOURCE_NAME: usize = 64;

fn bad(field: String, value: &str, reason: impl Into<String>) -> VfioError {
    VfioError::Config(InvalidValue {
        field,
        value: value.to_owned(),
        reason: reason.into(),
    })
}

fn check_resource(field: String, value: &str) -> Result<String, VfioError> {
    ExtendedResourceName::new(value).map_err(|e| bad(field.clone(), value, e.reason))?;
    if value.len() > MAX_RESOURCE_NAME {
        return Err(bad(
            field,
            value,
            format!("must be at most {MAX_RESOURCE_NAME} bytes (it is published as an attribute)"),
        ));
    }
    Ok(value.to_owned())
}

fn check_ids(field: String, value: &str) -> Result<VendorDevice, VfioError> {
    VendorDevice::parse(value).ok_or_else(|| {
        bad(
            field,
            value,
            "must be <vendor>:<device> in hex, e.g. 10de:2236",
        )
    })
}

impl VfioConfig {
    /// Checks the configuration; the error names the field and the bad value.
    pub fn validate(&self) -> Result<(), VfioError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<Checked, VfioError> {
        let mut pci = Vec::new();
        for (i, s) in self.pci_devices.iter().enumerate() {
            let ids = check_ids(format!("pciDevices[{i}].selector"), &s.selector)?;
            if pci.iter().any(|r: &PciRule| r.ids == ids) {
                return Err(bad(
                    format!("pciDevices[{i}].selector"),
                    &s.selector,
                    "selects the same vendor and device as an earlier entry",
                ));
            }
            let resource = match &s.resource_name {
                Some(r) => check_resource(format!("pciDevices[{i}].resourceName"), r)?,
                None => format!("pci.kubedev.io/{:04x}-{:04x}", ids.vendor, ids.device),
            };
            pci.push(PciRule { ids, resource });
        }
        let mut mdev = Vec::new();
        for (i, s) in self.mediated_devices.iter().enumerate() {
            let field = format!("mediatedDevices[{i}].mdevNameSelector");
            let name = normalize_type_name(&s.mdev_name_selector);
            if name.is_empty() {
                return Err(bad(field, &s.mdev_name_selector, "must not be empty"));
            }
            if mdev.iter().any(|r: &MdevRule| r.name == name) {
                return Err(bad(
                    field,
                    &s.mdev_name_selector,
                    "selects the same type as an earlier entry",
                ));
            }
            let resource = check_resource(
                format!("mediatedDevices[{i}].resourceName"),
                &s.resource_name,
            )?;
            mdev.push(MdevRule { name, resource });
        }
        let mut desired = Vec::new();
        for (i, d) in self.desired_mdev_types.iter().enumerate() {
            let parents = d
                .parent_selectors
                .iter()
                .enumerate()
                .map(|(j, p)| check_ids(format!("desiredMdevTypes[{i}].parentSelectors[{j}]"), p))
                .collect::<Result<Vec<_>, _>>()?;
            if d.types.is_empty() {
                return Err(bad(
                    format!("desiredMdevTypes[{i}].types"),
                    "[]",
                    "must name at least one type",
                ));
            }
            let mut types = Vec::new();
            for (j, t) in d.types.iter().enumerate() {
                let n = normalize_type_name(t);
                if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                    return Err(bad(
                        format!("desiredMdevTypes[{i}].types[{j}]"),
                        t,
                        "must be a type name or directory name",
                    ));
                }
                types.push(n);
            }
            desired.push(DesiredRule { parents, types });
        }
        if self.settle_timeout_ms == 0 || self.settle_timeout_ms > 600_000 {
            return Err(bad(
                "settleTimeoutMs".into(),
                &self.settle_timeout_ms.to_string(),
                "must be between 1 and 600000",
            ));
        }
        let vgpu_resource = check_resource("vgpuResourceName".into(), &self.vgpu_resource_name)?;
        Ok(Checked {
            pci,
            mdev,
            desired,
            vgpu_resource,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<VfioConfig, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn parses_camel_case_and_defaults() {
        let c = parse(serde_json::json!({
            "pciDevices": [{"selector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10"},
                           {"selector": "8086:154c"}],
            "mediatedDevices": [{"mdevNameSelector": "GRID T4-1B", "resourceName": "nvidia.com/GRID_T4-1B"}],
            "desiredMdevTypes": [{"parentSelectors": ["10de:1eb8"], "types": ["nvidia-222"]}]
        }))
        .unwrap();
        assert!(!c.bind_on_prepare);
        assert!(c.include_vgpu_vfs);
        assert_eq!(c.settle_timeout_ms, 5000);
        let k = c.check().unwrap();
        assert_eq!(
            k.pci[0].ids,
            VendorDevice {
                vendor: 0x10de,
                device: 0x2236
            }
        );
        assert_eq!(k.pci[1].resource, "pci.kubedev.io/8086-154c");
        assert_eq!(k.mdev[0].name, "GRID_T4-1B");
        assert_eq!(k.desired[0].types, ["nvidia-222"]);
        assert_eq!(VfioConfig::default().check().unwrap().pci, []);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = parse(serde_json::json!({"pciDevice": []})).unwrap_err();
        assert!(err.to_string().contains("pciDevice"), "{err}");
        let err = parse(serde_json::json!({"pciDevices": [{"selector": "1:2", "name": "x"}]}))
            .unwrap_err();
        assert!(err.to_string().contains("name"), "{err}");
    }

    #[test]
    fn errors_name_field_and_value() {
        let cases = [
            (
                serde_json::json!({"pciDevices": [{"selector": "10de-2236"}]}),
                "pciDevices[0].selector",
                "10de-2236",
            ),
            (
                serde_json::json!({"pciDevices": [{"selector": "10de:22366"}]}),
                "pciDevices[0].selector",
                "10de:22366",
            ),
            (
                serde_json::json!({"pciDevices": [{"selector": "10de:2236", "resourceName": "gpu"}]}),
                "pciDevices[0].resourceName",
                "gpu",
            ),
            (
                serde_json::json!({"pciDevices": [{"selector": "10de:2236"}, {"selector": "10DE:2236"}]}),
                "pciDevices[1].selector",
                "10DE:2236",
            ),
            (
                serde_json::json!({"mediatedDevices": [{"mdevNameSelector": "x", "resourceName": "a.b/c d"}]}),
                "mediatedDevices[0].resourceName",
                "a.b/c d",
            ),
            (
                serde_json::json!({"desiredMdevTypes": [{"parentSelectors": ["zz:1"], "types": ["a"]}]}),
                "desiredMdevTypes[0].parentSelectors[0]",
                "zz:1",
            ),
            (
                serde_json::json!({"desiredMdevTypes": [{"types": ["../x"]}]}),
                "desiredMdevTypes[0].types[0]",
                "../x",
            ),
            (
                serde_json::json!({"settleTimeoutMs": 0}),
                "settleTimeoutMs",
                "0",
            ),
            (
                serde_json::json!({"vgpuResourceName": format!("example.com/{}", "a".repeat(60))}),
                "vgpuResourceName",
                "example.com/aaaa",
            ),
        ];
        for (json, field, value) in cases {
            let err = parse(json).unwrap().validate().unwrap_err();
            let msg = kubedev_core::echo::chain(&err);
            assert!(msg.contains(field), "{msg}");
            assert!(msg.contains(value), "{msg}");
        }
    }

    #[test]
    fn vendor_device_parsing() {
        assert_eq!(
            VendorDevice::parse("8086:154C"),
            Some(VendorDevice {
                vendor: 0x8086,
                device: 0x154c
            })
        );
        for bad in [
            "",
            ":",
            "8086",
            "8086:",
            ":154c",
            "g086:1",
            "8086:154c:1",
            "+1:2",
        ] {
            assert_eq!(VendorDevice::parse(bad), None, "{bad}");
        }
        assert_eq!(
            VendorDevice {
                vendor: 0x10de,
                device: 0x2236
            }
            .to_string(),
            "10de:2236"
        );
    }
}
