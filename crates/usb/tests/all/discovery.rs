//! Discovery: what is read from sysfs, the attribute table, and how groups are formed.

use kubedev_core::hostfs::HostFs;
use kubedev_core::{AttributeValue, Device, DeviceSource};
use kubedev_testkit::machines::usb;
use kubedev_usb::read_usb_devices;

use crate::backend;

fn s(v: &str) -> AttributeValue {
    AttributeValue::String(v.into())
}

fn attr<'a>(d: &'a Device, id: &str) -> Option<&'a AttributeValue> {
    d.attribute(&format!("usb.kubedev.io/{id}"))
}

fn names(devices: &[Device]) -> Vec<&str> {
    devices.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn reads_devices_and_skips_root_hubs_and_interfaces() {
    let root = usb::three_devices().unwrap();
    let devices = read_usb_devices(&HostFs::new(root.path())).unwrap();
    let found: Vec<_> = devices
        .iter()
        .map(|d| {
            (
                d.sysfs_name.as_str(),
                d.vendor,
                d.product,
                d.busnum,
                d.devnum,
                d.node.as_str(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("1-1", 0x1050, 0x0407, 1, 2, "/dev/bus/usb/001/002"),
            ("1-2", 0x1050, 0x0407, 1, 3, "/dev/bus/usb/001/003"),
            ("2-1", 0x0403, 0x6001, 2, 2, "/dev/bus/usb/002/002"),
        ]
    );
    assert_eq!(devices[0].bcd_device, 0x0512);
    assert_eq!(devices[0].serial.as_deref(), Some("11111111"));
    assert_eq!(devices[2].manufacturer.as_deref(), Some("FTDI"));
    assert_eq!(devices[2].product_name.as_deref(), Some("FT232R USB UART"));
}

#[test]
fn no_usb_tree_means_no_devices() {
    let root = kubedev_testkit::hostroot::HostRoot::new().unwrap();
    assert!(
        read_usb_devices(&HostFs::new(root.path()))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn ports_sort_numerically() {
    let root = kubedev_testkit::hostroot::HostRoot::new().unwrap();
    usb::write_root_hub(&root, 1).unwrap();
    usb::write_root_hub(&root, 10).unwrap();
    let mut devs = vec![
        usb::yubikey(10, 1, 2, "a"),
        usb::yubikey(1, 10, 3, "b"),
        usb::yubikey(1, 2, 4, "c"),
    ];
    let mut nested = usb::yubikey(1, 2, 5, "d");
    nested.ports = vec![2, 1];
    devs.push(nested);
    for d in &devs {
        usb::write_device(&root, d).unwrap();
    }
    let found: Vec<String> = read_usb_devices(&HostFs::new(root.path()))
        .unwrap()
        .into_iter()
        .map(|d| d.sysfs_name)
        .collect();
    assert_eq!(found, ["1-2", "1-2.1", "1-10", "10-1"]);
}

#[tokio::test]
async fn attribute_table_of_a_single_device_instance() {
    let root = usb::three_devices().unwrap();
    let b = backend(
        &root,
        &[
            ("example.com/yubikey", &["1050:0407"]),
            ("example.com/serial", &["0403:6001"]),
        ],
    );
    let pools = b.discover().await.unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].name.as_str(), "node-a-usb");
    let devs = &pools[0].devices;
    assert_eq!(names(devs), ["yubikey-1-1", "yubikey-1-2", "serial-2-1"]);
    let d = &devs[0];
    assert!(d.health.is_healthy());
    let expect = [
        ("resource", s("example.com/yubikey")),
        ("deviceCount", AttributeValue::Int(1)),
        ("busnum", AttributeValue::Int(1)),
        ("vendorId", s("1050")),
        ("productId", s("0407")),
        ("bcdDevice", s("0512")),
        ("busDev", s("1:2")),
        ("portPath", s("1-1")),
        ("serial", s("11111111")),
        ("manufacturer", s("Yubico")),
        ("product", s("YubiKey OTP+FIDO+CCID")),
    ];
    for (id, value) in &expect {
        assert_eq!(attr(d, id), Some(value), "{id}");
    }
    // And the standard PCIe root of the controller.
    assert_eq!(
        d.attribute("resource.kubernetes.io/pcieRoot"),
        Some(&s("pci0000:00"))
    );
    assert_eq!(d.attributes.len(), expect.len() + 1, "{:?}", d.attributes);
    assert_eq!(attr(&devs[2], "busDev"), Some(&s("2:2")));
}

#[tokio::test]
async fn a_group_takes_all_its_members_and_lists_them_in_selector_order() {
    let root = usb::three_devices().unwrap();
    let b = backend(
        &root,
        &[("example.com/token-and-serial", &["0403:6001", "1050:0407"])],
    );
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["token-and-serial-2-1"]);
    let d = &devs[0];
    assert_eq!(attr(d, "deviceCount"), Some(&AttributeValue::Int(2)));
    assert_eq!(attr(d, "vendorId"), Some(&s("0403,1050")));
    assert_eq!(attr(d, "busDev"), Some(&s("2:2,1:2")));
    assert_eq!(attr(d, "portPath"), Some(&s("2-1,1-1")));
    assert_eq!(attr(d, "serial"), Some(&s("A50285BI,11111111")));
}

#[tokio::test]
async fn two_identical_groups_yield_two_instances() {
    // yubikey, ftdi, yubikey, ftdi on ports 1-1 .. 1-4.
    let root = usb::many_devices(4).unwrap();
    let b = backend(&root, &[("example.com/pair", &["1050:0407", "0403:6001"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["pair-1-1", "pair-1-3"]);
    assert_eq!(attr(&devs[0], "portPath"), Some(&s("1-1,1-2")));
    assert_eq!(attr(&devs[1], "portPath"), Some(&s("1-3,1-4")));
}

#[tokio::test]
async fn a_missing_member_means_fewer_instances() {
    let root = usb::many_devices(4).unwrap();
    // The second FTDI adapter (1-4) is gone from sysfs.
    root.remove("/sys/bus/usb/devices/1-4").unwrap();
    let b = backend(&root, &[("example.com/pair", &["1050:0407", "0403:6001"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["pair-1-1"]);

    // Two YubiKeys make one pair of YubiKeys; with one more needed, none.
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/keys", &["1050:0407", "1050:0407"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["keys-1-1"]);
    let b = backend(
        &root,
        &[("example.com/keys", &["1050:0407", "1050:0407", "1050:0407"])],
    );
    assert!(b.discover().await.unwrap()[0].devices.is_empty());
}

#[tokio::test]
async fn earlier_resources_take_their_devices_first() {
    let root = usb::three_devices().unwrap();
    let b = backend(
        &root,
        &[
            ("example.com/keys", &["1050:0407", "1050:0407"]),
            ("example.com/key", &["1050:0407"]),
        ],
    );
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["keys-1-1"]);
}

#[tokio::test]
async fn a_broken_device_is_skipped_and_the_others_stay() {
    let root = usb::three_devices().unwrap();
    root.file("/sys/bus/usb/devices/1-1/idVendor", "zzzz\n")
        .unwrap();
    root.remove("/sys/bus/usb/devices/2-1/devnum").unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["key-1-2"]);
}

#[tokio::test]
async fn hostile_devname_falls_back_to_the_bus_path() {
    let root = usb::three_devices().unwrap();
    root.file(
        "/sys/bus/usb/devices/1-1/uevent",
        "DEVNAME=../../etc/shadow\nDEVTYPE=usb_device\n",
    )
    .unwrap();
    let devices = read_usb_devices(&HostFs::new(root.path())).unwrap();
    assert_eq!(devices[0].node, "/dev/bus/usb/001/002");
}

#[tokio::test]
async fn ambiguous_lists_are_left_out() {
    let root = usb::three_devices().unwrap();
    root.file("/sys/bus/usb/devices/1-2/manufacturer", "Yubico, Inc.\n")
        .unwrap();
    let b = backend(&root, &[("example.com/keys", &["1050:0407", "1050:0407"])]);
    let d = b.discover().await.unwrap().remove(0).devices.remove(0);
    assert_eq!(attr(&d, "manufacturer"), None);
    assert_eq!(attr(&d, "serial"), Some(&s("11111111,22222222")));
}

#[tokio::test]
async fn a_missing_node_makes_the_instance_unhealthy_at_discovery() {
    let root = usb::three_devices().unwrap();
    root.remove("/dev/bus/usb/001/003").unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert!(devs[0].health.is_healthy());
    assert!(!devs[1].health.is_healthy());
    let reason = devs[1].health.reason.clone().unwrap();
    assert!(reason.contains("/dev/bus/usb/001/003"), "{reason}");
}

#[tokio::test]
async fn an_attribute_that_is_a_symlink_is_refused() {
    let root = usb::three_devices().unwrap();
    let dir = std::fs::canonicalize(root.join("/sys/bus/usb/devices/1-1")).unwrap();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "1050\n").unwrap();
    std::fs::remove_file(dir.join("idVendor")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("idVendor")).unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(names(&devs), ["key-1-2"]);
}

/// Read-only, against this machine's own `/sys`: every USB device found is an entry of
/// `/sys/bus/usb/devices` with the same IDs (a machine without USB finds none).
#[test]
fn this_machines_sysfs() {
    let found = read_usb_devices(&HostFs::new("/")).unwrap();
    let dir = std::path::Path::new("/sys/bus/usb/devices");
    for d in &found {
        let vendor = std::fs::read_to_string(dir.join(&d.sysfs_name).join("idVendor")).unwrap();
        assert_eq!(
            u16::from_str_radix(vendor.trim(), 16).unwrap(),
            d.vendor,
            "{}",
            d.sysfs_name
        );
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        let devices = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                !n.starts_with("usb") && !n.contains(':')
            })
            .count();
        assert_eq!(found.len(), devices);
    } else {
        assert!(found.is_empty());
    }
}

#[tokio::test]
async fn devices_carry_the_controllers_numa_node_and_pcie_root() {
    let root = usb::three_devices().unwrap();
    // Without numa_node the NUMA node is unknown; the PCIe root comes from the path alone.
    let devices = read_usb_devices(&HostFs::new(root.path())).unwrap();
    assert_eq!(devices[0].numa_node, None);
    assert_eq!(devices[0].pcie_root.as_deref(), Some("pci0000:00"));

    root.file("/sys/devices/pci0000:00/0000:00:14.0/numa_node", "1\n")
        .unwrap();
    let devices = read_usb_devices(&HostFs::new(root.path())).unwrap();
    assert!(
        devices.iter().all(|d| d.numa_node == Some(1)),
        "{devices:?}"
    );

    // A pair of YubiKeys on one controller: one NUMA node, one root; published as the
    // standard attributes.
    let b = backend(
        &root,
        &[("example.com/yubikey-pair", &["1050:0407", "1050:0407"])],
    );
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].numa_node, Some(1));
    assert_eq!(
        devs[0].attribute("resource.kubernetes.io/pcieRoot"),
        Some(&s("pci0000:00"))
    );

    // -1: the kernel does not know.
    root.file("/sys/devices/pci0000:00/0000:00:14.0/numa_node", "-1\n")
        .unwrap();
    let devices = read_usb_devices(&HostFs::new(root.path())).unwrap();
    assert_eq!(devices[0].numa_node, None);
}
