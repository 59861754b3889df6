//! Reading USB devices from `/sys/bus/usb/devices`.

use std::cmp::Ordering;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use kubedev_core::hostfs::{HostFs, HostFsError, parse_dec, parse_hex, parse_uevent};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Where the kernel lists USB devices and interfaces.
pub const SYSFS_USB_DEVICES: &str = "/sys/bus/usb/devices";

/// Where device nodes of USB devices live (`BBB/DDD` below it).
pub const DEV_BUS_USB: &str = "/dev/bus/usb";

/// One USB device as sysfs describes it (root hubs and interfaces are never one).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UsbDevice {
    /// The sysfs name: bus number and port chain, e.g. `1-1` or `1-1.4`.
    pub sysfs_name: String,
    /// `idVendor`.
    pub vendor: u16,
    /// `idProduct`.
    pub product: u16,
    /// `bcdDevice` (the device's release number, binary-coded decimal).
    pub bcd_device: u16,
    /// `busnum`.
    pub busnum: u32,
    /// `devnum` (changes each time the device is plugged in).
    pub devnum: u32,
    /// `serial`, if the device has one.
    pub serial: Option<String>,
    /// `manufacturer`, if the device reports one.
    pub manufacturer: Option<String>,
    /// `product` (the product string), if the device reports one.
    pub product_name: Option<String>,
    /// The device node as a host path, `/dev/` + the uevent's `DEVNAME`
    /// (`/dev/bus/usb/BBB/DDD` when the uevent has none).
    pub node: String,
    /// The NUMA node of the PCI USB controller the device hangs off, when the kernel knows it.
    pub numa_node: Option<i64>,
    /// The PCIe root complex of that controller (`pci0000:00`), when it is on PCI.
    pub pcie_root: Option<String>,
    /// The sort key: bus number, then the port numbers of the chain.
    port_key: (u32, Vec<u32>),
}

impl UsbDevice {
    /// `bus:dev` in decimal, e.g. `1:2` (the form the USB env variable lists).
    pub fn bus_dev(&self) -> String {
        format!("{}:{}", self.busnum, self.devnum)
    }

    /// The port path as used in device names: the sysfs name with `.` replaced by `-`
    /// (`1-1.4` → `1-1-4`). Stable while the device stays in the same port.
    pub fn port_label(&self) -> String {
        self.sysfs_name.replace('.', "-")
    }
}

