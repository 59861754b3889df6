//! Reading mdev instances and mdev parents (with their supported types) from sysfs.

use std::path::Path;

use kubedev_core::{HostFs, HostFsError};

use super::{MDEV_BUS, MDEV_DEVICES, MdevInstance, MdevParent, MdevType};
use crate::config::VendorDevice;
use crate::error::VfioError;
use crate::naming::{PciAddress, is_mdev_uuid, normalize_type_name};
use crate::pci::{link_name_opt, pcie_root_of};

/// Reads every mdev instance. A missing `/sys/bus/mdev` gives an empty list; an unreadable
/// instance is logged (warning, naming the file) and left out.
pub fn scan_mdevs(host: &HostFs) -> Result<Vec<MdevInstance>, VfioError> {
    let names = match host.list_dir(MDEV_DEVICES) {
        Ok(n) => n,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names {
        match read_instance(host, &name) {
            Ok(i) => out.push(i),
            Err(e) => {
                tracing::warn!(entry = %name, error = %kubedev_core::echo::Chain(&e), "skipping unreadable mdev instance")
            }
        }
    }
    Ok(out)
}

fn parse_err(path: &Path, value: &str, expected: &'static str) -> HostFsError {
    HostFsError::Parse {
        path: path.to_path_buf(),
        value: value.to_owned(),
        expected,
    }
}

fn read_instance(host: &HostFs, uuid: &str) -> Result<MdevInstance, VfioError> {
    let entry = Path::new(MDEV_DEVICES).join(uuid);
    if !is_mdev_uuid(uuid) {
        return Err(parse_err(&entry, uuid, "an entry named by a lowercase UUID").into());
    }
    let dir = host.canonicalize(&entry)?;
    let type_link = dir.join("mdev_type");
    let type_id = host.read_link_name(&type_link)?;
    let type_name = match host.read_attr_opt(type_link.join("name"))? {
        Some(n) if !n.trim().is_empty() => normalize_type_name(&n),
        _ => normalize_type_name(&type_id),
    };
    let parent_dir = dir
        .parent()
        .ok_or_else(|| parse_err(&entry, uuid, "an instance below its parent device"))?;
    let parent_name = parent_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let parent = PciAddress::parse(parent_name)
        .ok_or_else(|| parse_err(&entry, parent_name, "an instance below a PCI function"))?;
    let iommu_group = match link_name_opt(host, &dir.join("iommu_group"))? {
        None => None,
        Some(g) => Some(g.parse::<u32>().map_err(|_| {
            parse_err(
                &dir.join("iommu_group"),
                &g,
                "a link to a numbered IOMMU group",
            )
        })?),
    };
    let numa_node = read_numa(host, &parent_dir.join("numa_node"))?;
    Ok(MdevInstance {
        uuid: uuid.to_owned(),
        type_id,
        type_name,
        parent,
        iommu_group,
        numa_node,
        pcie_root: pcie_root_of(parent_dir),
    })
}

fn read_numa(host: &HostFs, p: &Path) -> Result<Option<i64>, HostFsError> {
    match host.read_dec(p) {
        Ok(n) if n >= 0 => Ok(Some(n)),
        Ok(_) => Ok(None),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads every mdev parent and its supported types. A missing `/sys/class/mdev_bus` gives an
/// empty list; an unreadable parent is logged and left out.
pub fn scan_mdev_parents(host: &HostFs) -> Result<Vec<MdevParent>, VfioError> {
    let names = match host.list_dir(MDEV_BUS) {
        Ok(n) => n,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names {
        match read_parent(host, &name) {
            Ok(p) => out.push(p),
            Err(e) => {
                tracing::warn!(entry = %name, error = %kubedev_core::echo::Chain(&e), "skipping unreadable mdev parent")
            }
        }
    }
    Ok(out)
}

fn read_parent(host: &HostFs, name: &str) -> Result<MdevParent, VfioError> {
    let entry = Path::new(MDEV_BUS).join(name);
    let address =
        PciAddress::parse(name).ok_or_else(|| parse_err(&entry, name, "a PCI address"))?;
    let dir = host.canonicalize(&entry)?;
    let vendor = host.read_hex(dir.join("vendor"))?;
    let device = host.read_hex(dir.join("device"))?;
    let ids = VendorDevice {
        vendor: u16::try_from(vendor)
            .map_err(|_| parse_err(&dir.join("vendor"), &vendor.to_string(), "a vendor ID"))?,
        device: u16::try_from(device)
            .map_err(|_| parse_err(&dir.join("device"), &device.to_string(), "a device ID"))?,
    };
    let types_dir = dir.join("mdev_supported_types");
    let mut types = Vec::new();
    for id in host.list_dir(&types_dir)? {
        let tdir = types_dir.join(&id);
        let name = match host.read_attr_opt(tdir.join("name"))? {
            Some(n) if !n.trim().is_empty() => normalize_type_name(&n),
            _ => normalize_type_name(&id),
        };
        let available_instances = match host.read_dec(tdir.join("available_instances")) {
            Ok(n) => u32::try_from(n).unwrap_or(0),
            Err(e) if e.is_not_found() => 0,
            Err(e) => return Err(e.into()),
        };
        let instances = match host.list_dir(tdir.join("devices")) {
            Ok(v) => v.into_iter().filter(|u| is_mdev_uuid(u)).collect(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        types.push(MdevType {
            id,
            name,
            available_instances,
            instances,
        });
    }
    Ok(MdevParent {
        address,
        ids,
        numa_node: read_numa(host, &dir.join("numa_node"))?,
        types,
    })
}
