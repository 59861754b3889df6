//! Names with Kubernetes' validation rules.
//!
//! Every name type is a validated string: it can only be built through a constructor that checks
//! the rule, so a value of the type is always valid. Errors name the offending value and the rule.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A name that broke a Kubernetes naming rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {}: {reason}", crate::echo::echo(value))]
#[non_exhaustive]
pub struct NameError {
    /// What kind of name was being checked ("device name", "driver name", ...).
    pub kind: &'static str,
    /// The rejected input.
    pub value: String,
    /// Which rule it broke.
    pub reason: String,
}

impl NameError {
    fn new(kind: &'static str, value: &str, reason: impl Into<String>) -> Self {
        NameError {
            kind,
            value: value.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Checks an RFC 1123 DNS label: at most 63 lowercase alphanumerics or '-', starting and ending
/// with an alphanumeric. Returns the reason on failure.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    check_label_with_max(s, 63)
}

fn check_label_with_max(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("must be no more than {max} characters"));
    }
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    if !ok_char(bytes[0]) || !ok_char(bytes[bytes.len() - 1]) {
        return Err("must start and end with a lowercase letter or digit".into());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii() && (ok_char(c as u8) || c == '-')))
    {
        return Err(format!(
            "contains {c:?}; only lowercase letters, digits and '-' are allowed"
        ));
    }
    Ok(())
}

/// Checks an RFC 1123 DNS subdomain of at most `max` characters, as Kubernetes does: parts
/// shaped like DNS labels (lowercase alphanumerics or '-', starting and ending with an
/// alphanumeric) joined by '.'. As in Kubernetes, a part may be longer than the 63 characters
/// of a DNS label; only the whole is limited. Returns the reason on failure.
pub fn check_dns_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("must be no more than {max} characters"));
    }
    for label in s.split('.') {
        check_label_with_max(label, max).map_err(|e| {
            if label.is_empty() {
                "must not contain empty labels (\"..\", or a leading or trailing '.')".to_string()
            } else {
                format!("label {label:?} {e}")
            }
        })?;
    }
    Ok(())
}

/// Checks a C identifier of at most `max` characters (`[A-Za-z_][A-Za-z0-9_]*`).
fn check_c_identifier(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("must be no more than {max} characters"));
    }
    let first = s.as_bytes()[0];
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return Err("must start with a letter or '_'".into());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(format!(
            "contains {c:?}; only letters, digits and '_' are allowed (a C identifier)"
        ));
    }
    Ok(())
}

/// Checks the name part of a Kubernetes qualified name: at most 63 characters, alphanumerics,
/// '-', '_' or '.', starting and ending with an alphanumeric.
fn check_qualified_name_part(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name part must not be empty".into());
    }
    if s.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    let b = s.as_bytes();
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Err("name part must start and end with a letter or digit".into());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "name part contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"
        ));
    }
    Ok(())
}

macro_rules! string_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                let check: fn(&str) -> Result<(), String> = $check;
                check(&value).map_err(|reason| NameError::new($kind, &value, reason))?;
                Ok($name(value))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                $name::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                $name::new(s)
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Maps keyed by the name are looked up by `&str` (equal and ordered as the text).
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self == &other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

string_name!(
    /// A device name within a pool: a DNS label (at most 63 lowercase alphanumerics or '-').
    DeviceName,
    "device name",
    check_dns_label
);

string_name!(
    /// A DRA driver name: a DNS subdomain of at most 63 characters, e.g. `gpu.example.com`.
    DriverName,
    "driver name",
    |s| check_dns_subdomain(s, 63)
);

string_name!(
    /// A pool name: one or more DNS subdomains joined by '/', at most 253 characters in all.
    PoolName,
    "pool name",
    check_pool_name
);

string_name!(
    /// A device-plugin extended resource name such as `example.com/gpu`: fully qualified
    /// (`<domain>/<name>`), outside the `kubernetes.io` domains, not starting with `requests.`.
    ExtendedResourceName,
    "extended resource name",
    check_extended_resource_name
);

string_name!(
    /// A counter set or counter name: a DNS label.
    CounterName,
    "counter name",
    check_dns_label
);

