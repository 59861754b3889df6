//! Preparing: device nodes, permissions and the env variable.

use kubedev_core::{AllocatedDevice, Consumer, ContainerEdits, DeviceSource, Preparer};
use kubedev_testkit::machines::usb;

use crate::{backend, dref};

fn alloc(name: &str) -> AllocatedDevice {
    AllocatedDevice::new(dref(name))
}

fn consumer() -> Consumer {
    Consumer::Container {
        resource: "example.com/yubikey-pair".into(),
    }
}

#[tokio::test]
async fn a_group_gets_all_its_nodes_and_one_env_list() {
    let root = usb::three_devices().unwrap();
    let b = backend(
        &root,
        &[("example.com/yubikey-pair", &["1050:0407", "1050:0407"])],
    );
    b.discover().await.unwrap();
    let out = b
        .prepare(&consumer(), &[alloc("yubikey-pair-1-1")])
        .await
        .unwrap();
    assert_eq!(out.len(), 1);
    let e = &out[0].edits;
    assert_eq!(e.env.len(), 1);
    assert_eq!(e.env["USB_RESOURCE_EXAMPLE_COM_YUBIKEY-PAIR"], "1:2,1:3");
    let nodes: Vec<_> = e
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.permissions.as_deref()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/bus/usb/001/002", Some("mrw")),
            ("/dev/bus/usb/001/003", Some("mrw"))
        ]
    );
    // Idempotent.
    let again = b
        .prepare(&consumer(), &[alloc("yubikey-pair-1-1")])
        .await
        .unwrap();
    assert_eq!(again, out);
}

#[tokio::test]
async fn several_instances_merge_into_one_env_list() {
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    // No discover first: prepare looks the devices up itself.
    let out = b
        .prepare(&consumer(), &[alloc("key-1-1"), alloc("key-1-2")])
        .await
        .unwrap();
    let mut all = ContainerEdits::default();
    for p in &out {
        all.merge(&p.edits);
    }
    assert_eq!(all.env["USB_RESOURCE_EXAMPLE_COM_KEY"], "1:2,1:3");
    assert_eq!(all.device_nodes.len(), 2);
}

#[tokio::test]
async fn unknown_and_unhealthy_devices_are_errors_that_name_them() {
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    b.discover().await.unwrap();
    let err = b
        .prepare(&consumer(), &[alloc("key-9-9")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("node-a-usb/key-9-9"), "{err}");
    let mut other_pool = alloc("key-1-1");
    other_pool.device.pool = kubedev_core::PoolName::new("node-b-usb").unwrap();
    let err = b.prepare(&consumer(), &[other_pool]).await.unwrap_err();
    assert!(err.to_string().contains("node-b-usb/key-1-1"), "{err}");
    root.remove("/dev/bus/usb/001/002").unwrap();
    let err = b
        .prepare(&consumer(), &[alloc("key-1-1")])
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("key-1-1") && msg.contains("/dev/bus/usb/001/002"),
        "{msg}"
    );
    // Unprepare changes nothing and always succeeds.
    let claim = kubedev_core::ClaimRef::parse("u", "n", "c").unwrap();
    b.unprepare(&claim, &[alloc("key-9-9")]).await.unwrap();
}
