//! Dynamic MIG: prepare creates the instance, unprepare destroys it, crashes are repaired.

use kubedev_core::{
    AllocatedDevice, ClaimRef, Consumer, DeviceName, DeviceRef, PoolName, PreparedDevice, Preparer,
};
use kubedev_nvidia::{MigStrategy, NvidiaBackend, NvidiaConfig};
use nvml_wrapper::Nvml;

use crate::{Fixture, discover};

fn partitionable(f: &Fixture) -> NvidiaBackend {
    f.backend(NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        ..f.config()
    })
}

fn alloc(device: &str) -> AllocatedDevice {
    AllocatedDevice::new(DeviceRef::new(
        PoolName::new("node-a-nvidia").unwrap(),
        DeviceName::new(device).unwrap(),
    ))
    .with_request("gpu")
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef::parse(uid, "default", &format!("claim-{uid}")).unwrap()
}

/// The capability node minor of `gpu<g>/gi<i>/access` (and `ci<c>`) in the fake host's list.
fn cap(g: u32, gi: u32, ci: Option<u32>) -> String {
    let base = 3 + g * 135 + gi * 9;
    let n = match ci {
        None => base,
        Some(c) => base + 1 + c,
    };
    format!("/dev/nvidia-caps/nvidia-cap{n}")
}

/// A handle that keeps the mock's state (the "driver") alive while backends come and go, as
/// the kernel driver keeps MIG instances across daemon restarts.
fn driver(f: &Fixture) -> Nvml {
    Nvml::builder()
        .lib_path(f.library.as_os_str())
        .init()
        .unwrap()
}

/// The MIG UUIDs NVML lists on GPU `index`, through a second handle on the same mock copy.
fn mig_uuids(f: &Fixture, index: u32) -> Vec<String> {
    let nvml = Nvml::builder()
        .lib_path(f.library.as_os_str())
        .init()
        .unwrap();
    let dev = nvml.device_by_index(index).unwrap();
    let max = dev.mig_device_count().unwrap();
    (0..max)
        .filter_map(|i| dev.mig_device_by_index(i).ok())
        .map(|m| m.uuid().unwrap())
        .collect()
}

fn record_path(f: &Fixture, device: &str) -> std::path::PathBuf {
    f.ctx.state_dir.join(format!("mig-{device}.json"))
}

