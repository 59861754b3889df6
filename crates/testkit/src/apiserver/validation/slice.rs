//! ResourceSlice spec validation: driver and pool, immutable fields, node selection, the device
//! list's size and the shared counter sets, by the rules of the release.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::device::{DeviceContext, validate_device};
use super::names::{check_dns_label, check_dns_subdomain, check_driver_name, check_pool_name};
use super::shared::{CounterNames, SliceRules, check_counters, has_list_value};
use super::{
    Path, RESOURCE_SLICE_MAX_COUNTER_SETS, RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
    RESOURCE_SLICE_MAX_DEVICE_COUNTERS_PER_SLICE_V1_34, RESOURCE_SLICE_MAX_DEVICES,
    RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_CONSUMES_COUNTERS,
    RESOURCE_SLICE_MAX_SHARED_COUNTERS_V1_34, array_at, map_at, present, render, str_at,
};
use crate::apiserver::release::KubeRelease;
use crate::apiserver::status::{FieldError, quote};

pub(super) fn validate_slice_spec(
    spec: &Value,
    old_spec: Option<&Value>,
    release: KubeRelease,
    errs: &mut Vec<FieldError>,
) {
    let rules = SliceRules::of(release);
    let path = Path::root("spec");
    let driver = str_at(spec, "driver").unwrap_or("");
    check_driver_name(errs, driver, &path.child("driver"));
    validate_pool(spec, &path, errs);
    if let Some(old) = old_spec {
        check_immutable(spec, old, &path, errs);
    }
    validate_node_selection(spec, &path, errs);

    if rules.split_counters && present(spec, "sharedCounters") && present(spec, "devices") {
        errs.push(FieldError::invalid(
            path.as_str(),
            "\"\"",
            "only one of `sharedCounters` or `devices` is allowed",
        ));
    }

    let devices = array_at(spec, "devices");
    let counter_sets = array_at(spec, "sharedCounters");
    // 1.34 only: consumed counters must be defined in this slice.
    let counter_names: Option<CounterNames<'_>> = (!rules.split_counters).then(|| {
        counter_sets
            .iter()
            .map(|set| {
                let names = map_at(set, "counters")
                    .map(|c| c.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                (str_at(set, "name").unwrap_or(""), names)
            })
            .collect()
    });
    validate_slice_devices(spec, old_spec, rules, counter_names.as_ref(), &path, errs);
    validate_counter_sets(devices, counter_sets, rules, &path, errs);
}

/// `spec.pool`: a valid name, a positive slice count and a non-negative generation.
fn validate_pool(spec: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let pool = spec.get("pool").cloned().unwrap_or(Value::Null);
    let pool_path = path.child("pool");
    let pool_name = str_at(&pool, "name").unwrap_or("");
    check_pool_name(errs, pool_name, &pool_path.child("name"));
    let count = pool
        .get("resourceSliceCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if count <= 0 {
        errs.push(FieldError::invalid(
            pool_path.child("resourceSliceCount").as_str(),
            &count.to_string(),
            "must be greater than zero",
        ));
    }
    let generation = pool.get("generation").and_then(Value::as_i64).unwrap_or(0);
    if generation < 0 {
        errs.push(FieldError::invalid(
            pool_path.child("generation").as_str(),
            &generation.to_string(),
            "must be greater than or equal to zero",
        ));
    }
}

/// On update: the pool name, the driver and the node name are immutable.
fn check_immutable(spec: &Value, old: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let pool_path = path.child("pool");
    let immutable = [
        ("/pool/name", pool_path.child("name")),
        ("/driver", path.child("driver")),
        ("/nodeName", path.child("nodeName")),
    ];
    for (pointer, field) in immutable {
        let new_value = spec.pointer(pointer).cloned().unwrap_or(Value::Null);
        let old_value = old.pointer(pointer).cloned().unwrap_or(Value::Null);
        if new_value != old_value {
            errs.push(FieldError::invalid(
                field.as_str(),
                &render(&new_value),
                "field is immutable",
            ));
        }
    }
}

/// Exactly one of `nodeName`, `nodeSelector`, `allNodes` and `perDeviceNodeSelection`, each
/// well formed.
fn validate_node_selection(spec: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let mut set_fields = Vec::new();
    if let Some(node) = spec.get("nodeName").filter(|v| !v.is_null()) {
        match node.as_str() {
            Some("") | None => errs.push(FieldError::invalid(
                path.child("nodeName").as_str(),
                &render(node),
                "must be either unset or set to a non-empty string",
            )),
            Some(name) => {
                set_fields.push("`nodeName`");
                check_dns_subdomain(errs, name, &path.child("nodeName"));
            }
        }
    }
    if let Some(selector) = spec.get("nodeSelector").filter(|v| !v.is_null()) {
        set_fields.push("`nodeSelector`");
        let terms = array_at(selector, "nodeSelectorTerms");
        if terms.len() != 1 {
            errs.push(FieldError::invalid(
                path.child("nodeSelector")
                    .child("nodeSelectorTerms")
                    .as_str(),
                &format!("{} terms", terms.len()),
                "must have exactly one node selector term",
            ));
        }
    }
    for flag in ["allNodes", "perDeviceNodeSelection"] {
        if let Some(value) = spec.get(flag).filter(|v| !v.is_null()) {
            if value.as_bool() == Some(true) {
                set_fields.push(if flag == "allNodes" {
                    "`allNodes`"
                } else {
                    "`perDeviceNodeSelection`"
                });
            } else {
                errs.push(FieldError::invalid(
                    path.child(flag).as_str(),
                    &render(value),
                    "must be either unset or set to true",
                ));
            }
        }
    }
    match set_fields.len() {
        0 => errs.push(FieldError::required(
            path.as_str(),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )),
        1 => {}
        _ => errs.push(FieldError::invalid(
            path.as_str(),
            &quote(&format!("{{{}}}", set_fields.join(", "))),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set",
        )),
    }
}

