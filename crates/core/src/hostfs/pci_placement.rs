//! Where a sysfs device path sits on the PCI bus: its PCIe root complex and the nearest PCI
//! function at or above it.

use std::path::{Path, PathBuf};

/// The PCIe root complex of a canonical sysfs device path: the first component below
/// `/sys/devices` when it is named `pci<domain>:<bus>`, as Kubernetes' standard
/// `resource.kubernetes.io/pcieRoot` attribute defines it
/// (`/sys/devices/pci0000:00/0000:00:01.0/0000:07:00.0` → `pci0000:00`).
pub fn pcie_root_of(canonical: &Path) -> Option<String> {
    let rest = canonical.strip_prefix("/sys/devices").ok()?;
    let first = rest.components().next()?.as_os_str().to_str()?;
    let (domain, bus) = first.strip_prefix("pci")?.split_once(':')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(domain) && domain.len() >= 4 && bus.len() == 2 && hex(bus)).then(|| first.to_owned())
}

/// The nearest PCI function at or above a canonical sysfs device path: the longest prefix
/// whose last component is a PCI address (`/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1` →
/// `/sys/devices/pci0000:00/0000:00:14.0`, the USB controller).
pub fn pci_function_of(canonical: &Path) -> Option<PathBuf> {
    // dddd:bb:dd.f, with a domain of at least four hex digits.
    let is_bdf = |name: &str| {
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit());
        let Some((addr, func)) = name.rsplit_once('.') else {
            return false;
        };
        let mut parts = addr.split(':');
        let (Some(domain), Some(bus), Some(slot), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        domain.len() >= 4
            && hex(domain)
            && bus.len() == 2
            && hex(bus)
            && slot.len() == 2
            && hex(slot)
            && matches!(func.as_bytes(), [b'0'..=b'7'])
    };
    let mut found = None;
    let mut prefix = PathBuf::new();
    for c in canonical.components() {
        prefix.push(c);
        if c.as_os_str().to_str().is_some_and(is_bdf) {
            found = Some(prefix.clone());
        }
    }
    found
}
