//! The DRA driver of the runtime, in-process, against the kubelet emulator's DRA side.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Claims, Daemon, DraDaemon, Slices};
use kubedev::runtime::ClusterServices;
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};

const DRIVER: &str = "gpu.example.com";
const WAIT: Duration = Duration::from_secs(10);

/// Allocates the GPUs `names` of the pool `node-a` to the claim `uid`, as the subrequest
/// `gpus/large`.
fn allocate(claims: &Claims, uid: &str, names: &[&str]) {
    let devices: Vec<_> = names.iter().map(|n| common::device("node-a", n)).collect();
    claims.allocate(uid, "gpus/large", &devices);
}

/// The daemon with its DRA kubelet, in a root of its own.
struct Node {
    root: tempfile::TempDir,
    dra: DraDaemon,
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
        "nodeName: node-a\n{dra}backends:\n  static:\n    pool: node-a\n    pollIntervalMs: 20\n    devices:\n{devices}",
        dra = common::dra_section(DRIVER, root, &root.join("plugins").join(DRIVER))
    )
}

async fn start_in(root: tempfile::TempDir, claims: Arc<Claims>) -> Node {
    let r = root.path().to_path_buf();
    if !r.join("boot_id").exists() {
        std::fs::write(r.join("boot_id"), "8b7c1f6e-0000-4000-8000-000000000001\n").unwrap();
    }
    let path = r.join("kubedev.yaml");
    let dra = DraDaemon::start(&r, &path, &config(&r), DRIVER, claims, WAIT).await;
    Node { root, dra }
}

impl Node {
    async fn stop(self) -> (tempfile::TempDir, Arc<Claims>) {
        let claims = self.dra.stop().await;
        (self.root, claims)
    }

    fn cdi_files(&self) -> Vec<PathBuf> {
        common::cdi_files(&self.root.path().join("cdi"))
    }
}

