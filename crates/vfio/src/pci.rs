//! PCI functions: reading them from sysfs ([`scan`]) and deciding which are offered, grouped by
//! IOMMU group ([`select`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubedev_core::{
    AttributeValue, Device, DeviceName, Health, HostFs, HostFsError, QualifiedName,
};

use crate::config::{Checked, VendorDevice};
use crate::error::VfioError;
use crate::naming::PciAddress;

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

/// Reads every PCI function under `/sys/bus/pci/devices`, before any filtering. A missing
/// directory (no PCI bus) gives an empty list; an entry that cannot be read is logged
/// (warning, naming the file) and left out.
pub fn scan(host: &HostFs) -> Result<Vec<PciFunction>, VfioError> {
    let names = match host.list_dir(PCI_DEVICES) {
        Ok(n) => n,
        Err(e) if e.is_not_found() => {
            tracing::debug!("{PCI_DEVICES} does not exist: no PCI functions");
            return Ok(Vec::new());
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match read_function(host, &name) {
            Ok(f) => out.push(f),
            Err(e) => {
                tracing::warn!(entry = %name, error = %kubedev_core::echo::Chain(&e), "skipping unreadable PCI function")
            }
        }
    }
    Ok(out)
}

/// Reads one function by its entry name in `/sys/bus/pci/devices`.
pub fn read_function(host: &HostFs, name: &str) -> Result<PciFunction, VfioError> {
    let address = PciAddress::parse(name).ok_or_else(|| HostFsError::Parse {
        path: Path::new(PCI_DEVICES).join(name),
        value: name.to_owned(),
        expected: "an entry named by a PCI address (dddd:bb:dd.f)",
    })?;
    let dir = host.canonicalize(format!("{PCI_DEVICES}/{name}"))?;
    let attr = |file: &str| dir.join(file);
    let vendor_id = read_u16(host, &attr("vendor"))?;
    let device_id = read_u16(host, &attr("device"))?;
    let class = read_u32(host, &attr("class"), 0xff_ffff)?;
    let driver = link_name_opt(host, &attr("driver"))?;
    let iommu_group = match link_name_opt(host, &attr("iommu_group"))? {
        None => None,
        Some(g) => Some(g.parse::<u32>().map_err(|_| HostFsError::Parse {
            path: attr("iommu_group"),
            value: g.clone(),
            expected: "a link to a numbered IOMMU group",
        })?),
    };
    let numa_node = match host.read_dec(attr("numa_node")) {
        Ok(n) if n >= 0 => Some(n),
        Ok(_) => None,
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.into()),
    };
    let sriov = if host.exists(attr("physfn")) {
        let pf = host.canonicalize(attr("physfn"))?;
        let pf_name = pf
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let physfn = PciAddress::parse(&pf_name).ok_or_else(|| HostFsError::Parse {
            path: attr("physfn"),
            value: pf_name,
            expected: "a link to a PCI function",
        })?;
        SriovRole::VirtualFunction { physfn }
    } else {
        match read_count(host, &attr("sriov_totalvfs"))? {
            Some(total_vfs) => SriovRole::PhysicalFunction {
                total_vfs,
                num_vfs: read_count(host, &attr("sriov_numvfs"))?.unwrap_or(0),
            },
            None => SriovRole::None,
        }
    };
    let vgpu_type = if vendor_id == 0x10de {
        read_count(host, &attr("nvidia/current_vgpu_type"))?
    } else {
        None
    };
    Ok(PciFunction {
        address,
        vendor_id,
        device_id,
        class,
        driver,
        iommu_group,
        numa_node,
        sriov,
        pcie_root: pcie_root_of(&dir),
        sysfs_path: dir,
        vgpu_type,
    })
}

pub use kubedev_core::hostfs::pcie_root_of;

