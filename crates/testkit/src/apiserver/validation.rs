//! Defaulting and validation of the served objects, following the rules and limits the
//! Kubernetes API server of each release enforces for `resource.k8s.io/v1` (ResourceSlice
//! limits and the shared-counter layout in particular), reported as field errors with the paths
//! the API server uses.
//!
//! This module holds the limits, field paths, defaults and the metadata and Event rules; `names`
//! (name and format checks), `slice`, `device` and `claim` (claims and classes) hold the rest.

mod claim;
mod device;
mod names;
mod shared;
mod slice;

use serde_json::{Map, Value};

use super::release::KubeRelease;
use super::resource::Resource;
use super::status::{FieldError, quote};
use claim::{validate_claim_spec, validate_claim_status, validate_class_spec};
use names::{check_label_key, check_label_value, dns1123_label, dns1123_subdomain};
use slice::validate_slice_spec;

/// Maximum number of devices in one ResourceSlice.
pub const RESOURCE_SLICE_MAX_DEVICES: usize = 128;
/// Maximum number of devices in one ResourceSlice when any device has taints or consumes
/// counters (from 1.35), or has a list attribute (from 1.36).
pub const RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_CONSUMES_COUNTERS: usize = 64;
/// Maximum number of shared counter sets in one ResourceSlice (from 1.35; 1.34 has no limit).
pub const RESOURCE_SLICE_MAX_COUNTER_SETS: usize = 8;
/// Maximum number of counters in one counter set (from 1.35).
pub const RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET: usize = 32;
/// Maximum number of counter consumptions per device (from 1.35; 1.34 has no limit).
pub const RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Maximum number of counters in one device counter consumption (from 1.35).
pub const RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION: usize = 32;
/// 1.34: maximum number of counters over all shared counter sets of a ResourceSlice.
pub const RESOURCE_SLICE_MAX_SHARED_COUNTERS_V1_34: usize = 32;
/// 1.34: maximum number of counters over all counter consumptions of one device.
pub const RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_V1_34: usize = 32;
/// 1.34: maximum number of counters over all counter consumptions of all devices of a
/// ResourceSlice.
pub const RESOURCE_SLICE_MAX_DEVICE_COUNTERS_PER_SLICE_V1_34: usize = 1024;
/// Maximum number of attributes and capacities, combined, per device.
pub const RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: usize = 32;
/// Maximum number of attribute values per device, each item of a list attribute counted
/// (from 1.36).
pub const RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE: usize = 48;
/// Maximum number of taints per device (from 1.35).
pub const DEVICE_TAINTS_MAX_LENGTH: usize = 16;
/// 1.34: maximum number of taints per device.
pub const DEVICE_TAINTS_MAX_LENGTH_V1_34: usize = 4;
/// Maximum length of a string or version attribute value.
pub const DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH: usize = 64;
/// Maximum length of the domain part of an attribute or capacity name.
pub const DEVICE_MAX_DOMAIN_LENGTH: usize = 63;
/// Maximum length of the identifier part of an attribute or capacity name.
pub const DEVICE_MAX_ID_LENGTH: usize = 32;
/// Maximum length of a driver name.
pub const DRIVER_NAME_MAX_LENGTH: usize = 63;
/// Maximum length of a pool name.
pub const POOL_NAME_MAX_LENGTH: usize = 253;
/// Maximum number of requests in a ResourceClaim.
pub const DEVICE_REQUESTS_MAX_SIZE: usize = 32;
/// Maximum number of selectors in a request or a DeviceClass.
pub const DEVICE_SELECTORS_MAX_SIZE: usize = 32;
/// Maximum number of allocation results in a ResourceClaim.
pub const ALLOCATION_RESULTS_MAX_SIZE: usize = 32;
/// Maximum number of entries in `status.reservedFor`.
pub const RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE: usize = 256;

/// Paths as the API server renders them: `spec.devices[3].attributes[model]`.
#[derive(Debug, Clone)]
struct Path(String);

impl Path {
    fn root(name: &str) -> Self {
        Path(name.to_owned())
    }
    fn child(&self, name: &str) -> Self {
        Path(format!("{}.{name}", self.0))
    }
    fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }
    fn key(&self, key: &str) -> Self {
        Path(format!("{}[{key}]", self.0))
    }
    fn as_str(&self) -> &str {
        &self.0
    }
}

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => quote(s),
        other => other.to_string(),
    }
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn present(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(|x| !x.is_null())
}

fn array_at<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn map_at<'a>(v: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    v.get(key).and_then(Value::as_object)
}