fn set_record_state(f: &Fixture, device: &str, state: &str) {
    let p = record_path(f, device);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["state"] = serde_json::Value::String(state.into());
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn visible(p: &[PreparedDevice]) -> String {
    p[0].edits.env["NVIDIA_VISIBLE_DEVICES"].clone()
}

#[tokio::test]
async fn prepare_creates_and_unprepare_destroys_the_instance() {
    let f = Fixture::new("dgx-a100");
    let b = partitionable(&f);
    discover(&b).await;
    assert!(mig_uuids(&f, 6).is_empty());
    let c1 = Consumer::Claim(claim("c1"));
    let dev = "gpu-6-mig-3g20gb-4";
    let out = b.prepare(&c1, &[alloc(dev)]).await.unwrap();
    let uuid = visible(&out);
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    assert_eq!(mig_uuids(&f, 6), vec![uuid.clone()]);
    let nodes: Vec<_> = out[0]
        .edits
        .device_nodes
        .iter()
        .map(|n| n.path.clone())
        .collect();
    // The GPU instance of a 3g.20gb at slice 4 has id 2 on an A100.
    assert_eq!(
        nodes,
        [
            "/dev/nvidiactl".to_string(),
            "/dev/nvidia-uvm".into(),
            "/dev/nvidia-uvm-tools".into(),
            "/dev/nvidia6".into(),
            cap(6, 2, None),
            cap(6, 2, Some(0)),
        ]
    );
    assert!(record_path(&f, dev).is_file());

    // Idempotent: the same answer, no second instance.
    let again = b.prepare(&c1, &[alloc(dev)]).await.unwrap();
    assert_eq!(again, out);
    assert_eq!(mig_uuids(&f, 6).len(), 1);

    // Another claim cannot take the placement.
    let err = b
        .prepare(&Consumer::Claim(claim("c2")), &[alloc(dev)])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("c1") && err.contains(dev), "{err}");

    // The device-plugin API never unprepares: placements are refused there.
    let err = b
        .prepare(
            &Consumer::Container {
                resource: "nvidia.com/gpu".into(),
            },
            &[alloc("gpu-6-mig-1g5gb-0")],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("DRA claims only"), "{err}");

    // Rediscovery keeps the placement device (it is ours), not a static copy of it.
    let pool = discover(&b).await;
    let d = pool.device(dev).unwrap();
    assert_eq!(d.consumes_counters.len(), 1);
    assert!(pool.device("gpu-6").is_some());

    // Unprepare of another claim leaves it; of the owner destroys it; twice is fine.
    b.unprepare(&claim("c2"), &[alloc(dev)]).await.unwrap();
    assert_eq!(mig_uuids(&f, 6).len(), 1);
    b.unprepare(&claim("c1"), &[alloc(dev)]).await.unwrap();
    assert!(mig_uuids(&f, 6).is_empty());
    assert!(!record_path(&f, dev).exists());
    b.unprepare(&claim("c1"), &[alloc(dev)]).await.unwrap();

    // Whole GPUs and placements of other sizes still prepare.
    let whole = b.prepare(&c1, &[alloc("gpu-0")]).await.unwrap();
    assert_eq!(visible(&whole), "GPU-4a1c2e8f-61b0-3d27-9a4e-0c5f7b1d2e01");
    let seven = b
        .prepare(&c1, &[alloc("gpu-6-mig-7g40gb-0")])
        .await
        .unwrap();
    assert!(visible(&seven).starts_with("MIG-"));
    b.unprepare(&claim("c1"), &[alloc("gpu-6-mig-7g40gb-0")])
        .await
        .unwrap();
    assert!(mig_uuids(&f, 6).is_empty());
}

#[tokio::test]
async fn placements_occupied_by_foreign_instances_fail_cleanly() {
    let f = Fixture::new("dgx-a100");
    let b = partitionable(&f);
    discover(&b).await;
    // The placement a stale scheduler view might pick on GPU 7 is not published; an unknown
    // device is an error that names it.
    let err = b
        .prepare(&Consumer::Claim(claim("c1")), &[alloc("gpu-7-mig-1g5gb-7")])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("gpu-7-mig-1g5gb-7"), "{err}");
}

#[tokio::test]
async fn a_crash_after_creating_is_rolled_back_at_start() {
    let f = Fixture::new("dgx-a100");
    let _driver = driver(&f);
    let dev = "gpu-6-mig-2g10gb-2";
    {
        let b = partitionable(&f);
        discover(&b).await;
        b.prepare(&Consumer::Claim(claim("c1")), &[alloc(dev)])
            .await
            .unwrap();
        assert_eq!(mig_uuids(&f, 6).len(), 1);
        // As if the daemon died after creating the instances but before recording that.
        set_record_state(&f, dev, "creating");
    }
    let b = partitionable(&f);
    assert!(
        mig_uuids(&f, 6).is_empty(),
        "the unfinished creation is rolled back when NVML is loaded"
    );
    assert!(!record_path(&f, dev).exists());
    // The runtime then unprepares the claim it had not finished preparing: a no-op.
    b.unprepare(&claim("c1"), &[alloc(dev)]).await.unwrap();
    // Or prepares it again: a fresh instance.
    discover(&b).await;
    let out = b
        .prepare(&Consumer::Claim(claim("c1")), &[alloc(dev)])
        .await
        .unwrap();
    assert_eq!(mig_uuids(&f, 6), vec![visible(&out)]);
}

