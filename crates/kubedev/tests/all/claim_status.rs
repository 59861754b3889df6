//! Claim device status (KEP-4817) through the `kubedev` binary: after a prepare the claim's
//! `status.devices` lists this driver's devices, `Ready` with the backend's data; after the
//! unprepare they are gone, and other drivers' entries are never touched.

use crate::common;
use crate::common::process::{DRIVER, Env, NODE, WAIT, stop};
use kubedev_testkit::apiserver::{Resource, Verb};
use kubedev_testkit::kubelet::ClaimId;
use serde_json::{Value, json};

/// The claim's `status.devices`, as stored.
fn device_status(env: &Env, name: &str) -> Value {
    env.api
        .get(Resource::ResourceClaims, Some("default"), name)
        .unwrap()["status"]["devices"]
        .clone()
}

async fn until(env: &Env, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    common::eventually(WAIT, || {
        let now = device_status(env, name);
        let result = if check(&now) {
            Ok(now)
        } else {
            Err(format!(
                "{what}: status.devices is {now}; the daemon said:\n{}",
                env.log_text()
            ))
        };
        async move { result }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_claim_lists_its_devices_ready_and_an_unprepared_one_does_not() {
    let env = Env::new().await;
    let daemon = env.start("").await;
    // Two GPUs of ours and a network device of another driver, which has written its own
    // status entry: kubedev must keep it.
    let other = json!({"driver": "net.example.com", "pool": NODE, "device": "eth1",
                       "networkData": {"interfaceName": "net1"}});
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "train", "namespace": "default", "uid": "uid-train"},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic"}}
                ]}},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"},
                        {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "eth1"}
                    ]}},
                    "devices": [other]
                }
            }),
        )
        .unwrap();
    let claim = ClaimId::new("default", "train", "uid-train");

    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out["uid-train"].is_ok(), "{out:?}");
    let status = until(&env, "train", "both GPUs listed", |s| {
        s.as_array().is_some_and(|a| a.len() == 3)
    })
    .await;
    let ours: Vec<&Value> = status
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["driver"] == DRIVER)
        .collect();
    assert_eq!(ours.len(), 2, "{status}");
    for (entry, device) in ours.iter().zip(["gpu-0", "gpu-3"]) {
        assert_eq!(entry["pool"], NODE);
        assert_eq!(entry["device"], device);
        let ready = &entry["conditions"][0];
        assert_eq!(
            (&ready["type"], &ready["status"], &ready["reason"]),
            (&json!("Ready"), &json!("True"), &json!("Prepared")),
            "{entry}"
        );
        assert!(ready["lastTransitionTime"].is_string(), "{entry}");
        // The static backend's data: the device nodes it gives.
        assert_eq!(entry["data"], json!({"deviceNodes": ["/dev/null"]}));
    }
    assert!(status.as_array().unwrap().contains(&other), "{status}");

    // The kubelet prepares the claim again (another pod, a kubelet restart): the status is read
    // and found as it should be, and nothing is written.
    let (gets, patches) = (
        env.api.request_count(Verb::Get, Resource::ResourceClaims),
        env.api.request_count(Verb::Patch, Resource::ResourceClaims),
    );
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(again["uid-train"].is_ok(), "{again:?}");
    common::eventually(WAIT, || {
        let read = env.api.request_count(Verb::Get, Resource::ResourceClaims);
        async move {
            if read > gets {
                Ok(())
            } else {
                Err("the repeated prepare's status was never checked".to_string())
            }
        }
    })
    .await;
    assert_eq!(
        env.api.request_count(Verb::Patch, Resource::ResourceClaims),
        patches
    );
    assert_eq!(device_status(&env, "train"), status);

    let out = env
        .kubelet
        .unprepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out["uid-train"].is_ok(), "{out:?}");
    let status = until(&env, "train", "our entries cleared", |s| {
        s.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    assert_eq!(status, json!([other]));
    stop(daemon);
}
