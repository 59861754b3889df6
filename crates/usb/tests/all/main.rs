//! Integration tests of the USB backend against fake host roots.
#![allow(clippy::unwrap_used)]

mod discovery;
mod hotplug;
mod prepare;

use kubedev_core::{BackendContext, DeviceName, DeviceRef, PoolName};
use kubedev_testkit::hostroot::HostRoot;
use kubedev_usb::{UsbBackend, UsbConfig};

/// A backend over `root` with the given resources (name, selectors).
pub(crate) fn backend(root: &HostRoot, resources: &[(&str, &[&str])]) -> UsbBackend {
    let resources: Vec<serde_json::Value> = resources
        .iter()
        .map(|(name, sel)| serde_json::json!({"name": name, "selectors": sel}))
        .collect();
    let config: UsbConfig =
        serde_json::from_value(serde_json::json!({ "resources": resources })).unwrap();
    let ctx = BackendContext::new(
        kubedev_core::HostFs::new(root.path()),
        root.path().join("state"),
        "node-a",
    );
    UsbBackend::new(config, &ctx).unwrap()
}

/// A reference to a device of the `node-a-usb` pool.
pub(crate) fn dref(name: &str) -> DeviceRef {
    DeviceRef::new(
        PoolName::new("node-a-usb").unwrap(),
        DeviceName::new(name).unwrap(),
    )
}
