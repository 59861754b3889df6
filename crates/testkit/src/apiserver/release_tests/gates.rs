//! Fields of disabled feature gates and fields a release's types lack: dropped on create,
//! kept on update when the stored object already uses them, answered by dry runs; list
//! attributes before and after 1.36.

use super::*;

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

const DEVICE_GATED: [&str; 7] = [
    "taints",
    "consumesCounters",
    "bindingConditions",
    "bindingFailureConditions",
    "bindsToNode",
    "allowMultipleAllocations",
    "capacity/memory/requestPolicy",
];

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

    // 1.36, 1.37 and 1.38 know the field; with the alpha gate off the strategy drops it
    // silently.
    for release in [V1_36, V1_37, V1_38] {
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

/// A claim in `default` whose one request uses every gated field of a request, and a
/// distinct-attribute constraint.
fn gated_claim(admin: bool) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu",
                "adminAccess": admin,
                "tolerations": [{"key": "example.com/unhealthy", "effect": "NoExecute"}],
                "capacity": {"requests": {"memory": "1Gi"}},
            }}],
            "constraints": [{"requests": ["gpu"], "distinctAttribute": "example.com/index"}],
        }},
    })
}

fn create_claim(store: &Store, claim: Value) -> Result<Written, ApiError> {
    store.create(
        Resource::ResourceClaims,
        Some("default"),
        claim,
        &WriteOptions::default(),
    )
}

#[test]
fn claims_lose_the_request_fields_of_disabled_gates_and_get_the_servers_defaults() {
    // As the real API server stores them at each release (checked against it by the cluster
    // tests): tolerations and consumable capacity are off before 1.36.
    for release in KubeRelease::ALL {
        let stored = create_claim(&store(release), gated_claim(false))
            .unwrap_or_else(|e| panic!("{release}: {}", e.message))
            .object;
        let exactly = &stored["spec"]["devices"]["requests"][0]["exactly"];
        let constraint = &stored["spec"]["devices"]["constraints"][0];
        if release >= V1_36 {
            assert_eq!(exactly["tolerations"][0]["operator"], "Equal", "{release}");
            assert_eq!(
                exactly["capacity"]["requests"]["memory"], "1Gi",
                "{release}"
            );
            assert_eq!(
                constraint["distinctAttribute"], "example.com/index",
                "{release}"
            );
        } else {
            assert!(exactly.get("tolerations").is_none(), "{release}: {exactly}");
            assert!(exactly.get("capacity").is_none(), "{release}: {exactly}");
            assert!(constraint.get("distinctAttribute").is_none(), "{release}");
        }
        assert_eq!(exactly["allocationMode"], "ExactCount", "{release}");
    }
}

#[test]
fn admin_access_needs_the_namespace_label() {
    let store = store(V1_37);
    let Err(e) = create_claim(&store, gated_claim(true)) else {
        panic!("a claim asking for admin access in an unlabelled namespace was stored");
    };
    assert_eq!(e.code, 422, "{}", e.message);
    assert!(
        e.message
            .contains("spec.devices.requests[0].exactly.adminAccess: Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: true` label"),
        "{}",
        e.message
    );
    store.set_namespace_labels(
        "default",
        [(
            "resource.kubernetes.io/admin-access".to_string(),
            "true".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    let stored = create_claim(&store, gated_claim(true))
        .unwrap_or_else(|e| panic!("{}", e.message))
        .object;
    assert_eq!(
        stored["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"],
        true
    );
}

#[test]
fn device_taints_get_the_time_they_were_added() {
    let store = store(V1_37);
    let mut d = device("gpu-0");
    d["taints"] = json!([
        {"key": "example.com/unhealthy", "effect": "NoSchedule"},
        {"key": "example.com/old", "effect": "NoSchedule", "timeAdded": "2026-01-02T03:04:05Z"},
    ]);
    let stored = created(&store, Resource::ResourceSlices, slice("s", vec![d]));
    let taints = &stored["spec"]["devices"][0]["taints"];
    let added = taints[0]["timeAdded"].as_str().unwrap_or_default();
    assert!(added.ends_with('Z') && added.len() == 20, "{added}");
    assert_eq!(taints[1]["timeAdded"], "2026-01-02T03:04:05Z");
}
