//! How each release's API server treats what a DRA driver writes: the fields of disabled feature
//! gates, the fields its types lack, and its layout rules for shared counters.

use serde_json::{Value, json};

use super::release::{KubeRelease, gate};
use super::resource::Resource;
use super::status::ApiError;
use super::store::{Key, PatchKind, Store, Target, WriteOptions, Written};
use super::strategy::{FieldValidation, Strategy};
use super::{ApiServer, ApiServerError};

use KubeRelease::{V1_34, V1_35, V1_36, V1_37};

fn store_with(release: KubeRelease, overrides: &[(&str, bool)]) -> Store {
    let overrides: Vec<(String, bool)> = overrides
        .iter()
        .map(|(g, on)| ((*g).to_owned(), *on))
        .collect();
    let gates = release.resolve_gates(&overrides).expect("gates resolve");
    Store::new(100, Strategy::new(release, gates))
}

fn store(release: KubeRelease) -> Store {
    store_with(release, &[])
}

fn create(store: &Store, resource: Resource, object: Value) -> Result<Written, ApiError> {
    store.create(resource, None, object, &WriteOptions::default())
}

fn created(store: &Store, resource: Resource, object: Value) -> Value {
    create(store, resource, object)
        .unwrap_or_else(|e| panic!("create refused: {}", e.message))
        .object
}

fn refused(store: &Store, object: Value) -> String {
    match create(store, Resource::ResourceSlices, object) {
        Ok(w) => panic!("accepted: {}", w.object),
        Err(e) => {
            assert_eq!(e.code, 422, "{}", e.message);
            e.message
        }
    }
}

fn slice_spec(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    let map = spec.as_object_mut().expect("spec object");
    map.entry("driver").or_insert(json!("gpu.example.com"));
    map.entry("pool")
        .or_insert(json!({"name": "node-1", "generation": 0, "resourceSliceCount": 2}));
    if !map.contains_key("perDeviceNodeSelection") && !map.contains_key("allNodes") {
        map.entry("nodeName").or_insert(json!("node-1"));
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

fn slice(name: &str, devices: Vec<Value>) -> Value {
    slice_spec(name, json!({"devices": devices}))
}

fn device(name: &str) -> Value {
    json!({"name": name, "attributes": {"model": {"string": "A100"}}})
}

/// A device using every gated ResourceSlice field a device can carry outside per-device node
/// selection.
fn gated_device(name: &str) -> Value {
    let mut d = device(name);
    d["taints"] = json!([{"key": "example.com/unhealthy", "effect": "NoSchedule"}]);
    d["consumesCounters"] =
        json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}]);
    d["bindingConditions"] = json!(["example.com/attached"]);
    d["bindingFailureConditions"] = json!(["example.com/attach-failed"]);
    d["bindsToNode"] = json!(true);
    d["allowMultipleAllocations"] = json!(true);
    d["capacity"] = json!({"memory": {"value": "80Gi", "requestPolicy": {"default": "10Gi", "validRange": {"min": "10Gi"}}}});
    d
}

fn counter_set(name: &str, counters: &[&str]) -> Value {
    let counters: serde_json::Map<String, Value> = counters
        .iter()
        .map(|c| ((*c).to_owned(), json!({"value": "80Gi"})))
        .collect();
    json!({"name": name, "counters": counters})
}

fn counters_slice(name: &str) -> Value {
    slice_spec(
        name,
        json!({"sharedCounters": [counter_set("gpu-0", &["memory"])]}),
    )
}

/// 1.34's layout: counters and the devices consuming them in one slice.
fn combined_slice(name: &str, devices: Vec<Value>) -> Value {
    slice_spec(
        name,
        json!({"sharedCounters": [counter_set("gpu-0", &["memory"])], "devices": devices}),
    )
}