#[tokio::test]
async fn prepare_writes_cdi_and_is_idempotent_unprepare_cleans_up() {
    let claims = Arc::new(Claims::default());
    allocate(&claims, "uid-1", &["gpu-1", "gpu-3"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let claim = [ClaimId::new("default", "train", "uid-1")];
    let out = d.dra.kubelet.prepare(DRIVER, &claim).await.unwrap();
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
    let again = d.dra.kubelet.prepare(DRIVER, &claim).await.unwrap();
    assert_eq!(again, out);
    assert_eq!(d.cdi_files().len(), 1);

    // Unknown claims fail alone; unprepare of an unknown claim succeeds.
    let other = [ClaimId::new("default", "x", "uid-404")];
    let err = d.dra.kubelet.prepare(DRIVER, &other).await.unwrap();
    assert!(
        err["uid-404"]
            .as_ref()
            .unwrap_err()
            .contains("not allocated")
    );
    assert!(d.dra.kubelet.unprepare(DRIVER, &other).await.unwrap()["uid-404"].is_ok());

    let un = d.dra.kubelet.unprepare(DRIVER, &claim).await.unwrap();
    assert!(un["uid-1"].is_ok());
    assert!(d.cdi_files().is_empty());
    assert!(d.dra.kubelet.unprepare(DRIVER, &claim).await.unwrap()["uid-1"].is_ok());
    assert!(d.dra.slices.count() > 0, "slices were published");
    d.stop().await;
}

#[tokio::test]
async fn hostile_claim_uids_never_touch_a_path() {
    let claims = Arc::new(Claims::default());
    allocate(&claims, "../../etc", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let out = d
        .dra
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
    allocate(&claims, "uid-1", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let claim = [ClaimId::new("default", "a", "uid-1")];
    let first = d.dra.kubelet.prepare(DRIVER, &claim).await.unwrap();
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
    let again = d.dra.kubelet.prepare(DRIVER, &claim).await.unwrap();
    assert_eq!(again, first, "a restart changes no answer");
    d.stop().await;
}

#[tokio::test]
async fn a_new_boot_forgets_old_claims() {
    let claims = Arc::new(Claims::default());
    allocate(&claims, "uid-1", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    d.dra
        .kubelet
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
    let health = |want| common::wait_dra_health(&d.dra.kubelet, DRIVER, "node-a/gpu-2", want, WAIT);
    health("HEALTHY").await;
    std::fs::remove_file(d.root.path().join("health/gpu-2")).unwrap();
    health("UNHEALTHY").await;
    let msg = d.dra.kubelet.health(DRIVER)["node-a/gpu-2"].message.clone();
    assert!(msg.contains("missing"), "{msg}");
    std::fs::write(d.root.path().join("health/gpu-2"), "").unwrap();
    health("HEALTHY").await;
    d.stop().await;
}

#[tokio::test]
async fn device_plugin_resources_and_dra_never_share_a_device() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("dp")).unwrap();
    std::fs::write(r.join("boot_id"), "8b7c1f6e-0000-4000-8000-000000000003\n").unwrap();
    let path = r.join("kubedev.yaml");
    let cfg = common::write_config(
        &path,
        &format!(
            "nodeName: node-a\ndevicePlugin:\n  directory: {dp}\n  resources:\n    - name: example.com/gpu\n      selector:\n        attributes:\n          type: {{string: gpu}}\n{dra}backends:\n  static:\n    pool: node-a\n    devices:\n      - {{name: gpu-0, attributes: {{type: {{string: gpu}}}}}}\n      - {{name: gpu-1, attributes: {{type: {{string: gpu}}}}}}\n      - {{name: nic-0, attributes: {{type: {{string: nic}}}}}}\n      - {{name: nic-1, attributes: {{type: {{string: nic}}}}}}\n",
            dp = r.join("dp").display(),
            dra = common::dra_section(DRIVER, r, &r.join("plugins")),
        ),
    );
    let kubelet = DraKubelet::start(r.join("registry")).unwrap();
    let dp_kubelet = kubedev_testkit::kubelet::KubeletEmulator::start(r.join("dp"))
        .await
        .unwrap();
    let slices = Arc::new(Slices::default());
    let cluster = ClusterServices {
        claims: Arc::new(Claims::default()),
        slices: slices.clone(),
        events: None,
        api: None,
    };
    let daemon = Daemon::spawn(cfg, &path, Some(cluster));
    let st = dp_kubelet
        .wait_for("example.com/gpu", WAIT, |s| s.capacity > 0)
        .await
        .unwrap();
    assert_eq!(st.devices.keys().collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    let published = slices.wait_last(WAIT).await;
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
    daemon.stop().await;
}

/// Each failed claim tells the kubelet whether its retries can succeed: a device of another
/// node or one the backend does not know is permanent; a device held by another claim is not.
#[tokio::test]
async fn failures_say_whether_the_kubelets_retries_can_succeed() {
    let claims = Arc::new(Claims::default());
    claims.allocate(
        "uid-elsewhere",
        "gpus",
        &[common::device("node-b", "gpu-1")],
    );
    allocate(&claims, "uid-unknown", &["gpu-7"]);
    allocate(&claims, "uid-first", &["gpu-0"]);
    allocate(&claims, "uid-second", &["gpu-0"]);
    let d = start_in(tempfile::tempdir().unwrap(), claims).await;
    let permanent = "(permanent: retrying cannot succeed until the claim or the driver's \
                     configuration changes)";
    let out = d
        .dra
        .kubelet
        .prepare(
            DRIVER,
            &[
                ClaimId::new("default", "elsewhere", "uid-elsewhere"),
                ClaimId::new("default", "unknown", "uid-unknown"),
                ClaimId::new("default", "first", "uid-first"),
            ],
        )
        .await
        .unwrap();
    let elsewhere = out["uid-elsewhere"].as_ref().unwrap_err();
    assert!(
        elsewhere.contains("node-b/gpu-1 is not on this node") && elsewhere.ends_with(permanent),
        "{elsewhere}"
    );
    let unknown = out["uid-unknown"].as_ref().unwrap_err();
    assert!(
        unknown.contains("gpu-7") && unknown.ends_with(permanent),
        "{unknown}"
    );
    assert!(out["uid-first"].is_ok(), "{out:?}");
    let out = d
        .dra
        .kubelet
        .prepare(DRIVER, &[ClaimId::new("default", "second", "uid-second")])
        .await
        .unwrap();
    let busy = out["uid-second"].as_ref().unwrap_err();
    assert!(
        busy.contains("already prepared for claim default/first") && !busy.contains("permanent"),
        "{busy}"
    );
    d.stop().await;
}
