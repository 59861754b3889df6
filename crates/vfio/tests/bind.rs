//! Bind-on-prepare: functions rebound to vfio-pci on prepare, given back on unprepare, also
//! after a crash. The kernel's part is played by testkit's `PciKernelSim`.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{alloc, attrs, backend, claim};
use kubedev_core::{Consumer, DeviceSource, Preparer};
use kubedev_testkit::hostroot::HostRoot;
use kubedev_testkit::machines::pci::{PciFunctionSpec, PciKernelSim, PciMachine};
use kubedev_vfio::BindRecord;

const GPU: &str = "0000:3b:00.0";
const DEVICE: &str = "pci-0000-3b-00-0";

/// One A10 on the `nvidia` driver (an SR-IOV-capable PF with no VFs enabled), group 20.
fn machine() -> HostRoot {
    PciMachine::new()
        .function(
            PciFunctionSpec::new("0000:3a:00.0", "pci0000:3a", 0x8086, 0x2030, 0x060400)
                .driver("pcieport")
                .group(19)
                .numa(0),
        )
        .function(
            PciFunctionSpec::new(GPU, "pci0000:3a/0000:3a:00.0", 0x10de, 0x2236, 0x030200)
                .driver("nvidia")
                .group(20)
                .numa(0)
                .sriov_pf(16),
        )
        .build()
        .unwrap()
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "pciDevices": [{"selector": "10de:2236", "resourceName": "nvidia.com/GA102GL_A10"}],
        "bindOnPrepare": true,
        "settleTimeoutMs": 3000
    })
}

fn driver(root: &HostRoot) -> Option<String> {
    std::fs::read_link(root.join(format!("/sys/bus/pci/devices/{GPU}/driver")))
        .ok()
        .map(|t| t.file_name().unwrap().to_string_lossy().into_owned())
}

fn record_path(state: &Path) -> std::path::PathBuf {
    state.join("bind").join(format!("{DEVICE}.json"))
}

#[tokio::test]
async fn prepare_binds_and_unprepare_after_a_crash_restores() {
    let root = machine();
    let state = tempfile::tempdir().unwrap();
    let _kernel = PciKernelSim::start(root.path());

    let b = backend(&root, state.path(), config());
    let pool = b.discover().await.unwrap().remove(0);
    assert_eq!(pool.devices.len(), 1);
    let d = &pool.devices[0];
    assert_eq!(attrs(d)["driver"], "s:nvidia");
    assert!(
        d.health.is_healthy(),
        "no group node yet, but bindable: {:?}",
        d.health
    );
    assert!(!root.join("/dev/vfio/20").exists());

    let out = b
        .prepare(&Consumer::Claim(claim()), &[alloc(DEVICE)])
        .await
        .unwrap();
    assert_eq!(driver(&root).as_deref(), Some("vfio-pci"));
    assert!(root.join("/dev/vfio/20").exists());
    assert_eq!(out[0].edits.env["PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"], GPU);
    let record: BindRecord =
        serde_json::from_slice(&std::fs::read(record_path(state.path())).unwrap()).unwrap();
    assert_eq!(record.device, DEVICE);
    assert_eq!(record.functions[0].address, GPU);
    assert_eq!(
        record.functions[0].original_driver.as_deref(),
        Some("nvidia")
    );

    // Prepare again: same answer, nothing rebound, the record keeps the true original.
    let again = b
        .prepare(&Consumer::Claim(claim()), &[alloc(DEVICE)])
        .await
        .unwrap();
    assert_eq!(out, again);
    let record2: BindRecord =
        serde_json::from_slice(&std::fs::read(record_path(state.path())).unwrap()).unwrap();
    assert_eq!(record, record2);

    // Crash: the backend is gone; a new one (same state directory) is asked to unprepare.
    drop(b);
    let b = backend(&root, state.path(), config());
    b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap();
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
    assert!(!root.join("/dev/vfio/20").exists());
    assert!(!record_path(state.path()).exists());
    let ov =
        std::fs::read_to_string(root.join(format!("/sys/bus/pci/devices/{GPU}/driver_override")))
            .unwrap();
    assert!(
        matches!(ov.trim(), "(null)" | ""),
        "override not cleared: {ov:?}"
    );
    // Unprepare again: nothing to do.
    b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap();
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
}

