//! Validation of one device of a ResourceSlice: attributes and capacity, taints, counter
//! consumption (1.34's and 1.35's rules), per-device node selection and binding conditions.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::names::{
    check_dns_label, check_dns_subdomain, check_label_key, check_label_value, check_qualified_name,
    is_semver,
};
use super::shared::{CounterNames, LIST_VALUES, SliceRules, check_counters, has_list_value};
use super::{
    DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH, DEVICE_MAX_DOMAIN_LENGTH, DEVICE_MAX_ID_LENGTH,
    DEVICE_TAINTS_MAX_LENGTH, DEVICE_TAINTS_MAX_LENGTH_V1_34, Path,
    RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE,
    RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE,
    RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
    RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_V1_34,
    RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE, array_at, map_at, present, render,
    str_at,
};
use crate::apiserver::status::{FieldError, quote};

/// What a device is validated against besides itself.
pub(super) struct DeviceContext<'a> {
    /// The device of the same name in the stored slice, for updates.
    pub(super) old: Option<&'a Value>,
    /// The slice sets `perDeviceNodeSelection: true`.
    pub(super) per_device: bool,
    pub(super) rules: SliceRules,
    /// 1.34: the counter sets of the slice and their counters.
    pub(super) counter_names: Option<&'a CounterNames<'a>>,
}

pub(super) fn validate_device(
    device: &Value,
    context: &DeviceContext<'_>,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let DeviceContext {
        old,
        per_device,
        rules,
        counter_names,
    } = *context;
    check_dns_label(
        errs,
        str_at(device, "name").unwrap_or(""),
        &path.child("name"),
    );
    validate_attributes_and_capacity(device, rules, path, errs);
    validate_taints(device, old, rules, path, errs);
    validate_consumption(device, counter_names, path, errs);
    validate_device_node_selection(device, per_device, path, errs);
    for (field, max) in [
        ("bindingConditions", 4usize),
        ("bindingFailureConditions", 4usize),
    ] {
        let list = array_at(device, field);
        if list.len() > max {
            errs.push(FieldError::too_many(
                path.child(field).as_str(),
                list.len(),
                max,
            ));
        }
    }
}

/// Attributes and capacity: the limits on their number (and, from 1.36, on attribute values),
/// qualified names, each attribute's value, and capacity request policies only on devices that
/// allow multiple allocations.
fn validate_attributes_and_capacity(
    device: &Value,
    rules: SliceRules,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let attributes = map_at(device, "attributes");
    let capacity = map_at(device, "capacity");
    let combined = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if combined > RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE {
        errs.push(FieldError::invalid(
            path.as_str(),
            &combined.to_string(),
            &format!(
                "the total number of attributes and capacities must not exceed {RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE}"
            ),
        ));
    }
    if rules.list_attributes {
        let values: usize = attributes
            .into_iter()
            .flat_map(Map::values)
            .map(|a| {
                if has_list_value(a) {
                    LIST_VALUES.iter().map(|k| array_at(a, k).len()).sum()
                } else {
                    1
                }
            })
            .sum();
        if values > RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE {
            errs.push(FieldError::invalid(
                path.as_str(),
                &values.to_string(),
                &format!(
                    "the total number of attribute values must not exceed {RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE}"
                ),
            ));
        }
    }
    let max_key = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH;
    if let Some(attributes) = attributes {
        let attrs_path = path.child("attributes");
        for (name, attribute) in attributes {
            let key_path = attrs_path.key(name);
            if name.len() > max_key {
                errs.push(FieldError::too_long(key_path.as_str(), max_key));
            }
            check_qualified_name(errs, name, &key_path);
            validate_attribute(attribute, &key_path, rules, errs);
        }
    }
    if let Some(capacity) = capacity {
        let multi = device
            .get("allowMultipleAllocations")
            .and_then(Value::as_bool)
            == Some(true);
        let cap_path = path.child("capacity");
        for (name, cap) in capacity {
            let key_path = cap_path.key(name);
            if name.len() > max_key {
                errs.push(FieldError::too_long(key_path.as_str(), max_key));
            }
            check_qualified_name(errs, name, &key_path);
            if !present(cap, "value") {
                errs.push(FieldError::required(key_path.child("value").as_str(), ""));
            }
            if present(cap, "requestPolicy") && !multi {
                errs.push(FieldError::forbidden(
                    key_path.child("requestPolicy").as_str(),
                    "allowMultipleAllocations must be true",
                ));
            }
        }
    }
}