impl PartialOrd for UsbDevice {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for UsbDevice {
    /// By bus number, then port chain numerically (`1-2` before `1-10`, `1-1` before `1-1.1`).
    fn cmp(&self, other: &Self) -> Ordering {
        self.port_key
            .cmp(&other.port_key)
            .then_with(|| self.sysfs_name.cmp(&other.sysfs_name))
    }
}

/// What a sysfs name under `/sys/bus/usb/devices` is.
#[derive(Debug, PartialEq, Eq)]
enum EntryKind {
    /// `usbN`.
    RootHub,
    /// `B-P.P:C.I`.
    Interface,
    /// `B-P.P`, with its sort key.
    Device(u32, Vec<u32>),
    /// Anything else.
    Unknown,
}

fn classify(name: &str) -> EntryKind {
    if name.starts_with("usb") {
        return EntryKind::RootHub;
    }
    if name.contains(':') {
        return EntryKind::Interface;
    }
    let Some((bus, ports)) = name.split_once('-') else {
        return EntryKind::Unknown;
    };
    let Ok(bus) = bus.parse::<u32>() else {
        return EntryKind::Unknown;
    };
    let ports: Option<Vec<u32>> = ports.split('.').map(|p| p.parse().ok()).collect();
    match ports {
        Some(p) if !p.is_empty() => EntryKind::Device(bus, p),
        _ => EntryKind::Unknown,
    }
}

/// True when `devname` (a uevent `DEVNAME`) is a plain relative path without `.` or `..`
/// components, so `/dev/` + it stays in `/dev`.
fn safe_devname(devname: &str) -> bool {
    !devname.is_empty()
        && !devname.starts_with('/')
        && devname
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && devname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.'))
}

/// Reads every USB device under `/sys/bus/usb/devices`, sorted by bus and port path.
///
/// Root hubs (`usbN`) and interfaces (`1-1:1.0`) are skipped. A device whose attributes cannot be
/// read or parsed is logged (naming the file) and skipped; the others are returned. A host
/// without `/sys/bus/usb/devices` has no USB devices. Only listing the directory itself can fail.
pub fn read_usb_devices(host: &HostFs) -> Result<Vec<UsbDevice>, HostFsError> {
    if !host.exists(SYSFS_USB_DEVICES) {
        tracing::debug!(path = SYSFS_USB_DEVICES, "no USB devices on this host");
        return Ok(Vec::new());
    }
    let mut devices = Vec::new();
    for name in host.list_dir(SYSFS_USB_DEVICES)? {
        let (bus, ports) = match classify(&name) {
            EntryKind::Device(bus, ports) => (bus, ports),
            EntryKind::RootHub | EntryKind::Interface => continue,
            EntryKind::Unknown => {
                tracing::debug!(name, "skipping unrecognised entry of {SYSFS_USB_DEVICES}");
                continue;
            }
        };
        match read_device(host, &name, (bus, ports)) {
            Ok(dev) => devices.push(dev),
            Err(error) => {
                tracing::warn!(device = name, %error, "skipping USB device");
            }
        }
    }
    devices.sort();
    Ok(devices)
}

/// A device's sysfs directory, opened once: its path is resolved inside the host root, then
/// every attribute is opened relative to it with `O_NOFOLLOW`, so an attribute that is a
/// symbolic link is refused and no read leaves the root. (Resolving each attribute's full path
/// instead costs a dozen `lstat`s per attribute behind the `/sys/bus/usb/devices` link.)
struct DevDir {
    fd: OwnedFd,
    host_dir: PathBuf,
    /// Where the directory really is, as a host path (`/sys/devices/pci…/usb1/1-1`).
    canonical: PathBuf,
}

impl DevDir {
    fn open(host: &HostFs, host_dir: PathBuf) -> Result<Self, HostFsError> {
        let canonical = host.canonicalize(&host_dir)?;
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(host.join(&canonical), flags, Mode::empty())
            .map_err(|e| io_error(&host_dir, e))?;
        Ok(DevDir {
            fd,
            host_dir,
            canonical,
        })
    }

    /// The attribute's content, surrounding white space removed; `None` when it does not exist.
    fn read_opt(&self, attr: &str) -> Result<Option<String>, HostFsError> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, attr, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io_error(&self.host_dir.join(attr), e)),
        };
        let mut text = String::new();
        std::fs::File::from(fd)
            .read_to_string(&mut text)
            .map_err(|e| io_error(&self.host_dir.join(attr), e))?;
        Ok(Some(text.trim().to_string()))
    }

    fn read(&self, attr: &str) -> Result<String, HostFsError> {
        self.read_opt(attr)?
            .ok_or_else(|| io_error(&self.host_dir.join(attr), Errno::NOENT))
    }

    fn parse<T>(
        &self,
        attr: &str,
        parse: impl Fn(&str) -> Option<T>,
        expected: &'static str,
    ) -> Result<T, HostFsError> {
        let v = self.read(attr)?;
        parse(&v).ok_or_else(|| HostFsError::Parse {
            path: self.host_dir.join(attr),
            value: v.chars().take(64).collect(),
            expected,
        })
    }
}

fn io_error(path: &Path, e: impl Into<std::io::Error>) -> HostFsError {
    let e: std::io::Error = e.into();
    HostFsError::Io {
        path: path.to_path_buf(),
        kind: e.kind(),
        error: kubedev_core::echo::chain(&e),
    }
}

