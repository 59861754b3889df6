//! Opaque configuration for this driver, as a claim's allocation carries it to the driver
//! (`status.allocation.devices.config[]` entries whose `opaque.driver` is this driver), and
//! decoding it into a backend's own type with errors that name the entry and the field.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Where an opaque configuration entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConfigSource {
    /// From the DeviceClass (set by an administrator); `FromClass` in the API.
    #[serde(rename = "FromClass")]
    Class,
    /// From the ResourceClaim (set by the user); `FromClaim` in the API.
    #[serde(rename = "FromClaim")]
    Claim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigSource::Class => "the device class",
            ConfigSource::Claim => "the claim",
        })
    }
}

/// One opaque configuration entry that applies to an allocated device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeviceConfig {
    /// Class or claim.
    pub source: ConfigSource,
    /// Its position in the allocation's `status.allocation.devices.config` list, so an error
    /// can point at it.
    pub index: usize,
    /// The driver-defined parameters (`opaque.parameters`), a JSON value.
    pub parameters: serde_json::Value,
}

impl DeviceConfig {
    /// Entry `index` of the allocation's configuration list, from `source`.
    pub fn new(source: ConfigSource, index: usize, parameters: serde_json::Value) -> Self {
        DeviceConfig {
            source,
            index,
            parameters,
        }
    }

    /// Where the entry is, for messages: `config[2] (from the claim)`; `config (from the
    /// claim)` for an entry read from an old checkpoint, whose position is unknown.
    pub fn location(&self) -> String {
        if self.index == usize::MAX {
            format!("config (from {})", self.source)
        } else {
            format!("config[{}] (from {})", self.index, self.source)
        }
    }
}

/// Checkpoints written before entries carried their source and position hold the bare
/// parameters; those read back as claim entries numbered in order.
impl<'de> Deserialize<'de> for DeviceConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Tagged {
            source: ConfigSource,
            index: usize,
            parameters: serde_json::Value,
        }
        let value = serde_json::Value::deserialize(d)?;
        match serde_json::from_value::<Tagged>(value.clone()) {
            Ok(t) => Ok(DeviceConfig::new(t.source, t.index, t.parameters)),
            Err(_) => Ok(DeviceConfig::new(ConfigSource::Claim, usize::MAX, value)),
        }
    }
}

/// A configuration type a backend accepts, checked beyond what decoding checks.
pub trait ValidateConfig {
    /// Says what is wrong, naming the field (`sharing.mpsConfig.defaultActiveThreadPercentage:
    /// must be from 1 to 100, got 150`).
    fn validate(&self) -> Result<(), String>;
}

/// Why a configuration entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The entry, e.g. `config[2] (from the claim)`.
    pub location: String,
    /// What is wrong, naming the field.
    pub message: String,
}

impl ConfigError {
    /// `message` about the entry at `location`.
    pub fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            location: location.into(),
            message: message.into(),
        }
    }
}

/// Decodes every entry of `configs` as a `T` (unknown fields are errors, as upstream drivers'
/// strict decoders have them) and validates it, then returns the one that applies: the last,
/// since `configs` is in order of precedence (class entries first, then the claim's, each in
/// list order). `None` when there is no entry.
///
/// Entries meant for another of this driver's types are told apart by the caller: `accepts`
/// says whether an entry is a `T` at all (e.g. by its `kind`); entries it refuses are skipped.
pub fn effective_config<T: DeserializeOwned + ValidateConfig>(
    configs: &[DeviceConfig],
    accepts: impl Fn(&serde_json::Value) -> bool,
) -> Result<Option<T>, ConfigError> {
    let mut chosen = None;
    for entry in configs.iter().filter(|c| accepts(&c.parameters)) {
        let location = entry.location();
        let value: T = serde_path_to_error::deserialize(&entry.parameters).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ConfigError {
                location: location.clone(),
                message: if path == "." {
                    inner
                } else {
                    format!("{path}: {inner}")
                },
            }
        })?;
        value
            .validate()
            .map_err(|message| ConfigError { location, message })?;
        chosen = Some(value);
    }
    Ok(chosen)
}

/// The `kind` of a configuration object (`{"apiVersion": …, "kind": "GpuConfig", …}`).
pub fn config_kind(parameters: &serde_json::Value) -> Option<&str> {
    parameters.get("kind").and_then(|k| k.as_str())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Cfg {
        kind: String,
        #[serde(default)]
        inner: Inner,
    }
    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Inner {
        #[serde(default)]
        percent: u32,
    }
    impl ValidateConfig for Cfg {
        fn validate(&self) -> Result<(), String> {
            if self.inner.percent > 100 {
                return Err(format!(
                    "inner.percent: must be at most 100, got {}",
                    self.inner.percent
                ));
            }
            Ok(())
        }
    }

    fn is_cfg(v: &serde_json::Value) -> bool {
        config_kind(v) == Some("Cfg")
    }

    #[test]
    fn the_last_entry_applies_and_every_entry_is_checked() {
        let configs = vec![
            DeviceConfig::new(
                ConfigSource::Class,
                0,
                json!({"kind": "Cfg", "inner": {"percent": 10}}),
            ),
            DeviceConfig::new(ConfigSource::Claim, 1, json!({"kind": "Other", "x": 1})),
            DeviceConfig::new(
                ConfigSource::Claim,
                2,
                json!({"kind": "Cfg", "inner": {"percent": 20}}),
            ),
        ];
        let got: Cfg = effective_config(&configs, is_cfg).unwrap().unwrap();
        assert_eq!(got.inner.percent, 20);

        let mut bad = configs.clone();
        bad[0].parameters = json!({"kind": "Cfg", "inner": {"percent": 200}});
        let e = effective_config::<Cfg>(&bad, is_cfg).unwrap_err();
        assert_eq!(
            crate::echo::chain(&e),
            "config[0] (from the device class): inner.percent: must be at most 100, got 200"
        );
        assert!(
            effective_config::<Cfg>(&[], is_cfg).unwrap().is_none(),
            "no entry, no configuration"
        );
    }

    #[test]
    fn decoding_errors_name_the_field() {
        let one = |v| vec![DeviceConfig::new(ConfigSource::Claim, 3, v)];
        let e = effective_config::<Cfg>(
            &one(json!({"kind": "Cfg", "inner": {"percent": "lots"}})),
            is_cfg,
        )
        .unwrap_err();
        assert!(
            crate::echo::chain(&e)
                .starts_with("config[3] (from the claim): inner.percent: invalid type"),
            "{e}"
        );
        let e =
            effective_config::<Cfg>(&one(json!({"kind": "Cfg", "inenr": {}})), is_cfg).unwrap_err();
        assert!(e.to_string().contains("unknown field `inenr`"), "{e}");
    }

    #[test]
    fn entries_read_back_from_old_checkpoints() {
        let new = DeviceConfig::new(ConfigSource::Class, 4, json!({"kind": "Cfg"}));
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(
            serde_json::from_str::<DeviceConfig>(&text).unwrap(),
            new,
            "round trip"
        );
        let legacy: DeviceConfig = serde_json::from_str(r#"{"kind":"Cfg"}"#).unwrap();
        assert_eq!(legacy.source, ConfigSource::Claim);
        assert_eq!(legacy.parameters, json!({"kind": "Cfg"}));
        let e = effective_config::<Cfg>(
            &[DeviceConfig {
                parameters: json!({"kind": "Cfg", "inner": {"percent": 101}}),
                ..legacy
            }],
            is_cfg,
        )
        .unwrap_err();
        assert!(
            crate::echo::chain(&e).starts_with("config (from the claim): "),
            "{e}"
        );
    }
}