string_name!(
    /// A namespace name: a DNS label, as the API server stores them. A claim reference that
    /// carries one can go into a request path or a log line as it is.
    Namespace,
    "namespace",
    check_dns_label
);

string_name!(
    /// A ResourceClaim's name: a DNS subdomain (at most 253 lowercase letters, digits, '-' or
    /// '.'), as the API server stores object names.
    ClaimName,
    "claim name",
    |s| check_dns_subdomain(s, 253)
);

/// Longest claim UID accepted. Kubernetes UIDs have 36 characters; the bound keeps file names
/// that contain one well below the 255-byte limit.
pub const MAX_CLAIM_UID_LEN: usize = 128;

string_name!(
    /// A ResourceClaim's UID as the kubelet passes it. Kubernetes UIDs (36-character UUIDs)
    /// always pass; the rules — letters, digits, '_', '-', '.' and ':', starting and ending
    /// with a letter or digit, no "..", at most [`MAX_CLAIM_UID_LEN`] characters — keep a UID
    /// safe inside CDI device names and file names.
    ClaimUid,
    "claim UID",
    check_claim_uid
);

fn check_claim_uid(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > MAX_CLAIM_UID_LEN {
        return Err(format!(
            "must be no more than {MAX_CLAIM_UID_LEN} characters"
        ));
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(format!(
            "contains {c:?}; only letters, digits, '_', '-', '.' and ':' are allowed"
        ));
    }
    if !s.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !s.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("must start and end with a letter or digit".into());
    }
    if s.contains("..") {
        return Err("must not contain \"..\"".into());
    }
    Ok(())
}

fn check_pool_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    for part in s.split('/') {
        check_dns_subdomain(part, 253).map_err(|e| format!("segment {part:?} {e}"))?;
    }
    Ok(())
}

fn check_extended_resource_name(s: &str) -> Result<(), String> {
    let Some((domain, name)) = s.split_once('/') else {
        return Err("must be fully qualified as <domain>/<name>".into());
    };
    if s.contains("kubernetes.io/") {
        return Err("must not be in a kubernetes.io domain (reserved for native resources)".into());
    }
    if s.starts_with("requests.") {
        return Err("must not start with \"requests.\"".into());
    }
    if name.contains('/') {
        return Err("must contain exactly one '/'".into());
    }
    check_dns_subdomain(domain, 253).map_err(|e| format!("domain {domain:?} {e}"))?;
    check_qualified_name_part(name)?;
    // The kubelet checks "requests." + name as a qualified name, so the domain gets 9 fewer
    // characters.
    if domain.len() + "requests.".len() > 253 {
        return Err("domain must be no more than 244 characters".into());
    }
    Ok(())
}

/// A qualified attribute or capacity name: `<domain>/<id>` or a bare `<id>`.
///
/// The domain is a DNS subdomain of at most 63 characters; the id is a C identifier of at most 32
/// characters. A bare id belongs to the domain of the driver that publishes the device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QualifiedName {
    full: String,
    /// Byte index of the '/' in `full`, if the name has a domain.
    slash: Option<usize>,
}

impl QualifiedName {
    /// Maximum length of the id part.
    pub const MAX_ID_LEN: usize = 32;
    /// Maximum length of the domain part.
    pub const MAX_DOMAIN_LEN: usize = 63;

    /// Validates `value` (`domain/id` or `id`) and wraps it.
    pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
        let full = value.into();
        let err = |reason: String| NameError::new("qualified name", &full, reason);
        let slash = full.find('/');
        match slash {
            Some(i) => {
                let (domain, id) = (&full[..i], &full[i + 1..]);
                check_dns_subdomain(domain, Self::MAX_DOMAIN_LEN)
                    .map_err(|e| err(format!("domain {domain:?} {e}")))?;
                check_c_identifier(id, Self::MAX_ID_LEN)
                    .map_err(|e| err(format!("id {id:?} {e}")))?;
            }
            None => check_c_identifier(&full, Self::MAX_ID_LEN).map_err(err)?,
        }
        Ok(QualifiedName { full, slash })
    }

    /// The domain part, if the name has one.
    pub fn domain(&self) -> Option<&str> {
        self.slash.map(|i| &self.full[..i])
    }

    /// The id part (the whole name when there is no domain).
    pub fn id(&self) -> &str {
        match self.slash {
            Some(i) => &self.full[i + 1..],
            None => &self.full,
        }
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The fully qualified form: a bare id is placed in `driver`'s domain.
    pub fn qualified_in(&self, driver: &DriverName) -> QualifiedName {
        match self.slash {
            Some(_) => self.clone(),
            None => QualifiedName {
                full: format!("{}/{}", driver.as_str(), self.full),
                slash: Some(driver.as_str().len()),
            },
        }
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for QualifiedName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        QualifiedName::new(s)
    }
}

