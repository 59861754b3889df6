//! Tests of the inventory-to-ResourceSlice mapping: chunking, both counter layouts, the device
//! shape, NUMA, unhealthy devices and the limits' messages.

use std::collections::BTreeMap;

use kubedev_core::{
    AttributeValue, CounterConsumption, CounterName, CounterSet, Device, DeviceName, Health,
    PoolName, QualifiedName, Quantity, Taint, TaintEffect,
};

use super::*;

fn driver() -> DriverName {
    DriverName::new("gpu.example.com").unwrap()
}

fn plain(i: usize) -> Device {
    Device::new(DeviceName::new(format!("dev-{i}")).unwrap())
}

fn tainted(i: usize) -> Device {
    let mut d = plain(i);
    d.taints.push(Taint::new(
        "example.com/maintenance",
        TaintEffect::NoSchedule,
    ));
    d
}

fn pool_of(devices: Vec<Device>) -> Pool {
    Pool::new(PoolName::new("node-a").unwrap(), devices)
}

fn sizes(pool: &DesiredPool) -> Vec<usize> {
    pool.slices.iter().map(|s| s.devices.len()).collect()
}

fn one_pool(pool: Pool) -> DesiredPool {
    desired_pools(
        &Inventory::new(vec![pool]),
        &driver(),
        UnhealthyDevices::Omit,
    )
    .unwrap()
    .remove(0)
}

#[test]
fn plain_devices_fill_slices_of_128() {
    assert_eq!(
        sizes(&one_pool(pool_of((0..128).map(plain).collect()))),
        vec![128]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..129).map(plain).collect()))),
        vec![128, 1]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..1000).map(plain).collect()))),
        vec![128, 128, 128, 128, 128, 128, 128, 104]
    );
}

#[test]
fn a_tainted_device_lowers_its_slice_to_64() {
    assert_eq!(
        sizes(&one_pool(pool_of((0..64).map(tainted).collect()))),
        vec![64]
    );
    assert_eq!(
        sizes(&one_pool(pool_of((0..65).map(tainted).collect()))),
        vec![64, 1]
    );
    // 100 plain devices then one tainted: the tainted one cannot join a slice of 100.
    let mut devices: Vec<Device> = (0..100).map(plain).collect();
    devices.push(tainted(100));
    assert_eq!(sizes(&one_pool(pool_of(devices))), vec![100, 1]);
    // A tainted device first: the slice closes at 64 even though the rest are plain.
    let mut devices = vec![tainted(0)];
    devices.extend((1..200).map(plain));
    assert_eq!(sizes(&one_pool(pool_of(devices))), vec![64, 128, 8]);
}

#[test]
fn order_is_kept_across_slices() {
    let pool = one_pool(pool_of((0..300).map(plain).collect()));
    let names: Vec<String> = pool
        .slices
        .iter()
        .flat_map(|s| s.devices.iter().map(|d| d.name.clone()))
        .collect();
    let expected: Vec<String> = (0..300).map(|i| format!("dev-{i}")).collect();
    assert_eq!(names, expected);
}

