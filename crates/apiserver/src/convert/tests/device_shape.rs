//! The device shape: the v1 fields, names in the driver's own domain published bare, the NUMA
//! attribute, limits reported with the device, and model errors.

use super::*;

#[test]
fn devices_map_to_the_v1_shape() {
    let mut d = Device::new(DeviceName::new("gpu-0").unwrap())
        .with_attribute(
            QualifiedName::new("model").unwrap(),
            AttributeValue::string("A100").unwrap(),
        )
        .with_attribute(
            QualifiedName::new("cores").unwrap(),
            AttributeValue::Int(108),
        )
        .with_attribute(
            QualifiedName::new("mig").unwrap(),
            AttributeValue::Bool(true),
        )
        .with_attribute(
            QualifiedName::new("example.com/driverVersion").unwrap(),
            AttributeValue::version("550.54.15").unwrap(),
        )
        .with_capacity(
            QualifiedName::new("memory").unwrap(),
            Quantity::parse("40Gi").unwrap(),
        )
        .with_numa_node(1);
    d.allow_multiple_allocations = true;
    d.taints
        .push(Taint::new("example.com/flaky", TaintEffect::NoExecute).with_value("xid-79"));
    let pool = pool_of(vec![d.clone()]);
    let out = map_device(&pool, &d, &driver()).unwrap();
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "name": "gpu-0",
            "attributes": {
                "cores": {"int": 108},
                "example.com/driverVersion": {"version": "550.54.15"},
                "mig": {"bool": true},
                "model": {"string": "A100"},
                "resource.kubernetes.io/numaNode": {"int": 1},
            },
            "capacity": {"memory": {"value": "40Gi"}},
            "taints": [{"key": "example.com/flaky", "value": "xid-79", "effect": "NoExecute"}],
            "allowMultipleAllocations": true,
        })
    );
}

#[test]
fn names_in_the_drivers_own_domain_are_published_bare() {
    let d = plain(0)
        .with_attribute(
            QualifiedName::new("gpu.example.com/model").unwrap(),
            AttributeValue::string("a100").unwrap(),
        )
        .with_attribute(
            QualifiedName::new("example.com/driverVersion").unwrap(),
            AttributeValue::version("550.54.15").unwrap(),
        )
        .with_capacity(
            QualifiedName::new("gpu.example.com/memory").unwrap(),
            Quantity::parse("40Gi").unwrap(),
        );
    let out = serde_json::to_value(map_device(&pool_of(vec![]), &d, &driver()).unwrap()).unwrap();
    assert_eq!(
        out["attributes"],
        serde_json::json!({
            "model": {"string": "a100"},
            "example.com/driverVersion": {"version": "550.54.15"},
        })
    );
    assert_eq!(
        out["capacity"],
        serde_json::json!({"memory": {"value": "40Gi"}})
    );

    // Both forms of one name are one name set twice.
    let twice = d.with_attribute(
        QualifiedName::new("model").unwrap(),
        AttributeValue::string("h100").unwrap(),
    );
    let err = map_device(&pool_of(vec![]), &twice, &driver()).unwrap_err();
    assert!(
        err.to_string()
            .contains("device dev-0 sets the attribute model twice, bare and in the driver's own domain gpu.example.com"),
        "{err}"
    );
}

#[test]
fn numa_attribute_set_by_the_device_wins() {
    let d = plain(0)
        .with_attribute(
            QualifiedName::new(NUMA_NODE_ATTRIBUTE).unwrap(),
            AttributeValue::Int(3),
        )
        .with_numa_node(1);
    let out = map_device(&pool_of(vec![]), &d, &driver()).unwrap();
    assert_eq!(out.attributes.unwrap()[NUMA_NODE_ATTRIBUTE].int, Some(3));
}

#[test]
fn numa_attribute_is_skipped_when_there_is_no_room() {
    let mut d = plain(0).with_numa_node(1);
    for i in 0..32 {
        d = d.with_attribute(
            QualifiedName::new(format!("a{i}")).unwrap(),
            AttributeValue::Int(i),
        );
    }
    let out = map_device(&pool_of(vec![]), &d, &driver()).unwrap();
    let attrs = out.attributes.unwrap();
    assert_eq!(attrs.len(), 32);
    assert!(!attrs.contains_key(NUMA_NODE_ATTRIBUTE));
}

#[test]
fn limits_are_reported_with_the_device() {
    let mut d = plain(7);
    for i in 0..33 {
        d = d.with_attribute(
            QualifiedName::new(format!("a{i}")).unwrap(),
            AttributeValue::Int(i),
        );
    }
    let err = desired_pools(
        &Inventory::new(vec![pool_of(vec![d])]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool node-a: device dev-7 has 33 attributes and capacities; at most 32 are allowed"
    );

    let mut d = plain(8);
    for i in 0..17 {
        d.taints.push(Taint::new(
            format!("example.com/t{i}"),
            TaintEffect::NoSchedule,
        ));
    }
    let err = desired_pools(
        &Inventory::new(vec![pool_of(vec![d])]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("device dev-8 has 17 taints"),
        "{err}"
    );

    let mut pool = counter_pool(3, 1);
    for s in 1..3 {
        pool.devices[0]
            .consumes_counters
            .push(CounterConsumption::new(
                CounterName::new(format!("set-{s}")).unwrap(),
                [(
                    CounterName::new("memory").unwrap(),
                    Quantity::parse("1").unwrap(),
                )]
                .into_iter()
                .collect(),
            ));
    }
    let err = desired_pools(
        &Inventory::new(vec![pool]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("device dev-0 consumes from 3 counter sets"),
        "{err}"
    );
}

#[test]
fn model_errors_are_reported() {
    let err = desired_pools(
        &Inventory::new(vec![pool_of(vec![plain(0), plain(0)])]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap_err();
    assert!(err.to_string().contains("dev-0"), "{err}");
}
