//! Tests of what is read from a claim (results, configuration order, UID, content errors) and of
//! the device-status merge.

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubedev_core::{DeviceName, DeviceRef, DriverName, PoolName};
use serde_json::json;

use super::status::merge_device_status;
use super::*;
use crate::error::Error;

fn driver() -> DriverName {
    DriverName::new("gpu.example.com").unwrap()
}

fn claim_ref() -> ClaimRef {
    ClaimRef::parse("uid-1", "team-a", "train").unwrap()
}

fn claim(status: serde_json::Value) -> res::ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-1"},
        "spec": {},
        "status": status,
    }))
    .unwrap()
}

fn allocated() -> res::ResourceClaim {
    claim(json!({
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"},
                    {"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth-1"},
                    {"request": "gpu/large", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-1",
                     "shareID": "4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e", "adminAccess": true,
                     "consumedCapacity": {"memory": "10Gi"},
                     "tolerations": [{"key": "example.com/flaky", "operator": "Exists", "effect": "NoSchedule"}]}
                ],
                "config": [
                    {"source": "FromClaim", "requests": ["gpu"],
                     "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "gpu"}}},
                    {"source": "FromClaim",
                     "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "all"}}},
                    {"source": "FromClass", "requests": ["gpu"],
                     "opaque": {"driver": "gpu.example.com", "parameters": {"class": "gpu"}}},
                    {"source": "FromClass",
                     "opaque": {"driver": "net.example.com", "parameters": {"class": "net"}}},
                    {"source": "FromClaim", "requests": ["gpu/small"],
                     "opaque": {"driver": "gpu.example.com", "parameters": {"claim": "small"}}}
                ]
            }
        }
    }))
}

fn params(config: &[kubedev_core::DeviceConfig]) -> Vec<serde_json::Value> {
    config.iter().map(|c| c.parameters.clone()).collect()
}

#[test]
fn results_of_other_drivers_are_left_out_and_config_is_ordered() {
    let out = allocated_claim(&driver(), &claim_ref(), &allocated()).unwrap();
    let devices: Vec<String> = out
        .results
        .iter()
        .map(|r| r.device.device.to_string())
        .collect();
    assert_eq!(devices, vec!["node-a/gpu-0", "node-a/gpu-1"]);

    let first = &out.results[0];
    assert_eq!(first.device.request, "gpu");
    assert_eq!(first.device.share_id, None);
    assert_eq!(
        params(&first.device.config),
        vec![
            json!({"class": "gpu"}),
            json!({"claim": "gpu"}),
            json!({"claim": "all"})
        ]
    );
    assert!(!first.admin_access);

    // "gpu/large": configs for the main request "gpu" apply, the one for "gpu/small" not.
    let second = &out.results[1];
    assert_eq!(second.device.request, "gpu/large");
    assert_eq!(
        second.device.share_id.as_deref(),
        Some("4b1e0a1c-5f5e-4a43-9d3c-8a5f0e1c2d3e")
    );
    assert_eq!(
        params(&second.device.config),
        vec![
            json!({"class": "gpu"}),
            json!({"claim": "gpu"}),
            json!({"claim": "all"})
        ]
    );
    assert!(second.admin_access);
    assert_eq!(
        second.consumed_capacity["memory"],
        Quantity::parse("10Gi").unwrap()
    );
    assert_eq!(second.tolerations.len(), 1);
    assert_eq!(second.tolerations[0].operator.as_deref(), Some("Exists"));

    let sources: Vec<ConfigSource> = out.config.iter().map(|c| c.source).collect();
    assert_eq!(
        sources,
        vec![
            ConfigSource::Class,
            ConfigSource::Claim,
            ConfigSource::Claim,
            ConfigSource::Claim
        ]
    );
    assert_eq!(out.devices().len(), 2);
}

#[test]
fn a_different_uid_is_named() {
    let mut other = claim_ref();
    other.uid = "uid-0".parse().unwrap();
    let err = allocated_claim(&driver(), &other, &allocated()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim team-a/train has UID uid-1, expected uid-0"
    );
}

#[test]
fn an_unallocated_claim_is_an_error() {
    let err = allocated_claim(&driver(), &claim_ref(), &claim(json!({}))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim team-a/train (uid-1) is not allocated"
    );
    let mut no_status = claim(json!({}));
    no_status.status = None;
    assert!(matches!(
        allocated_claim(&driver(), &claim_ref(), &no_status),
        Err(Error::ClaimNotAllocated { .. })
    ));
}

