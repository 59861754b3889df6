//! Mediated devices: instances under `/sys/bus/mdev/devices`, parents and their supported types
//! under `/sys/class/mdev_bus`, and the type manager that keeps the wanted types created.

use kubedev_core::{AttributeValue, Device, DeviceName, Health};

use crate::config::VendorDevice;
use crate::naming::{PciAddress, mdev_device_name, normalize_type_name};
use crate::pci::{attrs, set, string_attr};

mod manager;
mod plan;
mod sysfs;

pub use manager::{MdevReport, MdevTypeManager};
pub use plan::{MdevPlan, ParentPlan};
pub use sysfs::{scan_mdev_parents, scan_mdevs};

/// Where the kernel lists mdev instances.
pub const MDEV_DEVICES: &str = "/sys/bus/mdev/devices";
/// Where the kernel lists devices that can parent mdev instances.
pub const MDEV_BUS: &str = "/sys/class/mdev_bus";

/// One mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevInstance {
    /// The UUID (the entry's name in `/sys/bus/mdev/devices`).
    pub uuid: String,
    /// The type's directory name, e.g. `nvidia-222`.
    pub type_id: String,
    /// The type name: `mdev_type/name` if present, else the type's directory name; spaces
    /// replaced by `_` (`GRID_T4-1B`).
    pub type_name: String,
    /// The parent PCI function.
    pub parent: PciAddress,
    /// The instance's IOMMU group.
    pub iommu_group: Option<u32>,
    /// The parent's NUMA node.
    pub numa_node: Option<i64>,
    /// The parent's PCIe root complex.
    pub pcie_root: Option<String>,
}

impl MdevInstance {
    /// The device name, `mdev-<uuid>`.
    pub fn device_name(&self) -> Option<DeviceName> {
        mdev_device_name(&self.uuid)
    }
}

/// One type a parent supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevType {
    /// The directory name, e.g. `nvidia-222`.
    pub id: String,
    /// The name (spaces → `_`), or the directory name when there is no `name` file.
    pub name: String,
    /// `available_instances` now.
    pub available_instances: u32,
    /// UUIDs of the instances of this type on this parent.
    pub instances: Vec<String>,
}

/// A device that can parent mdev instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevParent {
    /// Its PCI address.
    pub address: PciAddress,
    /// Its vendor and device IDs.
    pub ids: VendorDevice,
    /// Its NUMA node.
    pub numa_node: Option<i64>,
    /// The types it supports, by directory name.
    pub types: Vec<MdevType>,
}

/// One offered mdev instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevUnit {
    /// The device name, `mdev-<uuid>`.
    pub name: DeviceName,
    /// The resource name from the matching selector.
    pub resource: String,
    /// The IOMMU group of the instance.
    pub group: u32,
    /// The instance.
    pub instance: MdevInstance,
}

impl MdevUnit {
    /// `/dev/vfio/<group>`.
    pub fn group_node(&self) -> String {
        format!("/dev/vfio/{}", self.group)
    }
}

/// The instances whose type a selector names; the rest are logged at debug level.
pub(crate) fn select_mdevs(
    instances: &[MdevInstance],
    rules: &[crate::config::MdevRule],
) -> Vec<MdevUnit> {
    let mut out = Vec::new();
    for i in instances {
        let skip = |reason: &str| {
            tracing::debug!(uuid = %i.uuid, reason, "mdev instance not offered");
        };
        let Some(rule) = rules
            .iter()
            .find(|r| r.name == i.type_name || r.name == normalize_type_name(&i.type_id))
        else {
            skip(&format!("type {} matches no mdev selector", i.type_name));
            continue;
        };
        let Some(group) = i.iommu_group else {
            skip("has no IOMMU group");
            continue;
        };
        let Some(name) = i.device_name() else {
            skip("UUID does not make a device name");
            continue;
        };
        out.push(MdevUnit {
            name,
            resource: rule.resource.clone(),
            group,
            instance: i.clone(),
        });
    }
    out
}

/// The published device for an mdev unit.
pub(crate) fn mdev_device(u: &MdevUnit, health: Health) -> Device {
    let i = &u.instance;
    let mut d = Device::new(u.name.clone());
    d = set(d, attrs::TYPE, string_attr("mdev"));
    d = set(d, attrs::UUID, string_attr(&i.uuid));
    d = set(d, attrs::MDEV_TYPE, string_attr(&i.type_name));
    d = set(d, attrs::MDEV_TYPE_ID, string_attr(&i.type_id));
    d = set(d, attrs::PARENT_ADDRESS, string_attr(&i.parent.to_string()));
    d = set(
        d,
        attrs::IOMMU_GROUP,
        AttributeValue::Int(i64::from(u.group)),
    );
    d = set(d, attrs::RESOURCE_NAME, string_attr(&u.resource));
    if let Some(n) = i.numa_node {
        d = set(d, attrs::NUMA_NODE, AttributeValue::Int(n)).with_numa_node(n);
    }
    if let Some(root) = &i.pcie_root {
        d = set(d, attrs::PCIE_ROOT, string_attr(root));
    }
    d.health = health;
    d
}
