//! Names: PCI addresses, mdev UUIDs, device names and the environment variables KubeVirt's
//! launcher reads.

use std::fmt;
use std::str::FromStr;

use kubedev_core::DeviceName;

/// The backend's name (logs, configuration, pool suffix).
pub const BACKEND_NAME: &str = "vfio";

/// A PCI address in extended BDF notation, `dddd:bb:dd.f` (as sysfs spells it: lowercase hex;
/// the domain has 4 digits, or more on hosts with large segment numbers such as Intel VMD's
/// `10000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus.
    pub bus: u8,
    /// Device (slot), 0..=31.
    pub device: u8,
    /// Function, 0..=7.
    pub function: u8,
}

impl PciAddress {
    /// Parses `dddd:bb:dd.f` exactly (lowercase hex as sysfs writes it, a domain of 4 to 8
    /// digits); anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        fn hex(part: &str, min: usize, max: usize) -> Option<u32> {
            let ok = (min..=max).contains(&part.len())
                && part
                    .bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
            if ok {
                u32::from_str_radix(part, 16).ok()
            } else {
                None
            }
        }
        let (rest, function) = s.rsplit_once('.')?;
        let mut parts = rest.split(':');
        let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        // sysfs prints the domain with "%04x": more than 4 digits never start with 0.
        if domain.len() > 4 && domain.starts_with('0') {
            return None;
        }
        let domain = hex(domain, 4, 8)?;
        let bus = u8::try_from(hex(bus, 2, 2)?).ok()?;
        let device = u8::try_from(hex(device, 2, 2)?).ok()?;
        let function = u8::try_from(hex(function, 1, 1)?).ok()?;
        if device > 31 || function > 7 {
            return None;
        }
        Some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }

    /// The device name for this function: `pci-0000-3b-00-0` for `0000:3b:00.0`.
    pub fn device_name(&self) -> Option<DeviceName> {
        DeviceName::new(format!(
            "pci-{:04x}-{:02x}-{:02x}-{:x}",
            self.domain, self.bus, self.device, self.function
        ))
        .ok()
    }

    /// Whether the address fits Kubernetes' `pciBusID` format (a 4-digit domain).
    pub fn is_standard_bdf(&self) -> bool {
        self.domain <= 0xffff
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PciAddress::parse(s).ok_or_else(|| format!("{s:?} is not a PCI address (dddd:bb:dd.f)"))
    }
}

/// True when `s` is a UUID as mdev uses them: `8-4-4-4-12` hex digits, lowercase.
pub fn is_mdev_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| {
            p.len() == n
                && p.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        })
}

/// The device name of an mdev instance: `mdev-<uuid>`.
pub fn mdev_device_name(uuid: &str) -> Option<DeviceName> {
    if !is_mdev_uuid(uuid) {
        return None;
    }
    DeviceName::new(format!("mdev-{uuid}")).ok()
}

/// An mdev type name as published: surrounding whitespace trimmed, inner spaces replaced by
/// `_` (`GRID T4-1B` → `GRID_T4-1B`).
pub fn normalize_type_name(s: &str) -> String {
    s.trim().replace(' ', "_")
}

/// The prefix of the variable that lists PCI addresses.
pub const PCI_RESOURCE_PREFIX: &str = "PCI_RESOURCE";
/// The prefix of the variable that lists mdev UUIDs.
pub const MDEV_PCI_RESOURCE_PREFIX: &str = "MDEV_PCI_RESOURCE";

/// The environment variable KubeVirt's launcher reads for `resource`: `<prefix>_<NAME>` where
/// NAME is the resource name upper-cased with `/` and `.` replaced by `_`
/// (`nvidia.com/GA102GL_A10` → `PCI_RESOURCE_NVIDIA_COM_GA102GL_A10`).
pub fn resource_env_name(prefix: &str, resource: &str) -> String {
    let name: String = resource
        .chars()
        .map(|c| match c {
            '/' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    format!("{prefix}_{name}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_parse_strictly_and_name_devices() {
        let a = PciAddress::parse("0000:3b:00.0").unwrap();
        assert_eq!(a.bus, 0x3b);
        assert_eq!(a.to_string(), "0000:3b:00.0");
        assert_eq!(a.device_name().unwrap().as_str(), "pci-0000-3b-00-0");
        assert!(a.is_standard_bdf());
        let b = PciAddress::parse("ffff:ff:1f.7").unwrap();
        assert_eq!(b.device_name().unwrap().as_str(), "pci-ffff-ff-1f-7");
        let vmd = PciAddress::parse("10000:e1:00.0").unwrap();
        assert_eq!(vmd.to_string(), "10000:e1:00.0");
        assert_eq!(vmd.device_name().unwrap().as_str(), "pci-10000-e1-00-0");
        assert!(!vmd.is_standard_bdf());
        for bad in [
            "",
            "0000:3b:00",
            "0000:3B:00.0",
            "000:3b:00.0",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000-3b-00-0",
            "0000:3b:00.0\n",
            "../../etc/x",
            "+000:3b:00.0",
            "000:3b:00.0",
            "123456789:3b:00.0",
            "0000:3b:00:00.0",
            "0000:3b:00.0.1",
            "0000:3b:00.",
            "00000:3b:00.0",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad:?}");
        }
        assert!(a < b);
    }

    #[test]
    fn env_names_follow_kubevirt() {
        assert_eq!(
            resource_env_name(PCI_RESOURCE_PREFIX, "nvidia.com/GA102GL_A10"),
            "PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"
        );
        assert_eq!(
            resource_env_name(MDEV_PCI_RESOURCE_PREFIX, "nvidia.com/GRID_T4-1B"),
            "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1B"
        );
        assert_eq!(
            resource_env_name(PCI_RESOURCE_PREFIX, "intel.com/sriov.vf"),
            "PCI_RESOURCE_INTEL_COM_SRIOV_VF"
        );
    }

    #[test]
    fn mdev_names() {
        let u = "4b20d080-1b54-4048-85b3-a6a62d165c01";
        assert!(is_mdev_uuid(u));
        assert_eq!(mdev_device_name(u).unwrap().as_str(), format!("mdev-{u}"));
        assert!(!is_mdev_uuid("4B20D080-1b54-4048-85b3-a6a62d165c01"));
        assert!(!is_mdev_uuid("4b20d080-1b54-4048-85b3"));
        assert!(mdev_device_name("../x").is_none());
        assert_eq!(normalize_type_name(" GRID T4-1B\n"), "GRID_T4-1B");
    }
}
