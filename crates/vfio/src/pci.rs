//! PCI functions: reading them from sysfs ([`scan`]) and deciding which are offered, grouped by
//! IOMMU group ([`select`]); the devices published for them and their health.

use std::path::PathBuf;

use kubedev_core::DeviceName;

use crate::config::VendorDevice;
use crate::naming::PciAddress;

pub mod attrs;
mod published;
mod selection;
mod sysfs;

pub(crate) use published::{container_missing, set, string_attr, unit_device, unit_health};
pub(crate) use selection::{SelectOptions, select};
pub(crate) use sysfs::link_name_opt;
pub use sysfs::{pcie_root_of, read_function, scan};

/// Where the kernel lists PCI functions.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// The VFIO PCI driver's name.
pub const VFIO_PCI: &str = "vfio-pci";
/// The VFIO container node every VFIO user opens.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";

/// A function's SR-IOV role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SriovRole {
    /// Neither a physical nor a virtual function.
    None,
    /// A physical function (it has `sriov_totalvfs`).
    PhysicalFunction {
        /// `sriov_totalvfs`.
        total_vfs: u32,
        /// `sriov_numvfs`: how many VFs are enabled now.
        num_vfs: u32,
    },
    /// A virtual function (it has a `physfn` link).
    VirtualFunction {
        /// The physical function.
        physfn: PciAddress,
    },
}

impl SriovRole {
    /// `pf`, `vf` or `none` (the `sriovRole` attribute).
    pub fn as_str(&self) -> &'static str {
        match self {
            SriovRole::None => "none",
            SriovRole::PhysicalFunction { .. } => "pf",
            SriovRole::VirtualFunction { .. } => "vf",
        }
    }
}

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFunction {
    /// The address (the entry's name in `/sys/bus/pci/devices`).
    pub address: PciAddress,
    /// `vendor`.
    pub vendor_id: u16,
    /// `device`.
    pub device_id: u16,
    /// `class` (24 bits).
    pub class: u32,
    /// The bound driver (the `driver` link's name), if any.
    pub driver: Option<String>,
    /// The IOMMU group (the `iommu_group` link's name), if the IOMMU is on.
    pub iommu_group: Option<u32>,
    /// `numa_node`; `None` when the kernel says -1 or has no such file.
    pub numa_node: Option<i64>,
    /// SR-IOV role.
    pub sriov: SriovRole,
    /// The PCIe root complex, `pci<domain>:<bus>`: the first component of the function's
    /// canonical path under `/sys/devices`.
    pub pcie_root: Option<String>,
    /// The canonical host path of the function's sysfs directory.
    pub sysfs_path: PathBuf,
    /// `nvidia/current_vgpu_type`, for NVIDIA functions that have it.
    pub vgpu_type: Option<u32>,
}

impl PciFunction {
    /// The function's vendor:device pair.
    pub fn ids(&self) -> VendorDevice {
        VendorDevice {
            vendor: self.vendor_id,
            device: self.device_id,
        }
    }

    /// Whether the function is a PCI bridge (class 0x0604) or host bridge (0x0600).
    pub fn is_bridge(&self) -> bool {
        matches!(self.class >> 8, 0x0604 | 0x0600)
    }

    /// Whether this is an NVIDIA vGPU virtual function with a vGPU type set.
    pub fn is_vgpu_vf(&self) -> bool {
        self.driver.as_deref() == Some("nvidia")
            && matches!(self.sriov, SriovRole::VirtualFunction { .. })
            && self.vgpu_type.is_some_and(|t| t != 0)
    }
}

/// How an offered PCI device is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PciKind {
    /// A function (or IOMMU group) passed through with `vfio-pci`.
    Passthrough,
    /// An NVIDIA vGPU virtual function (bound to `nvidia`, vGPU type set).
    VgpuVf,
}

/// One offered PCI device: all offered functions of one IOMMU group, allocated together.
///
/// The device is named after its first (lowest-address) function, `pci-0000-3b-00-0`, so the
/// name stays the same when IOMMU group numbers change across reboots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciUnit {
    /// The device name.
    pub name: DeviceName,
    /// The resource name (from the selector of the first function, or the vGPU resource name).
    pub resource: String,
    /// The IOMMU group.
    pub group: u32,
    /// The offered functions, lowest address first.
    pub functions: Vec<PciFunction>,
    /// How it is used.
    pub kind: PciKind,
}

impl PciUnit {
    /// The first function.
    pub fn primary(&self) -> &PciFunction {
        &self.functions[0]
    }

    /// The functions' addresses, comma-separated (the `PCI_RESOURCE_*` value).
    pub fn addresses(&self) -> String {
        self.functions
            .iter()
            .map(|f| f.address.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The group's VFIO node, `/dev/vfio/<group>`.
    pub fn group_node(&self) -> String {
        format!("/dev/vfio/{}", self.group)
    }

    /// Whether prepare will rebind some function to `vfio-pci`.
    pub fn needs_bind(&self) -> bool {
        self.kind == PciKind::Passthrough
            && self
                .functions
                .iter()
                .any(|f| f.driver.as_deref() != Some(VFIO_PCI))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
