//! Device metadata for containers (KEP-5304) through the `kubedev` binary: a prepared claim's
//! request gets a `DeviceMetadata` file with its devices' attributes, in the Kubernetes 1.37
//! form (the same object once per API version, newest first), mounted read-only by a CDI device
//! whose ID the kubelet receives; a file lost while the daemon was down is written again, one
//! whose devices' attributes changed gets the next generation, an unchanged one is left alone;
//! unprepare removes the file and its spec.

use std::path::Path;

use crate::common;
use crate::common::process::{DRIVER, Env, NODE, stop};
use kubedev_testkit::apiserver::Resource;
use kubedev_testkit::kubelet::ClaimId;
use serde_json::{Value, json};

const CONTAINER_FILE: &str = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json";
const V1BETA1: &str = "metadata.resource.k8s.io/v1beta1";
const V1ALPHA1: &str = "metadata.resource.k8s.io/v1alpha1";

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Decodes a device metadata file the way a workload's reader built for the API versions
/// `known` does, following the rules of upstream's `devicemetadata` package: the file is a
/// stream of JSON objects read in order; an object without `apiVersion` or `kind` is an error;
/// an object of a version not in `known` is skipped; the first of a known version is the
/// answer, and whatever follows it is not read. An empty stream, or one of unknown versions
/// only, is an error.
fn decode_metadata(bytes: &[u8], known: &[&str]) -> Result<Value, String> {
    let mut unknown: Vec<String> = Vec::new();
    for item in serde_json::Deserializer::from_slice(bytes).into_iter::<Value>() {
        let object = item.map_err(|e| format!("decoding the metadata stream: {e}"))?;
        let field = |name: &str| {
            object
                .get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let (Some(api_version), Some(_kind)) = (field("apiVersion"), field("kind")) else {
            return Err(format!(
                "metadata object without apiVersion or kind: {object}"
            ));
        };
        if known.contains(&api_version.as_str()) {
            return Ok(object);
        }
        unknown.push(api_version);
    }
    if unknown.is_empty() {
        Err("no metadata objects found in stream".to_owned())
    } else {
        Err(format!(
            "no supported metadata version in stream; found {}",
            unknown.join(", ")
        ))
    }
}

/// Every object of a device metadata file, in order.
fn all_objects(bytes: &[u8]) -> Vec<Value> {
    serde_json::Deserializer::from_slice(bytes)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect()
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[test]
fn the_test_decoder_follows_upstreams_rules() {
    let object = |version: &str, generation: i64| {
        json!({"kind": "DeviceMetadata", "apiVersion": version,
               "metadata": {"name": "c", "namespace": "ns", "uid": "u", "generation": generation}})
        .to_string()
    };
    let future = object("metadata.resource.k8s.io/v2", 3);
    let beta = object(V1BETA1, 2);
    let alpha = object(V1ALPHA1, 1);
    let generation = |stream: String, known: &[&str]| {
        decode_metadata(stream.as_bytes(), known).map(|o| o["metadata"]["generation"].clone())
    };
    let stream = format!("{future}\n{beta}\n{alpha}\n");
    assert_eq!(generation(stream.clone(), &[V1BETA1]), Ok(json!(2)));
    assert_eq!(generation(stream.clone(), &[V1ALPHA1]), Ok(json!(1)));
    assert_eq!(generation(stream, &[V1BETA1, V1ALPHA1]), Ok(json!(2)));
    assert_eq!(
        generation(format!("{beta}\n{{\"broken"), &[V1BETA1]),
        Ok(json!(2)),
        "what follows the answer is not read"
    );
    assert_eq!(
        generation(" \n".to_owned(), &[V1BETA1]),
        Err("no metadata objects found in stream".to_owned())
    );
    let only_unknown = generation(format!("{future}\n{alpha}"), &[V1BETA1]).unwrap_err();
    assert!(
        only_unknown.contains("metadata.resource.k8s.io/v2") && only_unknown.contains(V1ALPHA1),
        "{only_unknown}"
    );
    for bad in [
        json!({"kind": "DeviceMetadata"}),
        json!({"apiVersion": V1BETA1}),
        json!({"kind": "", "apiVersion": V1BETA1}),
    ] {
        let err = generation(format!("{bad}\n{beta}"), &[V1BETA1]).unwrap_err();
        assert!(err.contains("without apiVersion or kind"), "{err}");
    }
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

    let bytes = std::fs::read(&host_file).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.starts_with(&format!(
            "{{\n  \"kind\": \"DeviceMetadata\",\n  \"apiVersion\": \"{V1BETA1}\",\n"
        )) && text.ends_with("}\n"),
        "pretty-printed objects, each ending in a newline, the newest version first:\n{text}"
    );
    let file = decode_metadata(&bytes, &[V1BETA1]).unwrap();
    assert_eq!(file["apiVersion"], V1BETA1);
    assert_eq!(file["kind"], "DeviceMetadata");
    assert_eq!(
        file["metadata"],
        json!({"name": "train-gpus-x7k2q", "namespace": "default", "uid": "uid-train", "generation": 1})
    );
    assert_eq!(file["podClaimName"], "gpus");
    let request = &file["requests"][0];
    assert_eq!(
        request["name"], "gpu/big",
        "the full request name is kept, while the path has the main request"
    );
    assert_eq!(request["devices"].as_array().unwrap().len(), 2);
    assert_eq!(
        request["devices"][0],
        json!({"driver": DRIVER, "pool": NODE, "name": "gpu-0", "attributes": {
            "model": {"string": "x1"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}
        }})
    );
    assert_eq!(request["devices"][1]["name"], "gpu-3");
    // The same object once more for v1alpha1, which a reader built for 1.36 still finds.
    let objects = all_objects(&bytes);
    assert_eq!(objects.len(), 2, "{text}");
    assert_eq!(objects[0], file);
    let alpha = decode_metadata(&bytes, &[V1ALPHA1]).unwrap();
    assert_eq!(alpha, objects[1]);
    assert_eq!(alpha["apiVersion"], V1ALPHA1);
    let mut same = alpha.clone();
    same["apiVersion"] = json!(V1BETA1);
    assert_eq!(same, file, "both versions say the same");
    assert_eq!(
        decode_metadata(&bytes, &[V1BETA1, V1ALPHA1]).unwrap(),
        file,
        "a reader knowing both takes the newest"
    );
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&host_file), 0o644, "the container runtime reads it");

    // A restart with nothing changed leaves the file alone.
    stop(daemon);
    let before = inode(&host_file);
    let daemon = env.start("").await;
    assert_eq!(std::fs::read(&host_file).unwrap(), bytes);
    assert_eq!(inode(&host_file), before, "not written again");

    // The daemon goes down and the file is lost meanwhile: the next start puts it back (a new
    // file, generation 1), and a repeated prepare answers as before.
    stop(daemon);
    std::fs::remove_file(&host_file).unwrap();
    let daemon = env.start("").await;
    assert_eq!(std::fs::read(&host_file).unwrap(), bytes);
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(again["uid-train"].as_ref().unwrap(), devices);

    // A device's attributes changed while the daemon was down: the file is written again with
    // the next generation, keeping podClaimName.
    stop(daemon);
    env.edit_config(|c| c.replace("model: {string: x1}", "model: {string: x2}"));
    let daemon = env.start("").await;
    let bytes = std::fs::read(&host_file).unwrap();
    let file = decode_metadata(&bytes, &[V1BETA1]).unwrap();
    assert_eq!(file["metadata"]["generation"], 2);
    assert_eq!(file["podClaimName"], "gpus");
    assert_eq!(
        file["requests"][0]["devices"][0]["attributes"]["model"],
        json!({"string": "x2"})
    );
    let alpha = decode_metadata(&bytes, &[V1ALPHA1]).unwrap();
    assert_eq!(alpha["metadata"]["generation"], 2);
    assert_eq!(alpha["requests"], file["requests"]);
    let again = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(again["uid-train"].as_ref().unwrap(), devices);
    assert_eq!(
        std::fs::read(&host_file).unwrap(),
        bytes,
        "a repeated prepare changes nothing"
    );

    // The attribute changes while the daemon runs (the backend is rebuilt and discovered
    // again): the file follows with the next generation.
    env.edit_config(|c| c.replace("model: {string: x2}", "model: {string: x3}"));
    let generation = || {
        std::fs::read(&host_file)
            .ok()
            .and_then(|b| decode_metadata(&b, &[V1BETA1]).ok())
            .map(|f| {
                (
                    f["metadata"]["generation"].clone(),
                    f["requests"][0]["devices"][0]["attributes"]["model"].clone(),
                )
            })
    };
    let start = std::time::Instant::now();
    while generation() != Some((json!(3), json!({"string": "x3"}))) {
        assert!(
            start.elapsed() < common::process::WAIT,
            "the file did not follow the change: {:?}",
            generation()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_that_cannot_be_written_fails_the_prepare_as_metadata_and_leaves_nothing() {
    let env = Env::new().await;
    env.edit_config(|c| {
        c.replace(
            "  enabled: true\n",
            "  enabled: true\n  deviceMetadata: true\n",
        )
    });
    let daemon = env.start("").await;
    let claim = env.claim("train", "uid-train", &["gpu-0"]);
    // Something that is not a directory where the claim's directory goes.
    let claim_dir = env
        .root
        .path()
        .join("plugins/dra-device-metadata/default_train");
    std::fs::create_dir_all(claim_dir.parent().unwrap()).unwrap();
    std::fs::write(&claim_dir, "in the way").unwrap();

    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let error = out["uid-train"].as_ref().unwrap_err();
    assert!(
        error.starts_with("writing the device metadata of claim default/train (uid-train): ")
            && error.contains(claim_dir.to_str().unwrap()),
        "the kubelet is told which step failed and on which path: {error}"
    );
    assert_eq!(
        env.cdi_files(),
        Vec::<std::path::PathBuf>::new(),
        "the claim's CDI spec is removed with the failed prepare"
    );

    // Once the path is free, the kubelet's next try prepares the claim.
    std::fs::remove_file(&claim_dir).unwrap();
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out["uid-train"].is_ok(), "{out:?}");
    assert!(claim_dir.join("gpu/metadata.json").is_file());
    stop(daemon);
}
