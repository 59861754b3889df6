//! Reading PCI functions from sysfs: every entry of `/sys/bus/pci/devices` with its IDs,
//! driver, IOMMU group, NUMA node and SR-IOV role.

use std::path::Path;

use kubedev_core::{HostFs, HostFsError};

use super::{PCI_DEVICES, PciFunction, SriovRole};
use crate::error::VfioError;
use crate::naming::PciAddress;

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
