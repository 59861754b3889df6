//! Read-only discovery against this machine's own `/sys`.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use kubedev_core::HostFs;
use kubedev_vfio::scan;

/// `0x10de\n` → 0x10de, read without any of the backend's code.
fn hex(path: &Path) -> u16 {
    let s = std::fs::read_to_string(path).unwrap();
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap()
}

fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .map(|t| t.file_name().unwrap().to_string_lossy().into_owned())
}

#[test]
fn scan_of_the_real_sys_matches_sys_bus_pci_devices() {
    let dir = Path::new("/sys/bus/pci/devices");
    let Ok(rd) = std::fs::read_dir(dir) else {
        eprintln!("no /sys/bus/pci/devices on this machine: nothing to compare");
        assert!(scan(&HostFs::new("/")).unwrap().is_empty());
        return;
    };
    // What the kernel lists, read independently.
    let mut expected = BTreeMap::new();
    for e in rd {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let p = e.path();
        expected.insert(
            name,
            (
                hex(&p.join("vendor")),
                hex(&p.join("device")),
                link_name(&p.join("driver")),
                link_name(&p.join("iommu_group")).map(|g| g.parse::<u32>().unwrap()),
            ),
        );
    }
    let found: BTreeMap<String, _> = scan(&HostFs::new("/"))
        .unwrap()
        .into_iter()
        .map(|f| {
            (
                f.address.to_string(),
                (f.vendor_id, f.device_id, f.driver, f.iommu_group),
            )
        })
        .collect();
    assert_eq!(found, expected);
    // Every function's canonical path is under /sys/devices and names its PCIe root like the
    // kernel's own link does.
    for f in scan(&HostFs::new("/")).unwrap() {
        let target = std::fs::canonicalize(dir.join(f.address.to_string())).unwrap();
        assert_eq!(f.sysfs_path, target);
        let first = target
            .strip_prefix("/sys/devices")
            .unwrap()
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        if first.starts_with("pci") {
            assert_eq!(f.pcie_root.as_deref(), Some(first.as_str()));
        }
    }
}
