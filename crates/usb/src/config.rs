//! Configuration of the USB backend.

use kubedev_core::factory::InvalidValue;
use std::fmt;
use std::str::FromStr;

use kubedev_core::ExtendedResourceName;
use serde::{Deserialize, Serialize};

use crate::error::UsbError;

/// Configuration of the USB backend: which groups of USB devices are offered under which name.
///
/// ```yaml
/// resources:
///   - name: example.com/yubikey          # one YubiKey per instance
///     selectors: ["1050:0407"]
///   - name: example.com/token-and-serial # a YubiKey together with an FTDI adapter
///     selectors: ["1050:0407", "0403:6001"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsbConfig {
    /// The resources, in order of precedence: an earlier resource takes its devices first.
    #[serde(default)]
    pub resources: Vec<UsbResource>,
    /// Seconds between presence checks when no inotify event arrives (a safety net for missed
    /// events and for hosts without inotify); default 30, at least 1.
    #[serde(default = "default_resync_seconds")]
    pub resync_seconds: u64,
}

impl Default for UsbConfig {
    fn default() -> Self {
        UsbConfig {
            resources: Vec::new(),
            resync_seconds: default_resync_seconds(),
        }
    }
}

fn default_resync_seconds() -> u64 {
    30
}

/// One resource: a group of USB devices that are handed out together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsbResource {
    /// The resource name, e.g. `example.com/yubikey-pair`; also the device-plugin extended
    /// resource name and the source of the env variable name.
    pub name: ExtendedResourceName,
    /// The devices one instance needs: every selector takes one device, so
    /// `["1050:0407", "1050:0407"]` needs two YubiKeys.
    pub selectors: Vec<UsbSelector>,
}

impl UsbResource {
    /// The env variable that lists an instance's `bus:dev` pairs: `USB_RESOURCE_` followed by
    /// the resource name upper-cased, with `/` and `.` replaced by `_`
    /// (`example.com/yubikey` → `USB_RESOURCE_EXAMPLE_COM_YUBIKEY`).
    pub fn env_name(&self) -> String {
        let name: String = self
            .name
            .as_str()
            .chars()
            .map(|c| match c {
                '/' | '.' => '_',
                c => c.to_ascii_uppercase(),
            })
            .collect();
        format!("USB_RESOURCE_{name}")
    }

    /// The prefix of this resource's device names: the part of the name after `/`, lower-cased,
    /// every character other than `a-z`, `0-9` and `-` replaced by `-`, at most 40 characters.
    pub fn device_prefix(&self) -> String {
        let short = self
            .name
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or(self.name.as_str());
        let mapped: String = short
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_lowercase() || c.is_ascii_digit() {
                    c
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        mapped.trim_matches('-').to_string()
    }
}

/// A `vendor:product` pair of USB IDs, written as four hex digits each (`1050:0407`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UsbSelector {
    /// `idVendor`.
    pub vendor: u16,
    /// `idProduct`.
    pub product: u16,
}

impl UsbSelector {
    /// True when a device with these IDs matches.
    pub fn matches(&self, vendor: u16, product: u16) -> bool {
        self.vendor == vendor && self.product == product
    }
}

impl fmt::Display for UsbSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:04x}", self.vendor, self.product)
    }
}

impl FromStr for UsbSelector {
    type Err = UsbError;

    fn from_str(s: &str) -> Result<Self, UsbError> {
        let bad = |reason: &str| {
            UsbError::Config(InvalidValue {
                field: "selectors".into(),
                value: s.to_string(),
                reason: reason.into(),
            })
        };
        let (v, p) = s
            .split_once(':')
            .ok_or_else(|| bad("expected vendor:product, e.g. 1050:0407"))?;
        let hex = |x: &str| {
            if x.is_empty() || x.len() > 4 || !x.bytes().all(|b| b.is_ascii_hexdigit()) {
                None
            } else {
                u16::from_str_radix(x, 16).ok()
            }
        };
        match (hex(v), hex(p)) {
            (Some(vendor), Some(product)) => Ok(UsbSelector { vendor, product }),
            _ => Err(bad("vendor and product must be 1 to 4 hex digits each")),
        }
    }
}

impl TryFrom<String> for UsbSelector {
    type Error = UsbError;
    fn try_from(s: String) -> Result<Self, UsbError> {
        s.parse()
    }
}

impl From<UsbSelector> for String {
    fn from(s: UsbSelector) -> String {
        s.to_string()
    }
}