/// A non-negative decimal attribute; `None` when the file does not exist.
fn read_count(host: &HostFs, p: &Path) -> Result<Option<u32>, HostFsError> {
    match host.read_dec(p) {
        Ok(n) => u32::try_from(n).map(Some).map_err(|_| HostFsError::Parse {
            path: p.to_path_buf(),
            value: n.to_string(),
            expected: "a count",
        }),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

fn read_u16(host: &HostFs, p: &Path) -> Result<u16, HostFsError> {
    read_u32(host, p, 0xffff).map(|v| v as u16)
}

fn read_u32(host: &HostFs, p: &Path, max: u32) -> Result<u32, HostFsError> {
    let v = host.read_hex(p)?;
    if v > u64::from(max) {
        return Err(HostFsError::Parse {
            path: p.to_path_buf(),
            value: format!("{v:#x}"),
            expected: "an ID in range",
        });
    }
    Ok(v as u32)
}

/// The name a symlink points to, `None` when there is no link.
pub(crate) fn link_name_opt(host: &HostFs, p: &Path) -> Result<Option<String>, HostFsError> {
    match host.read_link_name(p) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
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

/// Options of [`select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SelectOptions {
    pub(crate) bind_on_prepare: bool,
    pub(crate) include_vgpu_vfs: bool,
}

/// Drivers a function may be bound to without blocking passthrough of the rest of its IOMMU
/// group (besides `vfio-pci` and no driver at all).
const GROUP_HARMLESS_DRIVERS: [&str; 2] = ["pci-stub", "pcieport"];

/// Decides which functions are offered and groups them into units by IOMMU group. Every
/// function left out is logged at debug level with the reason.
pub(crate) fn select(
    functions: &[PciFunction],
    cfg: &Checked,
    opts: SelectOptions,
) -> Vec<PciUnit> {
    let skip = |f: &PciFunction, reason: &str| {
        tracing::debug!(address = %f.address, reason, "PCI function not offered");
    };
    // Candidates: (function index, resource, kind).
    let mut by_group: BTreeMap<u32, Vec<(usize, String, PciKind)>> = BTreeMap::new();
    for (i, f) in functions.iter().enumerate() {
        let rule = cfg.pci.iter().find(|r| r.ids == f.ids());
        let nvidia_vf = f.driver.as_deref() == Some("nvidia")
            && matches!(f.sriov, SriovRole::VirtualFunction { .. });
        let (resource, kind) = if nvidia_vf && f.vgpu_type.is_some() {
            if !opts.include_vgpu_vfs {
                skip(f, "NVIDIA vGPU virtual function, and includeVgpuVfs is off");
                continue;
            }
            if !f.is_vgpu_vf() {
                skip(
                    f,
                    "NVIDIA vGPU virtual function without a vGPU type (current_vgpu_type is 0)",
                );
                continue;
            }
            let resource = rule.map_or_else(|| cfg.vgpu_resource.clone(), |r| r.resource.clone());
            (resource, PciKind::VgpuVf)
        } else {
            let Some(rule) = rule else {
                skip(f, "matches no PCI selector");
                continue;
            };
            let on_vfio = f.driver.as_deref() == Some(VFIO_PCI);
            if !on_vfio && !opts.bind_on_prepare {
                let reason = match &f.driver {
                    Some(d) => format!("bound to {d}, not {VFIO_PCI} (and bindOnPrepare is off)"),
                    None => {
                        format!("bound to no driver, not {VFIO_PCI} (and bindOnPrepare is off)")
                    }
                };
                skip(f, &reason);
                continue;
            }
            if let SriovRole::PhysicalFunction { num_vfs, .. } = f.sriov
                && num_vfs > 0
                && !on_vfio
            {
                skip(
                    f,
                    "an SR-IOV physical function with enabled VFs is not rebound (they depend on its driver)",
                );
                continue;
            }
            (rule.resource.clone(), PciKind::Passthrough)
        };
        let Some(group) = f.iommu_group else {
            skip(f, "has no IOMMU group (is the IOMMU enabled?)");
            continue;
        };
        by_group.entry(group).or_default().push((i, resource, kind));
    }
    let mut units = Vec::new();
    for (group, mut members) in by_group {
        members.sort_by_key(|(i, _, _)| functions[*i].address);
        let blocker = functions.iter().enumerate().find(|(i, f)| {
            f.iommu_group == Some(group)
                && !members.iter().any(|(m, _, _)| m == i)
                && !f.is_bridge()
                && f.driver
                    .as_deref()
                    .is_some_and(|d| d != VFIO_PCI && !GROUP_HARMLESS_DRIVERS.contains(&d))
        });
        if let Some((_, b)) = blocker {
            let reason = format!(
                "IOMMU group {group} also holds {} bound to {}, which blocks passthrough",
                b.address,
                b.driver.as_deref().unwrap_or("?")
            );
            for (i, _, _) in &members {
                skip(&functions[*i], &reason);
            }
            continue;
        }
        let (first, resource, kind) = members[0].clone();
        let Some(name) = functions[first].address.device_name() else {
            for (i, _, _) in &members {
                skip(&functions[*i], "its address does not make a device name");
            }
            continue;
        };
        units.push(PciUnit {
            name,
            resource,
            group,
            functions: members
                .iter()
                .map(|(i, _, _)| functions[*i].clone())
                .collect(),
            kind,
        });
    }
    units.sort_by_key(|u| u.primary().address);
    units
}

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

/// The attribute names this backend publishes (bare names are in the driver's domain).
pub mod attrs {
    /// `pci` or `mdev`.
    pub const TYPE: &str = "type";
    /// PCI address of the (first) function.
    pub const PCI_ADDRESS: &str = "pciAddress";
    /// Vendor ID, 4 hex digits.
    pub const VENDOR_ID: &str = "vendorID";
    /// Device ID, 4 hex digits.
    pub const DEVICE_ID: &str = "deviceID";
    /// Class code, 6 hex digits.
    pub const CLASS: &str = "class";
    /// IOMMU group number.
    pub const IOMMU_GROUP: &str = "iommuGroup";
    /// NUMA node (absent when the kernel does not know).
    pub const NUMA_NODE: &str = "numaNode";
    /// The bound driver at discovery time.
    pub const DRIVER: &str = "driver";
    /// The resource name from the configuration.
    pub const RESOURCE_NAME: &str = "resourceName";
    /// `pf`, `vf` or `none`.
    pub const SRIOV_ROLE: &str = "sriovRole";
    /// The physical function of a VF.
    pub const PHYSFN: &str = "physfn";
    /// How many functions the device (IOMMU group) passes.
    pub const FUNCTIONS: &str = "functions";
    /// NVIDIA vGPU type number of a vGPU VF.
    pub const VGPU_TYPE: &str = "vgpuType";
    /// mdev instance UUID.
    pub const UUID: &str = "uuid";
    /// mdev type name (spaces → `_`).
    pub const MDEV_TYPE: &str = "mdevType";
    /// mdev type directory name, e.g. `nvidia-222`.
    pub const MDEV_TYPE_ID: &str = "mdevTypeID";
    /// PCI address of an mdev's parent.
    pub const PARENT_ADDRESS: &str = "parentAddress";
    /// Kubernetes' standard PCI bus ID attribute.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// Kubernetes' standard PCIe root attribute.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
}
