//! The daemon's configuration file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubedev_core::static_backend::StaticConfig;
use kubedev_core::{AttributeMatch, AttributeValue, ExtendedResourceName, QualifiedName};
use serde::{Deserialize, Serialize};

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is not valid YAML for the schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line and field.
        message: String,
    },
    /// A value is well-formed but not acceptable.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, e.g. `devicePlugin.resources[1].name`.
        field: String,
        /// What was expected.
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// The node's name (default: the `NODE_NAME` environment variable).
    #[serde(default)]
    pub node_name: Option<String>,
    /// Device-plugin mode.
    #[serde(default)]
    pub device_plugin: DevicePluginSection,
    /// The backends and their options.
    #[serde(default)]
    pub backends: Backends,
}

/// Device-plugin mode settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicePluginSection {
    /// Whether device-plugin mode runs (default true when resources are configured).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The kubelet's device-plugin directory.
    #[serde(default = "default_dp_dir")]
    pub directory: PathBuf,
    /// The kubelet's registration socket (default `<directory>/kubelet.sock`).
    #[serde(default)]
    pub kubelet_socket: Option<PathBuf>,
    /// The extended resources to serve.
    #[serde(default)]
    pub resources: Vec<ResourceConfig>,
}

fn yes() -> bool {
    true
}

fn default_dp_dir() -> PathBuf {
    PathBuf::from(kubedev_kubelet_grpc::device_plugin::DEFAULT_PLUGIN_DIR)
}

impl Default for DevicePluginSection {
    fn default() -> Self {
        DevicePluginSection {
            enabled: true,
            directory: default_dp_dir(),
            kubelet_socket: None,
            resources: Vec::new(),
        }
    }
}

/// One extended resource and the devices it takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceConfig {
    /// The extended resource name, e.g. `example.com/gpu`.
    pub name: String,
    /// Which devices of the inventory belong to it (all when absent).
    #[serde(default)]
    pub selector: Selector,
}

/// A device selector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    /// Attribute name → required typed value; all must match.
    #[serde(default)]
    pub attributes: BTreeMap<QualifiedName, AttributeValue>,
}

/// Backend options; a backend runs when its section is present.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Backends {
    /// The `static` example backend.
    #[serde(default, rename = "static")]
    pub static_devices: Option<StaticConfig>,
}

/// A validated device-plugin resource.
#[derive(Debug, Clone)]
pub struct ResourceSpec {
    /// The name.
    pub name: ExtendedResourceName,
    /// The filter.
    pub filter: AttributeMatch,
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            message,
        };
        self.resources(path)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, r) in self.device_plugin.resources.iter().enumerate() {
            if !names.insert(r.name.as_str()) {
                return Err(invalid(
                    format!("devicePlugin.resources[{i}].name"),
                    format!("{:?} is configured twice", r.name),
                ));
            }
        }
        if self.device_plugin.enabled
            && !self.device_plugin.resources.is_empty()
            && self.backends == Backends::default()
        {
            return Err(invalid(
                "backends".into(),
                "no backend is configured, so the resources would have no devices".into(),
            ));
        }
        Ok(())
    }

    /// The device-plugin resources, validated.
    pub fn resources(&self, path: &Path) -> Result<Vec<ResourceSpec>, ConfigError> {
        self.device_plugin
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let name = ExtendedResourceName::new(r.name.clone()).map_err(|e| {
                    ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field: format!("devicePlugin.resources[{i}].name"),
                        message: e.to_string(),
                    }
                })?;
                Ok(ResourceSpec {
                    name,
                    filter: AttributeMatch {
                        attributes: r.selector.attributes.clone(),
                    },
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
devicePlugin:
  directory: /tmp/dp
  resources:
    - name: example.com/dev
      selector:
        attributes:
          model: {string: x1}
backends:
  static:
    pool: node-a
    devices:
      - name: dev-0
        attributes: {model: {string: x1}}
"#;

    #[test]
    fn parses_a_complete_config() {
        let c = Config::parse(GOOD, Path::new("c.yaml")).unwrap();
        assert_eq!(c.device_plugin.directory, PathBuf::from("/tmp/dp"));
        let r = c.resources(Path::new("c.yaml")).unwrap();
        assert_eq!(r[0].name.as_str(), "example.com/dev");
        assert_eq!(c.backends.static_devices.unwrap().devices.len(), 1);
    }

    #[test]
    fn errors_name_the_field_and_line() {
        let bad = GOOD.replace("example.com/dev", "dev");
        let err = Config::parse(&bad, Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("devicePlugin.resources[0].name"), "{err}");
        assert!(err.contains("fully qualified"), "{err}");

        let bad = GOOD.replace("directory:", "dirctory:");
        let err = Config::parse(&bad, Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("dirctory"), "{err}");
        assert!(err.contains("line 3") || err.contains("3:"), "{err}");

        let bad = GOOD.replace("name: dev-0", "name: Dev_0");
        let err = Config::parse(&bad, Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("Dev_0"), "{err}");
    }

    #[test]
    fn duplicate_resources_are_rejected() {
        let bad = GOOD.replace("backends:", "    - name: example.com/dev\nbackends:");
        let err = Config::parse(&bad, Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("configured twice"), "{err}");
    }
}