#[tokio::test]
async fn a_crash_before_the_rebind_leaves_a_record_that_unprepare_clears() {
    let root = machine();
    let state = tempfile::tempdir().unwrap();
    let _kernel = PciKernelSim::start(root.path());
    // The record was written, then the daemon died before touching the function.
    std::fs::create_dir_all(state.path().join("bind")).unwrap();
    std::fs::write(
        record_path(state.path()),
        serde_json::json!({"device": DEVICE, "functions": [
            {"address": GPU, "originalDriver": "nvidia", "originalOverride": null}
        ]})
        .to_string(),
    )
    .unwrap();
    let b = backend(&root, state.path(), config());
    b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap();
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
    assert!(!record_path(state.path()).exists());
}

#[tokio::test]
async fn a_rebind_the_kernel_never_does_times_out_and_is_undone() {
    let root = machine();
    let state = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg["settleTimeoutMs"] = 200.into();
    let b = backend(&root, state.path(), cfg);
    b.discover().await.unwrap();
    // No kernel: the unbind request is written but nothing happens.
    let err = b
        .prepare(&Consumer::Claim(claim()), &[alloc(DEVICE)])
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(DEVICE), "{msg}");
    assert!(msg.contains("unbound from nvidia"), "{msg}");
    assert!(msg.contains("200 ms"), "{msg}");
    // The record was written before anything changed.
    assert!(record_path(state.path()).exists());
    let ov =
        std::fs::read_to_string(root.join(format!("/sys/bus/pci/devices/{GPU}/driver_override")))
            .unwrap();
    assert_eq!(ov, "vfio-pci");
    // The runtime rolls the half-done prepare back with unprepare: the kernel is back now.
    std::fs::write(root.join("/sys/bus/pci/drivers/nvidia/unbind"), "").unwrap();
    let _kernel = PciKernelSim::start(root.path());
    b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap();
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
    assert!(!record_path(state.path()).exists());
    let ov =
        std::fs::read_to_string(root.join(format!("/sys/bus/pci/devices/{GPU}/driver_override")))
            .unwrap();
    assert!(
        matches!(ov.trim(), "(null)" | ""),
        "override not cleared: {ov:?}"
    );
}

#[tokio::test]
async fn a_corrupt_record_is_an_error_naming_it() {
    let root = machine();
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(state.path().join("bind")).unwrap();
    std::fs::write(record_path(state.path()), "{not json").unwrap();
    let b = backend(&root, state.path(), config());
    let err = b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap_err();
    assert!(err.to_string().contains(&format!("{DEVICE}.json")), "{err}");
    // A record naming a hostile driver is refused, not followed into a path.
    std::fs::write(
        record_path(state.path()),
        serde_json::json!({"device": DEVICE, "functions": [
            {"address": GPU, "originalDriver": "../../../etc"}
        ]})
        .to_string(),
    )
    .unwrap();
    let err = b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap_err();
    assert!(err.to_string().contains("../../../etc"), "{err}");
}

#[tokio::test]
async fn health_settles_to_healthy_across_bind_and_restore() {
    use kubedev_core::{HealthState, SourceEvent};
    use std::time::Duration;

    let root = machine();
    let state = tempfile::tempdir().unwrap();
    let _kernel = PciKernelSim::start(root.path());
    let b = backend(&root, state.path(), config());
    b.discover().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let watcher = tokio::spawn({
        let b = b.clone();
        async move { b.watch(tx).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.prepare(&Consumer::Claim(claim()), &[alloc(DEVICE)])
        .await
        .unwrap();
    b.unprepare(&claim(), &[alloc(DEVICE)]).await.unwrap();
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
    // Whatever the order of node and link changes, the last word is Healthy.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut last = None;
    while let Ok(ev) = rx.try_recv() {
        if let SourceEvent::Health { health, .. } = ev {
            last = Some(health.state);
        }
    }
    assert!(
        matches!(last, None | Some(HealthState::Healthy)),
        "last health event: {last:?}"
    );
    watcher.abort();
}

#[tokio::test]
async fn planned_edits_wait_for_the_bind_and_change_nothing() {
    let root = machine();
    let state = tempfile::tempdir().unwrap();
    let _kernel = PciKernelSim::start(root.path());
    let b = backend(&root, state.path(), config());
    b.discover().await.unwrap();
    let device = alloc(DEVICE).device;

    // Still on its host driver: the group node appears only when prepare binds it.
    assert_eq!(b.planned_edits(&device).await.unwrap(), None);
    assert_eq!(driver(&root).as_deref(), Some("nvidia"));
    assert!(!record_path(state.path()).exists());

    // Once bound, the planned edits are the claim's edits.
    let out = b
        .prepare(&Consumer::Claim(claim()), &[alloc(DEVICE)])
        .await
        .unwrap();
    let planned = b.planned_edits(&device).await.unwrap().unwrap();
    assert_eq!(planned, out[0].edits);
}