impl TryFrom<String> for QualifiedName {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, NameError> {
        QualifiedName::new(s)
    }
}

impl From<QualifiedName> for String {
    fn from(n: QualifiedName) -> String {
        n.full
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::prepare::ClaimRef;

    #[test]
    fn device_names_follow_dns_label_rules() {
        for ok in [
            "gpu-0",
            "a",
            "0",
            "x".repeat(63).as_str(),
            "gpu-0-mig-1g-5gb-0",
        ] {
            DeviceName::new(ok).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("GPU0", "start and end"),
            ("gpu_0", "'_'"),
            ("-gpu", "start and end"),
            ("gpu-", "start and end"),
            ("gpu.0", "'.'"),
            ("gpu/0", "'/'"),
            (&"x".repeat(64), "63"),
        ] {
            let err = DeviceName::new(bad).unwrap_err();
            assert_eq!(err.value, bad);
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
            assert!(err.to_string().contains("device name"));
        }
    }

    #[test]
    fn claim_references_hold_only_names_the_api_server_stores() {
        // A path traversal or a '/' would reach a request path or a file name.
        for bad in [
            "../../../api/v1/nodes/x",
            "train/status",
            "",
            "Train",
            "a_b",
        ] {
            let err = ClaimName::new(bad).unwrap_err();
            assert_eq!(err.kind, "claim name", "{bad:?}");
        }
        assert!(
            Namespace::new("a".repeat(64))
                .unwrap_err()
                .reason
                .contains("no more than 63")
        );
        assert!(
            Namespace::new("team.a").is_err(),
            "a namespace is a DNS label"
        );
        // A claim name is a subdomain: longer than a label, dots allowed.
        assert!(ClaimName::new("a".repeat(100)).is_ok());
        assert!(ClaimName::new("train.v2").is_ok());
        let err = ClaimRef::parse("uid-1", "team-a", "../x").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid claim name \"../x\": "),
            "{err}"
        );
        let claim = ClaimRef::parse("uid-1", "team-a", "train").unwrap();
        assert_eq!(claim.to_string(), "team-a/train (uid-1)");
        // The checkpoint and the kubelet's requests are read through the same rules.
        let read: Result<ClaimRef, _> =
            serde_json::from_str(r#"{"uid": "u", "namespace": "ns", "name": "a/b"}"#);
        assert!(read.is_err());
    }

    #[test]
    fn claim_uids_are_safe_in_file_and_cdi_device_names() {
        let longest = "a".repeat(MAX_CLAIM_UID_LEN);
        for ok in [
            "7f3d2c1e-0b4a-4a47-9d2e-3c6f1b2a9e10",
            "uid-1",
            "a",
            "ns:claim.1",
            longest.as_str(),
        ] {
            assert_eq!(ClaimUid::new(ok).unwrap().as_str(), ok);
        }
        let long = "a".repeat(MAX_CLAIM_UID_LEN + 1);
        for (bad, why) in [
            ("", "empty"),
            ("../x", "'/'"),
            ("a/b", "'/'"),
            ("..", "start and end"),
            ("a..b", "\"..\""),
            ("-a", "start and end"),
            ("a b", "' '"),
            ("a\0b", "'\\0'"),
            ("\u{fc}", "'\u{fc}'"),
            (long.as_str(), "128"),
        ] {
            let err = ClaimUid::new(bad).unwrap_err();
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
            assert!(err.to_string().contains("claim UID"), "{err}");
        }
        // A checkpoint or request holding a bad UID does not decode.
        assert!(serde_json::from_str::<ClaimUid>("\"a/b\"").is_err());
    }

