//! Typed device attributes, as DRA publishes them in ResourceSlices.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::version::{Version, VersionError};

/// Why a value cannot be a device attribute. Every variant names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttributeError {
    /// A string value longer than [`AttributeValue::MAX_LENGTH`] bytes.
    #[error(
        "attribute string {value:?} is {length} bytes long; at most {max} are allowed",
        max = AttributeValue::MAX_LENGTH
    )]
    StringTooLong {
        /// The rejected value.
        value: String,
        /// Its length in bytes.
        length: usize,
    },
    /// A version value longer than [`AttributeValue::MAX_LENGTH`] bytes.
    #[error(
        "attribute version {value:?} is {length} bytes long; at most {max} are allowed",
        max = AttributeValue::MAX_LENGTH
    )]
    VersionTooLong {
        /// The rejected value.
        value: String,
        /// Its length in bytes.
        length: usize,
    },
    /// A version value that is not a semantic version.
    #[error(transparent)]
    Version(#[from] VersionError),
}

/// The value of one DRA device attribute: exactly one of an integer, a boolean, a string or a
/// semantic version, as Kubernetes' `DeviceAttribute`.
///
/// Strings and version strings are at most [`MAX_LENGTH`](Self::MAX_LENGTH) bytes (Kubernetes
/// counts bytes, not characters). The checking constructors [`string`](Self::string) and
/// [`version`](Self::version), and deserialisation, enforce that; a value built directly from
/// a variant can be checked with [`validate`](Self::validate).
///
/// In JSON it has Kubernetes' shape: `{"int": 5}`, `{"bool": true}`, `{"string": "x"}`,
/// `{"version": "1.2.3"}`.
///
/// ```
/// use kubedev_core::AttributeValue;
///
/// let model = AttributeValue::string("A100-SXM4-40GB")?;
/// assert_eq!(serde_json::to_string(&model)?, r#"{"string":"A100-SXM4-40GB"}"#);
/// let driver: AttributeValue = serde_json::from_str(r#"{"version": "550.54.15"}"#)?;
/// assert_eq!(driver.as_version().map(|v| v.major()), Some(550));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttributeValue {
    /// An integer (`{"int": 5}`).
    Int(i64),
    /// A boolean (`{"bool": true}`).
    Bool(bool),
    /// A string of at most 64 bytes (`{"string": "x"}`).
    String(String),
    /// A semantic version of at most 64 bytes (`{"version": "1.2.3"}`).
    Version(Version),
}

impl AttributeValue {
    /// The longest string or version value, in bytes (Kubernetes'
    /// `DeviceAttributeMaxValueLength`).
    pub const MAX_LENGTH: usize = 64;

    /// A string attribute, checking its length.
    pub fn string(value: impl Into<String>) -> Result<AttributeValue, AttributeError> {
        let value = value.into();
        check_string(&value)?;
        Ok(AttributeValue::String(value))
    }

    /// A version attribute, checking the grammar and the length.
    pub fn version(value: &str) -> Result<AttributeValue, AttributeError> {
        check_version_length(value)?;
        Ok(AttributeValue::Version(Version::parse(value)?))
    }

    /// Checks the length limits of a value built directly from a variant.
    pub fn validate(&self) -> Result<(), AttributeError> {
        match self {
            AttributeValue::String(value) => check_string(value),
            AttributeValue::Version(version) => check_version_length(version.as_str()),
            AttributeValue::Int(_) | AttributeValue::Bool(_) => Ok(()),
        }
    }

    /// The JSON field name of the value's type: `"int"`, `"bool"`, `"string"` or `"version"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            AttributeValue::Int(_) => "int",
            AttributeValue::Bool(_) => "bool",
            AttributeValue::String(_) => "string",
            AttributeValue::Version(_) => "version",
        }
    }

    /// The integer, if this is an integer attribute.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            AttributeValue::Int(value) => Some(*value),
            _ => None,
        }
    }

    /// The boolean, if this is a boolean attribute.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            AttributeValue::Bool(value) => Some(*value),
            _ => None,
        }
    }

    /// The string, if this is a string attribute.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttributeValue::String(value) => Some(value),
            _ => None,
        }
    }

    /// The version, if this is a version attribute.
    pub fn as_version(&self) -> Option<&Version> {
        match self {
            AttributeValue::Version(value) => Some(value),
            _ => None,
        }
    }
}

fn check_string(value: &str) -> Result<(), AttributeError> {
    if value.len() > AttributeValue::MAX_LENGTH {
        return Err(AttributeError::StringTooLong {
            value: value.to_owned(),
            length: value.len(),
        });
    }
    Ok(())
}

