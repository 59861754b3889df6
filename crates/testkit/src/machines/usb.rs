//! Fake USB machines: `/sys/bus/usb/devices` and `/dev/bus/usb` laid out as the kernel does.
//!
//! A real machine's USB tree looks like this (one xHCI controller at PCI `0000:00:14.0`):
//!
//! ```text
//! /sys/bus/usb/devices/usb1    -> ../../../devices/pci0000:00/0000:00:14.0/usb1         (root hub)
//! /sys/bus/usb/devices/1-0:1.0 -> ../../../devices/pci0000:00/0000:00:14.0/usb1/1-0:1.0 (its interface)
//! /sys/bus/usb/devices/1-1     -> ../../../devices/pci0000:00/0000:00:14.0/usb1/1-1     (a device)
//! /sys/bus/usb/devices/1-1:1.0 -> ../../../devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0
//! /dev/bus/usb/001/001, /dev/bus/usb/001/002                                            (nodes)
//! ```
//!
//! Device directories hold `idVendor`, `idProduct`, `bcdDevice` (four hex digits), `busnum`,
//! `devnum` (decimal), optional `serial`, `manufacturer` and `product`, and a `uevent` with
//! `DEVNAME=bus/usb/BBB/DDD`. Device nodes are regular files standing in for character devices.

use std::io;

use crate::hostroot::HostRoot;

/// The PCI function of the fake xHCI controller every bus hangs off (a real xHCI controller has
/// two: a USB 2 bus and a USB 3 bus).
const CONTROLLER: &str = "/sys/devices/pci0000:00/0000:00:14.0";

/// One USB device (not a root hub) in a fake tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeUsbDevice {
    /// The bus number (1 for `usb1`).
    pub bus: u32,
    /// The port chain below the root hub, e.g. `[1]` for `1-1`, `[1, 4]` for `1-1.4`.
    pub ports: Vec<u32>,
    /// The device number on its bus (2 for the first device after the root hub).
    pub devnum: u32,
    /// `idVendor`.
    pub vendor: u16,
    /// `idProduct`.
    pub product: u16,
    /// `bcdDevice`.
    pub bcd_device: u16,
    /// `serial`, if the device has one.
    pub serial: Option<String>,
    /// `manufacturer`, if the device reports one.
    pub manufacturer: Option<String>,
    /// `product` (the product string), if the device reports one.
    pub product_name: Option<String>,
}

impl FakeUsbDevice {
    /// The sysfs name, e.g. `1-1` or `1-1.4`.
    pub fn sysfs_name(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u32::to_string).collect();
        format!("{}-{}", self.bus, ports.join("."))
    }

    /// The device node as on the host, e.g. `/dev/bus/usb/001/002`.
    pub fn node(&self) -> String {
        format!("/dev/bus/usb/{:03}/{:03}", self.bus, self.devnum)
    }

    /// The `bus:dev` pair in decimal, e.g. `1:2`.
    pub fn bus_dev(&self) -> String {
        format!("{}:{}", self.bus, self.devnum)
    }
}

/// A YubiKey 5 (`1050:0407`), one of the two identical devices of [`three_devices`].
pub fn yubikey(bus: u32, port: u32, devnum: u32, serial: &str) -> FakeUsbDevice {
    FakeUsbDevice {
        bus,
        ports: vec![port],
        devnum,
        vendor: 0x1050,
        product: 0x0407,
        bcd_device: 0x0512,
        serial: Some(serial.into()),
        manufacturer: Some("Yubico".into()),
        product_name: Some("YubiKey OTP+FIDO+CCID".into()),
    }
}

/// An FTDI FT232R serial adapter (`0403:6001`).
pub fn ftdi_serial(bus: u32, port: u32, devnum: u32, serial: &str) -> FakeUsbDevice {
    FakeUsbDevice {
        bus,
        ports: vec![port],
        devnum,
        vendor: 0x0403,
        product: 0x6001,
        bcd_device: 0x0600,
        serial: Some(serial.into()),
        manufacturer: Some("FTDI".into()),
        product_name: Some("FT232R USB UART".into()),
    }
}

/// The sysfs directory of bus `bus`'s root hub, e.g. `/sys/devices/pci0000:00/0000:00:14.0/usb1`.
fn hub_dir(bus: u32) -> String {
    format!("{CONTROLLER}/usb{bus}")
}