fn counter_pool(sets: usize, consuming_devices: usize) -> Pool {
    let mut pool = pool_of(Vec::new());
    for s in 0..sets {
        pool.shared_counters.push(CounterSet::new(
            CounterName::new(format!("set-{s}")).unwrap(),
            [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("40Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        ));
    }
    for i in 0..consuming_devices {
        let mut d = plain(i);
        d.consumes_counters.push(CounterConsumption::new(
            CounterName::new("set-0").unwrap(),
            [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("5Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        ));
        pool.devices.push(d);
    }
    pool
}

/// `gpus` GPUs as partitionable MIG publishes them: a set of `counters` counters each, the
/// whole GPU consuming all of them and `parts` partitions consuming one each; then `plain`
/// devices that consume nothing.
fn partitioned_gpus(gpus: usize, counters: usize, parts: usize, plain_devices: usize) -> Pool {
    let mut pool = pool_of(Vec::new());
    let all = |n: usize| -> BTreeMap<CounterName, Quantity> {
        (0..n)
            .map(|c| {
                (
                    CounterName::new(format!("c{c}")).unwrap(),
                    Quantity::parse("1").unwrap(),
                )
            })
            .collect()
    };
    for g in 0..gpus {
        let set = CounterName::new(format!("gpu-{g}-counters")).unwrap();
        pool.shared_counters
            .push(CounterSet::new(set.clone(), all(counters)));
        let mut whole = Device::new(DeviceName::new(format!("gpu-{g}")).unwrap());
        whole
            .consumes_counters
            .push(CounterConsumption::new(set.clone(), all(counters)));
        pool.devices.push(whole);
        for p in 0..parts {
            let mut d = Device::new(DeviceName::new(format!("gpu-{g}-part-{p}")).unwrap());
            d.consumes_counters
                .push(CounterConsumption::new(set.clone(), all(1)));
            pool.devices.push(d);
        }
    }
    for i in 0..plain_devices {
        pool.devices.push(plain(1000 + i));
    }
    pool
}

fn same_slice(pool: Pool) -> Result<DesiredPool, Error> {
    desired_pools_in(
        &Inventory::new(vec![pool]),
        &driver(),
        CounterLayout::SameSlice,
    )
    .map(|mut p| p.remove(0))
}

#[test]
fn kubernetes_1_34_gets_each_counter_set_with_its_devices() {
    // 8 GPUs of 15 counters (the NVIDIA backend's MIG model), 19 partitions each, then 3
    // plain devices: two GPUs per slice (30 of the 32 counters 1.34 allows).
    let pool = same_slice(partitioned_gpus(8, 15, 19, 3)).unwrap();
    let shape: Vec<(usize, usize)> = pool
        .slices
        .iter()
        .map(|s| (s.shared_counters.len(), s.devices.len()))
        .collect();
    assert_eq!(shape, vec![(2, 40), (2, 40), (2, 40), (2, 40), (0, 3)]);
    for slice in &pool.slices {
        let sets: Vec<&str> = slice
            .shared_counters
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for d in &slice.devices {
            for c in d.consumes_counters.iter().flatten() {
                assert!(
                    sets.contains(&c.counter_set.as_str()),
                    "{} consumes {} outside its slice",
                    d.name,
                    c.counter_set
                );
            }
        }
    }
    // The same pool in the later layout: counter sets in a slice of their own.
    let later = one_pool(partitioned_gpus(8, 15, 19, 3));
    assert!(
        later
            .slices
            .iter()
            .all(|s| s.devices.is_empty() || s.shared_counters.is_empty())
    );
}

#[test]
fn kubernetes_1_34_limits_are_named() {
    // A device joining two sets of 20 counters: 40 counters would have to share a slice.
    let mut pool = partitioned_gpus(2, 20, 0, 0);
    pool.devices.clear();
    let mut joint = plain(0);
    for g in 0..2 {
        joint.consumes_counters.push(CounterConsumption::new(
            CounterName::new(format!("gpu-{g}-counters")).unwrap(),
            [(
                CounterName::new("c0").unwrap(),
                Quantity::parse("1").unwrap(),
            )]
            .into(),
        ));
    }
    pool.devices.push(joint);
    let err = same_slice(pool).unwrap_err().to_string();
    assert!(
        err.contains("40 counters")
            && err.contains("Kubernetes 1.34 allows")
            && err.contains("gpu-0-counters, gpu-1-counters"),
        "{err}"
    );
    let mut pool = pool_of((0..1).map(plain).collect());
    for i in 0..5 {
        pool.devices[0].taints.push(Taint::new(
            format!("example.com/t{i}"),
            TaintEffect::NoSchedule,
        ));
    }
    let err = same_slice(pool.clone()).unwrap_err().to_string();
    assert!(err.contains("5 taints") && err.contains("1.34"), "{err}");
    // The later layout allows 16.
    assert!(
        desired_pools(
            &Inventory::new(vec![pool]),
            &driver(),
            UnhealthyDevices::Omit
        )
        .is_ok()
    );
    // 65 partitions of one GPU cannot share a slice with their counter set.
    let err = same_slice(partitioned_gpus(1, 2, 64, 0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("65 devices"), "{err}");
}

#[test]
fn counter_sets_go_in_slices_of_their_own_eight_at_most() {
    let pool = one_pool(counter_pool(10, 70));
    assert_eq!(sizes(&pool), vec![64, 6, 0, 0]);
    let sets: Vec<usize> = pool
        .slices
        .iter()
        .map(|s| s.shared_counters.len())
        .collect();
    assert_eq!(sets, vec![0, 0, 8, 2]);
    let set = &pool.slices[2].shared_counters[0];
    assert_eq!(set.name, "set-0");
    assert_eq!(set.counters["memory"].value.0, "40Gi");
    let consumed = pool.slices[0].devices[0]
        .consumes_counters
        .as_ref()
        .unwrap();
    assert_eq!(consumed[0].counter_set, "set-0");
    assert_eq!(consumed[0].counters["memory"].value.0, "5Gi");
}

#[test]
fn consumed_counters_per_slice_are_bounded() {
    // 40 devices consuming 2 x 32 counters each: 64 per device, 16 devices per 1024.
    let mut pool = pool_of(Vec::new());
    for s in 0..2 {
        pool.shared_counters.push(CounterSet::new(
            CounterName::new(format!("set-{s}")).unwrap(),
            (0..32)
                .map(|c| {
                    (
                        CounterName::new(format!("c{c}")).unwrap(),
                        Quantity::parse("1").unwrap(),
                    )
                })
                .collect(),
        ));
    }
    for i in 0..40 {
        let mut d = plain(i);
        for s in 0..2 {
            d.consumes_counters.push(CounterConsumption::new(
                CounterName::new(format!("set-{s}")).unwrap(),
                (0..32)
                    .map(|c| {
                        (
                            CounterName::new(format!("c{c}")).unwrap(),
                            Quantity::parse("1").unwrap(),
                        )
                    })
                    .collect(),
            ));
        }
        pool.devices.push(d);
    }
    assert_eq!(sizes(&one_pool(pool)), vec![16, 16, 8, 0]);
}

#[test]
fn an_empty_pool_is_one_empty_slice() {
    let pool = one_pool(pool_of(Vec::new()));
    assert_eq!(pool.slices, vec![DesiredSlice::default()]);
    assert_eq!(pool.name, "node-a");
}

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
fn unhealthy_devices_are_omitted_or_tainted() {
    let mut sick = plain(1);
    sick.health = Health::unhealthy("fell off the bus");
    let mut unknown = plain(2);
    unknown.health = Health::unknown("no answer");
    let inventory = Inventory::new(vec![pool_of(vec![plain(0), sick, unknown])]);

    let omitted = desired_pools(&inventory, &driver(), UnhealthyDevices::Omit).unwrap();
    let names: Vec<&str> = omitted[0].slices[0]
        .devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, vec!["dev-0", "dev-2"]);

    let tainted = desired_pools(&inventory, &driver(), UnhealthyDevices::Taint).unwrap();
    let devices = &tainted[0].slices[0].devices;
    assert_eq!(devices.len(), 3);
    let taints = devices[1].taints.as_ref().unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "gpu.example.com/unhealthy");
    assert_eq!(taints[0].effect, "NoSchedule");
    assert!(devices[0].taints.is_none());
    assert!(devices[2].taints.is_none());
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

#[test]
fn health_reasons_become_label_values() {
    use super::device::taint_value;
    assert_eq!(
        taint_value("Xid 79: GPU has fallen off the bus (GPU instance 3)"),
        "Xid-79-GPU-has-fallen-off-the-bus-GPU-instance-3"
    );
    assert_eq!(taint_value("  -- gone!"), "gone");
    assert_eq!(taint_value("état: perdu"), "tat-perdu");
    assert_eq!(taint_value(""), "");
    let long = taint_value(&"presence file missing ".repeat(10));
    assert_eq!(long.len(), 63, "{long}");
    assert!(long.starts_with("presence-file-missing-presence"), "{long}");
    // A cut that lands on a separator drops it: a label value ends with a letter or digit.
    assert_eq!(
        taint_value(&format!("{} b", "a".repeat(62))),
        "a".repeat(62)
    );
}

#[test]
fn unhealthy_devices_are_left_out_as_the_policy_says() {
    let mut sick = plain(1);
    sick.health = Health::unhealthy("gone");
    let mut held = plain(2);
    held.health = Health::unusable("Xid 79");
    let inventory = Inventory::new(vec![pool_of(vec![plain(0), sick, held])]);
    let in_use = |_: &str, d: &str| d == "dev-2";
    let names = |p: UnhealthyDevices| -> Vec<String> {
        unhealthy_left_out(&inventory, p, true, &in_use).0.pools[0]
            .devices
            .iter()
            .map(|d| d.name.to_string())
            .collect()
    };
    assert_eq!(names(UnhealthyDevices::Omit), ["dev-0"]);
    assert_eq!(names(UnhealthyDevices::Taint), ["dev-0", "dev-1", "dev-2"]);
    assert_eq!(names(UnhealthyDevices::TaintWhileInUse), ["dev-0", "dev-2"]);
    assert_eq!(
        UnhealthyDevices::Auto.resolve(true),
        UnhealthyDevices::Taint
    );
    assert_eq!(
        UnhealthyDevices::Auto.resolve(false),
        UnhealthyDevices::Omit
    );
    assert_eq!(
        UnhealthyDevices::TaintWhileInUse.resolve(false),
        UnhealthyDevices::TaintWhileInUse
    );
    // The held device is published NoExecute, with its reason.
    let pools = desired_pools(
        &unhealthy_left_out(&inventory, UnhealthyDevices::TaintWhileInUse, true, &in_use).0,
        &driver(),
        UnhealthyDevices::Taint,
    )
    .unwrap();
    let taint = &pools[0].slices[0].devices[1].taints.as_ref().unwrap()[0];
    assert_eq!(
        (
            taint.key.as_str(),
            taint.value.as_deref(),
            taint.effect.as_str()
        ),
        ("gpu.example.com/unhealthy", Some("Xid-79"), "NoExecute")
    );
}
