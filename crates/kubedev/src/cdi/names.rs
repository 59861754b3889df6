//! CDI naming rules: vendor and class names, device names and share IDs, checked before any of
//! them becomes part of a path or a spec, and the device name of a claim's device. A claim UID
//! comes checked, as a [`kubedev_core::ClaimUid`].

use kubedev_core::{AllocatedDevice, ClaimUid};

use super::{CdiError, MAX_SHARE_ID_LEN};

/// Checks a CDI vendor or class name: ASCII letters, digits, '_', '-' and '.', starting with a
/// letter and ending with a letter or digit.
pub(super) fn check_vendor_or_class(what: &'static str, s: &str) -> Result<(), CdiError> {
    let err = |reason: &str| CdiError::InvalidName {
        what,
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    let first = s.chars().next().ok_or_else(|| err("must not be empty"))?;
    if !first.is_ascii_alphabetic() {
        return Err(err("must start with a letter"));
    }
    if !s.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(err("must end with a letter or digit"));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(err(&format!(
            "contains {c:?}; only letters, digits, '_', '-' and '.' are allowed"
        )));
    }
    Ok(())
}

/// Checks a CDI device name: ASCII letters, digits, '_', '-', '.' and ':', starting and ending
/// with a letter or digit.
pub fn validate_device_name(name: &str) -> Result<(), CdiError> {
    check_device_name_rules("device name", name, usize::MAX)
}

fn check_device_name_rules(what: &'static str, s: &str, max: usize) -> Result<(), CdiError> {
    let err = |reason: String| CdiError::InvalidName {
        what,
        value: s.to_owned(),
        reason,
    };
    if s.is_empty() {
        return Err(err("must not be empty".into()));
    }
    if s.len() > max {
        return Err(err(format!("must be no more than {max} characters")));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(err(format!(
            "contains {c:?}; only letters, digits, '_', '-', '.' and ':' are allowed"
        )));
    }
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !s.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(err("must start and end with a letter or digit".into()));
    }
    if s.contains("..") {
        return Err(err("must not contain \"..\"".into()));
    }
    Ok(())
}

/// The CDI device name of an allocated device in a claim: `<claim UID>-<device>` or
/// `<claim UID>-<device>-<share ID>`. Valid by construction: a claim UID is made of the CDI
/// device-name characters and starts with a letter or digit, a device name is a DNS label, and
/// the share ID is checked here; so no part is checked twice.
pub(super) fn device_name(
    claim_uid: &ClaimUid,
    device: &AllocatedDevice,
) -> Result<String, CdiError> {
    let mut name = format!("{claim_uid}-{}", device.device.device);
    if let Some(share) = &device.share_id {
        check_device_name_rules("share ID", share, MAX_SHARE_ID_LEN)?;
        name.push('-');
        name.push_str(share);
    }
    debug_assert!(validate_device_name(&name).is_ok(), "{name}");
    Ok(name)
}
