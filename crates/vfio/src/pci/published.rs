//! The published device of an offered PCI unit, its attributes, and its health from the VFIO
//! nodes.

use kubedev_core::{AttributeValue, Device, Health, HostFs, QualifiedName};

use super::sysfs::link_name_opt;
use super::{PciKind, PciUnit, SriovRole, VFIO_CONTAINER, VFIO_PCI, attrs};

/// Adds attribute `name` (one of [`attrs`], checked by a test) to `d`.
pub(crate) fn set(d: Device, name: &str, value: AttributeValue) -> Device {
    match QualifiedName::new(name) {
        Ok(q) => d.with_attribute(q, value),
        Err(e) => {
            tracing::error!(attribute = name, error = %kubedev_core::echo::Chain(&e), "invalid attribute name left out");
            d
        }
    }
}

pub(crate) fn string_attr(s: &str) -> AttributeValue {
    // Every value passed here is short (addresses, IDs, driver names cut by the kernel to its
    // own limits, resource names checked to fit); cut defensively rather than fail.
    let cut: String = s.chars().take(AttributeValue::MAX_LENGTH).collect();
    AttributeValue::String(cut)
}

/// The published device for a unit, with `health`.
pub(crate) fn unit_device(u: &PciUnit, health: Health) -> Device {
    let f = u.primary();
    let addr = f.address.to_string();
    let mut d = Device::new(u.name.clone());
    d = set(d, attrs::TYPE, string_attr("pci"));
    d = set(d, attrs::PCI_ADDRESS, string_attr(&addr));
    d = set(
        d,
        attrs::VENDOR_ID,
        string_attr(&format!("{:04x}", f.vendor_id)),
    );
    d = set(
        d,
        attrs::DEVICE_ID,
        string_attr(&format!("{:04x}", f.device_id)),
    );
    d = set(d, attrs::CLASS, string_attr(&format!("{:06x}", f.class)));
    d = set(
        d,
        attrs::IOMMU_GROUP,
        AttributeValue::Int(i64::from(u.group)),
    );
    d = set(d, attrs::RESOURCE_NAME, string_attr(&u.resource));
    d = set(d, attrs::SRIOV_ROLE, string_attr(f.sriov.as_str()));
    d = set(
        d,
        attrs::FUNCTIONS,
        AttributeValue::Int(u.functions.len() as i64),
    );
    if f.address.is_standard_bdf() {
        d = set(d, attrs::PCI_BUS_ID, string_attr(&addr));
    }
    if let Some(n) = f.numa_node {
        d = set(d, attrs::NUMA_NODE, AttributeValue::Int(n)).with_numa_node(n);
    }
    if let Some(drv) = &f.driver {
        d = set(d, attrs::DRIVER, string_attr(drv));
    }
    if let SriovRole::VirtualFunction { physfn } = f.sriov {
        d = set(d, attrs::PHYSFN, string_attr(&physfn.to_string()));
    }
    if u.kind == PciKind::VgpuVf
        && let Some(t) = f.vgpu_type
    {
        d = set(d, attrs::VGPU_TYPE, AttributeValue::Int(i64::from(t)));
    }
    if let Some(root) = &f.pcie_root {
        d = set(d, attrs::PCIE_ROOT, string_attr(root));
    }
    d.health = health;
    d
}

/// Unhealthy when the VFIO container node `/dev/vfio/vfio` is missing: no VFIO device can be
/// used then; unknown when whether it exists cannot be told.
pub(crate) fn container_missing(host: &HostFs) -> Option<Health> {
    match host.presence(VFIO_CONTAINER) {
        Ok(true) => None,
        Ok(false) => Some(Health::unhealthy(format!(
            "{VFIO_CONTAINER} is missing (is the vfio module loaded?)"
        ))),
        Err(e) => Some(Health::unknown(format!(
            "cannot tell whether {VFIO_CONTAINER} exists: {e}"
        ))),
    }
}

/// A unit's health now: healthy while `/dev/vfio/vfio` and `/dev/vfio/<group>` exist, or while
/// the group node is expected to be missing because prepare will bind the functions to
/// `vfio-pci` first.
pub(crate) fn unit_health(host: &HostFs, u: &PciUnit, bind_on_prepare: bool) -> Health {
    if let Some(h) = container_missing(host) {
        return h;
    }
    let node = u.group_node();
    match host.presence(&node) {
        Ok(true) => return Health::healthy(),
        Ok(false) => {}
        Err(e) => {
            return Health::unknown(format!(
                "cannot tell whether {node} exists: {}",
                kubedev_core::echo::chain(&e)
            ));
        }
    }
    if bind_on_prepare && u.kind == PciKind::Passthrough {
        // Re-read the drivers: the node is absent exactly while nothing is bound to vfio-pci.
        let unbound = u.functions.iter().all(|f| {
            link_name_opt(host, &f.sysfs_path.join("driver"))
                .ok()
                .flatten()
                .as_deref()
                != Some(VFIO_PCI)
        });
        if unbound {
            return Health::healthy();
        }
    }
    Health::unhealthy(format!("{node} is missing"))
}
