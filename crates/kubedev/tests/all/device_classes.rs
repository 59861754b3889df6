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
async fn a_claim_is_looked_up_by_its_checked_name_and_a_missing_one_stays_missing() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start().await.unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let cfg = config(dir.path(), "node-a");
    let spec = cfg.dra(Path::new("c.yaml"), |_| None).unwrap().unwrap();
    let (services, task) = kubedev::cluster::connect_cluster(&spec).await.unwrap();
    let claim = |namespace: &str, name: &str| {
        ClaimRef::parse("0b7c1f6e-0000-4000-8000-000000000001", namespace, name).unwrap()
    };

    // A name no API server stores never becomes a claim reference (the kubelet's request is
    // refused at the plugin socket, naming the field), so no lookup can be made for it.
    for (namespace, name) in [("default", "../../../api/v1/nodes/x"), ("Default", "train")] {
        let err = ClaimRef::parse("0b7c1f6e-0000-4000-8000-000000000001", namespace, name);
        assert!(err.is_err(), "{namespace}/{name}");
    }
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
