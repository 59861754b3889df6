//! Configuration: defaults, permanent devices and validation errors that name the field.

use kubedev_core::{AttributeValue, DeviceSource};
use kubedev_host::{HostBackend, HostConfig};
use kubedev_testkit::hostroot::HostRoot;

use crate::backend;

fn new_err(config: serde_json::Value) -> String {
    let root = HostRoot::new().unwrap();
    let config: HostConfig = serde_json::from_value(config).unwrap();
    let ctx = kubedev_core::BackendContext::new(
        kubedev_core::HostFs::new(root.path()),
        root.path(),
        "node-a",
    );
    HostBackend::new(config, &ctx).unwrap_err().to_string()
}

#[tokio::test]
async fn permanent_devices_give_kvm_tun_and_vhost_net() {
    let root = HostRoot::new().unwrap();
    for n in ["/dev/kvm", "/dev/net/tun", "/dev/vhost-net"] {
        root.device_node(n).unwrap();
    }
    let b = backend(
        &root,
        serde_json::json!({"permanentDevices": true, "permanentSlots": 3}),
    );
    let pool = b.discover().await.unwrap().remove(0);
    assert_eq!(pool.name.as_str(), "node-a-host");
    let names: Vec<&str> = pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "kvm-0",
            "kvm-1",
            "kvm-2",
            "tun-0",
            "tun-1",
            "tun-2",
            "vhost-net-0",
            "vhost-net-1",
            "vhost-net-2"
        ]
    );
    assert!(pool.devices.iter().all(|d| d.health.is_healthy()));
    let tun = &pool.devices[4];
    let a = |id: &str| tun.attribute(&format!("host.kubedev.io/{id}")).cloned();
    assert_eq!(a("name"), Some(AttributeValue::String("tun".into())));
    assert_eq!(a("kind"), Some(AttributeValue::String("char".into())));
    assert_eq!(
        a("path"),
        Some(AttributeValue::String("/dev/net/tun".into()))
    );
    assert_eq!(a("slot"), Some(AttributeValue::Int(1)));
    assert_eq!(tun.attributes.len(), 4);
}

#[tokio::test]
async fn default_slots_and_overriding_a_permanent_device() {
    let root = HostRoot::new().unwrap();
    let b = backend(
        &root,
        serde_json::json!({
            "permanentDevices": true,
            "characterDevices": [{"name": "kvm", "path": "/dev/kvm", "slots": 2}]
        }),
    );
    let pool = b.discover().await.unwrap().remove(0);
    let count = |prefix: &str| {
        pool.devices
            .iter()
            .filter(|d| d.name.as_str().rsplit_once('-').map(|x| x.0) == Some(prefix))
            .count()
    };
    assert_eq!(count("kvm"), 2);
    assert_eq!(count("tun"), kubedev_host::DEFAULT_SLOTS as usize);
    assert_eq!(count("vhost-net"), 110);
    // Nodes are missing in this root: unhealthy, with the path in the reason.
    let kvm = pool.device("kvm-1").unwrap();
    let reason = kvm.health.reason.clone().unwrap();
    assert!(reason.contains("/dev/kvm"), "{reason}");
}

#[test]
fn invalid_configurations_name_the_field_and_value() {
    let cases = [
        (
            serde_json::json!({"characterDevices": [{"name": "kvm", "path": "/dev/kvm", "slots": 1, "slotsFrom": {"miscCapacity": "tdx"}}]}),
            "characterDevices[0].slots",
        ),
        (
            serde_json::json!({"characterDevices": [{"name": "Kvm", "path": "/dev/kvm"}]}),
            "characterDevices[0].name",
        ),
        (
            serde_json::json!({"characterDevices": [{"name": "kvm", "path": "dev/kvm"}]}),
            "characterDevices[0].path",
        ),
        (
            serde_json::json!({"characterDevices": [{"name": "kvm", "path": "/dev/../etc/kvm"}]}),
            "characterDevices[0].path",
        ),
        (
            serde_json::json!({"characterDevices": [{"name": "kvm", "path": "/dev/kvm", "slots": 100000}]}),
            "characterDevices[0].slots",
        ),
        (
            serde_json::json!({"permanentDevices": true, "socketDevices": [{"name": "tun", "path": "/run/x/s"}]}),
            "socketDevices[0].name",
        ),
        (
            serde_json::json!({"socketDevices": [{"name": "s", "path": "/s.sock"}]}),
            "socketDevices[0].path",
        ),
        (
            serde_json::json!({"socketDevices": [{"name": "s", "path": "/run/s/s.sock", "slotsFrom": {"miscCapacity": "TDX"}}]}),
            "socketDevices[0].slotsFrom.miscCapacity",
        ),
        (
            serde_json::json!({"socketDevices": [{"name": "s", "path": "/run/s/s.sock", "selinuxContext": ""}]}),
            "socketDevices[0].selinuxContext",
        ),
        (
            serde_json::json!({"permanentDevices": true, "permanentSlots": 5000}),
            "permanentSlots",
        ),
    ];
    for (config, field) in cases {
        let err = new_err(config.clone());
        assert!(err.contains(field), "{config}: {err}");
    }
    let err = serde_json::from_value::<HostConfig>(serde_json::json!({"permanentDevice": true}))
        .unwrap_err();
    assert!(err.to_string().contains("permanentDevice"), "{err}");
    let err = serde_json::from_value::<HostConfig>(
        serde_json::json!({"socketDevices": [{"name": "s", "path": "/run/s/s", "slotsFrom": {"cpus": 1}}]}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("cpus"), "{err}");
}

#[test]
fn pre_open_failures_are_reported_not_fatal() {
    let root = HostRoot::new().unwrap();
    root.device_node("/dev/vhost-net").unwrap();
    // /dev/net/tun is missing; new() still succeeds.
    let b = backend(&root, serde_json::json!({"permanentDevices": true}));
    let failures: Vec<String> = b.pre_open().iter().map(ToString::to_string).collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("/dev/net/tun"), "{failures:?}");
}