#[tokio::test]
async fn a_crash_before_creating_or_during_unprepare_is_repaired() {
    let f = Fixture::new("dgx-a100");
    let kept = "gpu-6-mig-1g5gb-0";
    let dying = "gpu-6-mig-1g5gb-1";
    let never = "gpu-6-mig-1g5gb-2";
    let _driver = driver(&f);
    {
        let b = partitionable(&f);
        discover(&b).await;
        for d in [kept, dying, never] {
            b.prepare(&Consumer::Claim(claim(d)), &[alloc(d)])
                .await
                .unwrap();
        }
        // `never`: the record was written, the instance not yet made.
        b.unprepare(&claim(never), &[alloc(never)]).await.unwrap();
        let rec = serde_json::json!({
            "claimUid": never, "device": never,
            "gpuUuid": "GPU-3e5a7c97-6b8f-4dac-87e5-90b13d4f5b67",
            "profileIndex": 0, "profileId": 19, "start": 2, "size": 1, "state": "creating"
        });
        std::fs::write(record_path(&f, never), rec.to_string()).unwrap();
        // `dying`: unprepare had marked it but not destroyed it yet.
        set_record_state(&f, dying, "destroying");
        assert_eq!(mig_uuids(&f, 6).len(), 2);
    }
    let b = partitionable(&f);
    assert_eq!(
        mig_uuids(&f, 6).len(),
        1,
        "only the completed prepare is left"
    );
    assert!(record_path(&f, kept).exists());
    assert!(!record_path(&f, dying).exists());
    assert!(!record_path(&f, never).exists());
    // The surviving claim still gets its instance back, unchanged.
    discover(&b).await;
    let out = b
        .prepare(&Consumer::Claim(claim(kept)), &[alloc(kept)])
        .await
        .unwrap();
    assert_eq!(mig_uuids(&f, 6), vec![visible(&out)]);
}

#[tokio::test]
async fn a_creating_record_with_a_complete_instance_is_adopted_by_prepare() {
    let f = Fixture::new("dgx-a100");
    let b = partitionable(&f);
    discover(&b).await;
    let dev = "gpu-6-mig-4g20gb-0";
    let c = Consumer::Claim(claim("c9"));
    let first = b.prepare(&c, &[alloc(dev)]).await.unwrap();
    set_record_state(&f, dev, "creating");
    let second = b.prepare(&c, &[alloc(dev)]).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(mig_uuids(&f, 6).len(), 1);
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record_path(&f, dev)).unwrap()).unwrap();
    assert_eq!(rec["state"], "created");
}

#[tokio::test]
async fn nvml_loaded_after_start_still_reconciles_and_unprepares() {
    // The driver (here: the mock) appears only after the backend started.
    let f = Fixture::new("dgx-a100");
    let late_dir = f.dir.path().join("late");
    std::fs::create_dir_all(&late_dir).unwrap();
    let late_lib = late_dir.join(nvml_mock::LIBRARY_FILE);
    let b = f.backend(NvidiaConfig {
        mig_strategy: MigStrategy::Partitionable,
        library_path: Some(late_lib.clone()),
        ..NvidiaConfig::default()
    });
    let dev = "gpu-6-mig-1g5gb-0";
    let rec = serde_json::json!({
        "claimUid": "c1", "device": dev,
        "gpuUuid": "GPU-3e5a7c97-6b8f-4dac-87e5-90b13d4f5b67",
        "profileIndex": 0, "profileId": 19, "start": 0, "size": 1, "state": "created",
        "giId": 7, "ciId": 0, "migUuid": "MIG-gone"
    });
    std::fs::write(record_path(&f, dev), rec.to_string()).unwrap();
    let copied =
        nvml_mock::isolated_library(&late_dir, &nvml_mock::machine_path("dgx-a100"), None).unwrap();
    assert_eq!(copied, late_lib);
    // The first NVML use reconciles under the MIG lock; unprepare must not wait on itself.
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        b.unprepare(&claim("c1"), &[alloc(dev)]),
    )
    .await
    .expect("no deadlock")
    .unwrap();
    assert!(!record_path(&f, dev).exists());
}
