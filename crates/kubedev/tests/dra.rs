//! The DRA driver of the runtime, in-process, against the kubelet emulator's DRA side.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kubedev::config::Config;
use kubedev::dra_driver::ClaimSource;
use kubedev::runtime::{ClusterServices, run};
use kubedev_core::{
    AllocatedDevice, ClaimRef, DeviceName, DeviceRef, Inventory, PoolName, PublishError, Publisher,
};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "gpu.example.com";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Claims(Mutex<BTreeMap<String, Vec<AllocatedDevice>>>);

impl Claims {
    fn allocate(&self, uid: &str, devices: &[&str]) {
        let list = devices
            .iter()
            .map(|d| AllocatedDevice {
                device: DeviceRef {
                    pool: PoolName::new("node-a").unwrap(),
                    device: DeviceName::new(*d).unwrap(),
                },
                request: "gpus/large".into(),
                share_id: None,
                config: vec![],
            })
            .collect();
        self.0.lock().unwrap().insert(uid.to_string(), list);
    }
}

#[async_trait]
impl ClaimSource for Claims {
    async fn allocated_devices(&self, claim: &ClaimRef) -> Result<Vec<AllocatedDevice>, String> {
        self.0
            .lock()
            .unwrap()
            .get(&claim.uid)
            .cloned()
            .ok_or_else(|| format!("claim {claim} is not allocated"))
    }
}

#[derive(Default)]
struct Slices(Mutex<Vec<Inventory>>);

#[async_trait]
impl Publisher for Slices {
    async fn publish(&self, inventory: &Inventory) -> Result<(), PublishError> {
        self.0.lock().unwrap().push(inventory.clone());
        Ok(())
    }
}

struct Daemon {
    root: tempfile::TempDir,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    claims: Arc<Claims>,
    slices: Arc<Slices>,
    kubelet: DraKubelet,
}

fn config(root: &Path) -> String {
    let health = root.join("health");
    std::fs::create_dir_all(&health).unwrap();
    for i in 0..4 {
        std::fs::write(health.join(format!("gpu-{i}")), "").unwrap();
    }
    let devices: String = (0..4)
        .map(|i| {
            format!(
                "      - name: gpu-{i}\n        deviceNodes: [\"/dev/null\"]\n        env: {{GPU_CAPS: compute}}\n        presencePath: {}/gpu-{i}\n",
                health.display()
            )
        })
        .collect();
    format!(
        "nodeName: node-a\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  pluginDir: {r}/plugins/{DRIVER}\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n  static:\n    pool: node-a\n    pollIntervalMs: 20\n    devices:\n{devices}",
        r = root.display()
    )
}

async fn start_in(root: tempfile::TempDir, claims: Arc<Claims>) -> Daemon {
    let r = root.path().to_path_buf();
    if !r.join("boot_id").exists() {
        std::fs::write(r.join("boot_id"), "8b7c1f6e-0000-4000-8000-000000000001\n").unwrap();
    }
    let path = r.join("kubedev.yaml");
    std::fs::write(&path, config(&r)).unwrap();
    let cfg = Config::load(&path).unwrap();
    let kubelet = DraKubelet::start(r.join("registry")).unwrap();
    let slices = Arc::new(Slices::default());
    let cluster = ClusterServices {
        claims: claims.clone(),
        slices: slices.clone(),
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move { run(cfg, &path, Some(cluster), c).await });
    assert!(
        kubelet
            .wait_until(WAIT, |k| k.drivers().contains_key(DRIVER))
            .await,
        "driver did not register: {:?}",
        kubelet.rejected()
    );
    Daemon {
        root,
        cancel,
        task,
        claims,
        slices,
        kubelet,
    }
}

impl Daemon {
    async fn stop(self) -> (tempfile::TempDir, Arc<Claims>) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
        self.kubelet.stop().await;
        (self.root, self.claims)
    }

    fn cdi_files(&self) -> Vec<PathBuf> {
        cdi_files(self.root.path())
    }
}

