//! Defaulting and validation of the served objects, following the rules and limits the
//! Kubernetes API server of each release enforces for `resource.k8s.io/v1` (ResourceSlice
//! limits and the shared-counter layout in particular), reported as field errors with the paths
//! the API server uses.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::release::KubeRelease;
use super::resource::Resource;
use super::status::{FieldError, quote};

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

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

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

fn is_label_char(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn dns_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_label_char(b[0])
        && is_label_char(b[b.len() - 1])
        && b.iter().all(|&c| is_label_char(c) || c == b'-')
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Problems with a DNS-1123 label, as messages.
fn dns1123_label(s: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        msgs.push(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !dns_label_shape(s) {
        msgs.push(DNS1123_LABEL_MSG.to_owned());
    }
    msgs
}

/// Problems with a DNS-1123 subdomain, as messages.
fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut msgs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        msgs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if s.is_empty() || !s.split('.').all(dns_label_shape) {
        msgs.push(DNS1123_SUBDOMAIN_MSG.to_owned());
    }
    msgs
}

fn check_dns_label(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if value.is_empty() {
        errs.push(FieldError::required(path.as_str(), ""));
        return;
    }
    for msg in dns1123_label(value) {
        errs.push(FieldError::invalid(path.as_str(), &quote(value), &msg));
    }
}

fn check_dns_subdomain(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if value.is_empty() {
        errs.push(FieldError::required(path.as_str(), ""));
        return;
    }
    for msg in dns1123_subdomain(value) {
        errs.push(FieldError::invalid(path.as_str(), &quote(value), &msg));
    }
}

/// Driver names follow the CSI driver name rules: at most 63 characters, a DNS subdomain
/// (checked case-insensitively).
fn check_driver_name(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if value.is_empty() {
        errs.push(FieldError::required(path.as_str(), ""));
        return;
    }
    if value.len() > DRIVER_NAME_MAX_LENGTH {
        errs.push(FieldError::too_long(path.as_str(), DRIVER_NAME_MAX_LENGTH));
    }
    for msg in dns1123_subdomain(&value.to_ascii_lowercase()) {
        errs.push(FieldError::invalid(path.as_str(), &quote(value), &msg));
    }
}

fn check_pool_name(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if value.is_empty() {
        errs.push(FieldError::required(path.as_str(), ""));
        return;
    }
    if value.len() > POOL_NAME_MAX_LENGTH {
        errs.push(FieldError::too_long(path.as_str(), POOL_NAME_MAX_LENGTH));
    }
    for part in value.split('/') {
        for msg in dns1123_subdomain(part) {
            errs.push(FieldError::invalid(path.as_str(), &quote(part), &msg));
        }
    }
}

fn is_c_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

fn check_c_identifier(errs: &mut Vec<FieldError>, id: &str, path: &Path) {
    if id.len() > DEVICE_MAX_ID_LENGTH {
        errs.push(FieldError::too_long(path.as_str(), DEVICE_MAX_ID_LENGTH));
    }
    if !is_c_identifier(id) {
        errs.push(FieldError::invalid(
            path.as_str(),
            &quote(id),
            "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')",
        ));
    }
}

/// Attribute and capacity names: a C identifier, optionally prefixed by `domain/`.
fn check_qualified_name(errs: &mut Vec<FieldError>, name: &str, path: &Path) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [id] => check_c_identifier(errs, id, path),
        [domain, id] => {
            if domain.is_empty() {
                errs.push(FieldError::invalid(
                    path.as_str(),
                    "\"\"",
                    "the domain must not be empty",
                ));
            } else {
                check_driver_name(errs, domain, path);
            }
            if id.is_empty() {
                errs.push(FieldError::invalid(
                    path.as_str(),
                    "\"\"",
                    "the name must not be empty",
                ));
            } else {
                check_c_identifier(errs, id, path);
            }
        }
        _ => errs.push(FieldError::invalid(
            path.as_str(),
            &quote(name),
            "must not contain more than one slash",
        )),
    }
}

