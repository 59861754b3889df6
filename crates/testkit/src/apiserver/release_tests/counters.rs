//! Shared-counter layout rules: 1.34's counters beside the devices consuming them in one
//! slice, and 1.35's split layout with per-set and per-consumption limits.

use super::*;

fn on_1_34() -> Store {
    store_with(
        V1_34,
        &[
            (gate::DRA_PARTITIONABLE_DEVICES, true),
            (gate::DRA_DEVICE_TAINTS, true),
        ],
    )
}

fn consuming(name: &str, consumptions: Value) -> Value {
    let mut d = device(name);
    d["consumesCounters"] = consumptions;
    d
}

#[test]
fn layout_rules_of_1_34() {
    let store = on_1_34();
    // Counters and their devices in one slice; 9 sets, 3 consumptions a device, 128 devices
    // consuming counters: no per-set or per-device entry limits, and no 64-device cap.
    let sets: Vec<Value> = (0..9)
        .map(|i| counter_set(&format!("set-{i}"), &["a", "b", "c"]))
        .collect();
    let devices: Vec<Value> = (0..128)
        .map(|i| {
            consuming(
                &format!("gpu-{i}"),
                json!([
                    {"counterSet": "set-0", "counters": {"a": {"value": "1"}}},
                    {"counterSet": "set-1", "counters": {"b": {"value": "1"}}},
                    {"counterSet": "set-2", "counters": {"c": {"value": "1"}}},
                ]),
            )
        })
        .collect();
    let stored = created(
        &store,
        Resource::ResourceSlices,
        slice_spec("ok", json!({"sharedCounters": sets, "devices": devices})),
    );
    assert_eq!(
        stored["spec"]["devices"].as_array().map(Vec::len),
        Some(128)
    );
    let tainted: Vec<Value> = (0..128)
        .map(|i| {
            let mut d = device(&format!("gpu-{i}"));
            d["taints"] = Value::Array(vec![json!({"key": "k", "effect": "NoSchedule"}); 4]);
            d
        })
        .collect();
    created(&store, Resource::ResourceSlices, slice("tainted", tainted));

    // At most 32 counters over all sets.
    let names: Vec<String> = (0..33).map(|i| format!("c{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let message = refused(
        &store,
        slice_spec(
            "shared",
            json!({"sharedCounters": [counter_set("x", &names[..20]), counter_set("y", &names[20..])]}),
        ),
    );
    assert!(
        message.contains("spec.sharedCounters: Invalid value: 33: the total number of shared counters must not exceed 32"),
        "{message}"
    );

    // At most 32 counters a device, over its consumptions.
    let counters = |range: std::ops::Range<usize>| -> Value {
        range
            .map(|i| (format!("c{i}"), json!({"value": "1"})))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let message = refused(
        &store,
        slice_spec(
            "per-device",
            json!({
                "sharedCounters": [counter_set("x", &names[..32])],
                "devices": [consuming("gpu-0", json!([
                    {"counterSet": "x", "counters": counters(0..20)},
                    {"counterSet": "x", "counters": counters(20..33)},
                ]))],
            }),
        ),
    );
    assert!(
        message.contains(
            "spec.devices[0]: Invalid value: 33: the total number of counters must not exceed 32"
        ),
        "{message}"
    );

    // At most 1024 consumed counters over all devices.
    let devices: Vec<Value> = (0..33)
        .map(|i| {
            consuming(
                &format!("gpu-{i}"),
                json!([{"counterSet": "x", "counters": counters(0..32)}]),
            )
        })
        .collect();
    let message = refused(
        &store,
        slice_spec(
            "per-slice",
            json!({"sharedCounters": [counter_set("x", &names[..32])], "devices": devices}),
        ),
    );
    assert!(
        message.contains("spec.devices: Invalid value: 1056: the total number of counters in devices must not exceed 1024"),
        "{message}"
    );

    // At most 4 taints a device, and no `None` effect.
    let mut d = device("gpu-0");
    d["taints"] = Value::Array(vec![json!({"key": "k", "effect": "NoSchedule"}); 5]);
    let message = refused(&store, slice("taints", vec![d]));
    assert!(
        message.contains("spec.devices[0].taints: Too many: 5: must have at most 4 items"),
        "{message}"
    );
    let mut d = device("gpu-0");
    d["taints"] = json!([{"key": "k", "effect": "None"}]);
    let message = refused(&store, slice("none", vec![d]));
    assert!(
        message.contains("spec.devices[0].taints[0].effect: Unsupported value: \"None\": supported values: \"NoExecute\", \"NoSchedule\""),
        "{message}"
    );

    // A counter missing from the referenced set.
    let message = refused(
        &store,
        combined_slice(
            "missing",
            vec![consuming(
                "gpu-0",
                json!([{"counterSet": "gpu-0", "counters": {"cores": {"value": "1"}}}]),
            )],
        ),
    );
    assert!(
        message.contains("spec.devices[0].consumesCounters[0].counters: Invalid value: \"cores\": must reference a counter defined in the ResourceSlice sharedCounters"),
        "{message}"
    );
}

#[test]
fn split_layout_of_1_35_is_refused_by_1_34_and_combined_by_1_35() {
    let device_slice = slice(
        "devices",
        vec![consuming(
            "gpu-0",
            json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}]),
        )],
    );
    // 1.35+: the counters live in their own slice of the pool; the devices refer to them.
    let on_1_35 = store_with(V1_35, &[(gate::DRA_PARTITIONABLE_DEVICES, true)]);
    created(
        &on_1_35,
        Resource::ResourceSlices,
        counters_slice("counters"),
    );
    created(&on_1_35, Resource::ResourceSlices, device_slice.clone());
    let message = refused(
        &on_1_35,
        combined_slice(
            "combined",
            vec![consuming(
                "gpu-0",
                json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}]),
            )],
        ),
    );
    assert!(
        message.contains(
            "spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed"
        ),
        "{message}"
    );

    // 1.34: a device must consume from a set of its own slice.
    let on_1_34 = on_1_34();
    let stored = created(
        &on_1_34,
        Resource::ResourceSlices,
        counters_slice("counters"),
    );
    assert_eq!(
        stored["spec"].get("devices"),
        Some(&Value::Null),
        "1.34 writes `devices` even when there are none"
    );
    let message = refused(&on_1_34, device_slice);
    assert!(
        message.contains("spec.devices[0].consumesCounters[0].counterSet: Invalid value: \"gpu-0\": must reference a counterSet defined in the ResourceSlice sharedCounters"),
        "{message}"
    );
    created(
        &on_1_34,
        Resource::ResourceSlices,
        combined_slice(
            "combined",
            vec![consuming(
                "gpu-0",
                json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}]),
            )],
        ),
    );

    // 1.35's limits that 1.34 does not have.
    let sets: Vec<Value> = (0..9)
        .map(|i| counter_set(&format!("set-{i}"), &["a"]))
        .collect();
    let message = refused(
        &on_1_35,
        slice_spec("nine", json!({"sharedCounters": sets})),
    );
    assert!(
        message.contains("spec.sharedCounters: Too many: 9: must have at most 8 items"),
        "{message}"
    );
}