impl UsbConfig {
    /// Checks what serde cannot: every resource has selectors, names and device-name prefixes
    /// are unique. Errors name the field and the value.
    pub fn validate(&self) -> Result<(), UsbError> {
        if self.resync_seconds == 0 {
            return Err(UsbError::Config(InvalidValue {
                field: "resyncSeconds".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            }));
        }
        for (i, r) in self.resources.iter().enumerate() {
            let field = |f: &str| format!("resources[{i}].{f}");
            if r.selectors.is_empty() {
                return Err(UsbError::Config(InvalidValue {
                    field: field("selectors"),
                    value: "[]".into(),
                    reason: format!("resource {} needs at least one selector", r.name),
                }));
            }
            let prefix = r.device_prefix();
            if prefix.is_empty() {
                return Err(UsbError::Config(InvalidValue {
                    field: field("name"),
                    value: r.name.to_string(),
                    reason: "the part after '/' must contain a letter or digit".into(),
                }));
            }
            for (j, other) in self.resources[..i].iter().enumerate() {
                if other.name == r.name {
                    return Err(UsbError::Config(InvalidValue {
                        field: field("name"),
                        value: r.name.to_string(),
                        reason: format!("also used by resources[{j}]"),
                    }));
                }
                let theirs = other.device_prefix();
                if theirs == prefix
                    || prefix.starts_with(&format!("{theirs}-"))
                    || theirs.starts_with(&format!("{prefix}-"))
                {
                    return Err(UsbError::Config(InvalidValue {
                        field: field("name"),
                        value: r.name.to_string(),
                        reason: format!(
                            "its device names (\"{prefix}-<port>\") could clash with those of \
                             resources[{j}] ({}, \"{theirs}-<port>\"); choose distinct names \
                             after '/', neither extending the other with '-'",
                            other.name
                        ),
                    }));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_and_print_as_hex_pairs() {
        let s: UsbSelector = "1050:407".parse().unwrap();
        assert_eq!((s.vendor, s.product), (0x1050, 0x0407));
        assert_eq!(s.to_string(), "1050:0407");
        for bad in [
            "1050",
            "1050:",
            "xyz1:0001",
            "12345:0001",
            ":0001",
            "1050:0407:1",
        ] {
            let err = bad.parse::<UsbSelector>().unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn config_parses_camel_case_and_rejects_unknown_fields() {
        let c: UsbConfig = serde_json::from_value(serde_json::json!({
            "resources": [{"name": "example.com/yubikey-pair", "selectors": ["1050:0407", "1050:0407"]}],
            "resyncSeconds": 5
        }))
        .unwrap();
        assert_eq!(c.resources[0].selectors.len(), 2);
        assert_eq!(c.resync_seconds, 5);
        let err =
            serde_json::from_value::<UsbConfig>(serde_json::json!({"resource": []})).unwrap_err();
        assert!(err.to_string().contains("resource"), "{err}");
        let err = serde_json::from_value::<UsbConfig>(serde_json::json!({
            "resources": [{"name": "example.com/x", "selectors": ["10500407"]}]
        }))
        .unwrap_err();
        assert!(err.to_string().contains("10500407"), "{err}");
    }

    #[test]
    fn env_and_prefix_follow_the_resource_name() {
        let r = UsbResource {
            name: ExtendedResourceName::new("example.com/Yubikey.Pair_2").unwrap(),
            selectors: vec![],
        };
        assert_eq!(r.env_name(), "USB_RESOURCE_EXAMPLE_COM_YUBIKEY_PAIR_2");
        assert_eq!(r.device_prefix(), "yubikey-pair-2");
    }

    #[test]
    fn validation_names_the_bad_field() {
        let res = |name: &str, sel: &[&str]| UsbResource {
            name: ExtendedResourceName::new(name).unwrap(),
            selectors: sel.iter().map(|s| s.parse().unwrap()).collect(),
        };
        let mut c = UsbConfig {
            resources: vec![
                res("example.com/key", &["1050:0407"]),
                res("other.io/key", &["1050:0407"]),
            ],
            ..UsbConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("resources[1].name") && err.contains("other.io/key"),
            "{err}"
        );
        c.resources[1] = res("example.com/key-1", &["1050:0407"]);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("resources[1].name") && err.contains("key-1"),
            "{err}"
        );
        c.resources[1] = res("example.com/empty", &[]);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("resources[1].selectors"), "{err}");
        c.resources.pop();
        assert!(c.validate().is_ok());
        c.resync_seconds = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("resyncSeconds")
        );
    }
}
