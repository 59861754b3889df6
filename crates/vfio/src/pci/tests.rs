//! Tests of the attribute names and PCIe roots.

use std::path::Path;

use kubedev_core::QualifiedName;

use super::*;

#[test]
fn attribute_names_are_valid() {
    for name in [
        attrs::TYPE,
        attrs::PCI_ADDRESS,
        attrs::VENDOR_ID,
        attrs::DEVICE_ID,
        attrs::CLASS,
        attrs::IOMMU_GROUP,
        attrs::NUMA_NODE,
        attrs::DRIVER,
        attrs::RESOURCE_NAME,
        attrs::SRIOV_ROLE,
        attrs::PHYSFN,
        attrs::FUNCTIONS,
        attrs::VGPU_TYPE,
        attrs::UUID,
        attrs::MDEV_TYPE,
        attrs::MDEV_TYPE_ID,
        attrs::PARENT_ADDRESS,
        attrs::PCI_BUS_ID,
        attrs::PCIE_ROOT,
    ] {
        QualifiedName::new(name).unwrap();
    }
}

#[test]
fn pcie_roots_come_from_the_first_component() {
    let root = |p: &str| pcie_root_of(Path::new(p));
    assert_eq!(
        root("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0").as_deref(),
        Some("pci0000:3a")
    );
    assert_eq!(
        root("/sys/devices/pci10000:e0/10000:e0:00.0").as_deref(),
        Some("pci10000:e0")
    );
    assert_eq!(root("/sys/devices/platform/foo/0000:00:00.0"), None);
    assert_eq!(root("/sys/devices/LNXSYSTM:00/x"), None);
    assert_eq!(root("/sys/bus/pci/devices/0000:00:00.0"), None);
    assert_eq!(root("/sys/devices/pci0000:3/x"), None);
}
