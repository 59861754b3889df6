//! Consumable capacity (KEP-5075) through the `kubedev` binary: a host socket device marked
//! `consumableCapacity` is published once, allowing multiple allocations, with a `slots`
//! capacity and its request policy; two claims allocated shares of it are prepared side by side
//! (one CDI device per share ID), and unpreparing one leaves the other in place.

use crate::common;
use crate::common::process::{DRIVER, Env, WAIT, slices_of, stop};
use kubedev_testkit::apiserver::Resource;
use kubedev_testkit::kubelet::ClaimId;
use serde_json::{Value, json};

const POOL: &str = "node-a-host";

fn share_claim(env: &Env, name: &str, uid: &str, share: &str, slots: &str) -> ClaimId {
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default", "uid": uid},
                "spec": {"devices": {"requests": [{"name": "qgs", "exactly": {
                    "deviceClassName": "qgs",
                    "capacity": {"requests": {"slots": slots}}
                }}]}},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "qgs", "driver": DRIVER, "pool": POOL, "device": "qgs",
                    "shareID": share, "consumedCapacity": {"slots": slots}
                }]}}}
            }),
        )
        .unwrap();
    ClaimId::new("default", name, uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_share_one_socket_device() {
    let env = Env::new().await;
    let socket_dir = env.root.path().join("qgs");
    std::fs::create_dir_all(&socket_dir).unwrap();
    let socket = socket_dir.join("qgs.socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    env.edit_config(|c| {
        format!(
            "{c}  host:\n    socketDevices:\n      - {{name: qgs, path: {}, slots: 4, consumableCapacity: true}}\n",
            socket.display()
        )
    });
    let daemon = env.start("").await;

    let device: Value = common::eventually(WAIT, || {
        let found = slices_of(&env.api)
            .into_iter()
            .filter(|s| s["spec"]["pool"]["name"] == POOL)
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == "qgs")
            .ok_or_else(|| {
                format!(
                    "no shared device published; the daemon said:\n{}",
                    env.log_text()
                )
            });
        async move { found }
    })
    .await;
    assert_eq!(device["allowMultipleAllocations"], true, "{device}");
    assert_eq!(
        device["capacity"]["slots"],
        json!({"value": "4", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}),
        "{device}"
    );

    let share_a = "4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e";
    let share_b = "9c2d1e0f-7a6b-4c5d-8e9f-0a1b2c3d4e5f";
    let a = share_claim(&env, "vm-a", "uid-a", share_a, "1");
    let b = share_claim(&env, "vm-b", "uid-b", share_b, "3");
    let out = env
        .kubelet
        .prepare(DRIVER, &[a.clone(), b.clone()])
        .await
        .unwrap();
    let id = |uid: &str, share: &str| format!("k8s.{DRIVER}/claim={uid}-qgs-{share}");
    for (uid, share) in [("uid-a", share_a), ("uid-b", share_b)] {
        let devices = out[uid].as_ref().unwrap_or_else(|e| panic!("{uid}: {e}"));
        assert_eq!(devices[0].device, "qgs");
        assert_eq!(devices[0].share_id.as_deref(), Some(share));
        assert_eq!(devices[0].cdi_device_ids, [id(uid, share)]);
    }
    let specs = env.cdi_files();
    assert_eq!(specs.len(), 2, "{specs:?}");
    for spec in &specs {
        let text = std::fs::read_to_string(spec).unwrap();
        assert!(text.contains(&*socket_dir.to_string_lossy()), "{text}");
    }

    let out = env
        .kubelet
        .unprepare(DRIVER, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert!(out["uid-a"].is_ok(), "{out:?}");
    let left = env.cdi_files();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].to_string_lossy().contains("uid-b"), "{left:?}");
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&b))
        .await
        .unwrap();
    assert_eq!(
        again["uid-b"].as_ref().unwrap()[0].cdi_device_ids,
        [id("uid-b", share_b)]
    );
    stop(daemon);
}
