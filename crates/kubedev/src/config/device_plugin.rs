//! Device-plugin mode: the `devicePlugin` section of the file, its extended resources and their
//! selectors, and the resources once validated ([`ResourceSpec`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubedev_core::{AttributeMatch, AttributeValue, ExtendedResourceName, QualifiedName};
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError, default_cdi_dir, yes};

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
    /// Answer `Allocate` with CDI device names (the runtime applies the CDI spec) instead of
    /// device specs, mounts and env.
    #[serde(default)]
    pub cdi: bool,
    /// Where the device-plugin CDI specs are written.
    #[serde(default = "default_cdi_dir")]
    pub cdi_dir: PathBuf,
    /// A directory of `.wasm` selection policies, watched and hot-reloaded; a resource's
    /// `policy` that is a bare name (no `/`) names a module in it (its file stem).
    #[serde(default)]
    pub policy_dir: Option<PathBuf>,
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
            cdi: false,
            cdi_dir: default_cdi_dir(),
            policy_dir: None,
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
    /// A WebAssembly selection policy that chooses devices for `GetPreferredAllocation`: a
    /// `.wasm` file, or the name of a module in `devicePlugin.policyDir` (hot-reloaded).
    #[serde(default)]
    pub policy: Option<PathBuf>,
    /// Time-slicing: advertise each device this many times (IDs `<device>::<n>`), so as many
    /// containers share it; 1 (the default) advertises each device once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// The most replicas one device may be advertised as.
pub const MAX_REPLICAS: u32 = 64;

/// A device selector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    /// Attribute name → required typed value; all must match.
    #[serde(default)]
    pub attributes: BTreeMap<QualifiedName, AttributeValue>,
    /// A CEL expression over `device` as in a DeviceClass selector, e.g.
    /// `device.attributes["gpu.nvidia.com"].type == "gpu"`; must also be true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<String>,
}

/// A validated device-plugin resource.
#[derive(Debug, Clone)]
pub struct ResourceSpec {
    /// The name.
    pub name: ExtendedResourceName,
    /// The filter.
    pub filter: crate::selector::ResourceFilter,
    /// The selection policy module, if any.
    pub policy: Option<PathBuf>,
    /// How many times each device is advertised (1 = once).
    pub replicas: u32,
}

impl Config {
    /// The device-plugin resources, validated.
    pub fn resources(&self, path: &Path) -> Result<Vec<ResourceSpec>, ConfigError> {
        self.device_plugin
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let invalid = |field: &str, message: String| {
                    ConfigError::invalid(
                        path,
                        format!("devicePlugin.resources[{i}].{field}"),
                        message,
                    )
                };
                let name = ExtendedResourceName::new(r.name.clone())
                    .map_err(|e| invalid("name", kubedev_core::echo::chain(&e)))?;
                // Bare attribute names in a CEL selector belong to the DRA driver's domain when
                // there is one, else to the resource's own domain.
                let domain =
                    self.dra.driver_name.clone().unwrap_or_else(|| {
                        name.as_str().split('/').next().unwrap_or("").to_string()
                    });
                let cel = r
                    .selector
                    .cel
                    .as_deref()
                    .map(|expr| crate::selector::CelSelector::new(expr, &domain))
                    .transpose()
                    .map_err(|message| invalid("selector.cel", message))?;
                let replicas = r.replicas.unwrap_or(1);
                if !(1..=MAX_REPLICAS).contains(&replicas) {
                    return Err(invalid(
                        "replicas",
                        format!("{replicas} is not between 1 and {MAX_REPLICAS}"),
                    ));
                }
                Ok(ResourceSpec {
                    replicas,
                    name,
                    filter: crate::selector::ResourceFilter {
                        attributes: AttributeMatch::new(r.selector.attributes.clone()),
                        cel,
                    },
                    policy: r.policy.clone(),
                })
            })
            .collect()
    }

    /// Checks the device-plugin resources: each valid, none configured twice, each socket
    /// fitting in its directory, and no selection policy when the `wasm` feature is left out.
    pub(super) fn validate_device_plugin(&self, path: &Path) -> Result<(), ConfigError> {
        #[cfg(not(feature = "wasm"))]
        {
            let no_wasm = "this kubedev was built without the `wasm` feature (selection policies); \
                           rebuild with `cargo build --features wasm`";
            if self.device_plugin.policy_dir.is_some() {
                return Err(ConfigError::invalid(
                    path,
                    "devicePlugin.policyDir",
                    no_wasm,
                ));
            }
            if let Some(i) = self
                .device_plugin
                .resources
                .iter()
                .position(|r| r.policy.is_some())
            {
                return Err(ConfigError::invalid(
                    path,
                    format!("devicePlugin.resources[{i}].policy"),
                    no_wasm,
                ));
            }
        }
        self.resources(path)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, r) in self.device_plugin.resources.iter().enumerate() {
            if !names.insert(r.name.as_str()) {
                return Err(ConfigError::invalid(
                    path,
                    format!("devicePlugin.resources[{i}].name"),
                    format!("{:?} is configured twice", r.name),
                ));
            }
            if let Ok(name) = ExtendedResourceName::new(r.name.clone()) {
                kubedev_kubelet_grpc::device_plugin::DevicePluginConfig::new(name)
                    .plugin_dir(&self.device_plugin.directory)
                    .socket_path()
                    .map_err(|e| {
                        ConfigError::invalid(
                            path,
                            "devicePlugin.directory",
                            kubedev_core::echo::chain(&e),
                        )
                    })?;
            }
        }
        Ok(())
    }
}
