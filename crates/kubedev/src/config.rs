//! The daemon's configuration file.
//!
//! The file's sections are in `config/dra.rs` (DRA mode) and `config/device_plugin.rs`
//! (device-plugin mode, its resources and selectors); `config/checks.rs` runs the checks that
//! read beyond the file, and `config/lines.rs` finds the line of each field for errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::registry::Registry;

mod checks;
mod device_plugin;
mod dra;
mod lines;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

#[cfg(feature = "wasm")]
pub(crate) use checks::{PolicyModule, policy_module};
pub use device_plugin::{
    DevicePluginSection, MAX_REPLICAS, ResourceConfig, ResourceSpec, Selector,
};
pub use dra::{DeviceClassConfig, DraSection, DraSpec, SliceRequests, UnhealthyDevicesConfig};

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
        /// What is wrong, starting with the line (`line N: ...`).
        message: String,
    },
    /// A value is well-formed but not acceptable.
    #[error("{path}: {}{field}: {message}", at_line(*.line))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line of the field, or of the section around it when the file leaves the field
        /// out; `None` when the file is not at hand.
        line: Option<usize>,
        /// The field, e.g. `devicePlugin.resources[1].name`.
        field: String,
        /// What was expected.
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

impl ConfigError {
    /// The error [`ConfigError::Invalid`] of `field` in the file at `path`, its line not known
    /// yet.
    fn invalid(path: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// This error with the line of its field in `text`, the file's content.
    fn locate(self, text: &str) -> Self {
        match self {
            ConfigError::Invalid {
                path,
                line: None,
                field,
                message,
            } => ConfigError::Invalid {
                line: lines::FieldLines::new(text).line_or_cause(&field),
                path,
                field,
                message,
            },
            other => other,
        }
    }
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
    /// DRA mode.
    #[serde(default)]
    pub dra: DraSection,
    /// The backends and their options: each key names a registered backend kind (see
    /// [`Registry`]), its value is that backend's section; a backend runs when its section is
    /// present.
    #[serde(default)]
    pub backends: BTreeMap<String, serde_json::Value>,
    /// Where the host's `/` is seen (`/` on the host, `/host` or `/proc/1/root` in a container):
    /// backends read sysfs and `/dev` beneath it.
    #[serde(default = "default_host_root")]
    pub host_root: PathBuf,
    /// Where backends keep their own records (one subdirectory per backend), e.g. the original
    /// driver of a PCI function rebound to vfio-pci.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The HTTP endpoint for metrics and probes.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// The backend kinds the sections were checked against, and that build the backends.
    #[serde(skip)]
    pub registry: Registry,
}

/// Where metrics and probes are served, and where pod and container labels come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsSection {
    /// `host:port` serving `/metrics`, `/healthz` and `/readyz` (none when absent), e.g.
    /// `0.0.0.0:9464`.
    #[serde(default)]
    pub address: Option<String>,
    /// The kubelet's pod resources socket, read for the pod, namespace and container labels of
    /// held devices (skipped while it does not exist).
    #[serde(default = "default_pod_resources")]
    pub pod_resources_socket: PathBuf,
    /// How often the pod resources socket is read, in seconds.
    #[serde(default = "default_pod_resources_interval")]
    pub pod_resources_interval_seconds: u64,
}

fn default_pod_resources() -> PathBuf {
    PathBuf::from(kubedev_kubelet_grpc::pod_resources::DEFAULT_SOCKET)
}

fn default_pod_resources_interval() -> u64 {
    15
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            address: None,
            pod_resources_socket: default_pod_resources(),
            pod_resources_interval_seconds: default_pod_resources_interval(),
        }
    }
}

fn default_host_root() -> PathBuf {
    PathBuf::from("/")
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/kubedev")
}

fn default_cdi_dir() -> PathBuf {
    PathBuf::from(crate::cdi::DEFAULT_CDI_DIR)
}

fn yes() -> bool {
    true
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, Registry::builtin())
    }

    /// Reads and validates a configuration file whose backend sections are those `registry`
    /// knows.
    pub fn load_with(path: &Path, registry: Registry) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse_with(&text, path, registry)
    }

    /// Reads and validates a configuration file as [`Config::load`] does, then reads what it
    /// names as `kubedev run` does before serving: the kubeconfig of DRA mode and the selection
    /// policy modules. Nothing on the host is changed and nothing is sent to the API server.
    /// Every error names the field and its line.
    pub fn check(path: &Path) -> Result<Config, ConfigError> {
        Self::check_with(path, Registry::builtin())
    }

    /// [`Config::check`] with the backend kinds `registry` knows.
    pub fn check_with(path: &Path, registry: Registry) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let config = Self::parse_with(&text, path, registry)?;
        config.check_files(path).map_err(|e| e.locate(&text))?;
        Ok(config)
    }

    /// Parses and validates configuration text; `path` is used in error messages, which name
    /// the line of the offending field.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Self::parse_with(text, path, Registry::builtin())
    }

    /// [`Config::parse`] with the backend kinds `registry` knows.
    pub fn parse_with(text: &str, path: &Path, registry: Registry) -> Result<Config, ConfigError> {
        let mut config: Config = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: kubedev_inputs::yaml::describe_error(&e, &serde_saphyr::Budget::default()),
        })?;
        config.registry = registry;
        config.validate(path).map_err(|e| e.locate(text))?;
        Ok(config)
    }

    /// The node's name as configured: `nodeName`, else the `NODE_NAME` variable of `env`; an
    /// empty value counts as unset. DRA requires it; the backends' pools fall back to the host
    /// name without it ([`Config::node_name_or_host`]).
    pub fn configured_node_name(&self, env: impl Fn(&str) -> Option<String>) -> Option<String> {
        let configured = self.node_name.clone().filter(|n| !n.is_empty());
        configured.or_else(|| env("NODE_NAME").filter(|n| !n.is_empty()))
    }

    /// The node's name: [`Config::configured_node_name`] (the configuration, else `NODE_NAME`),
    /// else the host name, else `localhost`.
    pub fn node_name_or_host(&self) -> String {
        self.configured_node_name(|k| std::env::var(k).ok())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "localhost".to_string())
    }

    /// Checks what the file says beyond its syntax: the DRA settings, that each backend kind is
    /// known, the device-plugin resources, that something is served by some backend, and the
    /// backends' sections.
    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        self.dra(path, |k| std::env::var(k).ok())?;
        if let Some(kind) = self
            .backends
            .keys()
            .find(|k| self.registry.get(k).is_none())
        {
            return Err(ConfigError::invalid(
                path,
                format!("backends.{kind}"),
                self.registry.why_not(kind),
            ));
        }
        self.validate_device_plugin(path)?;
        if (self.dra.enabled
            || (self.device_plugin.enabled && !self.device_plugin.resources.is_empty()))
            && self.backends.is_empty()
        {
            return Err(ConfigError::invalid(
                path,
                "backends",
                "no backend is configured, so there would be no devices to serve",
            ));
        }
        self.validate_sections(path)
    }
}
