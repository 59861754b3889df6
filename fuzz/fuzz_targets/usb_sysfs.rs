//! USB discovery over a sysfs tree whose attribute files hold arbitrary bytes: the reader never
//! panics, and a device it accepts has the IDs its files said.
#![no_main]

use libfuzzer_sys::fuzz_target;

const FILES: [&str; 9] = [
    "idVendor",
    "idProduct",
    "bcdDevice",
    "busnum",
    "devnum",
    "serial",
    "manufacturer",
    "product",
    "uevent",
];

fuzz_target!(|data: &[u8]| {
    let root = tempfile::tempdir().expect("temp dir");
    let dev = root
        .path()
        .join("sys/devices/pci0000:00/0000:00:14.0/usb1/1-1");
    std::fs::create_dir_all(&dev).expect("device dir");
    std::fs::create_dir_all(root.path().join("sys/bus/usb/devices")).expect("bus dir");
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:00/0000:00:14.0/usb1/1-1",
        root.path().join("sys/bus/usb/devices/1-1"),
    )
    .expect("link");
    // The input, split at 0xff bytes, fills the attribute files in order.
    let mut parts = data.split(|b| *b == 0xff);
    for name in FILES {
        if let Some(content) = parts.next() {
            std::fs::write(dev.join(name), content).expect("attribute");
        }
    }
    let host = kubedev_core::HostFs::new(root.path());
    if let Ok(devices) = kubedev_usb::read_usb_devices(&host) {
        for d in devices {
            let vendor = std::fs::read_to_string(dev.join("idVendor")).unwrap_or_default();
            assert_eq!(
                kubedev_core::hostfs::parse_hex(&vendor),
                Some(u64::from(d.vendor))
            );
        }
    }
});