fn label_name_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Label keys (and taint keys): an optional DNS-subdomain prefix and a name of at most 63
/// characters.
fn check_label_key(errs: &mut Vec<FieldError>, key: &str, path: &Path) {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        for msg in dns1123_subdomain(prefix) {
            errs.push(FieldError::invalid(
                path.as_str(),
                &quote(key),
                &format!("prefix part {msg}"),
            ));
        }
    }
    if !label_name_shape(name) {
        errs.push(FieldError::invalid(
            path.as_str(),
            &quote(key),
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, and be at most 63 characters",
        ));
    }
}

fn check_label_value(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if !value.is_empty() && !label_name_shape(value) {
        errs.push(FieldError::invalid(
            path.as_str(),
            &quote(value),
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, and be at most 63 characters",
        ));
    }
}

fn is_numeric_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

/// Semantic versions as semver.org 2.0.0 defines them.
fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let core_ok = {
        let parts: Vec<&str> = core.split('.').collect();
        parts.len() == 3 && parts.iter().all(|p| is_numeric_identifier(p))
    };
    let ident_ok =
        |id: &str| !id.is_empty() && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
    let pre_ok = pre.is_none_or(|p| {
        p.split('.').all(|id| {
            ident_ok(id) && (!id.bytes().all(|c| c.is_ascii_digit()) || is_numeric_identifier(id))
        })
    });
    let build_ok = build.is_none_or(|b| b.split('.').all(ident_ok));
    core_ok && pre_ok && build_ok
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
/// cluster.
pub(crate) fn apply_defaults(resource: Resource, object: &mut Value) {
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
        Resource::DeviceClasses => validate_class_spec(&spec, &mut errs),
        Resource::Nodes => {}
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

/// Which of the release-dependent slice rules apply.
#[derive(Debug, Clone, Copy)]
struct SliceRules {
    /// 1.35+: counter sets and devices in separate slices of the pool, with per-set and
    /// per-consumption limits; 1.34: counters in the slice of their devices, with totals.
    split_counters: bool,
    /// 1.36+: list-valued attributes are part of the type.
    list_attributes: bool,
}

impl SliceRules {
    fn of(release: KubeRelease) -> Self {
        Self {
            split_counters: release.at_least(KubeRelease::V1_35),
            list_attributes: release.at_least(KubeRelease::V1_36),
        }
    }
}

fn has_list_value(attribute: &Value) -> bool {
    LIST_VALUES.iter().any(|k| present(attribute, k))
}

const LIST_VALUES: [&str; 4] = ["bools", "ints", "strings", "versions"];

/// Counter names of each shared counter set of a slice (1.34 checks references against them).
type CounterNames<'a> = std::collections::BTreeMap<&'a str, BTreeSet<&'a str>>;

fn validate_slice_spec(
    spec: &Value,
    old_spec: Option<&Value>,
    release: KubeRelease,
    errs: &mut Vec<FieldError>,
) {
    let rules = SliceRules::of(release);
    let path = Path::root("spec");
    let driver = str_at(spec, "driver").unwrap_or("");
    check_driver_name(errs, driver, &path.child("driver"));

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

    if let Some(old) = old_spec {
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
                counter_names: counter_names.as_ref(),
            };
            validate_device(device, &context, &device_path, errs);
            let name = str_at(device, "name").unwrap_or("");
            if !seen.insert(name) {
                errs.push(FieldError::duplicate(device_path.as_str(), name));
            }
        }
    }

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

fn check_counters(errs: &mut Vec<FieldError>, holder: &Value, path: &Path, max: usize) {
    match map_at(holder, "counters") {
        None => errs.push(FieldError::required(path.as_str(), "")),
        Some(counters) if counters.is_empty() => errs.push(FieldError::required(path.as_str(), "")),
        Some(counters) if counters.len() > max => {
            errs.push(FieldError::too_many(path.as_str(), counters.len(), max))
        }
        Some(counters) => {
            for (name, counter) in counters {
                let key_path = path.key(name);
                for msg in dns1123_label(name) {
                    errs.push(FieldError::invalid(key_path.as_str(), &quote(name), &msg));
                }
                if !present(counter, "value") {
                    errs.push(FieldError::required(key_path.child("value").as_str(), ""));
                }
            }
        }
    }
}

/// What a device is validated against besides itself.
struct DeviceContext<'a> {
    /// The device of the same name in the stored slice, for updates.
    old: Option<&'a Value>,
    /// The slice sets `perDeviceNodeSelection: true`.
    per_device: bool,
    rules: SliceRules,
    /// 1.34: the counter sets of the slice and their counters.
    counter_names: Option<&'a CounterNames<'a>>,
}

