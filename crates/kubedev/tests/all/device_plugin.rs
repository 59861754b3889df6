//! The daemon's device-plugin mode in-process, against the kubelet emulator: routing Allocate
//! to the static backend, and a WebAssembly selection policy choosing GetPreferredAllocation.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{self, DevicePluginDaemon, plugin};
use kubedev::config::Config;
use kubedev::runtime::run;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

/// Four GPUs on one NUMA node, two per PCIe root: NUMA packing takes gpu-0 and gpu-1 (one root),
/// the spread policy one GPU per root.
fn config(dp: &std::path::Path, policy: Option<PathBuf>) -> String {
    let devices: String = (0..4)
        .map(|i| {
            format!(
                "      - name: gpu-{i}\n        attributes:\n          resource.kubernetes.io/pcieRoot: {{string: \"pci0000:{:02x}\"}}\n        numaNode: 0\n        deviceNodes: [\"/dev/null\"]\n",
                i / 2
            )
        })
        .collect();
    let policy = policy
        .map(|p| format!("      policy: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "devicePlugin:\n  directory: {}\n  resources:\n    - name: example.com/gpu\n{policy}backends:\n  static:\n    pool: node-a\n    devices:\n{devices}",
        dp.display()
    )
}

async fn preferred(policy: Option<PathBuf>) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    let node = DevicePluginDaemon::start(&path, &config(dir.path(), policy), dir.path()).await;
    let kubelet = &node.kubelet;
    kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 4)
        .await
        .unwrap();
    let all: Vec<String> = (0..4).map(|i| format!("gpu-{i}")).collect();
    let got = kubelet
        .preferred_allocation("example.com/gpu", &all, &[], 2)
        .await
        .unwrap();
    // Allocate goes through the static backend.
    let a = kubelet
        .allocate("example.com/gpu", &["gpu-1"])
        .await
        .unwrap();
    assert_eq!(a.envs["STATIC_VISIBLE_DEVICES"], "gpu-1");
    node.stop().await;
    got
}

#[tokio::test]
async fn numa_packing_is_the_default_and_a_policy_changes_the_choice() {
    assert_eq!(preferred(None).await, ["gpu-0", "gpu-1"]);
    assert_eq!(preferred(Some(plugin("spread"))).await, ["gpu-0", "gpu-2"]);
}

#[tokio::test]
async fn a_broken_policy_is_a_clear_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"not wasm").unwrap();
    let path = dir.path().join("kubedev.yaml");
    let cfg = common::write_config(&path, &config(dir.path(), Some(bad)));
    let err = run(cfg, &path, None, CancellationToken::new())
        .await
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("example.com/gpu") && msg.contains("bad.wasm"),
        "{msg}"
    );
}

