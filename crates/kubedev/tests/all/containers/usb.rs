//! A USB device in a container: its node and variable, on a fake host root.

use kubedev_core::DeviceRef;
use kubedev_testkit::podman::{Container, FakeNode};

use super::{allocated, char_dev, dra_node, node_of, podman, run, stat_node};

#[cfg(feature = "usb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn usb_device_node_and_variable_on_a_fake_host_root() {
    use kubedev_testkit::machines::usb::{three_devices, three_devices_list};
    let podman = podman();
    let machine = three_devices().unwrap();
    let key = three_devices_list()
        .into_iter()
        .find(|d| d.serial.as_deref() == Some("22222222"))
        .unwrap();
    // The node the kernel would make: the numbers the device's uevent declares.
    let uevent = std::fs::read_to_string(
        machine.join(format!("/sys/bus/usb/devices/{}/uevent", key.sysfs_name())),
    )
    .unwrap();
    let field = |name: &str| -> u32 {
        uevent
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (major, minor) = (field("MAJOR"), field("MINOR"));
    assert_eq!((major, minor), (189, 2), "bus 1, device 3");
    machine.char_device(key.node(), major, minor).unwrap();
    let backends = "  usb:\n    resources:\n      - name: example.com/yubikey\n        selectors: [\"1050:0407\"]\n";
    let dir = tempfile::tempdir().unwrap();
    let node = dra_node(
        dir.path(),
        Some(machine.path()),
        "usb.example.com",
        backends,
    )
    .await;
    let inv = node.published().await;
    let dev = inv
        .devices()
        .find(|(_, d)| {
            d.attributes
                .values()
                .any(|v| v.to_string().contains("22222222"))
        })
        .map(|(p, d)| DeviceRef::new(p.name.clone(), d.name.clone()))
        .unwrap_or_else(|| panic!("no device carries serial 22222222: {inv:?}"));
    let uid = "5f1d2c3b-0000-4000-8000-00000000a006";
    let p = node.prepare(uid, vec![allocated(&dev)]).await;
    let _spec = podman.install_spec(&p.spec).unwrap();
    let script = format!(
        "{}echo \"list=$USB_RESOURCE_EXAMPLE_COM_YUBIKEY\"\nls /dev/bus/usb/*/* | tr '\\n' ' ' | sed 's/^/nodes=/'; echo\n",
        stat_node("key", "/dev/bus/usb/001/003")
    );
    let out = run(
        &podman,
        Container::new(script)
            .devices(&p.ids)
            .node(FakeNode::from_host_root(machine.path(), &key.node()).unwrap())
            .check(&p.spec, &p.ids),
    );
    out.assert_ok();
    assert_eq!(node_of(&out, "key"), char_dev(189, 2), "{}", out.report());
    assert_eq!(out.value("list"), Some("1:3"), "{}", out.report());
    assert_eq!(
        out.value("nodes").map(str::trim),
        Some("/dev/bus/usb/001/003"),
        "only the allocated key's node"
    );
    node.stop().await;
}