/// The devices: the size limit (lower when a device has taints, consumes counters or, from
/// 1.36, a list attribute), then each device against its stored version, and unique names.
fn validate_slice_devices(
    spec: &Value,
    old_spec: Option<&Value>,
    rules: SliceRules,
    counter_names: Option<&CounterNames<'_>>,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let devices = array_at(spec, "devices");
    let advanced = rules.split_counters
        && devices.iter().any(|d| {
            !array_at(d, "taints").is_empty()
                || !array_at(d, "consumesCounters").is_empty()
                || (rules.list_attributes
                    && map_at(d, "attributes")
                        .is_some_and(|attrs| attrs.values().any(has_list_value)))
        });
    let max_devices = if advanced {
        RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_CONSUMES_COUNTERS
    } else {
        RESOURCE_SLICE_MAX_DEVICES
    };
    let devices_path = path.child("devices");
    if devices.len() > max_devices {
        // Like the API server, stop at the size check: the entries are not looked at.
        errs.push(FieldError::too_many(
            devices_path.as_str(),
            devices.len(),
            max_devices,
        ));
    } else {
        let per_device = spec.get("perDeviceNodeSelection").and_then(Value::as_bool) == Some(true);
        let mut seen = BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            let device_path = devices_path.index(i);
            let old_device = old_spec.and_then(|o| {
                array_at(o, "devices")
                    .iter()
                    .find(|d| str_at(d, "name") == str_at(device, "name"))
            });
            let context = DeviceContext {
                old: old_device,
                per_device,
                rules,
                counter_names,
            };
            validate_device(device, &context, &device_path, errs);
            let name = str_at(device, "name").unwrap_or("");
            if !seen.insert(name) {
                errs.push(FieldError::duplicate(device_path.as_str(), name));
            }
        }
    }
}

/// The shared counter sets: 1.34's totals over the slice, or 1.35's limits per set; each set
/// with a valid, unique name and valid counters.
fn validate_counter_sets(
    devices: &[Value],
    counter_sets: &[Value],
    rules: SliceRules,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let devices_path = path.child("devices");
    let sets_path = path.child("sharedCounters");
    if !rules.split_counters {
        let consumed: usize = devices
            .iter()
            .flat_map(|d| array_at(d, "consumesCounters"))
            .map(|c| map_at(c, "counters").map_or(0, Map::len))
            .sum();
        if consumed > RESOURCE_SLICE_MAX_DEVICE_COUNTERS_PER_SLICE_V1_34 {
            errs.push(FieldError::invalid(
                devices_path.as_str(),
                &consumed.to_string(),
                &format!(
                    "the total number of counters in devices must not exceed {RESOURCE_SLICE_MAX_DEVICE_COUNTERS_PER_SLICE_V1_34}"
                ),
            ));
        }
        let shared: usize = counter_sets
            .iter()
            .map(|set| map_at(set, "counters").map_or(0, Map::len))
            .sum();
        if shared > RESOURCE_SLICE_MAX_SHARED_COUNTERS_V1_34 {
            errs.push(FieldError::invalid(
                sets_path.as_str(),
                &shared.to_string(),
                &format!(
                    "the total number of shared counters must not exceed {RESOURCE_SLICE_MAX_SHARED_COUNTERS_V1_34}"
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, set) in counter_sets.iter().enumerate() {
            let set_path = sets_path.index(i);
            let name = str_at(set, "name").unwrap_or("");
            check_dns_label(errs, name, &set_path.child("name"));
            // The size limit is on the total over all sets, checked above.
            check_counters(errs, set, &set_path.child("counters"), usize::MAX);
            if !seen.insert(name) {
                errs.push(FieldError::duplicate(set_path.as_str(), name));
            }
        }
    } else if counter_sets.len() > RESOURCE_SLICE_MAX_COUNTER_SETS {
        errs.push(FieldError::too_many(
            sets_path.as_str(),
            counter_sets.len(),
            RESOURCE_SLICE_MAX_COUNTER_SETS,
        ));
    } else {
        let mut seen = BTreeSet::new();
        for (i, set) in counter_sets.iter().enumerate() {
            let set_path = sets_path.index(i);
            let name = str_at(set, "name").unwrap_or("");
            check_dns_label(errs, name, &set_path.child("name"));
            check_counters(
                errs,
                set,
                &set_path.child("counters"),
                RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET,
            );
            if !seen.insert(name) {
                errs.push(FieldError::duplicate(set_path.as_str(), name));
            }
        }
    }
}