/// Writes the root hub of bus `bus` (`usbN`, its interface `N-0:1.0`, `/dev/bus/usb/NNN/001`).
pub fn write_root_hub(root: &HostRoot, bus: u32) -> io::Result<()> {
    let dir = hub_dir(bus);
    let attrs = [
        ("idVendor", "1d6b".to_string()),
        ("idProduct", "0002".to_string()),
        ("bcdDevice", "0608".to_string()),
        ("busnum", bus.to_string()),
        ("devnum", "1".to_string()),
        ("manufacturer", "Linux 6.8.0 xhci-hcd".to_string()),
        ("product", "xHCI Host Controller".to_string()),
    ];
    for (name, value) in attrs {
        root.file(format!("{dir}/{name}"), format!("{value}\n"))?;
    }
    root.file(
        format!("{dir}/uevent"),
        format!(
            "MAJOR=189\nMINOR={}\nDEVNAME=bus/usb/{bus:03}/001\nDEVTYPE=usb_device\n\
             DRIVER=usb\nPRODUCT=1d6b/2/608\nTYPE=9/0/1\nBUSNUM={bus:03}\nDEVNUM=001\n",
            bus.saturating_sub(1) * 128
        ),
    )?;
    let iface = format!("{bus}-0:1.0");
    root.file(
        format!("{dir}/{iface}/uevent"),
        "DEVTYPE=usb_interface\nDRIVER=hub\nINTERFACE=9/0/0\n",
    )?;
    root.file(format!("{dir}/{iface}/bInterfaceClass"), "09\n")?;
    root.link(
        format!("/sys/bus/usb/devices/usb{bus}"),
        format!("../../..{}", dir.trim_start_matches("/sys")),
    )?;
    root.link(
        format!("/sys/bus/usb/devices/{iface}"),
        format!("../../..{}/{iface}", dir.trim_start_matches("/sys")),
    )?;
    root.device_node(format!("/dev/bus/usb/{bus:03}/001"))?;
    Ok(())
}

/// Writes one device below its bus's root hub (which must exist): sysfs directory, bus link,
/// one interface, and the device node.
pub fn write_device(root: &HostRoot, dev: &FakeUsbDevice) -> io::Result<()> {
    let name = dev.sysfs_name();
    // A device behind hubs sits in its parent's directory: 1-1.4 lives in usb1/1-1/1-1.4.
    let mut dir = hub_dir(dev.bus);
    for depth in 1..=dev.ports.len() {
        let partial = FakeUsbDevice {
            ports: dev.ports[..depth].to_vec(),
            ..dev.clone()
        };
        dir = format!("{dir}/{}", partial.sysfs_name());
    }
    let mut attrs = vec![
        ("idVendor", format!("{:04x}", dev.vendor)),
        ("idProduct", format!("{:04x}", dev.product)),
        ("bcdDevice", format!("{:04x}", dev.bcd_device)),
        ("busnum", dev.bus.to_string()),
        ("devnum", dev.devnum.to_string()),
        ("speed", "12".to_string()),
        (
            "devpath",
            name.split_once('-').map(|x| x.1).unwrap_or("").into(),
        ),
    ];
    if let Some(s) = &dev.serial {
        attrs.push(("serial", s.clone()));
    }
    if let Some(s) = &dev.manufacturer {
        attrs.push(("manufacturer", s.clone()));
    }
    if let Some(s) = &dev.product_name {
        attrs.push(("product", s.clone()));
    }
    for (attr, value) in attrs {
        root.file(format!("{dir}/{attr}"), format!("{value}\n"))?;
    }
    root.file(
        format!("{dir}/uevent"),
        format!(
            "MAJOR=189\nMINOR={}\nDEVNAME=bus/usb/{:03}/{:03}\nDEVTYPE=usb_device\nDRIVER=usb\n\
             PRODUCT={:x}/{:x}/{:x}\nTYPE=0/0/0\nBUSNUM={:03}\nDEVNUM={:03}\n",
            dev.bus.saturating_sub(1) * 128 + dev.devnum.saturating_sub(1),
            dev.bus,
            dev.devnum,
            dev.vendor,
            dev.product,
            dev.bcd_device,
            dev.bus,
            dev.devnum
        ),
    )?;
    let iface = format!("{name}:1.0");
    root.file(
        format!("{dir}/{iface}/uevent"),
        "DEVTYPE=usb_interface\nDRIVER=usbhid\nINTERFACE=3/1/1\n",
    )?;
    root.file(format!("{dir}/{iface}/bInterfaceClass"), "03\n")?;
    let rel = dir.trim_start_matches("/sys");
    root.link(
        format!("/sys/bus/usb/devices/{name}"),
        format!("../../..{rel}"),
    )?;
    root.link(
        format!("/sys/bus/usb/devices/{iface}"),
        format!("../../..{rel}/{iface}"),
    )?;
    root.device_node(dev.node())?;
    Ok(())
}