/// Taints: the release's limit and effects; each key, value and effect, unless (from 1.35) an
/// update leaves them as they were.
fn validate_taints(
    device: &Value,
    old: Option<&Value>,
    rules: SliceRules,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let taints = array_at(device, "taints");
    // 1.35 stopped re-validating taints an update leaves as they were.
    let taints_changed =
        !rules.split_counters || old.is_none_or(|o| array_at(o, "taints") != taints);
    let taints_path = path.child("taints");
    let (max_taints, effects): (usize, &[&str]) = if rules.split_counters {
        (
            DEVICE_TAINTS_MAX_LENGTH,
            &["NoExecute", "NoSchedule", "None"],
        )
    } else {
        (DEVICE_TAINTS_MAX_LENGTH_V1_34, &["NoExecute", "NoSchedule"])
    };
    if taints.len() > max_taints {
        errs.push(FieldError::too_many(
            taints_path.as_str(),
            taints.len(),
            max_taints,
        ));
    } else if taints_changed {
        for (i, taint) in taints.iter().enumerate() {
            let taint_path = taints_path.index(i);
            let key = str_at(taint, "key").unwrap_or("");
            if key.is_empty() {
                errs.push(FieldError::required(taint_path.child("key").as_str(), ""));
            } else {
                check_label_key(errs, key, &taint_path.child("key"));
            }
            check_label_value(
                errs,
                str_at(taint, "value").unwrap_or(""),
                &taint_path.child("value"),
            );
            match str_at(taint, "effect") {
                None | Some("") => errs.push(FieldError::required(
                    taint_path.child("effect").as_str(),
                    "",
                )),
                Some(effect) if !effects.contains(&effect) => {
                    errs.push(FieldError::not_supported(
                        taint_path.child("effect").as_str(),
                        effect,
                        effects,
                    ));
                }
                Some(_) => {}
            }
        }
    }
}

/// Counter consumption: 1.34's rules when the slice's counter sets are given, else 1.35's
/// limits, valid counter set names and counters, and no set consumed twice.
fn validate_consumption(
    device: &Value,
    counter_names: Option<&CounterNames<'_>>,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let consumes = array_at(device, "consumesCounters");
    let consumes_path = path.child("consumesCounters");
    if let Some(counter_names) = counter_names {
        validate_consumption_v1_34(consumes, counter_names, path, errs);
    } else if consumes.len() > RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE {
        errs.push(FieldError::too_many(
            consumes_path.as_str(),
            consumes.len(),
            RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE,
        ));
    } else {
        let mut seen = BTreeSet::new();
        for (i, consumption) in consumes.iter().enumerate() {
            let c_path = consumes_path.index(i);
            let set = str_at(consumption, "counterSet").unwrap_or("");
            check_dns_label(errs, set, &c_path.child("counterSet"));
            check_counters(
                errs,
                consumption,
                &c_path.child("counters"),
                RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION,
            );
            if !seen.insert(set) {
                errs.push(FieldError::duplicate(c_path.as_str(), set));
            }
        }
    }
}

/// Per-device node selection: with `perDeviceNodeSelection`, exactly one of `nodeName`,
/// `nodeSelector` and `allNodes`; without it, none of them.
fn validate_device_node_selection(
    device: &Value,
    per_device: bool,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let node_fields = ["nodeName", "nodeSelector", "allNodes"];
    if per_device {
        let mut set = Vec::new();
        if let Some(node) = device.get("nodeName").filter(|v| !v.is_null()) {
            match node.as_str() {
                Some("") | None => {
                    errs.push(FieldError::invalid(
                        path.child("nodeName").as_str(),
                        &render(node),
                        "must not be empty",
                    ));
                }
                Some(name) => {
                    set.push("`nodeName`");
                    check_dns_subdomain(errs, name, &path.child("nodeName"));
                }
            }
        }
        if present(device, "nodeSelector") {
            set.push("`nodeSelector`");
        }
        if let Some(all) = device.get("allNodes").filter(|v| !v.is_null()) {
            if all.as_bool() == Some(true) {
                set.push("`allNodes`");
            } else {
                errs.push(FieldError::invalid(
                    path.child("allNodes").as_str(),
                    &render(all),
                    "must be either unset or set to true",
                ));
            }
        }
        let why = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";
        match set.len() {
            0 => errs.push(FieldError::required(path.as_str(), why)),
            1 => {}
            _ => errs.push(FieldError::invalid(
                path.as_str(),
                &quote(&format!("{{{}}}", set.join(", "))),
                why,
            )),
        }
    } else if node_fields.iter().any(|f| present(device, f)) {
        errs.push(FieldError::invalid(
            path.as_str(),
            "null",
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        ));
    }
}