#[test]
fn an_allocation_without_our_devices_is_empty() {
    let out = allocated_claim(&driver(), &claim_ref(), &claim(json!({"allocation": {}}))).unwrap();
    assert!(out.results.is_empty() && out.config.is_empty());
}

/// The scheduler names the node of a node-local slice's devices in `metadata.name` fields; a
/// selector by labels, or by a field with another operator, names no node.
#[test]
fn the_nodes_an_allocation_names_come_from_its_metadata_name_fields() {
    let with_selector = |selector: serde_json::Value| {
        claim(json!({"allocation": {"nodeSelector": selector, "devices": {"results": []}}}))
    };
    let by_name = with_selector(json!({"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b", "node-a"]}],
         "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
    ]}));
    let out = allocated_claim(&driver(), &claim_ref(), &by_name).unwrap();
    assert_eq!(out.node_names, ["node-a", "node-b"]);
    assert!(out.names_node("node-b") && !out.names_node("node-c"));

    let by_label = with_selector(json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}]}
    ]}));
    let out = allocated_claim(&driver(), &claim_ref(), &by_label).unwrap();
    assert!(out.node_names.is_empty() && !out.names_node("node-a"));
    let out = allocated_claim(&driver(), &claim_ref(), &allocated()).unwrap();
    assert!(out.node_names.is_empty());
}

#[test]
fn bad_content_is_an_error_naming_the_value() {
    let bad = claim(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "GPU_0"}
    ]}}}));
    let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
    assert!(err.to_string().contains("\"GPU_0\""), "{err}");

    let bad = claim(json!({"allocation": {"devices": {"config": [
        {"source": "FromSomewhere", "opaque": {"driver": "gpu.example.com", "parameters": {}}}
    ]}}}));
    let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
    assert!(err.to_string().contains("FromSomewhere"), "{err}");

    let bad = claim(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0",
         "consumedCapacity": {"memory": "lots"}}
    ]}}}));
    let err = allocated_claim(&driver(), &claim_ref(), &bad).unwrap_err();
    assert!(err.to_string().contains("memory"), "{err}");
}

#[test]
fn device_status_replaces_our_entries_and_keeps_others() {
    let dev = |d: &str| {
        DeviceRef::new(
            PoolName::new("node-a").unwrap(),
            DeviceName::new(d).unwrap(),
        )
    };
    let t0 = Timestamp::from_second(1_700_000_000).unwrap();
    let t1 = Timestamp::from_second(1_700_000_100).unwrap();
    let mut entries = vec![res::AllocatedDeviceStatus {
        driver: "net.example.com".into(),
        pool: "node-a".into(),
        device: "eth-1".into(),
        ..Default::default()
    }];
    merge_device_status(
        &mut entries,
        &driver(),
        &[DeviceStatus::ready(dev("gpu-0"), None)],
        t0,
    );
    assert_eq!(entries.len(), 2);
    let ready = &entries[1].conditions.as_ref().unwrap()[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert_eq!(ready.last_transition_time, Time(t0));

    // Same status again: the transition time stays. A new status: it moves.
    merge_device_status(
        &mut entries,
        &driver(),
        &[DeviceStatus::ready(dev("gpu-0"), None)],
        t1,
    );
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[1].conditions.as_ref().unwrap()[0].last_transition_time,
        Time(t0)
    );
    let mut failed = DeviceStatus::ready(dev("gpu-0"), None);
    failed.conditions = vec![DeviceCondition::new(
        "Ready",
        ConditionStatus::False,
        "Failed",
        "boom",
    )];
    merge_device_status(&mut entries, &driver(), &[failed], t1);
    assert_eq!(
        entries[1].conditions.as_ref().unwrap()[0].last_transition_time,
        Time(t1)
    );
    assert_eq!(entries[0].driver, "net.example.com");
}

#[test]
fn applies_to_matches_main_requests_and_subrequests() {
    let c = |requests: &[&str]| OpaqueConfig {
        source: ConfigSource::Claim,
        index: 0,
        requests: requests.iter().map(|s| s.to_string()).collect(),
        parameters: json!({}),
    };
    assert!(c(&[]).applies_to("gpu"));
    assert!(c(&["gpu"]).applies_to("gpu"));
    assert!(c(&["gpu"]).applies_to("gpu/large"));
    assert!(c(&["gpu/large"]).applies_to("gpu/large"));
    assert!(!c(&["gpu/large"]).applies_to("gpu/small"));
    assert!(!c(&["gpu/large"]).applies_to("gpu"));
    assert!(!c(&["nic"]).applies_to("gpu"));
    assert_eq!(base_request("gpu/large"), "gpu");
    assert_eq!(base_request("gpu"), "gpu");
}