fn check_version_length(value: &str) -> Result<(), AttributeError> {
    if value.len() > AttributeValue::MAX_LENGTH {
        return Err(AttributeError::VersionTooLong {
            value: value.to_owned(),
            length: value.len(),
        });
    }
    Ok(())
}

impl fmt::Display for AttributeValue {
    /// Integers, booleans and versions as written; strings quoted, so `"1.2.3"` (a string) and
    /// `1.2.3` (a version) read differently.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeValue::Int(value) => write!(f, "{value}"),
            AttributeValue::Bool(value) => write!(f, "{value}"),
            AttributeValue::String(value) => write!(f, "{value:?}"),
            AttributeValue::Version(value) => write!(f, "{value}"),
        }
    }
}

impl From<i64> for AttributeValue {
    fn from(value: i64) -> Self {
        AttributeValue::Int(value)
    }
}

impl From<bool> for AttributeValue {
    fn from(value: bool) -> Self {
        AttributeValue::Bool(value)
    }
}

impl From<Version> for AttributeValue {
    /// A version attribute. The 64-byte limit is not checked here; see
    /// [`validate`](AttributeValue::validate).
    fn from(value: Version) -> Self {
        AttributeValue::Version(value)
    }
}

impl Serialize for AttributeValue {
    /// An object with the one field that is set, as Kubernetes writes it.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            AttributeValue::Int(value) => map.serialize_entry("int", value)?,
            AttributeValue::Bool(value) => map.serialize_entry("bool", value)?,
            AttributeValue::String(value) => map.serialize_entry("string", value)?,
            AttributeValue::Version(value) => map.serialize_entry("version", value)?,
        }
        map.end()
    }
}

const FIELDS: &[&str] = &["int", "bool", "string", "version"];

impl<'de> Deserialize<'de> for AttributeValue {
    /// Reads Kubernetes' object shape. Exactly one field must be set (a `null` field counts as
    /// unset, as in Kubernetes); an unknown field, a repeated field, a string or version over
    /// 64 bytes, or an invalid version is an error that names the problem.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(AttributeVisitor)
    }
}

struct AttributeVisitor;

