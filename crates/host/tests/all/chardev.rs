//! Character devices: health follows the node, prepare gives the node with `rw`.

use kubedev_core::{Consumer, ContainerEdits, DeviceSource, HealthState, Preparer, SourceEvent};
use kubedev_testkit::hostroot::HostRoot;

use crate::{alloc, backend, dref, next, start_watch};

fn consumer() -> Consumer {
    Consumer::Container {
        resource: "devices.kubevirt.io/kvm".into(),
    }
}

#[tokio::test]
async fn removing_and_re_adding_the_node_turns_all_slots_unhealthy_then_healthy() {
    let root = HostRoot::new().unwrap();
    root.device_node("/dev/kvm").unwrap();
    root.device_node("/dev/net/tun").unwrap();
    let b = backend(
        &root,
        serde_json::json!({"characterDevices": [
            {"name": "kvm", "path": "/dev/kvm", "slots": 2},
            {"name": "tun", "path": "/dev/net/tun", "slots": 1}
        ]}),
    );
    b.discover().await.unwrap();
    let (task, mut rx) = start_watch(&b).await;
    assert!(rx.try_recv().is_err(), "no change, no event");

    root.remove("/dev/kvm").unwrap();
    for slot in ["kvm-0", "kvm-1"] {
        match next(&mut rx).await {
            SourceEvent::Health { device, health } => {
                assert_eq!(device, dref(slot));
                assert_eq!(health.state, HealthState::Unhealthy);
                assert!(health.reason.unwrap().contains("/dev/kvm"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    root.device_node("/dev/kvm").unwrap();
    for slot in ["kvm-0", "kvm-1"] {
        match next(&mut rx).await {
            SourceEvent::Health { device, health } => {
                assert_eq!(device, dref(slot));
                assert!(health.is_healthy());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A node in a subdirectory: /dev/net is watched too.
    root.remove("/dev/net").unwrap();
    match next(&mut rx).await {
        SourceEvent::Health { device, health } => {
            assert_eq!(device, dref("tun-0"));
            assert!(!health.is_healthy());
        }
        other => panic!("unexpected {other:?}"),
    }
    root.device_node("/dev/net/tun").unwrap();
    match next(&mut rx).await {
        SourceEvent::Health { device, health } => {
            assert_eq!(device, dref("tun-0"));
            assert!(health.is_healthy());
        }
        other => panic!("unexpected {other:?}"),
    }
    task.abort();
}

#[tokio::test]
async fn prepare_gives_the_shared_node_once() {
    let root = HostRoot::new().unwrap();
    root.device_node("/dev/kvm").unwrap();
    let b = backend(
        &root,
        serde_json::json!({"characterDevices": [{"name": "kvm", "path": "/dev/kvm", "slots": 2}]}),
    );
    // No discover first: prepare looks the slots up itself.
    let out = b
        .prepare(&consumer(), &[alloc("kvm-0"), alloc("kvm-1")])
        .await
        .unwrap();
    assert_eq!(out.len(), 2);
    let n = &out[0].edits.device_nodes[0];
    assert_eq!(
        (n.path.as_str(), n.permissions.as_deref()),
        ("/dev/kvm", Some("rw"))
    );
    let mut all = ContainerEdits::default();
    for p in &out {
        all.merge(&p.edits);
    }
    assert_eq!(all.device_nodes.len(), 1);
    assert!(all.env.is_empty() && all.mounts.is_empty());
}

#[tokio::test]
async fn unknown_slots_and_missing_nodes_are_errors_that_name_the_device() {
    let root = HostRoot::new().unwrap();
    root.device_node("/dev/kvm").unwrap();
    let b = backend(
        &root,
        serde_json::json!({"characterDevices": [{"name": "kvm", "path": "/dev/kvm", "slots": 2}]}),
    );
    for bad in ["kvm-2", "kvm-01", "tun-0"] {
        let err = b.prepare(&consumer(), &[alloc(bad)]).await.unwrap_err();
        assert!(
            err.to_string().contains(&format!("node-a-host/{bad}")),
            "{err}"
        );
    }
    root.remove("/dev/kvm").unwrap();
    let err = b
        .prepare(&consumer(), &[alloc("kvm-0")])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("kvm-0") && err.contains("/dev/kvm"), "{err}");
}

/// Read-only, against this machine's own root: health equals the nodes' presence.
#[tokio::test]
async fn this_machines_dev() {
    let config: kubedev_host::HostConfig = serde_json::from_value(serde_json::json!({
        "characterDevices": [
            {"name": "kvm", "path": "/dev/kvm", "slots": 1},
            {"name": "tun", "path": "/dev/net/tun", "slots": 1},
            {"name": "vhost-net", "path": "/dev/vhost-net", "slots": 1}
        ]
    }))
    .unwrap();
    let ctx = kubedev_core::BackendContext::new(
        kubedev_core::HostFs::new("/"),
        "/nonexistent-state",
        "node-a",
    );
    let b = kubedev_host::HostBackend::new(config, &ctx).unwrap();
    let pool = b.discover().await.unwrap().remove(0);
    for (name, path) in [
        ("kvm-0", "/dev/kvm"),
        ("tun-0", "/dev/net/tun"),
        ("vhost-net-0", "/dev/vhost-net"),
    ] {
        let d = pool.device(name).unwrap();
        assert_eq!(
            d.health.is_healthy(),
            std::path::Path::new(path).exists(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_node_nobody_can_look_up_is_of_unknown_health_with_why() {
    let root = HostRoot::new().unwrap();
    root.device_node("/dev/kvm").unwrap();
    // /dev/tdx is a link to itself: whether the node exists cannot be told.
    std::os::unix::fs::symlink("tdx", root.path().join("dev/tdx")).unwrap();
    let b = backend(
        &root,
        serde_json::json!({"characterDevices": [
            {"name": "kvm", "path": "/dev/kvm"},
            {"name": "tdx", "path": "/dev/tdx"},
            {"name": "sev", "path": "/dev/sev"}
        ]}),
    );
    let pool = b.discover().await.unwrap().remove(0);
    let health = |name: &str| pool.device(name).unwrap().health.clone();
    assert!(health("kvm-0").is_healthy());
    assert_eq!(health("sev-0").state, HealthState::Unhealthy);
    let tdx = health("tdx-0");
    assert_eq!(tdx.state, HealthState::Unknown, "{tdx:?}");
    let why = tdx.reason.unwrap();
    assert!(
        why.contains("cannot tell whether device node /dev/tdx exists")
            && why.contains("symbolic links"),
        "{why}"
    );
}