/// The devices of [`three_devices`]: two identical YubiKeys on bus 1 (ports 1 and 2, device
/// numbers 2 and 3) and an FTDI serial adapter on bus 2 (port 1, device number 2).
pub fn three_devices_list() -> Vec<FakeUsbDevice> {
    vec![
        yubikey(1, 1, 2, "11111111"),
        yubikey(1, 2, 3, "22222222"),
        ftdi_serial(2, 1, 2, "A50285BI"),
    ]
}

/// A host root with two root hubs and the three devices of [`three_devices_list`].
pub fn three_devices() -> io::Result<HostRoot> {
    let root = HostRoot::new()?;
    write_root_hub(&root, 1)?;
    write_root_hub(&root, 2)?;
    for dev in three_devices_list() {
        write_device(&root, &dev)?;
    }
    Ok(root)
}

/// `n` devices spread over buses of at most 16 ports each; even ones are YubiKeys, odd ones FTDI
/// adapters, each with a distinct serial. Device `i` sits on bus `i / 16 + 1`, port
/// `i % 16 + 1`, device number `i % 16 + 2`.
pub fn many_devices_list(n: usize) -> Vec<FakeUsbDevice> {
    (0..n)
        .map(|i| {
            let bus = u32::try_from(i / 16 + 1).unwrap_or(u32::MAX);
            let port = u32::try_from(i % 16 + 1).unwrap_or(1);
            let serial = format!("SN{i:06}");
            if i % 2 == 0 {
                yubikey(bus, port, port + 1, &serial)
            } else {
                ftdi_serial(bus, port, port + 1, &serial)
            }
        })
        .collect()
}

/// A host root holding the devices of [`many_devices_list`] and their root hubs.
pub fn many_devices(n: usize) -> io::Result<HostRoot> {
    let root = HostRoot::new()?;
    let devices = many_devices_list(n);
    let mut buses: Vec<u32> = devices.iter().map(|d| d.bus).collect();
    buses.dedup();
    for bus in buses {
        write_root_hub(&root, bus)?;
    }
    for dev in &devices {
        write_device(&root, dev)?;
    }
    Ok(root)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn three_devices_look_like_sysfs() {
        let root = three_devices().unwrap();
        let link = std::fs::read_link(root.join("/sys/bus/usb/devices/1-1")).unwrap();
        assert_eq!(
            link.to_str().unwrap(),
            "../../../devices/pci0000:00/0000:00:14.0/usb1/1-1"
        );
        let vendor =
            std::fs::read_to_string(root.join("/sys/bus/usb/devices/1-2/idVendor")).unwrap();
        assert_eq!(vendor, "1050\n");
        let uevent = std::fs::read_to_string(root.join("/sys/bus/usb/devices/2-1/uevent")).unwrap();
        assert!(uevent.contains("DEVNAME=bus/usb/002/002\n"), "{uevent}");
        assert!(root.join("/dev/bus/usb/001/003").exists());
        assert!(root.join("/sys/bus/usb/devices/1-1:1.0/uevent").exists());
        assert!(root.join("/sys/bus/usb/devices/usb2/idProduct").exists());
    }

    #[test]
    fn devices_behind_hubs_nest_in_their_parent() {
        let root = HostRoot::new().unwrap();
        write_root_hub(&root, 1).unwrap();
        let mut dev = yubikey(1, 1, 5, "x");
        dev.ports = vec![1, 4];
        write_device(&root, &dev).unwrap();
        let link = std::fs::read_link(root.join("/sys/bus/usb/devices/1-1.4")).unwrap();
        assert!(link.ends_with("usb1/1-1/1-1.4"), "{}", link.display());
        assert!(root.join("/sys/bus/usb/devices/1-1.4/idVendor").exists());
    }

    #[test]
    fn many_devices_spread_over_buses() {
        let list = many_devices_list(64);
        assert_eq!(list.len(), 64);
        assert_eq!(list[17].sysfs_name(), "2-2");
        assert_eq!(list[17].node(), "/dev/bus/usb/002/003");
        let root = many_devices(20).unwrap();
        assert!(root.join("/dev/bus/usb/002/005").exists());
    }
}