const DEVICE_GATED: [&str; 7] = [
    "taints",
    "consumesCounters",
    "bindingConditions",
    "bindingFailureConditions",
    "bindsToNode",
    "allowMultipleAllocations",
    "capacity/memory/requestPolicy",
];

fn has(object: &Value, pointer: &str) -> bool {
    object.pointer(pointer).is_some_and(|v| !v.is_null())
}

fn kept_device_fields(stored: &Value) -> Vec<&'static str> {
    DEVICE_GATED
        .into_iter()
        .filter(|f| has(stored, &format!("/spec/devices/0/{f}")))
        .collect()
}

/// The slice a release's driver would publish with every gated device field.
fn gated_slice(release: KubeRelease) -> Value {
    if release == V1_34 {
        combined_slice("s", vec![gated_device("gpu-0")])
    } else {
        slice("s", vec![gated_device("gpu-0")])
    }
}

#[test]
fn default_gates_drop_what_each_release_has_off() {
    for release in KubeRelease::ALL {
        let store = store(release);
        let stored = created(&store, Resource::ResourceSlices, gated_slice(release));
        let kept = kept_device_fields(&stored);
        if release >= V1_36 {
            assert_eq!(kept, DEVICE_GATED, "{release}");
        } else {
            assert!(kept.is_empty(), "{release} kept {kept:?}");
            assert!(!has(&stored, "/spec/sharedCounters"), "{release}");
            assert_eq!(
                stored["spec"]["devices"][0]["capacity"]["memory"],
                json!({"value": "80Gi"}),
                "{release}: only the request policy goes"
            );
        }
        if release >= V1_35 {
            let counters = created(&store, Resource::ResourceSlices, counters_slice("c"));
            assert_eq!(
                has(&counters, "/spec/sharedCounters"),
                release >= V1_36,
                "{release}"
            );
        }
        // Per-device node selection is part of partitionable devices: without it the slice
        // names no node at all.
        let per_device = slice_spec(
            "p",
            json!({"perDeviceNodeSelection": true, "devices": [{"name": "d", "nodeName": "node-1"}]}),
        );
        match create(&store, Resource::ResourceSlices, per_device) {
            Ok(w) if release >= V1_36 => {
                assert_eq!(w.object["spec"]["devices"][0]["nodeName"], "node-1");
            }
            Err(e) if release < V1_36 => assert!(
                e.message.contains("spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
                "{release}: {}",
                e.message
            ),
            other => panic!("{release}: {other:?}"),
        }
    }
}

#[test]
fn turning_a_gate_on_keeps_its_fields() {
    let all_on = [
        (gate::DRA_PARTITIONABLE_DEVICES, true),
        (gate::DRA_DEVICE_TAINTS, true),
        (gate::DRA_DEVICE_BINDING_CONDITIONS, true),
        (gate::DRA_CONSUMABLE_CAPACITY, true),
    ];
    for release in [V1_34, V1_35] {
        let store = store_with(release, &all_on);
        let stored = created(&store, Resource::ResourceSlices, gated_slice(release));
        assert_eq!(kept_device_fields(&stored), DEVICE_GATED, "{release}");
    }
    // One gate at a time: only its own fields stay.
    let store = store_with(V1_35, &[(gate::DRA_DEVICE_TAINTS, true)]);
    let stored = created(&store, Resource::ResourceSlices, gated_slice(V1_35));
    assert_eq!(kept_device_fields(&stored), ["taints"]);
    let store = store_with(V1_35, &[(gate::DRA_CONSUMABLE_CAPACITY, true)]);
    let stored = created(&store, Resource::ResourceSlices, gated_slice(V1_35));
    assert_eq!(
        kept_device_fields(&stored),
        ["allowMultipleAllocations", "capacity/memory/requestPolicy"]
    );
    // Binding conditions need the claim device status gate as well.
    let store = store_with(V1_36, &[(gate::DRA_RESOURCE_CLAIM_DEVICE_STATUS, false)]);
    let stored = created(&store, Resource::ResourceSlices, gated_slice(V1_36));
    let kept = kept_device_fields(&stored);
    assert!(!kept.contains(&"bindingConditions") && !kept.contains(&"bindsToNode"));
    assert!(kept.contains(&"taints"));
    // 1.37's device taints are GA but may still be switched off.
    let store = store_with(V1_37, &[(gate::DRA_DEVICE_TAINTS, false)]);
    let stored = created(&store, Resource::ResourceSlices, gated_slice(V1_37));
    assert!(!kept_device_fields(&stored).contains(&"taints"));
    assert!(has(&stored, "/spec/devices/0/consumesCounters"));
}

#[test]
fn device_class_extended_resource_name_follows_its_gate() {
    let class = |name: &str| json!({"metadata": {"name": name}, "spec": {"extendedResourceName": "example.com/gpu"}});
    for release in KubeRelease::ALL {
        let stored = created(&store(release), Resource::DeviceClasses, class("gpu"));
        assert_eq!(
            has(&stored, "/spec/extendedResourceName"),
            release >= V1_36,
            "{release}"
        );
    }
    let store = store_with(V1_35, &[(gate::DRA_EXTENDED_RESOURCE, true)]);
    let stored = created(&store, Resource::DeviceClasses, class("gpu"));
    assert_eq!(stored["spec"]["extendedResourceName"], "example.com/gpu");
}

#[test]
fn an_update_keeps_fields_the_stored_object_already_uses() {
    // A slice stored while the gates were on (say, before a downgrade to 1.35's defaults).
    let store = store(V1_35);
    let mut old = slice("s", vec![gated_device("gpu-0"), device("gpu-1")]);
    old["spec"]["devices"][0]
        .as_object_mut()
        .expect("device")
        .remove("consumesCounters");
    let stored = store
        .put_raw(Resource::ResourceSlices, old)
        .expect("stored");
    let mut update = stored.clone();
    update["spec"]["devices"][1]["taints"] =
        json!([{"key": "example.com/new", "effect": "NoExecute"}]);
    update["spec"]["devices"][1]["consumesCounters"] =
        json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]);
    let updated = store
        .update(
            Resource::ResourceSlices,
            &Key::new(None, "s"),
            update,
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("update")
        .object;
    assert_eq!(
        updated["spec"]["devices"][1]["taints"][0]["key"], "example.com/new",
        "taints were in use, so a new device may get them too"
    );
    assert!(
        !has(&updated, "/spec/devices/1/consumesCounters"),
        "counters were not in use: dropped"
    );
    assert!(has(&updated, "/spec/devices/0/bindsToNode"));
    assert!(has(
        &updated,
        "/spec/devices/0/capacity/memory/requestPolicy"
    ));

    // Through a merge patch, a JSON patch and an apply, the same.
    let key = Key::new(None, "s");
    let patched = store
        .patch(
            Resource::ResourceSlices,
            &key,
            PatchKind::Merge,
            &json!({"spec": {"devices": [device("gpu-0"), {"name": "gpu-1", "taints": [{"key": "k", "effect": "NoSchedule"}]}]}}),
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("merge patch")
        .object;
    assert!(
        has(&patched, "/spec/devices/1/taints"),
        "the stored object had taints"
    );
    let fresh = created(
        &store,
        Resource::ResourceSlices,
        slice("t", vec![device("a")]),
    );
    let before = fresh["metadata"]["generation"].clone();
    let patched = store
        .patch(
            Resource::ResourceSlices,
            &Key::new(None, "t"),
            PatchKind::Json,
            &json!([{"op": "add", "path": "/spec/devices/0/taints", "value": [{"key": "k", "effect": "NoSchedule"}]}]),
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("json patch")
        .object;
    assert!(
        !has(&patched, "/spec/devices/0/taints"),
        "not in use: dropped"
    );
    assert_eq!(
        patched["metadata"]["generation"],
        json!(before.as_i64().expect("generation") + 1),
        "the ResourceSlice strategy compares specs before dropping"
    );
    let mut applied = slice("t", vec![device("a")]);
    applied["apiVersion"] = json!("resource.k8s.io/v1");
    applied["kind"] = json!("ResourceSlice");
    applied["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
    let applied = store
        .patch(
            Resource::ResourceSlices,
            &Key::new(None, "t"),
            PatchKind::Apply,
            &applied,
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("apply")
        .object;
    assert!(!has(&applied, "/spec/devices/0/allowMultipleAllocations"));

    // A DeviceClass that already names an extended resource keeps (and may change) it.
    let class = store
        .put_raw(
            Resource::DeviceClasses,
            json!({"metadata": {"name": "gpu"}, "spec": {"extendedResourceName": "example.com/gpu"}}),
        )
        .expect("stored");
    let mut renamed = class.clone();
    renamed["spec"]["extendedResourceName"] = json!("example.com/gpu-2");
    let updated = store
        .update(
            Resource::DeviceClasses,
            &Key::new(None, "gpu"),
            renamed,
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("update")
        .object;
    assert_eq!(updated["spec"]["extendedResourceName"], "example.com/gpu-2");
    let plain = created(
        &store,
        Resource::DeviceClasses,
        json!({"metadata": {"name": "plain"}, "spec": {}}),
    );
    let mut named = plain.clone();
    named["spec"]["extendedResourceName"] = json!("example.com/plain");
    let updated = store
        .update(
            Resource::DeviceClasses,
            &Key::new(None, "plain"),
            named,
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("update")
        .object;
    assert!(!has(&updated, "/spec/extendedResourceName"));
    assert_eq!(
        updated["metadata"]["generation"], plain["metadata"]["generation"],
        "the DeviceClass strategy compares after dropping"
    );
}

#[test]
fn dry_runs_answer_with_what_would_be_stored() {
    let store = store(V1_35);
    let answer = store
        .create(
            Resource::ResourceSlices,
            None,
            slice("s", vec![gated_device("gpu-0")]),
            &WriteOptions::dry_run(),
        )
        .expect("dry-run create")
        .object;
    assert!(kept_device_fields(&answer).is_empty(), "{answer}");
    assert_eq!(answer["metadata"]["generation"], 1);
    assert!(
        store
            .get(Resource::ResourceSlices, &Key::new(None, "s"))
            .is_none()
    );

    let stored = created(
        &store,
        Resource::ResourceSlices,
        slice("s", vec![device("gpu-0")]),
    );
    let mut update = stored.clone();
    update["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    update["metadata"]["labels"] = json!({"a": "b"});
    let key = Key::new(None, "s");
    let answer = store
        .update(
            Resource::ResourceSlices,
            &key,
            update,
            Target::Main,
            &WriteOptions::dry_run(),
        )
        .expect("dry-run update")
        .object;
    assert!(!has(&answer, "/spec/devices/0/taints"));
    assert_eq!(answer["metadata"]["labels"]["a"], "b");
    let answer = store
        .patch(
            Resource::ResourceSlices,
            &key,
            PatchKind::Merge,
            &json!({"metadata": {"labels": {"c": "d"}}, "spec": {"devices": [gated_device("gpu-0")]}}),
            Target::Main,
            &WriteOptions::dry_run(),
        )
        .expect("dry-run patch")
        .object;
    assert!(kept_device_fields(&answer).is_empty());
    assert_eq!(answer["metadata"]["labels"]["c"], "d");
    assert_eq!(
        store.get(Resource::ResourceSlices, &key),
        Some(stored),
        "nothing stored"
    );
}

fn list_slice(attribute: Value) -> Value {
    let mut d = device("gpu-0");
    d["attributes"]["numa"] = attribute;
    slice("s", vec![d])
}

#[test]
fn list_attributes_are_unknown_before_1_36_and_gated_after() {
    for release in [V1_34, V1_35] {
        let store = store(release);
        // Alongside a scalar, the list goes and the scalar stays.
        let written = create(
            &store,
            Resource::ResourceSlices,
            list_slice(json!({"int": 0, "ints": [0, 1]})),
        )
        .expect("accepted without the list");
        assert_eq!(
            written.warnings,
            ["unknown field \"spec.devices[0].attributes.numa.ints\""]
        );
        assert_eq!(
            written.object["spec"]["devices"][0]["attributes"]["numa"],
            json!({"int": 0})
        );
        // Alone, the attribute is left without a value.
        let message = refused(&store, list_slice(json!({"ints": [0, 1]})));
        let expected = if release == V1_34 {
            "spec.devices[0].attributes[numa]: Required value: exactly one value must be specified"
        } else {
            "spec.devices[0].attributes[numa]: Invalid value: \"\": exactly one value must be specified"
        };
        assert!(message.contains(expected), "{release}: {message}");
        let strict = store
            .create(
                Resource::ResourceSlices,
                None,
                list_slice(json!({"ints": [0, 1]})),
                &WriteOptions {
                    field_validation: FieldValidation::Strict,
                    ..WriteOptions::default()
                },
            )
            .expect_err("strict");
        assert_eq!((strict.code, strict.reason), (400, "BadRequest"));
        let mut quiet = list_slice(json!({"int": 0, "ints": [0, 1]}));
        quiet["metadata"]["name"] = json!("quiet");
        let ignored = store
            .create(
                Resource::ResourceSlices,
                None,
                quiet,
                &WriteOptions {
                    field_validation: FieldValidation::Ignore,
                    ..WriteOptions::default()
                },
            )
            .expect("dropped silently");
        assert!(ignored.warnings.is_empty());
        assert!(!has(
            &ignored.object,
            "/spec/devices/0/attributes/numa/ints"
        ));
        // Server-side apply types the patch with the release's schema and fails.
        let mut applied = list_slice(json!({"int": 0, "ints": [0, 1]}));
        applied["apiVersion"] = json!("resource.k8s.io/v1");
        applied["kind"] = json!("ResourceSlice");
        let err = store
            .patch(
                Resource::ResourceSlices,
                &Key::new(None, "applied"),
                PatchKind::Apply,
                &applied,
                Target::Main,
                &WriteOptions::default(),
            )
            .expect_err("apply fails");
        assert_eq!(err.code, 500);
        assert!(
            err.message
                .ends_with(".spec.devices[0].attributes.numa.ints: field not declared in schema"),
            "{}",
            err.message
        );
    }

    // 1.36 and 1.37 know the field; with the alpha gate off the strategy drops it silently.
    for release in [V1_36, V1_37] {
        let store = store(release);
        let written = create(
            &store,
            Resource::ResourceSlices,
            list_slice(json!({"int": 0, "ints": [0, 1]})),
        )
        .expect("accepted");
        assert!(written.warnings.is_empty());
        assert_eq!(
            written.object["spec"]["devices"][0]["attributes"]["numa"],
            json!({"int": 0})
        );
    }

    // With the gate on: kept and validated.
    let store = store_with(V1_36, &[(gate::DRA_LIST_TYPE_ATTRIBUTES, true)]);
    let stored = created(
        &store,
        Resource::ResourceSlices,
        list_slice(json!({"ints": [0, 1]})),
    );
    assert_eq!(
        stored["spec"]["devices"][0]["attributes"]["numa"]["ints"],
        json!([0, 1])
    );
    let mut bad = list_slice(json!({"strings": ["x".repeat(65)]}));
    bad["metadata"]["name"] = json!("bad");
    bad["spec"]["devices"][0]["attributes"]["empty"] = json!({"versions": []});
    let message = refused(&store, bad);
    for needle in [
        "spec.devices[0].attributes[numa].strings[0]: Too long: may not be more than 64 bytes",
        "spec.devices[0].attributes[empty].versions: Invalid value: []: must not be empty if specified",
    ] {
        assert!(message.contains(needle), "{needle} not in {message}");
    }
    let mut many = list_slice(json!({"ints": (0..48).collect::<Vec<_>>()}));
    many["metadata"]["name"] = json!("many");
    let message = refused(&store, many);
    assert!(
        message.contains("spec.devices[0]: Invalid value: 49: the total number of attribute values must not exceed 48"),
        "{message}"
    );
    let devices: Vec<Value> = (0..65)
        .map(|i| {
            let mut d = device(&format!("gpu-{i}"));
            d["attributes"]["numa"] = json!({"ints": [0]});
            d
        })
        .collect();
    let message = refused(&store, slice("big", devices));
    assert!(
        message.contains("spec.devices: Too many: 65: must have at most 64 items"),
        "{message}"
    );
}

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

/// Sends one HTTP/1.1 request and reads the whole answer.
async fn http(
    server: &ApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: emulator\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8(answer).expect("utf-8");
    let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
    let code = head[9..12].parse().expect("status code");
    (
        code,
        head.to_owned(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_server_reports_its_release_and_applies_its_gates() {
    let server = ApiServer::builder()
        .kubernetes(V1_35)
        .feature_gate(gate::DRA_DEVICE_TAINTS, true)
        .start()
        .await
        .expect("start");
    assert_eq!(server.release(), V1_35);
    assert!(server.feature_enabled(gate::DRA_DEVICE_TAINTS));
    assert!(!server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));
    assert_eq!(
        server.feature_gates().get(gate::DRA_LIST_TYPE_ATTRIBUTES),
        None
    );

    let (code, _, version) = http(&server, "GET", "/version", "application/json", "").await;
    assert_eq!(code, 200);
    assert_eq!(
        (
            version["major"].as_str(),
            version["minor"].as_str(),
            version["gitVersion"].as_str()
        ),
        (Some("1"), Some("35"), Some("v1.35.0-kubedev-emulator"))
    );
    let info = server
        .client()
        .expect("client")
        .apiserver_version()
        .await
        .expect("kube reads the version");
    assert_eq!(info.minor, "35");

    // A dry-run create answers with the stored form and stores nothing; the unknown field
    // comes back as a warning.
    let mut body = list_slice(json!({"int": 0, "ints": [0]}));
    body["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "None"}]);
    body["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
    let path = "/apis/resource.k8s.io/v1/resourceslices";
    let (code, head, answer) = http(
        &server,
        "POST",
        &format!("{path}?dryRun=All"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{answer}");
    assert!(
        head.to_ascii_lowercase().contains(
            "warning: 299 - \"unknown field \\\"spec.devices[0].attributes.numa.ints\\\"\""
        ),
        "{head}"
    );
    assert_eq!(answer["spec"]["devices"][0]["taints"][0]["effect"], "None");
    assert!(!has(&answer, "/spec/devices/0/allowMultipleAllocations"));
    assert!(server.objects(Resource::ResourceSlices).is_empty());

    let (code, _, answer) = http(
        &server,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!((code, answer["reason"].as_str()), (400, Some("BadRequest")));

    let (code, _, answer) = http(
        &server,
        "PATCH",
        &format!("{path}/s?fieldManager=test"),
        "application/apply-patch+yaml",
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"})
            .as_object()
            .map(|m| {
                let mut b = body.clone();
                for (k, v) in m {
                    b[k] = v.clone();
                }
                b.to_string()
            })
            .expect("object"),
    )
    .await;
    assert_eq!(code, 500, "{answer}");
    assert!(answer.get("reason").is_none(), "{answer}");
    server.shutdown().await;
}

#[tokio::test]
async fn start_refuses_gates_the_release_does_not_allow() {
    let err = ApiServer::builder()
        .kubernetes(V1_34)
        .feature_gate(gate::DRA_LIST_TYPE_ATTRIBUTES, true)
        .start()
        .await
        .expect_err("no such gate in 1.34");
    assert!(
        matches!(err, ApiServerError::FeatureGate { release: V1_34, .. }),
        "{err}"
    );
    let err = ApiServer::builder()
        .feature_gate(gate::DRA_EXTENDED_RESOURCE, false)
        .start()
        .await
        .expect_err("locked in 1.37");
    assert!(err.to_string().contains("locked to true"), "{err}");
    let server = ApiServer::start().await.expect("start");
    assert_eq!(server.release(), KubeRelease::NEWEST);
    assert_eq!(server.feature_gates(), V1_37.default_feature_gates());
    server.shutdown().await;
}

#[tokio::test]
async fn a_restart_as_another_release_keeps_objects_and_ends_watches() {
    use futures::StreamExt;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::api::{Api, PostParams, WatchParams};

    let server = ApiServer::builder()
        .kubernetes(V1_35)
        .start()
        .await
        .expect("start");
    // One client for the whole test: it stays connected across the restart.
    let client = server.client().expect("client");
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let post = |name: &str| {
        let slices = slices.clone();
        let body: ResourceSlice = serde_json::from_value(counters_slice(name)).expect("typed");
        async move { slices.create(&PostParams::default(), &body).await }
    };
    let counters = |slice: &ResourceSlice| {
        slice
            .spec
            .shared_counters
            .as_ref()
            .map_or(0, |sets| sets.len())
    };

    // 1.35 with its defaults: DRAPartitionableDevices is off, so sharedCounters is dropped.
    let before = post("before").await.expect("create on 1.35");
    assert_eq!(counters(&before), 0);
    let stored_before = server
        .get(Resource::ResourceSlices, None, "before")
        .expect("stored");
    assert!(
        !has(&stored_before, "/spec/sharedCounters"),
        "{stored_before}"
    );

    let mut watch = slices
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await
        .expect("watch")
        .boxed();

    // A gate 1.34 does not have: the restart is refused and nothing changes.
    let err = server
        .restart_as(V1_34, &[(gate::DRA_LIST_TYPE_ATTRIBUTES, true)])
        .expect_err("no such gate in 1.34");
    assert!(
        matches!(err, ApiServerError::FeatureGate { release: V1_34, .. }),
        "{err}"
    );
    assert_eq!(server.release(), V1_35);
    assert_eq!(server.feature_gates(), V1_35.default_feature_gates());

    // The upgrade to 1.36, whose defaults have the gate on.
    server.restart_as(V1_36, &[]).expect("restart as 1.36");
    assert_eq!(server.release(), V1_36);
    assert_eq!(server.feature_gates(), V1_36.default_feature_gates());
    assert!(server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));

    // The open watch ends, as a restarting API server's do.
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while watch.next().await.is_some() {}
    })
    .await
    .expect("the watch ends on the restart");

    let info = client.apiserver_version().await.expect("version");
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "36"));
    assert_eq!(info.git_version, "v1.36.0-kubedev-emulator");

    // The same create now keeps the counters; the object written before is untouched.
    let after = post("after").await.expect("create on 1.36");
    assert_eq!(counters(&after), 1);
    assert_eq!(
        server.get(Resource::ResourceSlices, None, "before"),
        Some(stored_before)
    );

    // Back to 1.35 with the gate turned on by hand: the counters are kept as well.
    server
        .restart_as(V1_35, &[(gate::DRA_PARTITIONABLE_DEVICES, true)])
        .expect("restart as 1.35 with the gate");
    assert_eq!(server.release(), V1_35);
    assert!(server.feature_enabled(gate::DRA_PARTITIONABLE_DEVICES));
    assert_eq!(counters(&post("gated").await.expect("create")), 1);
    server.shutdown().await;
}
