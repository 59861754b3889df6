//! Integration tests of the host backend against fake host roots.
#![allow(clippy::unwrap_used)]

mod chardev;
mod config;
mod slots;
mod socket;

use std::time::Duration;

use kubedev_core::{AllocatedDevice, BackendContext, DeviceName, DeviceRef, PoolName, SourceEvent};
use kubedev_host::{HostBackend, HostConfig};
use kubedev_testkit::hostroot::HostRoot;
use tokio::sync::mpsc;

/// A backend over `root` with the configuration given as JSON.
pub(crate) fn backend(root: &HostRoot, config: serde_json::Value) -> HostBackend {
    let config: HostConfig = serde_json::from_value(config).unwrap();
    let ctx = BackendContext::new(
        kubedev_core::HostFs::new(root.path()),
        root.path().join("state"),
        "node-a",
    );
    HostBackend::new(config, &ctx).unwrap()
}

/// A reference to a device of the `node-a-host` pool.
pub(crate) fn dref(name: &str) -> DeviceRef {
    DeviceRef::new(
        PoolName::new("node-a-host").unwrap(),
        DeviceName::new(name).unwrap(),
    )
}

/// An allocation of one device of the `node-a-host` pool.
pub(crate) fn alloc(name: &str) -> AllocatedDevice {
    AllocatedDevice::new(dref(name))
}

/// The next event, within 10 s (the backends' resync is 30 s, so inotify delivered it).
pub(crate) async fn next(rx: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("the watcher is running")
}

/// Starts `b.watch` and waits until it has set up its watches.
pub(crate) async fn start_watch(
    b: &HostBackend,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<SourceEvent>) {
    use kubedev_core::DeviceSource;
    let (tx, rx) = mpsc::channel(64);
    let b = b.clone();
    let task = tokio::spawn(async move {
        b.watch(tx).await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    (task, rx)
}