#[tokio::test]
async fn cdi_mode_answers_with_cdi_names_and_writes_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    let text = config(dir.path(), None).replace(
        "  resources:",
        &format!(
            "  cdi: true\n  cdiDir: {}/cdi\n  resources:",
            dir.path().display()
        ),
    );
    let node = DevicePluginDaemon::start(&path, &text, dir.path()).await;
    let kubelet = &node.kubelet;
    kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected)
        .await
        .unwrap();
    let a = kubelet
        .allocate("example.com/gpu", &["gpu-1"])
        .await
        .unwrap();
    let b = kubelet
        .allocate("example.com/gpu", &["gpu-3", "gpu-0"])
        .await
        .unwrap();
    assert_eq!(a.cdi_devices.len(), 1);
    assert_eq!(a.cdi_devices[0].name, "k8s.example.com/claim=dp-gpu-gpu-1");
    // Devices allocated together are one CDI device, named after the set (the same set in
    // another order gets the same name).
    assert_eq!(b.cdi_devices.len(), 1, "{:?}", b.cdi_devices);
    let together = b.cdi_devices[0].name.clone();
    assert!(
        together.starts_with("k8s.example.com/claim=dp-gpu-alloc-"),
        "{together}"
    );
    let again = kubelet
        .allocate("example.com/gpu", &["gpu-0", "gpu-3"])
        .await
        .unwrap();
    assert_eq!(again.cdi_devices[0].name, together);
    assert!(
        a.devices.is_empty() && a.envs.is_empty(),
        "CDI mode leaves the edits to the runtime"
    );
    // One spec holds every allocation handed out so far, so earlier containers still resolve;
    // each allocation's variables are its own devices' only.
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("cdi/k8s.example.com-claim_dp-gpu.json")).unwrap(),
    )
    .unwrap();
    let devices: Vec<_> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    let alloc = together.split('=').nth(1).unwrap();
    let mut want = vec![alloc, "dp-gpu-gpu-1"];
    want.sort_unstable();
    assert_eq!(devices, want);
    let env = |name: &str| -> Vec<String> {
        let d = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap();
        let mut v: Vec<String> = spec["containerEdits"]["env"]
            .as_array()
            .into_iter()
            .chain(d["containerEdits"]["env"].as_array())
            .flatten()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    let single = env("dp-gpu-gpu-1");
    assert!(
        single.iter().any(|e| e.ends_with("=gpu-1")),
        "gpu-1's container learns gpu-1 only: {single:?}"
    );
    assert!(
        !single
            .iter()
            .any(|e| e.contains("gpu-0") || e.contains("gpu-3")),
        "{single:?}"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_policy_from_the_policy_directory_is_hot_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::copy(plugin("numa-pack"), policies.join("gpu-choice.wasm")).unwrap();
    let path = dir.path().join("kubedev.yaml");
    let text = config(dir.path(), Some(PathBuf::from("gpu-choice"))).replace(
        "  resources:",
        &format!("  policyDir: {}\n  resources:", policies.display()),
    );
    let node = DevicePluginDaemon::start(&path, &text, dir.path()).await;
    let kubelet = &node.kubelet;
    kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 4)
        .await
        .unwrap();
    let all: Vec<String> = (0..4).map(|i| format!("gpu-{i}")).collect();
    let ask = || kubelet.preferred_allocation("example.com/gpu", &all, &[], 2);
    // The directory is loaded off the start-up path, at once on its own thread.
    common::eventually(WAIT, || async {
        match ask().await.unwrap() {
            p if p == ["gpu-0", "gpu-1"] => Ok(()),
            p => Err(format!("numa-pack keeps one PCIe root; got {p:?}")),
        }
    })
    .await;
    // A broken module does not replace the working one.
    std::fs::write(policies.join("gpu-choice.wasm"), b"\0asm broken").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(ask().await.unwrap(), ["gpu-0", "gpu-1"]);
    // A good new module takes over without a restart.
    std::fs::copy(plugin("spread"), policies.join("gpu-choice.wasm")).unwrap();
    common::eventually(WAIT, || async {
        if ask().await.unwrap() == ["gpu-0", "gpu-2"] {
            Ok(())
        } else {
            Err("the new policy was never loaded".to_string())
        }
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn time_sliced_devices_are_advertised_once_per_replica() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubedev.yaml");
    let text = config(dir.path(), None).replace(
        "    - name: example.com/gpu\n",
        "    - name: example.com/gpu\n      replicas: 3\n",
    );
    let node = DevicePluginDaemon::start(&path, &text, dir.path()).await;
    let kubelet = &node.kubelet;
    let st = kubelet
        .wait_for("example.com/gpu", WAIT, |r| r.connected && r.capacity == 12)
        .await
        .unwrap();
    assert!(
        st.devices.contains_key("gpu-1::2"),
        "{:?}",
        st.devices.keys()
    );
    // Two replicas of one GPU in one container: the GPU is given once.
    let a = kubelet
        .allocate("example.com/gpu", &["gpu-1::0", "gpu-1::2"])
        .await
        .unwrap();
    assert_eq!(a.envs["STATIC_VISIBLE_DEVICES"], "gpu-1");
    assert_eq!(a.devices.len(), 1, "{a:?}");
    node.stop().await;

    std::fs::write(&path, text.replace("replicas: 3", "replicas: 0")).unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("devicePlugin.resources[0].replicas"), "{err}");
}