/// 1.34's counter consumption: no limit on entries or counters per entry, but at most 32
/// counters per device, and every counter set and counter must be defined in the same slice.
fn validate_consumption_v1_34(
    consumes: &[Value],
    counter_names: &CounterNames<'_>,
    device_path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let consumes_path = device_path.child("consumesCounters");
    let mut seen = BTreeSet::new();
    for (i, consumption) in consumes.iter().enumerate() {
        let c_path = consumes_path.index(i);
        let set = str_at(consumption, "counterSet").unwrap_or("");
        if set.is_empty() {
            errs.push(FieldError::required(
                c_path.child("counterSet").as_str(),
                "",
            ));
        }
        check_counters(errs, consumption, &c_path.child("counters"), usize::MAX);
        if !seen.insert(set) {
            errs.push(FieldError::duplicate(c_path.as_str(), set));
        }
    }
    let total: usize = consumes
        .iter()
        .map(|c| map_at(c, "counters").map_or(0, Map::len))
        .sum();
    if total > RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_V1_34 {
        errs.push(FieldError::invalid(
            device_path.as_str(),
            &total.to_string(),
            &format!(
                "the total number of counters must not exceed {RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_V1_34}"
            ),
        ));
    }
    for (i, consumption) in consumes.iter().enumerate() {
        let c_path = consumes_path.index(i);
        let set = str_at(consumption, "counterSet").unwrap_or("");
        match counter_names.get(set) {
            Some(defined) => {
                for name in map_at(consumption, "counters")
                    .into_iter()
                    .flat_map(Map::keys)
                {
                    if !defined.contains(name.as_str()) {
                        errs.push(FieldError::invalid(
                            c_path.child("counters").as_str(),
                            &quote(name),
                            "must reference a counter defined in the ResourceSlice sharedCounters",
                        ));
                    }
                }
            }
            None => errs.push(FieldError::invalid(
                c_path.child("counterSet").as_str(),
                &quote(set),
                "must reference a counterSet defined in the ResourceSlice sharedCounters",
            )),
        }
    }
}

fn check_string_value(errs: &mut Vec<FieldError>, value: &Value, path: &Path) {
    if value
        .as_str()
        .is_some_and(|s| s.len() > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH)
    {
        errs.push(FieldError::too_long(
            path.as_str(),
            DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH,
        ));
    }
}

fn check_version_value(errs: &mut Vec<FieldError>, value: &Value, path: &Path) {
    let text = value.as_str().unwrap_or("");
    if !is_semver(text) {
        errs.push(FieldError::invalid(
            path.as_str(),
            &quote(text),
            "must be a string compatible with semver.org spec 2.0.0",
        ));
    }
    if text.len() > DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH {
        errs.push(FieldError::too_long(
            path.as_str(),
            DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH,
        ));
    }
}

fn validate_attribute(
    attribute: &Value,
    path: &Path,
    rules: SliceRules,
    errs: &mut Vec<FieldError>,
) {
    let mut set = 0;
    if present(attribute, "bool") {
        set += 1;
    }
    if present(attribute, "int") {
        set += 1;
    }
    if let Some(s) = attribute.get("string").filter(|v| !v.is_null()) {
        set += 1;
        check_string_value(errs, s, &path.child("string"));
    }
    if let Some(v) = attribute.get("version").filter(|v| !v.is_null()) {
        set += 1;
        check_version_value(errs, v, &path.child("version"));
    }
    // Before 1.36 the lists are not fields of the type (decoding dropped them).
    let lists: &[&str] = if rules.list_attributes {
        &LIST_VALUES
    } else {
        &[]
    };
    for &list in lists {
        if let Some(v) = attribute.get(list).filter(|v| !v.is_null()) {
            set += 1;
            let items = v.as_array().map(Vec::as_slice).unwrap_or(&[]);
            if items.is_empty() {
                errs.push(FieldError::invalid(
                    path.child(list).as_str(),
                    "[]",
                    "must not be empty if specified",
                ));
            }
            for (i, item) in items.iter().enumerate() {
                let item_path = path.child(list).index(i);
                match list {
                    "strings" => check_string_value(errs, item, &item_path),
                    "versions" => check_version_value(errs, item, &item_path),
                    _ => {}
                }
            }
        }
    }
    match set {
        0 if !rules.split_counters => errs.push(FieldError::required(
            path.as_str(),
            "exactly one value must be specified",
        )),
        0 => errs.push(FieldError::invalid(
            path.as_str(),
            "\"\"",
            "exactly one value must be specified",
        )),
        1 => {}
        _ => errs.push(FieldError::invalid(
            path.as_str(),
            &render(attribute),
            "exactly one value must be specified",
        )),
    }
}
