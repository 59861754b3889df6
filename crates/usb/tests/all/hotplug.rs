//! Hot-plug: health follows the device nodes; new nodes ask for a rediscovery.

use std::time::Duration;

use kubedev_core::{DeviceSource, HealthState, SourceEvent};
use kubedev_testkit::machines::usb;
use tokio::sync::mpsc;

use crate::{backend, dref};

async fn next(rx: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s (the resync is 30 s, so inotify delivered it)")
        .expect("the watcher is running")
}

#[tokio::test]
async fn removing_and_re_adding_a_node_turns_unhealthy_then_healthy() {
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    b.discover().await.unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    // Let the watcher set up its watches (it reports nothing while nothing changed).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "no change, no event");

    root.remove("/dev/bus/usb/001/003").unwrap();
    match next(&mut rx).await {
        SourceEvent::Health { device, health } => {
            assert_eq!(device, dref("key-1-2"));
            assert_eq!(health.state, HealthState::Unhealthy);
        }
        other => panic!("unexpected {other:?}"),
    }
    root.device_node("/dev/bus/usb/001/003").unwrap();
    match next(&mut rx).await {
        SourceEvent::Health { device, health } => {
            assert_eq!(device, dref("key-1-2"));
            assert!(health.is_healthy());
        }
        other => panic!("unexpected {other:?}"),
    }
    watcher.abort();
}

#[tokio::test]
async fn a_new_device_asks_for_rediscovery() {
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    assert_eq!(b.discover().await.unwrap()[0].devices.len(), 2);
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A third YubiKey on a new bus: sysfs first, then the node (as udev does).
    usb::write_root_hub(&root, 3).unwrap();
    usb::write_device(&root, &usb::yubikey(3, 1, 2, "33333333")).unwrap();
    assert_eq!(next(&mut rx).await, SourceEvent::Rediscover);
    let devs = b.discover().await.unwrap().remove(0).devices;
    assert_eq!(devs.len(), 3);
    assert_eq!(devs[2].name.as_str(), "key-3-1");
    watcher.abort();
}

#[tokio::test]
async fn replugging_under_a_new_device_number_keeps_the_name() {
    let root = usb::three_devices().unwrap();
    let b = backend(&root, &[("example.com/key", &["1050:0407"])]);
    b.discover().await.unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    root.remove("/dev/bus/usb/001/002").unwrap();
    root.remove("/sys/bus/usb/devices/1-1").unwrap();
    match next(&mut rx).await {
        SourceEvent::Health { device, health } => {
            assert_eq!(device, dref("key-1-1"));
            assert!(!health.is_healthy());
        }
        other => panic!("unexpected {other:?}"),
    }
    usb::write_device(&root, &usb::yubikey(1, 1, 7, "11111111")).unwrap();
    assert_eq!(next(&mut rx).await, SourceEvent::Rediscover);
    let devs = b.discover().await.unwrap().remove(0).devices;
    let d = devs.iter().find(|d| d.name.as_str() == "key-1-1").unwrap();
    assert!(d.health.is_healthy());
    assert_eq!(
        d.attribute("usb.kubedev.io/busDev"),
        Some(&kubedev_core::AttributeValue::String("1:7".into()))
    );
    watcher.abort();
}
