//! Slot counts from the kernel's `misc.capacity`.

use kubedev_core::DeviceSource;
use kubedev_host::{MISC_CAPACITY, parse_misc_capacity};
use kubedev_testkit::hostroot::HostRoot;

use crate::backend;

fn config() -> serde_json::Value {
    serde_json::json!({
        "characterDevices": [
            {"name": "kvm", "path": "/dev/kvm", "slots": 1},
            {"name": "sev", "path": "/dev/sev", "slotsFrom": {"miscCapacity": "sev"}},
            {"name": "sev-es", "path": "/dev/sev", "slotsFrom": {"miscCapacity": "sev_es"}}
        ],
        "socketDevices": [
            {"name": "tdx-qgs", "path": "/var/run/tdx-qgs/qgs.socket", "slotsFrom": {"miscCapacity": "tdx"}, "optional": true}
        ]
    })
}

async fn counts(root: &HostRoot) -> Vec<(String, usize)> {
    let b = backend(root, config());
    let pool = b.discover().await.unwrap().remove(0);
    let mut out: Vec<(String, usize)> = Vec::new();
    for d in &pool.devices {
        let entry = d.name.as_str().rsplit_once('-').unwrap().0.to_string();
        match out.last_mut() {
            Some((e, n)) if *e == entry => *n += 1,
            _ => out.push((entry, 1)),
        }
    }
    out
}

fn pairs(v: &[(&str, usize)]) -> Vec<(String, usize)> {
    v.iter().map(|(s, n)| (s.to_string(), *n)).collect()
}

#[tokio::test]
async fn a_device_is_offered_as_often_as_the_host_allows() {
    let root = HostRoot::new().unwrap();
    root.file(MISC_CAPACITY, "sev 509\nsev_es 0\ntdx 15\n")
        .unwrap();
    assert_eq!(
        counts(&root).await,
        pairs(&[("kvm", 1), ("sev", 509), ("tdx-qgs", 15)])
    );
}

#[tokio::test]
async fn a_resource_the_kernel_does_not_list_gets_no_slots() {
    let root = HostRoot::new().unwrap();
    root.file(MISC_CAPACITY, "sev 4\n").unwrap();
    assert_eq!(counts(&root).await, pairs(&[("kvm", 1), ("sev", 4)]));
    // No misc controller at all (cgroup v1, old kernel): only the fixed counts.
    let root = HostRoot::new().unwrap();
    assert_eq!(counts(&root).await, pairs(&[("kvm", 1)]));
}

#[tokio::test]
async fn a_bad_misc_capacity_file_costs_only_the_devices_that_need_it() {
    let root = HostRoot::new().unwrap();
    root.file(MISC_CAPACITY, "sev 509\ntdx fifteen\n").unwrap();
    assert_eq!(counts(&root).await, pairs(&[("kvm", 1)]));
    let text = std::fs::read_to_string(root.join(MISC_CAPACITY)).unwrap();
    let err = parse_misc_capacity(std::path::Path::new(MISC_CAPACITY), &text)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/sys/fs/cgroup/misc.capacity")
            && err.contains("line 2")
            && err.contains("tdx fifteen"),
        "{err}"
    );
}
