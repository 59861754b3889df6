//! The DRA device metadata file, readable in the container at its documented path.

use kubedev_testkit::kubelet::ClaimId;
use kubedev_testkit::podman::Container;

use super::{char_dev, node_of, podman, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, podman and runc: run by cargo xtask ci"]
async fn device_metadata_file_is_readable_at_the_documented_path() {
    use crate::common::process::{DRIVER, Env, NODE, stop};
    use kubedev_testkit::apiserver::Resource;
    use serde_json::{Value, json};
    const CONTAINER_FILE: &str = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json";

    let podman = podman();
    let env = Env::new().await;
    env.edit_config(|c| {
        c.replace("  enabled: true\n", "  enabled: true\n  deviceMetadata: true\n")
            .replace(
                "      - name: gpu-0\n",
                "      - name: gpu-0\n        attributes:\n          model: {string: x1}\n          resource.kubernetes.io/pciBusID: {string: \"0000:3b:00.0\"}\n",
            )
    });
    let daemon = env.start("").await;
    let uid = "5f1d2c3b-0000-4000-8000-00000000a009";
    env.api
        .put_raw(
            Resource::ResourceClaims,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "train-gpus-x7k2q", "namespace": "default", "uid": uid,
                             "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}
                ]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
                    {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}
                ]}}}
            }),
        )
        .unwrap();
    let claim = ClaimId::new("default", "train-gpus-x7k2q", uid);
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = out[uid].as_ref().unwrap();
    let ids: Vec<String> = devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect();
    let specs = env.cdi_files();
    assert_eq!(
        specs.len(),
        2,
        "the claim's spec and its metadata spec: {specs:?}"
    );
    let texts: Vec<String> = specs
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let _installed: Vec<_> = texts
        .iter()
        .map(|t| podman.install_spec(t).unwrap())
        .collect();
    let mut container = Container::new(format!(
        "echo \"meta=$(tr -d '\\n' < {CONTAINER_FILE})\"\n\
         echo \"meta_write=$( (: >> {CONTAINER_FILE}) 2>&1 && echo written)\"\n\
         echo \"null=$(stat -c '%F|%t|%T' /dev/null)\"\n\
         echo \"visible=$STATIC_VISIBLE_DEVICES\"\n"
    ))
    .devices(&ids);
    for t in &texts {
        let kind = serde_json::from_str::<Value>(t).unwrap()["kind"]
            .as_str()
            .unwrap()
            .to_string();
        let mine: Vec<&String> = ids
            .iter()
            .filter(|id| id.starts_with(&format!("{kind}=")))
            .collect();
        container = container.check(t, &mine);
    }
    let run_out = run(&podman, container);
    run_out.assert_ok();
    // The file is a stream of objects (v1beta1 first, then v1alpha1): read the first.
    let meta: Value = serde_json::Deserializer::from_str(run_out.value("meta").unwrap())
        .into_iter::<Value>()
        .next()
        .expect("an object in the metadata file")
        .unwrap_or_else(|e| {
            panic!(
                "the metadata file does not parse: {e}\n{}",
                run_out.report()
            )
        });
    assert_eq!(meta["kind"], "DeviceMetadata", "{meta}");
    assert_eq!(meta["metadata"]["uid"], uid, "{meta}");
    assert_eq!(meta["podClaimName"], "gpus", "{meta}");
    let names: Vec<&str> = meta["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-3"], "{meta}");
    assert_eq!(
        meta["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"],
        json!({"string": "0000:3b:00.0"}),
        "{meta}"
    );
    let write = run_out.value("meta_write").unwrap();
    assert!(write.contains("Read-only file system"), "{write}");
    assert_eq!(node_of(&run_out, "null"), char_dev(1, 3));
    assert_eq!(run_out.value("visible"), Some("gpu-0,gpu-3"));
    stop(daemon);
}
