//! Live configuration: a changed file is applied without restarting what did not change; a bad
//! one is rejected and the running set stays.

use std::path::Path;
use std::time::Duration;

use crate::common::{self, DevicePluginDaemon};
use kubedev_testkit::kubelet::KubeletEmulator;

const WAIT: Duration = Duration::from_secs(10);

fn config(dp: &Path, with_nics: bool) -> String {
    let nic_resource = if with_nics {
        "    - name: example.com/nic\n      selector:\n        attributes:\n          type: {string: nic}\n"
    } else {
        ""
    };
    let nic_device = if with_nics {
        "      - {name: nic-0, attributes: {type: {string: nic}}}\n"
    } else {
        ""
    };
    format!(
        "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/gpu\n      selector:\n        attributes:\n          type: {{string: gpu}}\n{nic_resource}backends:\n  static:\n    pool: node-a\n    devices:\n      - {{name: gpu-0, attributes: {{type: {{string: gpu}}}}}}\n      - {{name: gpu-1, attributes: {{type: {{string: gpu}}}}}}\n{nic_device}",
        dp.display()
    )
}

fn registrations(k: &KubeletEmulator, resource: &str) -> usize {
    k.registrations()
        .iter()
        .filter(|r| r.resource == resource && r.rejected.is_none())
        .count()
}

#[tokio::test]
async fn resources_are_added_and_removed_while_the_others_keep_serving() {
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let path = dir.path().join("kubedev.yaml");
    let node = DevicePluginDaemon::start(&path, &config(&dp, false), &dp).await;
    let kubelet = &node.kubelet;
    kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 2)
        .await
        .unwrap();
    let gpu_endpoint = kubelet.resource("example.com/gpu").unwrap().endpoint;

    // A new resource and a new device: the NIC resource starts; the GPU server is untouched.
    std::fs::write(&path, config(&dp, true)).unwrap();
    kubelet
        .wait_for("example.com/nic", WAIT, |r| r.connected && r.capacity == 1)
        .await
        .unwrap();
    assert_eq!(registrations(kubelet, "example.com/gpu"), 1);
    let gpu = kubelet.resource("example.com/gpu").unwrap();
    assert_eq!(
        gpu.endpoint, gpu_endpoint,
        "the GPU server was not restarted"
    );
    assert!(gpu.connected && gpu.capacity == 2);

    // A file that does not validate is rejected: everything keeps serving.
    std::fs::write(
        &path,
        "devicePlugin:\n  resources:\n    - name: not a name\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(kubelet.resource("example.com/nic").unwrap().connected);
    assert!(kubelet.resource("example.com/gpu").unwrap().connected);

    // Back to GPUs only: the NIC resource stops, the GPU server still is the first one.
    std::fs::write(&path, config(&dp, false)).unwrap();
    kubelet
        .wait_for("example.com/nic", WAIT, |r| !r.connected)
        .await
        .unwrap();
    let gpu = kubelet.resource("example.com/gpu").unwrap();
    assert_eq!(gpu.endpoint, gpu_endpoint);
    assert!(gpu.connected);
    assert_eq!(registrations(kubelet, "example.com/gpu"), 1);
    let nic_sockets = || -> Vec<String> {
        std::fs::read_dir(&dp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("nic"))
            .collect()
    };
    common::eventually(WAIT, || {
        let left = nic_sockets();
        std::future::ready(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("the NIC socket stays: {left:?}"))
        })
    })
    .await;

    node.stop().await;
}

#[cfg(feature = "host")]
#[tokio::test]
async fn a_backend_added_to_the_file_starts_serving() {
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("dev")).unwrap();
    std::fs::write(host.join("dev/kvm"), "").unwrap();
    let path = dir.path().join("kubedev.yaml");
    let base = format!(
        "hostRoot: {}\nstateDir: {}/state\n{}",
        host.display(),
        dir.path().display(),
        config(&dp, false)
    );
    let node = DevicePluginDaemon::start(&path, &base, &dp).await;
    let kubelet = &node.kubelet;
    kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 2)
        .await
        .unwrap();
    let with_kvm = base
        .replace(
            "backends:\n",
            "    - name: devices.kubevirt.io/kvm\n      selector:\n        attributes:\n          host.kubedev.io/name: {string: kvm}\nbackends:\n  host:\n    characterDevices:\n      - {name: kvm, path: /dev/kvm, slots: 4}\n",
        );
    std::fs::write(&path, with_kvm).unwrap();
    kubelet
        .wait_for("devices.kubevirt.io/kvm", WAIT, |r| {
            r.connected && r.capacity == 4
        })
        .await
        .unwrap();
    assert_eq!(registrations(kubelet, "example.com/gpu"), 1);
    // The GPU resource's selector does not take the kvm slots.
    assert_eq!(kubelet.resource("example.com/gpu").unwrap().capacity, 2);
    node.stop().await;
}
