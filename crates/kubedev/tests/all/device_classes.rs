//! The DRA driver's cluster side against the API-server emulator: the DeviceClasses it applies
//! (KEP-5004 extended resource names) and the claims it looks up.

use std::path::Path;
use std::time::Duration;

use crate::common;
use kubedev::config::Config;
use kubedev_core::ClaimRef;
use kubedev_testkit::apiserver::{ApiServer, Resource, Verb};

fn config(dir: &Path, node: &str) -> Config {
    let path = dir.join(format!("{node}.yaml"));
    common::write_config(
        &path,
        &format!(
            "nodeName: {node}
dra:
  enabled: true
  driverName: gpu.example.com
  kubeconfig: {r}/kubeconfig
  deviceClasses:
    - name: gpu.example.com
      cel: device.attributes[\"gpu.example.com\"].type == \"gpu\"
      extendedResourceName: example.com/gpu
    - name: all.gpu.example.com
backends:
  static:
    pool: {node}
    devices: []
",
            r = dir.display()
        ),
    )
}

#[tokio::test]
async fn every_node_applies_the_same_classes_without_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let mut tasks = Vec::new();
    for node in ["node-a", "node-b"] {
        let cfg = config(dir.path(), node);
        let spec = cfg.dra(Path::new("c.yaml"), |_| None).unwrap().unwrap();
        let (_services, task) = kubedev::cluster::connect_cluster(&spec).await.unwrap();
        tasks.push(task);
    }
    common::eventually(Duration::from_secs(10), || {
        std::future::ready(if api.objects(Resource::DeviceClasses).len() < 2 {
            Err("classes not applied".to_string())
        } else {
            Ok(())
        })
    })
    .await;
    // Give the second node's apply time to land too: still two objects, same content.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let classes = api.objects(Resource::DeviceClasses);
    assert_eq!(classes.len(), 2);
    let gpu = api
        .get(Resource::DeviceClasses, None, "gpu.example.com")
        .unwrap();
    assert_eq!(gpu["spec"]["extendedResourceName"], "example.com/gpu");
    let selectors: Vec<&str> = gpu["spec"]["selectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cel"]["expression"].as_str().unwrap())
        .collect();
    assert_eq!(
        selectors,
        [
            "device.driver == \"gpu.example.com\"",
            "device.attributes[\"gpu.example.com\"].type == \"gpu\""
        ]
    );
    let all = api
        .get(Resource::DeviceClasses, None, "all.gpu.example.com")
        .unwrap();
    assert!(all["spec"].get("extendedResourceName").is_none(), "{all}");
    for t in tasks {
        t.stop().await;
    }
}

#[tokio::test]
async fn a_claim_with_a_bad_name_is_that_claims_error_and_never_reaches_the_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let cfg = config(dir.path(), "node-a");
    let spec = cfg.dra(Path::new("c.yaml"), |_| None).unwrap().unwrap();
    let (services, task) = kubedev::cluster::connect_cluster(&spec).await.unwrap();
    let claim = |namespace: &str, name: &str| {
        ClaimRef::new(
            "0b7c1f6e-0000-4000-8000-000000000001".parse().unwrap(),
            namespace,
            name,
        )
    };

    // What the DRA driver's prepare gets back from the claim lookup, and so what the kubelet
    // sees as this claim's error.
    let err = services
        .claims
        .allocated_devices(&claim("default", "../../../api/v1/nodes/x"))
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "a bad name stays bad: {err}");
    let err = err.to_string();
    assert!(
        err.starts_with(
            "ResourceClaim name \"../../../api/v1/nodes/x\" (namespace default, UID \
             0b7c1f6e-0000-4000-8000-000000000001) is not a valid DNS subdomain"
        ),
        "{err}"
    );
    let err = services
        .claims
        .allocated_devices(&claim("Default", "train"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("ResourceClaim namespace \"Default\" (name \"train\", UID "),
        "{err}"
    );
    assert!(err.contains("is not a valid DNS label"), "{err}");
    assert_eq!(api.request_count(Verb::Get, Resource::ResourceClaims), 0);

    // A good name is looked up.
    let err = services
        .claims
        .allocated_devices(&claim("default", "train"))
        .await
        .unwrap_err();
    assert!(
        !err.is_retryable(),
        "a claim that is gone stays gone: {err}"
    );
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(api.request_count(Verb::Get, Resource::ResourceClaims), 1);
    task.stop().await;
}

#[test]
fn bad_classes_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, field) in [
        ("    - name: Not_A_Name\n", "dra.deviceClasses[0].name"),
        (
            "    - name: x.example.com\n      extendedResourceName: gpu\n",
            "dra.deviceClasses[0].extendedResourceName",
        ),
        (
            "    - name: x.example.com\n      cel: device.attributes[\n",
            "dra.deviceClasses[0].cel",
        ),
    ] {
        let path = dir.path().join("bad.yaml");
        std::fs::write(
            &path,
            format!("nodeName: node-a\ndra:\n  enabled: true\n  driverName: gpu.example.com\n  deviceClasses:\n{bad}backends:\n  static:\n    pool: p\n    devices: []\n"),
        )
        .unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}