    #[test]
    fn driver_names_are_short_dns_subdomains() {
        DriverName::new("gpu.example.com").unwrap();
        DriverName::new("kubedev").unwrap();
        assert!(DriverName::new("Gpu.example.com").is_err());
        assert!(DriverName::new("gpu..example.com").is_err());
        assert!(DriverName::new(".example.com").is_err());
        let long = format!("{}.com", "a".repeat(60));
        let err = DriverName::new(long).unwrap_err();
        assert!(err.reason.contains("63"), "{err}");
    }

    #[test]
    fn qualified_names_split_domain_and_id() {
        let q = QualifiedName::new("gpu.nvidia.com/productName").unwrap();
        assert_eq!(q.domain(), Some("gpu.nvidia.com"));
        assert_eq!(q.id(), "productName");
        let bare = QualifiedName::new("model").unwrap();
        assert_eq!(bare.domain(), None);
        assert_eq!(bare.id(), "model");
        let driver = DriverName::new("gpu.example.com").unwrap();
        assert_eq!(bare.qualified_in(&driver).as_str(), "gpu.example.com/model");
        assert_eq!(bare.qualified_in(&driver).id(), "model");
        assert_eq!(q.qualified_in(&driver), q);
    }

    #[test]
    fn qualified_names_reject_bad_parts() {
        for bad in [
            "",
            "1abc",
            "a-b",
            "dom/1abc",
            "Dom.com/abc",
            "dom.com/",
            "/abc",
            "a/b/c",
            &"a".repeat(33),
            &format!("{}/x", "a".repeat(64)),
        ] {
            let err = QualifiedName::new(bad).unwrap_err();
            assert_eq!(err.value, bad);
        }
        QualifiedName::new("_x9").unwrap();
        QualifiedName::new("a".repeat(32)).unwrap();
    }

    #[test]
    fn extended_resource_names_follow_kubelet_rules() {
        for ok in [
            "nvidia.com/gpu",
            "example.com/foo.bar_baz-1",
            "devices.kubevirt.io/kvm",
        ] {
            ExtendedResourceName::new(ok).unwrap();
        }
        for (bad, why) in [
            ("gpu", "fully qualified"),
            ("kubernetes.io/gpu", "kubernetes.io"),
            ("foo.kubernetes.io/gpu", "kubernetes.io"),
            ("requests.example.com/gpu", "requests."),
            ("example.com/", "empty"),
            ("example.com/-gpu", "start and end"),
            ("example.com/a/b", "exactly one"),
            ("Example.com/gpu", "domain"),
            ("example.com/g pu", "' '"),
        ] {
            let err = ExtendedResourceName::new(bad).unwrap_err();
            assert!(err.to_string().contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn subdomain_parts_are_limited_only_by_the_whole() {
        // Kubernetes object names (claims, nodes, classes) are DNS subdomains of at most 253
        // characters with no 63-character limit on a part between dots.
        let long = "a".repeat(100);
        check_dns_subdomain(&long, 253).unwrap();
        check_dns_subdomain(&format!("{long}.example.com"), 253).unwrap();
        let err = check_dns_subdomain(&"a".repeat(254), 253).unwrap_err();
        assert!(err.contains("253"), "{err}");
        let err = check_dns_subdomain(&format!("{long}-"), 253).unwrap_err();
        assert!(err.contains("start and end"), "{err}");
        // A label is still at most 63 characters.
        assert!(check_dns_label(&"a".repeat(64)).is_err());
    }

    #[test]
    fn pool_names_allow_slash_separated_subdomains() {
        PoolName::new("node-1").unwrap();
        PoolName::new("node-1/gpu-0").unwrap();
        assert!(PoolName::new("node-1//gpu").is_err());
        assert!(PoolName::new("Node").is_err());
    }

    #[test]
    fn names_round_trip_through_serde() {
        let n: DeviceName = serde_json::from_str("\"gpu-1\"").unwrap();
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"gpu-1\"");
        let err = serde_json::from_str::<DeviceName>("\"GPU\"").unwrap_err();
        assert!(err.to_string().contains("invalid device name"), "{err}");
        let q: QualifiedName = serde_json::from_str("\"a.b/c\"").unwrap();
        assert_eq!(q.domain(), Some("a.b"));
    }
}
