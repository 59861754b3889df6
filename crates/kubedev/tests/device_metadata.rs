//! Device metadata for containers (KEP-5304) through the `kubedev` binary: a prepared claim's
//! request gets a `DeviceMetadata` file with its devices' attributes, mounted read-only by a CDI
//! device whose ID the kubelet receives; a file lost while the daemon was down is written again;
//! unprepare removes the file and its spec.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::process::{DRIVER, Env, NODE, stop};
use kubedev_testkit::apiserver::Resource;
use kubedev_testkit::kubelet::ClaimId;
use serde_json::{Value, json};

const CONTAINER_FILE: &str = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json";

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_gets_a_metadata_file_mounted_through_cdi() {
    let env = Env::new().await;
    env.edit_config(|c| {
        c.replace("  enabled: true\n", "  enabled: true\n  deviceMetadata: true\n")
            .replace(
                "      - name: gpu-0\n",
                "      - name: gpu-0\n        attributes:\n          model: {string: x1}\n          resource.kubernetes.io/pciBusID: {string: \"0000:3b:00.0\"}\n",
            )
    });
    let daemon = env.start("").await;
    // A claim made from a template: the pod calls it "gpus".
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "train-gpus-x7k2q", "namespace": "default", "uid": "uid-train",
                             "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "gpu", "count": 2}]}
                ]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu/big", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
                    {"request": "gpu/big", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}
                ]}}}
            }),
        )
        .unwrap();
    let claim = ClaimId::new("default", "train-gpus-x7k2q", "uid-train");

    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = out["uid-train"].as_ref().unwrap();
    let meta_id = format!("k8s.{DRIVER}/metadata=uid-train-gpu");
    assert_eq!(
        devices[0].cdi_device_ids,
        [
            format!("k8s.{DRIVER}/claim=uid-train-gpu-0"),
            meta_id.clone()
        ],
        "the request's first device carries the metadata"
    );
    assert_eq!(
        devices[1].cdi_device_ids,
        [format!("k8s.{DRIVER}/claim=uid-train-gpu-3")]
    );

    let root = env.root.path();
    let host_file =
        root.join("plugins/dra-device-metadata/default_train-gpus-x7k2q/gpu/metadata.json");
    let spec = read_json(&root.join(format!("cdi/k8s.{DRIVER}-metadata_uid-train.json")));
    assert_eq!(spec["kind"], format!("k8s.{DRIVER}/metadata"));
    let device = &spec["devices"][0];
    assert_eq!(device["name"], "uid-train-gpu");
    let mount = &device["containerEdits"]["mounts"][0];
    assert_eq!(mount["hostPath"], host_file.to_str().unwrap());
    assert_eq!(mount["containerPath"], CONTAINER_FILE);
    assert!(
        mount["options"].as_array().unwrap().contains(&json!("ro")),
        "{mount}"
    );

    let file = read_json(&host_file);
    assert_eq!(file["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(file["kind"], "DeviceMetadata");
    assert_eq!(
        file["metadata"],
        json!({"name": "train-gpus-x7k2q", "namespace": "default", "uid": "uid-train", "generation": 1})
    );
    assert_eq!(file["podClaimName"], "gpus");
    let request = &file["requests"][0];
    assert_eq!(request["name"], "gpu/big", "the full request name is kept");
    assert_eq!(request["devices"].as_array().unwrap().len(), 2);
    assert_eq!(
        request["devices"][0],
        json!({"driver": DRIVER, "pool": NODE, "name": "gpu-0", "attributes": {
            "model": {"string": "x1"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}
        }})
    );
    assert_eq!(request["devices"][1]["name"], "gpu-3");
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&host_file), 0o644, "the container runtime reads it");

    // The daemon goes down and the file is lost meanwhile: the next start puts it back, and a
    // repeated prepare answers as before.
    stop(daemon);
    std::fs::remove_file(&host_file).unwrap();
    let daemon = env.start("").await;
    assert_eq!(read_json(&host_file), file);
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(again["uid-train"].as_ref().unwrap(), devices);

    let out = env
        .kubelet
        .unprepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out["uid-train"].is_ok(), "{out:?}");
    assert!(!host_file.parent().unwrap().parent().unwrap().exists());
    assert_eq!(
        env.cdi_files(),
        Vec::<std::path::PathBuf>::new(),
        "no spec is left"
    );
    stop(daemon);
}
