//! Hot-plug: `/dev/vfio/<group>` removed and re-added in a fake root.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::backend;
use kubedev_core::{DeviceSource, HealthState, SourceEvent};
use kubedev_testkit::machines::pci;
use tokio::sync::mpsc;

async fn next(rx: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("the watcher is running")
}

fn health_of(ev: &SourceEvent) -> (String, HealthState) {
    match ev {
        SourceEvent::Health { device, health } => (device.to_string(), health.state),
        other => panic!("expected a health event, got {other:?}"),
    }
}

#[tokio::test]
async fn group_node_removed_then_back_is_unhealthy_then_healthy() {
    let root = pci::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [{"selector": "10de:2236"}]}),
    );
    let pools = b.discover().await.unwrap();
    assert!(pools[0].devices.iter().all(|d| d.health.is_healthy()));
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    // Give the watcher a moment to set up; a change before that is still reported (the watcher
    // compares with what discovery reported when it starts).
    tokio::time::sleep(Duration::from_millis(100)).await;
    root.remove("/dev/vfio/40").unwrap();
    let (dev, state1) = health_of(&next(&mut rx).await);
    assert_eq!(dev, "node-a-vfio/pci-0000-af-00-0");
    assert_eq!(state1, HealthState::Unhealthy);
    root.device_node("/dev/vfio/40").unwrap();
    let (dev, state2) = health_of(&next(&mut rx).await);
    assert_eq!(dev, "node-a-vfio/pci-0000-af-00-0");
    assert_eq!(state2, HealthState::Healthy);
    // Without the container node no device is usable.
    root.remove("/dev/vfio/vfio").unwrap();
    for _ in 0..4 {
        let (_, s) = health_of(&next(&mut rx).await);
        assert_eq!(s, HealthState::Unhealthy);
    }
    root.device_node("/dev/vfio/vfio").unwrap();
    for _ in 0..4 {
        let (_, s) = health_of(&next(&mut rx).await);
        assert_eq!(s, HealthState::Healthy);
    }
    // A group node no device knows asks for a rediscovery.
    root.device_node("/dev/vfio/77").unwrap();
    assert_eq!(next(&mut rx).await, SourceEvent::Rediscover);
    // The whole /dev/vfio directory going away makes every device unhealthy.
    root.remove("/dev/vfio").unwrap();
    let mut down = Vec::new();
    for _ in 0..4 {
        let (dev, s) = health_of(&next(&mut rx).await);
        assert_eq!(s, HealthState::Unhealthy);
        down.push(dev);
    }
    down.sort();
    assert_eq!(down.len(), 4);
    // And back: the directory is watched again.
    root.dir("/dev/vfio").unwrap();
    assert_eq!(next(&mut rx).await, SourceEvent::Rediscover);
    root.device_node("/dev/vfio/20").unwrap();
    // Still unusable without the container node; with it, the device with its node is back.
    root.device_node("/dev/vfio/vfio").unwrap();
    let (dev, s) = health_of(&next(&mut rx).await);
    assert_eq!(
        (dev.as_str(), s),
        ("node-a-vfio/pci-0000-3b-00-0", HealthState::Healthy)
    );
    watcher.abort();
}

#[tokio::test]
async fn a_change_before_the_watch_starts_is_reported() {
    let root = pci::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [{"selector": "10de:2236"}]}),
    );
    b.discover().await.unwrap();
    root.remove("/dev/vfio/20").unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    let (dev, s) = health_of(&next(&mut rx).await);
    assert_eq!(
        (dev.as_str(), s),
        ("node-a-vfio/pci-0000-3b-00-0", HealthState::Unhealthy)
    );
    watcher.abort();
}

#[tokio::test]
async fn mdev_instances_follow_their_group_node() {
    let root = kubedev_testkit::machines::mdev::vgpu_mdev_host().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"mediatedDevices": [
            {"mdevNameSelector": "GRID T4-1B", "resourceName": "nvidia.com/GRID_T4-1B"}
        ]}),
    );
    b.discover().await.unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let uuid = kubedev_testkit::machines::mdev::MDEV_INSTANCES[1].0;
    root.remove("/dev/vfio/201").unwrap();
    let (dev, s) = health_of(&next(&mut rx).await);
    assert_eq!(dev, format!("node-a-vfio/mdev-{uuid}"));
    assert_eq!(s, HealthState::Unhealthy);
    root.device_node("/dev/vfio/201").unwrap();
    let (dev, s) = health_of(&next(&mut rx).await);
    assert_eq!(dev, format!("node-a-vfio/mdev-{uuid}"));
    assert_eq!(s, HealthState::Healthy);
    watcher.abort();
}

#[tokio::test]
async fn the_watch_ends_when_nobody_listens() {
    let root = pci::dual_socket_gpu_server().unwrap();
    let state = tempfile::tempdir().unwrap();
    let b = backend(
        &root,
        state.path(),
        serde_json::json!({"pciDevices": [{"selector": "10de:2236"}]}),
    );
    let (tx, rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(rx);
    let out = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watch returns")
        .unwrap();
    assert!(out.is_ok());
}
