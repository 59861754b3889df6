//! Names and formats the API server checks: DNS-1123 labels and subdomains, driver and pool
//! names, C identifiers and qualified attribute names, label keys and values, semantic versions.

use super::{DEVICE_MAX_ID_LENGTH, DRIVER_NAME_MAX_LENGTH, POOL_NAME_MAX_LENGTH, Path};
use crate::apiserver::status::{FieldError, quote};

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

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
pub(super) fn dns1123_label(s: &str) -> Vec<String> {
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
pub(super) fn dns1123_subdomain(s: &str) -> Vec<String> {
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

pub(super) fn check_dns_label(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
    if value.is_empty() {
        errs.push(FieldError::required(path.as_str(), ""));
        return;
    }
    for msg in dns1123_label(value) {
        errs.push(FieldError::invalid(path.as_str(), &quote(value), &msg));
    }
}

pub(super) fn check_dns_subdomain(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
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
pub(super) fn check_driver_name(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
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

pub(super) fn check_pool_name(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
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
pub(super) fn check_qualified_name(errs: &mut Vec<FieldError>, name: &str, path: &Path) {
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
pub(super) fn check_label_key(errs: &mut Vec<FieldError>, key: &str, path: &Path) {
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

pub(super) fn check_label_value(errs: &mut Vec<FieldError>, value: &str, path: &Path) {
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
pub(super) fn is_semver(s: &str) -> bool {
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