fn validate_device(
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

fn validate_allocation_mode(request: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let count = request.get("count").and_then(Value::as_i64).unwrap_or(0);
    match str_at(request, "allocationMode").unwrap_or("ExactCount") {
        "All" => {
            if count != 0 {
                errs.push(FieldError::invalid(
                    path.child("count").as_str(),
                    &count.to_string(),
                    "must not be specified when allocationMode is 'All'",
                ));
            }
        }
        "ExactCount" => {
            if count <= 0 {
                errs.push(FieldError::invalid(
                    path.child("count").as_str(),
                    &count.to_string(),
                    "must be greater than zero",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            path.child("allocationMode").as_str(),
            other,
            &["All", "ExactCount"],
        )),
    }
}

fn validate_exact_request(request: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    check_dns_subdomain(
        errs,
        str_at(request, "deviceClassName").unwrap_or(""),
        &path.child("deviceClassName"),
    );
    let selectors = array_at(request, "selectors");
    if selectors.len() > DEVICE_SELECTORS_MAX_SIZE {
        errs.push(FieldError::too_many(
            path.child("selectors").as_str(),
            selectors.len(),
            DEVICE_SELECTORS_MAX_SIZE,
        ));
    }
    validate_allocation_mode(request, path, errs);
}

fn validate_claim_spec(spec: &Value, errs: &mut Vec<FieldError>) {
    let path = Path::root("spec").child("devices").child("requests");
    let devices = spec.get("devices").cloned().unwrap_or(Value::Null);
    let requests = array_at(&devices, "requests");
    if requests.len() > DEVICE_REQUESTS_MAX_SIZE {
        errs.push(FieldError::too_many(
            path.as_str(),
            requests.len(),
            DEVICE_REQUESTS_MAX_SIZE,
        ));
        return;
    }
    let mut seen = BTreeSet::new();
    for (i, request) in requests.iter().enumerate() {
        let r_path = path.index(i);
        let name = str_at(request, "name").unwrap_or("");
        check_dns_label(errs, name, &r_path.child("name"));
        if !seen.insert(name) {
            errs.push(FieldError::duplicate(r_path.as_str(), name));
        }
        let exactly = request.get("exactly").filter(|v| !v.is_null());
        let first = array_at(request, "firstAvailable");
        match (exactly, first.is_empty()) {
            (None, true) => errs.push(FieldError::required(
                r_path.as_str(),
                "exactly one of `exactly` or `firstAvailable` is required",
            )),
            (Some(_), false) => errs.push(FieldError::invalid(
                r_path.as_str(),
                "null",
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
            )),
            (Some(exact), true) => validate_exact_request(exact, &r_path.child("exactly"), errs),
            (None, false) => {
                let mut sub_seen = BTreeSet::new();
                for (j, sub) in first.iter().enumerate() {
                    let s_path = r_path.child("firstAvailable").index(j);
                    let sub_name = str_at(sub, "name").unwrap_or("");
                    check_dns_label(errs, sub_name, &s_path.child("name"));
                    if !sub_seen.insert(sub_name) {
                        errs.push(FieldError::duplicate(s_path.as_str(), sub_name));
                    }
                    validate_exact_request(sub, &s_path, errs);
                }
            }
        }
    }
}

/// Request names a result may refer to: `req` or `req/subreq`.
fn claim_request_names(object: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let requests = object
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array);
    for request in requests.map(Vec::as_slice).unwrap_or(&[]) {
        let name = str_at(request, "name").unwrap_or("").to_owned();
        let subs = array_at(request, "firstAvailable");
        if subs.is_empty() {
            names.insert(name);
        } else {
            for sub in subs {
                names.insert(format!("{name}/{}", str_at(sub, "name").unwrap_or("")));
            }
        }
    }
    names
}

fn validate_claim_status(object: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let status = object.get("status").cloned().unwrap_or(Value::Null);
    let path = Path::root("status");
    let old_allocation = old
        .and_then(|o| o.pointer("/status/allocation"))
        .filter(|v| !v.is_null());
    let allocation = status.get("allocation").filter(|v| !v.is_null());
    if let (Some(old_alloc), Some(new_alloc)) = (old_allocation, allocation)
        && old_alloc != new_alloc
    {
        errs.push(FieldError::invalid(
            path.child("allocation").as_str(),
            "{...}",
            "field is immutable",
        ));
    }
    let mut allocated = BTreeSet::new();
    if let Some(allocation) = allocation {
        let results_path = path.child("allocation").child("devices").child("results");
        let results = allocation
            .pointer("/devices/results")
            .and_then(Value::as_array);
        let results = results.map(Vec::as_slice).unwrap_or(&[]);
        if results.len() > ALLOCATION_RESULTS_MAX_SIZE {
            errs.push(FieldError::too_many(
                results_path.as_str(),
                results.len(),
                ALLOCATION_RESULTS_MAX_SIZE,
            ));
        }
        let names = claim_request_names(object);
        let changed = old_allocation != Some(allocation);
        for (i, result) in results.iter().enumerate() {
            let r_path = results_path.index(i);
            let request = str_at(result, "request").unwrap_or("");
            if changed && !names.contains(request) {
                errs.push(FieldError::invalid(
                    r_path.child("request").as_str(),
                    &quote(request),
                    "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'",
                ));
            }
            if changed {
                check_driver_name(
                    errs,
                    str_at(result, "driver").unwrap_or(""),
                    &r_path.child("driver"),
                );
                check_pool_name(
                    errs,
                    str_at(result, "pool").unwrap_or(""),
                    &r_path.child("pool"),
                );
                check_dns_label(
                    errs,
                    str_at(result, "device").unwrap_or(""),
                    &r_path.child("device"),
                );
            }
            allocated.insert((
                str_at(result, "driver").unwrap_or("").to_owned(),
                str_at(result, "pool").unwrap_or("").to_owned(),
                str_at(result, "device").unwrap_or("").to_owned(),
                str_at(result, "shareID").map(str::to_owned),
            ));
        }
    }
    let reserved = array_at(&status, "reservedFor");
    if reserved.len() > RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE {
        errs.push(FieldError::too_many(
            path.child("reservedFor").as_str(),
            reserved.len(),
            RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE,
        ));
    }
    if !reserved.is_empty() && allocation.is_none() {
        errs.push(FieldError::forbidden(
            path.child("reservedFor").as_str(),
            "may not be specified when `allocated` is not set",
        ));
    }
    let devices_path = path.child("devices");
    let mut seen = BTreeSet::new();
    for (i, device) in array_at(&status, "devices").iter().enumerate() {
        let d_path = devices_path.index(i);
        let key = (
            str_at(device, "driver").unwrap_or("").to_owned(),
            str_at(device, "pool").unwrap_or("").to_owned(),
            str_at(device, "device").unwrap_or("").to_owned(),
            str_at(device, "shareID").map(str::to_owned),
        );
        if !allocated.contains(&key) {
            errs.push(FieldError::invalid(
                d_path.as_str(),
                &quote(&format!("{}/{}/{}", key.0, key.1, key.2)),
                "must be an allocated device in the claim",
            ));
        }
        if !seen.insert(key.clone()) {
            errs.push(FieldError::duplicate(
                d_path.as_str(),
                &format!("{}/{}/{}", key.0, key.1, key.2),
            ));
        }
    }
}

fn validate_class_spec(spec: &Value, errs: &mut Vec<FieldError>) {
    let selectors = array_at(spec, "selectors");
    if selectors.len() > DEVICE_SELECTORS_MAX_SIZE {
        errs.push(FieldError::too_many(
            "spec.selectors",
            selectors.len(),
            DEVICE_SELECTORS_MAX_SIZE,
        ));
    }
    for (i, selector) in selectors.iter().enumerate() {
        let expression = selector
            .pointer("/cel/expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        if expression.is_empty() {
            errs.push(FieldError::required(
                &format!("spec.selectors[{i}].cel.expression"),
                "",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        claim["status"] =
            json!({"devices": [{"driver": "d.example.com", "pool": "p", "device": "x"}]});
        let errs = validate(Resource::ResourceClaims, &claim, None, KubeRelease::NEWEST);
        assert_eq!(errs[0].field, "status.devices[0]");
    }
}