/// Fills in the defaults the API server sets, so clients read back what they would from a real
/// cluster: a claim's `allocationMode` and `count`, a toleration's `operator` (`Equal`), a
/// slice's device taint's `timeAdded` (now, in whole seconds).
pub(crate) fn apply_defaults(resource: Resource, object: &mut Value) {
    if resource == Resource::ResourceSlices {
        default_taint_times(object);
        return;
    }
    if resource != Resource::ResourceClaims {
        return;
    }
    let Some(requests) = object
        .pointer_mut("/spec/devices/requests")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let default_request = |r: &mut Value| {
        let Some(map) = r.as_object_mut() else { return };
        let mode = map
            .entry("allocationMode")
            .or_insert_with(|| Value::from("ExactCount"))
            .as_str()
            .unwrap_or("")
            .to_owned();
        if mode == "ExactCount" {
            map.entry("count").or_insert_with(|| Value::from(1));
        }
        for t in map
            .get_mut("tolerations")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            let unset = t
                .get("operator")
                .is_none_or(|o| o.is_null() || o.as_str() == Some(""));
            if unset {
                t.insert("operator".into(), Value::from("Equal"));
            }
        }
    };
    for request in requests {
        if let Some(exactly) = request.get_mut("exactly") {
            default_request(exactly);
        }
        if let Some(subs) = request
            .get_mut("firstAvailable")
            .and_then(Value::as_array_mut)
        {
            for sub in subs {
                default_request(sub);
            }
        }
    }
}

/// Sets `timeAdded` of each device taint of a slice that has none, as the API server's
/// defaulting does.
fn default_taint_times(object: &mut Value) {
    let Some(devices) = object
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let now = crate::apiserver::store::now_rfc3339();
    for taint in devices
        .iter_mut()
        .filter_map(|d| d.get_mut("taints").and_then(Value::as_array_mut))
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        if taint.get("timeAdded").is_none_or(Value::is_null) {
            taint.insert("timeAdded".into(), Value::from(now.clone()));
        }
    }
}

/// Validates `metadata` of a new or updated object.
fn validate_metadata(resource: Resource, object: &Value, errs: &mut Vec<FieldError>) {
    let meta = Path::root("metadata");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.is_empty() {
        errs.push(FieldError::required(
            meta.child("name").as_str(),
            "name or generateName is required",
        ));
    } else {
        for msg in dns1123_subdomain(name) {
            errs.push(FieldError::invalid(
                meta.child("name").as_str(),
                &quote(name),
                &msg,
            ));
        }
    }
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    if resource.namespaced() {
        if namespace.is_empty() {
            errs.push(FieldError::required(meta.child("namespace").as_str(), ""));
        } else {
            for msg in dns1123_label(namespace) {
                errs.push(FieldError::invalid(
                    meta.child("namespace").as_str(),
                    &quote(namespace),
                    &msg,
                ));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(
            meta.child("namespace").as_str(),
            "not allowed on this type",
        ));
    }
    if let Some(labels) = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        for (key, value) in labels {
            let path = meta.child("labels");
            check_label_key(errs, key, &path);
            match value.as_str() {
                Some(v) => check_label_value(errs, v, &path),
                None => errs.push(FieldError::invalid(
                    path.as_str(),
                    &render(value),
                    "must be a string",
                )),
            }
        }
    }
}

/// Validates an object about to be stored, by the rules of `release`. `old` is the stored
/// object for updates.
pub(crate) fn validate(
    resource: Resource,
    object: &Value,
    old: Option<&Value>,
    release: KubeRelease,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_metadata(resource, object, &mut errs);
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    let old_spec = old.and_then(|o| o.get("spec"));
    match resource {
        Resource::ResourceSlices => validate_slice_spec(&spec, old_spec, release, &mut errs),
        Resource::ResourceClaims => {
            match old_spec {
                Some(old_spec) if *old_spec != spec => {
                    errs.push(FieldError::invalid("spec", "{...}", "field is immutable"));
                }
                Some(_) => {}
                None => validate_claim_spec(&spec, &mut errs),
            }
            validate_claim_status(object, old, &mut errs);
        }
        Resource::DeviceClasses => validate_class_spec(&spec, old_spec, &mut errs),
        Resource::Nodes | Resource::Pods => {}
        Resource::Events => validate_event(object, &mut errs),
    }
    errs
}

/// The rules the API server applies to an `events.k8s.io/v1` Event on create.
fn validate_event(event: &Value, errs: &mut Vec<FieldError>) {
    let text = |field: &str| event.get(field).and_then(Value::as_str).unwrap_or("");
    for field in [
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if text(field).is_empty() {
            errs.push(FieldError::required(field, ""));
        }
    }
    for (field, limit) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        if text(field).len() > limit {
            errs.push(FieldError::invalid(
                field,
                "",
                &format!("can have at most {limit} characters"),
            ));
        }
    }
    if event.get("eventTime").is_none_or(Value::is_null) {
        errs.push(FieldError::required("eventTime", ""));
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        errs.push(FieldError::not_supported(
            "type",
            text("type"),
            &["Normal", "Warning"],
        ));
    }
    // An Event about a cluster-scoped object lives in "default" (or no namespace); one about a
    // namespaced object lives in that object's namespace.
    let namespace = event
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let regarding = event
        .pointer("/regarding/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ok = if regarding.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        namespace == regarding
    };
    if !ok {
        errs.push(FieldError::invalid(
            "regarding.namespace",
            regarding,
            "does not match event.namespace",
        ));
    }
}

#[cfg(test)]
mod tests;