impl<'de> Visitor<'de> for AttributeVisitor {
    type Value = AttributeValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a device attribute object with exactly one of \"int\", \"bool\", \"string\" or \
             \"version\"",
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AttributeValue, A::Error> {
        let mut seen: Vec<&'static str> = Vec::new();
        let mut values: Vec<AttributeValue> = Vec::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let Some(field) = FIELDS.iter().copied().find(|f| *f == key) else {
                return Err(de::Error::unknown_field(&key, FIELDS));
            };
            if seen.contains(&field) {
                return Err(de::Error::duplicate_field(field));
            }
            seen.push(field);
            let value = match field {
                "int" => map.next_value::<Option<i64>>()?.map(AttributeValue::Int),
                "bool" => map.next_value::<Option<bool>>()?.map(AttributeValue::Bool),
                "string" => match map.next_value::<Option<String>>()? {
                    Some(value) => Some(AttributeValue::string(value).map_err(de::Error::custom)?),
                    None => None,
                },
                _ => match map.next_value::<Option<String>>()? {
                    Some(value) => {
                        Some(AttributeValue::version(&value).map_err(de::Error::custom)?)
                    }
                    None => None,
                },
            };
            values.extend(value);
        }
        let mut values = values.into_iter();
        match (values.next(), values.next()) {
            (Some(value), None) => Ok(value),
            (None, _) => Err(de::Error::custom(
                "device attribute has no value: exactly one of int, bool, string or version \
                 must be set",
            )),
            (Some(first), Some(second)) => Err(de::Error::custom(format_args!(
                "device attribute sets both {} and {}: exactly one value must be set",
                first.type_name(),
                second.type_name()
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn from_json(json: &str) -> Result<AttributeValue, String> {
        serde_json::from_str(json).map_err(|e| crate::echo::chain(&e))
    }

    #[test]
    fn json_round_trips_in_the_kubernetes_shape() {
        for (value, json) in [
            (AttributeValue::Int(5), r#"{"int":5}"#),
            (
                AttributeValue::Int(i64::MIN),
                r#"{"int":-9223372036854775808}"#,
            ),
            (AttributeValue::Bool(true), r#"{"bool":true}"#),
            (AttributeValue::string("x").unwrap(), r#"{"string":"x"}"#),
            (AttributeValue::string("").unwrap(), r#"{"string":""}"#),
            (
                AttributeValue::version("1.2.3").unwrap(),
                r#"{"version":"1.2.3"}"#,
            ),
            (
                AttributeValue::version("1.0.0-rc.1+b.5").unwrap(),
                r#"{"version":"1.0.0-rc.1+b.5"}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&value).unwrap(), json);
            assert_eq!(from_json(json).unwrap(), value);
        }
        // A null field is unset, as in Kubernetes.
        assert_eq!(
            from_json(r#"{"int": null, "bool": false}"#).unwrap(),
            AttributeValue::Bool(false)
        );
    }

    #[test]
    fn json_rejections_name_the_problem() {
        let long = "x".repeat(65);
        for (json, needle) in [
            ("{}", "no value"),
            (r#"{"int": null}"#, "no value"),
            (r#"{"int": 1, "string": "x"}"#, "both int and string"),
            (
                r#"{"version": "1.0.0", "bool": true}"#,
                "both version and bool",
            ),
            (r#"{"int": 1, "int": 2}"#, "duplicate field `int`"),
            (r#"{"strings": ["a"]}"#, "unknown field `strings`"),
            (r#"{"int": 1.5}"#, "1.5"),
            (r#"{"int": "5"}"#, "\"5\""),
            (r#"{"bool": "true"}"#, "\"true\""),
            (r#"{"version": "1.2"}"#, "\"1.2\""),
            (r#"{"version": "v1.2.3"}"#, "\"v1.2.3\""),
            (&format!(r#"{{"string": "{long}"}}"#), "65 bytes"),
            (
                &format!(r#"{{"version": "1.0.0-{}"}}"#, "a".repeat(59)),
                "65 bytes",
            ),
            ("5", "device attribute object"),
            ("null", "device attribute object"),
        ] {
            let err = from_json(json).expect_err(json);
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn limits_count_bytes() {
        let ascii = "a".repeat(64);
        assert!(AttributeValue::string(ascii.clone()).is_ok());
        assert!(AttributeValue::string(format!("{ascii}b")).is_err());
        // 32 two-byte characters fit; 33 do not, although they are only 33 characters.
        assert!(AttributeValue::string("é".repeat(32)).is_ok());
        let err = AttributeValue::string("é".repeat(33)).unwrap_err();
        assert_eq!(
            err,
            AttributeError::StringTooLong {
                value: "é".repeat(33),
                length: 66
            }
        );
        assert!(err.to_string().contains("66 bytes"));
        let version = format!("1.0.0-{}", "a".repeat(58));
        assert_eq!(version.len(), 64);
        assert!(AttributeValue::version(&version).is_ok());
        let too_long = format!("{version}b");
        assert!(matches!(
            AttributeValue::version(&too_long),
            Err(AttributeError::VersionTooLong { length: 65, .. })
        ));
        let err = AttributeValue::version("1.02.3").unwrap_err();
        assert!(matches!(err, AttributeError::Version(_)));
        assert!(err.to_string().contains("\"1.02.3\""), "{err}");
    }

    #[test]
    fn validate_checks_directly_built_values() {
        assert!(AttributeValue::String("x".repeat(65)).validate().is_err());
        assert!(AttributeValue::String("x".repeat(64)).validate().is_ok());
        let long = Version::parse(&format!("1.0.0+{}", "b".repeat(60))).unwrap();
        assert!(AttributeValue::from(long).validate().is_err());
        assert!(AttributeValue::Int(-1).validate().is_ok());
        assert!(AttributeValue::from(true).validate().is_ok());
    }

    #[test]
    fn display_and_accessors() {
        let version = AttributeValue::version("1.2.3").unwrap();
        let string = AttributeValue::string("1.2.3").unwrap();
        assert_eq!(version.to_string(), "1.2.3");
        assert_eq!(string.to_string(), "\"1.2.3\"");
        assert_eq!(AttributeValue::from(-7).to_string(), "-7");
        assert_eq!(AttributeValue::from(false).to_string(), "false");
        assert_ne!(version, string);
        assert_eq!(string.as_str(), Some("1.2.3"));
        assert_eq!(version.as_str(), None);
        assert_eq!(version.as_version().map(Version::minor), Some(2));
        assert_eq!(AttributeValue::Int(3).as_int(), Some(3));
        assert_eq!(AttributeValue::Bool(true).as_bool(), Some(true));
        assert_eq!(AttributeValue::Bool(true).as_int(), None);
        assert_eq!(version.type_name(), "version");
        // Version equality is exact, as Kubernetes' matchAttribute compares version strings.
        assert_ne!(
            AttributeValue::version("1.0.0+a").unwrap(),
            AttributeValue::version("1.0.0+b").unwrap()
        );
    }
}