fn read_device(
    host: &HostFs,
    name: &str,
    port_key: (u32, Vec<u32>),
) -> Result<UsbDevice, HostFsError> {
    let dir = DevDir::open(host, Path::new(SYSFS_USB_DEVICES).join(name))?;
    let hex16 = |attr: &str| {
        dir.parse(
            attr,
            |v| parse_hex(v).and_then(|n| u16::try_from(n).ok()),
            "a 16-bit hexadecimal number",
        )
    };
    let dec32 = |attr: &str| {
        dir.parse(
            attr,
            |v| parse_dec(v).and_then(|n| u32::try_from(n).ok()),
            "a non-negative 32-bit decimal number",
        )
    };
    let text = |attr: &str| -> Option<String> {
        match dir.read_opt(attr) {
            Ok(v) => v.filter(|s| !s.is_empty()),
            Err(error) => {
                tracing::debug!(device = name, attr, %error, "unreadable optional attribute");
                None
            }
        }
    };
    let vendor = hex16("idVendor")?;
    let product = hex16("idProduct")?;
    let bcd_device = hex16("bcdDevice")?;
    let busnum = dec32("busnum")?;
    let devnum = dec32("devnum")?;
    let fallback = format!("{DEV_BUS_USB}/{busnum:03}/{devnum:03}");
    let uevent_path = dir.host_dir.join("uevent");
    let node = match dir.read("uevent") {
        Ok(text) => match parse_uevent(&text) {
            Ok(map) => match map.get("DEVNAME") {
                Some(devname) if safe_devname(devname) => format!("/dev/{devname}"),
                Some(devname) => {
                    tracing::warn!(path = %uevent_path.display(), devname, "unsafe DEVNAME; using {fallback}");
                    fallback
                }
                None => fallback,
            },
            Err(error) => {
                return Err(HostFsError::Parse {
                    path: uevent_path,
                    value: kubedev_core::echo::chain(&error),
                    expected: "KEY=VALUE lines",
                });
            }
        },
        Err(error) => {
            tracing::debug!(%error, "no uevent; using {fallback}");
            fallback
        }
    };
    // Where the device hangs off: the PCI controller above its sysfs directory.
    let pcie_root = kubedev_core::hostfs::pcie_root_of(&dir.canonical);
    let numa_node = kubedev_core::hostfs::pci_function_of(&dir.canonical)
        .and_then(|f| host.read_dec(f.join("numa_node")).ok())
        .filter(|n| *n >= 0);
    Ok(UsbDevice {
        sysfs_name: name.to_string(),
        numa_node,
        pcie_root,
        vendor,
        product,
        bcd_device,
        busnum,
        devnum,
        serial: text("serial"),
        manufacturer: text("manufacturer"),
        product_name: text("product"),
        node,
        port_key,
    })
}

/// Lists the device nodes present under `/dev/bus/usb` (`/dev/bus/usb/BBB/DDD`), sorted.
pub(crate) fn list_nodes(host: &HostFs) -> Vec<String> {
    let mut nodes = Vec::new();
    let Ok(buses) = host.list_dir(DEV_BUS_USB) else {
        return nodes;
    };
    for bus in buses {
        let dir = format!("{DEV_BUS_USB}/{bus}");
        if let Ok(devs) = host.list_dir(&dir) {
            nodes.extend(devs.into_iter().map(|d| format!("{dir}/{d}")));
        }
    }
    nodes.sort();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_sysfs_names() {
        assert_eq!(classify("usb1"), EntryKind::RootHub);
        assert_eq!(classify("1-0:1.0"), EntryKind::Interface);
        assert_eq!(classify("1-1:1.0"), EntryKind::Interface);
        assert_eq!(classify("1-1"), EntryKind::Device(1, vec![1]));
        assert_eq!(classify("3-1.4.2"), EntryKind::Device(3, vec![1, 4, 2]));
        assert_eq!(classify("x-1"), EntryKind::Unknown);
        assert_eq!(classify("1-"), EntryKind::Unknown);
        assert_eq!(classify("1-1..2"), EntryKind::Unknown);
    }

    #[test]
    fn devnames_must_stay_in_dev() {
        assert!(safe_devname("bus/usb/001/002"));
        for bad in [
            "",
            "/etc/passwd",
            "bus/../../etc",
            "bus//x",
            "./x",
            "bus/usb/001/002\n",
        ] {
            assert!(!safe_devname(bad), "{bad:?}");
        }
    }
}
