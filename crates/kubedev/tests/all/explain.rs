//! `kubedev explain` on a cluster dump made from the API-server emulator, as `kubectl get
//! resourceslices,deviceclasses,resourceclaims,nodes,pods -o yaml` (and `-o json`) prints it:
//! a List of stored objects with their metadata, `managedFields` and status; and on the
//! emulator itself, read through a kubeconfig. The pod's 2-GPU claim fits the node with two
//! free GPUs; the node whose GPU another claim holds and the node with one GPU do not, each
//! with the reason.

use std::process::Command;

use kubedev_testkit::apiserver::{ApiServer, Resource};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";

fn slice(node: &str, gpus: usize) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"model": {"string": "H100"}}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": format!("{node}-gpus")},
           "spec": {"driver": DRIVER, "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices}})
}

fn claim(name: &str, count: usize, allocated: Option<(&str, &str)>) -> Value {
    let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}}});
    if let Some((pool, device)) = allocated {
        c["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}]}}});
    }
    c
}

/// The emulator with three nodes' slices, a class, a claim holding one of node-b's GPUs, the
/// pod's 2-GPU claim and the pod.
async fn emulator() -> ApiServer {
    let api = ApiServer::builder().start().await.unwrap();
    for (node, gpus) in [("node-a", 2), ("node-b", 2), ("node-c", 1)] {
        api.put_raw(Resource::ResourceSlices, slice(node, gpus))
            .unwrap();
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"zone": "z1"}}}),
        )
        .unwrap();
    }
    api.put_raw(
        Resource::DeviceClasses,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == {DRIVER:?}")}}]}}),
    )
    .unwrap();
    api.put_raw(
        Resource::ResourceClaims,
        claim("other", 1, Some(("node-b", "gpu-0"))),
    )
    .unwrap();
    api.put_raw(Resource::ResourceClaims, claim("train", 2, None))
        .unwrap();
    api.put_raw(
        Resource::Pods,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": "train"}]},
            "status": {"phase": "Pending"}}),
    )
    .unwrap();
    api
}

/// The dump of every object the emulator stores, as YAML and as JSON.
async fn dump(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let api = emulator().await;
    let mut items = Vec::new();
    for r in [
        Resource::ResourceSlices,
        Resource::DeviceClasses,
        Resource::ResourceClaims,
        Resource::Nodes,
        Resource::Pods,
    ] {
        items.extend(api.objects(r));
    }
    assert!(
        items
            .iter()
            .any(|i| i["metadata"]["managedFields"].is_array()
                || i["metadata"]["resourceVersion"].is_string()),
        "the dump carries what a real one does"
    );
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let (yaml, json) = (dir.join("cluster.yaml"), dir.join("cluster.json"));
    std::fs::write(&yaml, serde_saphyr::to_string(&list).unwrap()).unwrap();
    std::fs::write(&json, list.to_string()).unwrap();
    (yaml, json)
}

fn explain(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .arg("explain")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_pods_claims_are_explained_for_every_node_of_a_dump() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dump(dir.path()).await;
    let file = path.to_str().unwrap();

    let text = explain(&["-f", file, "--pod", "default/trainer", "--details"]);
    assert!(
        text.starts_with("1 of 3 nodes can take default/train\n  fit: node-a\n"),
        "{text}"
    );
    assert!(text.contains("node node-b:"), "{text}");
    assert!(text.contains("node node-c:"), "{text}");

    let json: Value = serde_json::from_str(&explain(&[
        "-f",
        file,
        "--claim",
        "default/train",
        "-o",
        "json",
    ]))
    .unwrap();
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes[0], json!({"node": "node-a", "fits": true}));
    for n in &nodes[1..] {
        assert_eq!(n["fits"], false, "{n}");
        let reasons = n["reasons"].as_array().unwrap();
        assert!(
            reasons.iter().any(|r| r
                .as_str()
                .unwrap()
                .contains("claim default/train request gpu")),
            "{n}"
        );
    }
    // node-b: one GPU taken by the other claim; node-c: one GPU only.
    let reasons =
        |node: &str| nodes.iter().find(|n| n["node"] == node).unwrap()["reasons"].to_string();
    assert!(
        reasons("node-b").contains("2 devices, 1 in use, 1 usable, 2 wanted"),
        "{}",
        reasons("node-b")
    );
    assert!(
        reasons("node-c").contains("1 devices, 1 usable, 2 wanted"),
        "{}",
        reasons("node-c")
    );

    // An allocated claim is not allocated again; an unknown pod is a clear error.
    let text = explain(&["-f", file, "--claim", "default/other"]);
    assert!(
        text.starts_with("already allocated: default/other\n"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["explain", "-f", file, "--pod", "default/nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pod default/nope is not in the input"));
}

/// The same answers from the JSON dump (read straight into the allocator's types) and from
/// the live emulator through a kubeconfig.
#[tokio::test]
async fn json_dumps_and_the_live_cluster_give_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, json_path) = dump(dir.path()).await;
    let api = emulator().await;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let args = ["--pod", "default/trainer", "-o", "json"];
    let from_yaml = explain(&[&["-f", yaml.to_str().unwrap()][..], &args].concat());
    let from_json = explain(&[&["-f", json_path.to_str().unwrap()][..], &args].concat());
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    let live = tokio::task::spawn_blocking(move || {
        explain(&[&["--kubeconfig", kubeconfig.as_str()][..], &args].concat())
    })
    .await
    .unwrap();
    let parsed: Value = serde_json::from_str(&from_yaml).unwrap();
    assert_eq!(parsed["nodes"][0], json!({"node": "node-a", "fits": true}));
    assert_eq!(parsed["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(from_json, from_yaml);
    assert_eq!(live, from_yaml);
}
