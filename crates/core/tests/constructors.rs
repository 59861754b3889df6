//! Every data type a backend builds can be built from outside the crate with its constructors,
//! and what they build is written as the Kubernetes and CDI shapes the fields always had.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use kubedev_core::{
    AttributeMatch, AttributeValue, Capacity, ContainerEdits, CounterConsumption, CounterName,
    CounterSet, Device, DeviceFilter, DeviceName, DeviceNode, DeviceNodeType, DeviceRef, Health,
    Hook, Mount, Pool, PoolName, QualifiedName, Quantity, RequestPolicy, RequestRange, Taint,
    TaintEffect,
};
use serde_json::json;

fn counters(pairs: &[(&str, &str)]) -> BTreeMap<CounterName, Quantity> {
    pairs
        .iter()
        .map(|(n, q)| (CounterName::new(*n).unwrap(), Quantity::parse(q).unwrap()))
        .collect()
}

#[test]
fn a_partitioned_tainted_device_keeps_its_resource_slice_shape() {
    let set = CounterName::new("gpu-0-counters").unwrap();
    let mut d = Device::new(DeviceName::new("gpu-0-half").unwrap());
    d.consumes_counters.push(CounterConsumption::new(
        set.clone(),
        counters(&[("memory", "20Gi")]),
    ));
    d.taints
        .push(Taint::new("example.com/flaky", TaintEffect::NoExecute).with_value("xid-79"));
    d.taints
        .push(Taint::new("example.com/info", TaintEffect::None));
    let policy = RequestPolicy::range(
        Quantity::parse("1Gi").unwrap(),
        Quantity::parse("1Gi").unwrap(),
        Some(Quantity::parse("20Gi").unwrap()),
        None,
    );
    d.capacity.insert(
        QualifiedName::new("memory").unwrap(),
        Capacity::new(Quantity::parse("20Gi").unwrap()).with_request_policy(policy),
    );
    let mut pool = Pool::new(PoolName::new("node-a").unwrap(), vec![d]);
    pool.shared_counters
        .push(CounterSet::new(set, counters(&[("memory", "40Gi")])));
    assert!(pool.validate().is_ok());

    let v = serde_json::to_value(&pool).unwrap();
    assert_eq!(
        v,
        json!({
            "name": "node-a",
            "devices": [{
                "name": "gpu-0-half",
                "capacity": {"memory": {
                    "value": "20Gi",
                    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "max": "20Gi"}},
                }},
                "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {"memory": "20Gi"}}],
                "taints": [
                    {"key": "example.com/flaky", "value": "xid-79", "effect": "NoExecute"},
                    {"key": "example.com/info", "effect": "None"},
                ],
                "health": {"state": "Healthy"},
            }],
            "sharedCounters": [{"name": "gpu-0-counters", "counters": {"memory": "40Gi"}}],
        })
    );
    assert_eq!(serde_json::from_value::<Pool>(v).unwrap(), pool);
}

#[test]
fn a_request_range_built_step_by_step_equals_the_policy_shorthand() {
    let q = |s: &str| Quantity::parse(s).unwrap();
    let range = RequestRange::new(q("1Gi"))
        .with_max(q("8Gi"))
        .with_step(q("1Gi"));
    let policy = RequestPolicy::range(q("2Gi"), q("1Gi"), Some(q("8Gi")), Some(q("1Gi")));
    assert_eq!(policy.valid_range, Some(range));
}

#[test]
fn every_taint_effect_is_spelled_as_the_api_spells_it() {
    for effect in [
        TaintEffect::NoSchedule,
        TaintEffect::NoExecute,
        TaintEffect::None,
    ] {
        assert_eq!(
            serde_json::to_value(effect).unwrap(),
            json!(effect.as_str())
        );
        assert_eq!(effect.to_string(), effect.as_str());
    }
}

#[test]
fn edits_built_with_constructors_have_the_cdi_shape() {
    let edits = ContainerEdits::new()
        .with_device_node(
            DeviceNode::new("/dev/card0", "rw")
                .with_host_path("/host/dev/card0")
                .with_node_type(DeviceNodeType::Char)
                .with_numbers(226, 0)
                .with_file_mode(0o660)
                .with_owner(0, 44),
        )
        .with_mount(
            Mount::new("/opt/lib/libx.so", "/usr/lib/libx.so")
                .with_options(vec!["ro".into(), "nosuid".into()])
                .with_type("bind"),
        )
        .with_hook(
            Hook::new("createContainer", "/usr/bin/x-hook")
                .with_args(vec!["x-hook".into(), "update-ldcache".into()])
                .with_env(vec!["DEBUG=1".into()])
                .with_timeout(5),
        );
    assert!(edits.mounts[0].is_read_only());
    assert_eq!(
        serde_json::to_value(&edits).unwrap(),
        json!({
            "deviceNodes": [{
                "path": "/dev/card0", "hostPath": "/host/dev/card0", "type": "c",
                "major": 226, "minor": 0, "fileMode": 0o660, "permissions": "rw",
                "uid": 0, "gid": 44,
            }],
            "mounts": [{
                "hostPath": "/opt/lib/libx.so", "containerPath": "/usr/lib/libx.so",
                "options": ["ro", "nosuid"], "type": "bind",
            }],
            "hooks": [{
                "hookName": "createContainer", "path": "/usr/bin/x-hook",
                "args": ["x-hook", "update-ldcache"], "env": ["DEBUG=1"], "timeout": 5,
            }],
        })
    );
    // A bare mount and hook write nothing for what they leave unset.
    assert_eq!(
        serde_json::to_value(Mount::new("/a", "/b")).unwrap(),
        json!({"hostPath": "/a", "containerPath": "/b"})
    );
    assert_eq!(
        serde_json::to_value(Hook::new("poststop", "/bin/true")).unwrap(),
        json!({"hookName": "poststop", "path": "/bin/true"})
    );
}

#[test]
fn an_attribute_match_built_up_requires_every_attribute() {
    let model = QualifiedName::new("model").unwrap();
    let numa = QualifiedName::new("numa").unwrap();
    let filter = AttributeMatch::new(BTreeMap::new())
        .with_attribute(model.clone(), AttributeValue::String("x1".into()))
        .with_attribute(numa.clone(), AttributeValue::Int(0));
    let pool = Pool::new(PoolName::new("node-a").unwrap(), Vec::new());
    let both = Device::new(DeviceName::new("gpu-0").unwrap())
        .with_attribute(model.clone(), AttributeValue::String("x1".into()))
        .with_attribute(numa, AttributeValue::Int(0));
    let one = Device::new(DeviceName::new("gpu-1").unwrap())
        .with_attribute(model, AttributeValue::String("x1".into()));
    assert!(filter.matches(&pool, &both).unwrap());
    assert!(!filter.matches(&pool, &one).unwrap());
}

#[test]
fn a_device_ref_and_health_keep_their_shapes() {
    let r = DeviceRef::new(
        PoolName::new("node-a").unwrap(),
        DeviceName::new("gpu-0").unwrap(),
    );
    assert_eq!(r.to_string(), "node-a/gpu-0");
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        json!({"pool": "node-a", "device": "gpu-0"})
    );
    assert_eq!(
        serde_json::to_value(Health::unusable("Xid 79")).unwrap(),
        json!({"state": "Unhealthy", "reason": "Xid 79", "evict": true})
    );
}
