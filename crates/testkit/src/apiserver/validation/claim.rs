//! ResourceClaim and DeviceClass validation: requests, allocation modes, and the claim status
//! (allocation results, reservations, devices).

use std::collections::BTreeSet;

use serde_json::Value;

use super::names::{check_dns_label, check_dns_subdomain, check_driver_name, check_pool_name};
use super::{
    ALLOCATION_RESULTS_MAX_SIZE, DEVICE_REQUESTS_MAX_SIZE, DEVICE_SELECTORS_MAX_SIZE, Path,
    RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE, array_at, str_at,
};
use crate::apiserver::status::{FieldError, quote};

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

/// Longest CEL selector expression the API server accepts when it is written
/// (`CELSelectorExpressionMaxLength`); stored expressions are not checked again.
const CEL_SELECTOR_EXPRESSION_MAX_LENGTH: usize = 10 * 1024;

/// Refuses new selector expressions longer than the API server accepts.
fn check_expression_lengths(selectors: &[Value], path: &Path, errs: &mut Vec<FieldError>) {
    for (i, selector) in selectors.iter().enumerate() {
        let expression = selector
            .pointer("/cel/expression")
            .and_then(Value::as_str)
            .unwrap_or("");
        if expression.len() > CEL_SELECTOR_EXPRESSION_MAX_LENGTH {
            errs.push(FieldError::too_long(
                path.index(i).child("cel").child("expression").as_str(),
                CEL_SELECTOR_EXPRESSION_MAX_LENGTH,
            ));
        }
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
    // A claim's spec is immutable: its selectors are only ever new here.
    check_expression_lengths(selectors, &path.child("selectors"), errs);
    validate_allocation_mode(request, path, errs);
}

pub(super) fn validate_claim_spec(spec: &Value, errs: &mut Vec<FieldError>) {
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

/// A device as a claim's status names it: driver, pool, device and share ID.
type DeviceKey = (String, String, String, Option<String>);

/// The driver, pool, device and share ID an allocation result or a status device names.
fn device_key(entry: &Value) -> DeviceKey {
    (
        str_at(entry, "driver").unwrap_or("").to_owned(),
        str_at(entry, "pool").unwrap_or("").to_owned(),
        str_at(entry, "device").unwrap_or("").to_owned(),
        str_at(entry, "shareID").map(str::to_owned),
    )
}

/// Validates a claim's status (`old`: the stored claim on an update): the allocation, which
/// cannot change once made, the reservations (only on an allocated claim), and `devices`, whose
/// entries must name allocated devices, once each.
pub(super) fn validate_claim_status(
    object: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
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
    let allocated = match allocation {
        Some(allocation) => validate_allocation(object, allocation, old_allocation, &path, errs),
        None => BTreeSet::new(),
    };
    validate_reserved_for(&status, allocation.is_some(), &path, errs);
    validate_status_devices(&status, &allocated, &path, errs);
}

/// Validates the results of the claim's `allocation` (checked in full only when it differs
/// from `old_allocation`); the devices it allocates.
fn validate_allocation(
    object: &Value,
    allocation: &Value,
    old_allocation: Option<&Value>,
    path: &Path,
    errs: &mut Vec<FieldError>,
) -> BTreeSet<DeviceKey> {
    let mut allocated = BTreeSet::new();
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
        allocated.insert(device_key(result));
    }
    allocated
}

/// Validates `status.reservedFor`: bounded, and only on an allocated claim.
fn validate_reserved_for(
    status: &Value,
    is_allocated: bool,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let reserved = array_at(status, "reservedFor");
    if reserved.len() > RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE {
        errs.push(FieldError::too_many(
            path.child("reservedFor").as_str(),
            reserved.len(),
            RESOURCE_CLAIM_RESERVED_FOR_MAX_SIZE,
        ));
    }
    if !reserved.is_empty() && !is_allocated {
        errs.push(FieldError::forbidden(
            path.child("reservedFor").as_str(),
            "may not be specified when `allocated` is not set",
        ));
    }
}

/// Validates `status.devices`: each names a device of `allocated`, once.
fn validate_status_devices(
    status: &Value,
    allocated: &BTreeSet<DeviceKey>,
    path: &Path,
    errs: &mut Vec<FieldError>,
) {
    let devices_path = path.child("devices");
    let mut seen = BTreeSet::new();
    for (i, device) in array_at(status, "devices").iter().enumerate() {
        let d_path = devices_path.index(i);
        let key = device_key(device);
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

/// `old` is the stored spec on an update: unchanged selectors are stored expressions, which
/// the API server does not hold to the length limit again.
pub(super) fn validate_class_spec(spec: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let selectors = array_at(spec, "selectors");
    let unchanged = old.is_some_and(|o| o.get("selectors") == spec.get("selectors"));
    if !unchanged {
        check_expression_lengths(selectors, &Path::root("spec").child("selectors"), errs);
    }
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
