//! Tests of defaulting and validation: slice limits by release, counters, attributes, taints,
//! claims.

use serde_json::json;

use super::names::is_semver;
use super::*;

fn slice(devices: Vec<Value>) -> Value {
    json!({
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        }
    })
}

fn device(i: usize) -> Value {
    json!({"name": format!("gpu-{i}"), "attributes": {"model": {"string": "A100"}}})
}

#[test]
fn slice_device_limits() {
    let ok = slice((0..128).map(device).collect());
    assert!(validate(Resource::ResourceSlices, &ok, None, KubeRelease::NEWEST).is_empty());
    let errs = validate(
        Resource::ResourceSlices,
        &slice((0..129).map(device).collect()),
        None,
        KubeRelease::NEWEST,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.devices");
    let tainted: Vec<Value> = (0..65)
        .map(|i| {
            let mut d = device(i);
            d["taints"] = json!([{"key": "example.com/broken", "effect": "NoSchedule"}]);
            d
        })
        .collect();
    let errs = validate(
        Resource::ResourceSlices,
        &slice(tainted),
        None,
        KubeRelease::NEWEST,
    );
    assert_eq!(
        errs[0].message,
        "spec.devices: Too many: 65: must have at most 64 items"
    );
}

#[test]
fn slice_field_rules() {
    let mut bad = slice(vec![device(0), device(0)]);
    bad["spec"]["driver"] = json!("Not_A_Driver");
    bad["spec"]["allNodes"] = json!(true);
    bad["spec"]["devices"][0]["attributes"]["bad/x/y"] = json!({"int": 1});
    bad["spec"]["devices"][1]["attributes"]["v"] = json!({"version": "1.2"});
    let errs = validate(Resource::ResourceSlices, &bad, None, KubeRelease::NEWEST);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert!(fields.contains(&"spec.driver"), "{fields:?}");
    assert!(fields.contains(&"spec"), "{fields:?}");
    assert!(
        fields.contains(&"spec.devices[0].attributes[bad/x/y]"),
        "{fields:?}"
    );
    assert!(
        fields.contains(&"spec.devices[1].attributes[v].version"),
        "{fields:?}"
    );
    assert!(fields.contains(&"spec.devices[1]"), "duplicate: {fields:?}");
}

#[test]
fn semver_rules() {
    for ok in ["1.2.3", "0.0.0-alpha.1", "1.0.0+build.5", "10.20.30-rc.1+x"] {
        assert!(is_semver(ok), "{ok}");
    }
    for bad in ["1.2", "01.2.3", "1.2.3-", "1.2.3-01", "v1.2.3", ""] {
        assert!(!is_semver(bad), "{bad}");
    }
}

#[test]
fn claim_defaults_and_status_checks() {
    let mut claim = json!({
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    });
    apply_defaults(Resource::ResourceClaims, &mut claim);
    assert_eq!(
        claim.pointer("/spec/devices/requests/0/exactly/count"),
        Some(&json!(1))
    );
    assert!(validate(Resource::ResourceClaims, &claim, None, KubeRelease::NEWEST).is_empty());
    claim["status"] = json!({"devices": [{"driver": "d.example.com", "pool": "p", "device": "x"}]});
    let errs = validate(Resource::ResourceClaims, &claim, None, KubeRelease::NEWEST);
    assert_eq!(errs[0].field, "status.devices[0]");
}

/// A new selector expression may be at most 10 KiB; a stored one is not checked again when the
/// selectors do not change (a class stored by an earlier server keeps working).
#[test]
fn selector_expressions_are_limited_when_written() {
    let expression = |n: usize| format!("device.driver == \"{}\"", "x".repeat(n));
    let class = |e: &str| {
        json!({"metadata": {"name": "gpu"},
               "spec": {"selectors": [{"cel": {"expression": e}}]}})
    };
    let long = expression(10 * 1024);
    let short = expression(100);
    assert!(
        validate(
            Resource::DeviceClasses,
            &class(&short),
            None,
            KubeRelease::NEWEST
        )
        .is_empty()
    );
    let errs = validate(
        Resource::DeviceClasses,
        &class(&long),
        None,
        KubeRelease::NEWEST,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.selectors[0].cel.expression");
    assert!(
        errs[0]
            .message
            .contains("Too long: may not be more than 10240 bytes"),
        "{}",
        errs[0].message
    );
    // Stored and unchanged (only a label changes): accepted.
    let mut relabelled = class(&long);
    relabelled["metadata"]["labels"] = json!({"team": "ml"});
    assert!(
        validate(
            Resource::DeviceClasses,
            &relabelled,
            Some(&class(&long)),
            KubeRelease::NEWEST
        )
        .is_empty()
    );
    // Changed to another long expression: checked again.
    let errs = validate(
        Resource::DeviceClasses,
        &class(&expression(11 * 1024)),
        Some(&class(&long)),
        KubeRelease::NEWEST,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");

    let claim = json!({"metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "count": 1,
             "selectors": [{"cel": {"expression": short}}, {"cel": {"expression": long}}]}]}]}}});
    let errs = validate(Resource::ResourceClaims, &claim, None, KubeRelease::NEWEST);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].field,
        "spec.devices.requests[0].firstAvailable[0].selectors[1].cel.expression"
    );
}