fn cdi_files(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("cdi"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn prepare_writes_cdi_and_is_idempotent_unprepare_cleans_up() {
    let claims = Arc::new(Claims::default());
    claims.allocate("uid-1", &["gpu-1", "gpu-3"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let claim = [ClaimId::new("default", "train", "uid-1")];
    let out = d.kubelet.prepare(DRIVER, &claim).await.unwrap();
    let devs = out["uid-1"].as_ref().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0].device, "gpu-1");
    assert_eq!(
        devs[0].request_names,
        ["gpus"],
        "subrequest reduced to its request"
    );
    assert_eq!(
        devs[0].cdi_device_ids,
        [format!("k8s.{DRIVER}/claim=uid-1-gpu-1")]
    );
    let files = d.cdi_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(spec["kind"], format!("k8s.{DRIVER}/claim"));
    assert_eq!(spec["devices"][1]["name"], "uid-1-gpu-3");
    let env = spec["devices"][1]["containerEdits"]["env"]
        .as_array()
        .unwrap();
    // Both devices of the claim are listed on each, so a container given both sees both.
    assert!(
        env.iter()
            .any(|e| e == "STATIC_VISIBLE_DEVICES=gpu-1,gpu-3"),
        "{env:?}"
    );

    // Same answer again, and the CDI file comes back if someone removed it.
    std::fs::remove_file(&files[0]).unwrap();
    let again = d.kubelet.prepare(DRIVER, &claim).await.unwrap();
    assert_eq!(again, out);
    assert_eq!(d.cdi_files().len(), 1);

    // Unknown claims fail alone; unprepare of an unknown claim succeeds.
    let other = [ClaimId::new("default", "x", "uid-404")];
    let err = d.kubelet.prepare(DRIVER, &other).await.unwrap();
    assert!(
        err["uid-404"]
            .as_ref()
            .unwrap_err()
            .contains("not allocated")
    );
    assert!(d.kubelet.unprepare(DRIVER, &other).await.unwrap()["uid-404"].is_ok());

    let un = d.kubelet.unprepare(DRIVER, &claim).await.unwrap();
    assert!(un["uid-1"].is_ok());
    assert!(d.cdi_files().is_empty());
    assert!(d.kubelet.unprepare(DRIVER, &claim).await.unwrap()["uid-1"].is_ok());
    assert!(
        !d.slices.0.lock().unwrap().is_empty(),
        "slices were published"
    );
    d.stop().await;
}

#[tokio::test]
async fn hostile_claim_uids_never_touch_a_path() {
    let claims = Arc::new(Claims::default());
    claims.allocate("../../etc", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let out = d
        .kubelet
        .prepare(DRIVER, &[ClaimId::new("default", "evil", "../../etc")])
        .await
        .unwrap();
    assert!(out["../../etc"].is_err());
    assert!(d.cdi_files().is_empty());
    d.stop().await;
}

#[tokio::test]
async fn restart_keeps_prepared_claims_and_removes_orphans() {
    let claims = Arc::new(Claims::default());
    claims.allocate("uid-1", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let claim = [ClaimId::new("default", "a", "uid-1")];
    let first = d.kubelet.prepare(DRIVER, &claim).await.unwrap();
    let (root, claims) = d.stop().await;
    // Someone leaves a CDI file of ours that no claim owns.
    let orphan = root
        .path()
        .join("cdi")
        .join(format!("k8s.{DRIVER}-claim_uid-zzz.json"));
    std::fs::write(&orphan, "{}").unwrap();
    let d = start_in(root, claims).await;
    assert!(!orphan.exists(), "orphan CDI file kept");
    assert_eq!(d.cdi_files().len(), 1);
    let again = d.kubelet.prepare(DRIVER, &claim).await.unwrap();
    assert_eq!(again, first, "a restart changes no answer");
    d.stop().await;
}

#[tokio::test]
async fn a_new_boot_forgets_old_claims() {
    let claims = Arc::new(Claims::default());
    claims.allocate("uid-1", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    d.kubelet
        .prepare(DRIVER, &[ClaimId::new("default", "a", "uid-1")])
        .await
        .unwrap();
    let (root, claims) = d.stop().await;
    std::fs::write(
        root.path().join("boot_id"),
        "8b7c1f6e-0000-4000-8000-000000000002\n",
    )
    .unwrap();
    let d = start_in(root, claims).await;
    assert!(
        d.cdi_files().is_empty(),
        "CDI files of the previous boot were kept"
    );
    d.stop().await;
}

#[tokio::test]
async fn health_reaches_the_kubelet_and_recovers() {
    let claims = Arc::new(Claims::default());
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let h = |k: &DraKubelet| {
        k.health(DRIVER)
            .get("node-a/gpu-2")
            .map(|h| h.health.clone())
    };
    assert!(
        d.kubelet
            .wait_until(WAIT, |k| h(k).as_deref() == Some("HEALTHY"))
            .await
    );
    std::fs::remove_file(d.root.path().join("health/gpu-2")).unwrap();
    assert!(
        d.kubelet
            .wait_until(WAIT, |k| h(k).as_deref() == Some("UNHEALTHY"))
            .await
    );
    let msg = d.kubelet.health(DRIVER)["node-a/gpu-2"].message.clone();
    assert!(msg.contains("missing"), "{msg}");
    std::fs::write(d.root.path().join("health/gpu-2"), "").unwrap();
    assert!(
        d.kubelet
            .wait_until(WAIT, |k| h(k).as_deref() == Some("HEALTHY"))
            .await
    );
    d.stop().await;
}

#[tokio::test]
async fn device_plugin_resources_and_dra_never_share_a_device() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("dp")).unwrap();
    std::fs::write(r.join("boot_id"), "8b7c1f6e-0000-4000-8000-000000000003\n").unwrap();
    let path = r.join("kubedev.yaml");
    std::fs::write(
        &path,
        format!(
            "nodeName: node-a\ndevicePlugin:\n  directory: {r}/dp\n  resources:\n    - name: example.com/gpu\n      selector:\n        attributes:\n          type: {{string: gpu}}\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\nbackends:\n  static:\n    pool: node-a\n    devices:\n      - {{name: gpu-0, attributes: {{type: {{string: gpu}}}}}}\n      - {{name: gpu-1, attributes: {{type: {{string: gpu}}}}}}\n      - {{name: nic-0, attributes: {{type: {{string: nic}}}}}}\n      - {{name: nic-1, attributes: {{type: {{string: nic}}}}}}\n",
            r = r.display()
        ),
    )
    .unwrap();
    let cfg = Config::load(&path).unwrap();
    let kubelet = DraKubelet::start(r.join("registry")).unwrap();
    let dp_kubelet = kubedev_testkit::kubelet::KubeletEmulator::start(r.join("dp"))
        .await
        .unwrap();
    let slices = Arc::new(Slices::default());
    let cluster = ClusterServices {
        claims: Arc::new(Claims::default()),
        slices: slices.clone(),
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move { run(cfg, &path, Some(cluster), c).await });
    let st = dp_kubelet
        .wait_for("example.com/gpu", WAIT, |s| s.capacity > 0)
        .await
        .unwrap();
    assert_eq!(st.devices.keys().collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    let deadline = std::time::Instant::now() + WAIT;
    let published = loop {
        if let Some(p) = slices.0.lock().unwrap().last().cloned() {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was published as slices"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let names: Vec<String> = published
        .devices()
        .map(|(_, d)| d.name.to_string())
        .collect();
    assert_eq!(
        names,
        ["nic-0", "nic-1"],
        "DRA must publish only what no device-plugin resource takes"
    );
    assert!(
        kubelet
            .wait_until(WAIT, |k| k.health(DRIVER).len() == 2)
            .await,
        "health covers DRA devices only"
    );
    cancel.cancel();
    task.await.unwrap().unwrap();
}
