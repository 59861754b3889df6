//! The daemon's configuration file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubedev_core::{AttributeMatch, AttributeValue, ExtendedResourceName, QualifiedName};
use serde::{Deserialize, Serialize};

use crate::registry::Registry;

mod checks;
mod lines;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

#[cfg(feature = "wasm")]
pub(crate) use checks::{PolicyModule, policy_module};

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

/// DRA mode settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraSection {
    /// Whether DRA mode runs.
    #[serde(default)]
    pub enabled: bool,
    /// The driver name, a DNS subdomain such as `gpu.example.com`.
    #[serde(default)]
    pub driver_name: Option<String>,
    /// A kubeconfig file; in-cluster configuration when absent.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The driver's plugin directory (default `/var/lib/kubelet/plugins/<driver>`).
    #[serde(default)]
    pub plugin_dir: Option<PathBuf>,
    /// The kubelet's plugin registry directory.
    #[serde(default = "default_registry_dir")]
    pub registry_dir: PathBuf,
    /// Where CDI spec files are written.
    #[serde(default = "default_cdi_dir")]
    pub cdi_dir: PathBuf,
    /// Where the checkpoint lives (default: the plugin directory).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// The pod UID for per-pod socket names (default: the `POD_UID` environment variable).
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// Serve the resource health stream.
    #[serde(default = "yes")]
    pub health: bool,
    /// What the ResourceSlices show of an unhealthy device (default `auto`).
    #[serde(default)]
    pub unhealthy_devices: UnhealthyDevicesConfig,
    /// Write a prepared claim's devices into its `status.devices` and clear them on unprepare
    /// (needs `patch` on `resourceclaims/status`).
    #[serde(default = "yes")]
    pub claim_status: bool,
    /// Write device metadata files for containers (KEP-5304) and mount them through CDI at
    /// `/var/run/kubernetes.io/dra-device-attributes/…`.
    #[serde(default)]
    pub device_metadata: bool,
    /// The file holding the node's boot ID.
    #[serde(default = "default_boot_id")]
    pub boot_id_path: PathBuf,
    /// DeviceClasses the driver applies to the cluster (server-side apply, so every node's
    /// daemon may apply the same ones).
    #[serde(default)]
    pub device_classes: Vec<DeviceClassConfig>,
}

/// What the ResourceSlices show of an unhealthy device (`dra.unhealthyDevices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnhealthyDevicesConfig {
    /// `taint` where the API server keeps device taints (Kubernetes 1.36 and later by
    /// default), `omit` where it does not.
    #[default]
    Auto,
    /// Published with the taint `<driver>/unhealthy` (`NoSchedule`, or `NoExecute` when the
    /// device is unusable for the workloads on it), the reason in its value; removed when the
    /// device recovers.
    Taint,
    /// Left out of the ResourceSlices.
    Omit,
    /// Tainted while a claim on this node holds it, left out once none does.
    TaintWhileInUse,
}

impl From<UnhealthyDevicesConfig> for kubedev_apiserver::UnhealthyDevices {
    fn from(c: UnhealthyDevicesConfig) -> Self {
        match c {
            UnhealthyDevicesConfig::Auto => kubedev_apiserver::UnhealthyDevices::Auto,
            UnhealthyDevicesConfig::Taint => kubedev_apiserver::UnhealthyDevices::Taint,
            UnhealthyDevicesConfig::Omit => kubedev_apiserver::UnhealthyDevices::Omit,
            UnhealthyDevicesConfig::TaintWhileInUse => {
                kubedev_apiserver::UnhealthyDevices::TaintWhileInUse
            }
        }
    }
}

/// A DeviceClass the driver publishes: `device.driver == "<driverName>"` plus `cel`, and
/// optionally an extended resource name (KEP-5004) so pods that request e.g. `nvidia.com/gpu`
/// get a device of this class through DRA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceClassConfig {
    /// The class name, a DNS subdomain.
    pub name: String,
    /// A CEL selector the class adds to the driver match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<String>,
    /// The extended resource name pods may request instead of a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
}

fn default_registry_dir() -> PathBuf {
    PathBuf::from(kubedev_kubelet_grpc::dra::DEFAULT_REGISTRY_DIR)
}

fn default_cdi_dir() -> PathBuf {
    PathBuf::from(crate::cdi::DEFAULT_CDI_DIR)
}

fn default_boot_id() -> PathBuf {
    PathBuf::from(crate::checkpoint::DEFAULT_BOOT_ID_PATH)
}

impl Default for DraSection {
    fn default() -> Self {
        DraSection {
            enabled: false,
            driver_name: None,
            kubeconfig: None,
            plugin_dir: None,
            registry_dir: default_registry_dir(),
            cdi_dir: default_cdi_dir(),
            state_dir: None,
            pod_uid: None,
            health: true,
            unhealthy_devices: UnhealthyDevicesConfig::default(),
            claim_status: true,
            device_metadata: false,
            boot_id_path: default_boot_id(),
            device_classes: Vec::new(),
        }
    }
}

/// Validated DRA settings, with defaults and environment applied.
#[derive(Debug, Clone)]
pub struct DraSpec {
    /// The driver.
    pub driver: kubedev_core::DriverName,
    /// The node.
    pub node_name: String,
    /// Kubeconfig, if any.
    pub kubeconfig: Option<PathBuf>,
    /// The plugin directory.
    pub plugin_dir: PathBuf,
    /// The registry directory.
    pub registry_dir: PathBuf,
    /// The CDI directory.
    pub cdi_dir: PathBuf,
    /// The checkpoint directory.
    pub state_dir: PathBuf,
    /// The pod UID.
    pub pod_uid: Option<String>,
    /// Health streaming on.
    pub health: bool,
    /// What the ResourceSlices show of an unhealthy device.
    pub unhealthy_devices: kubedev_apiserver::UnhealthyDevices,
    /// Whether prepared claims' device status is written.
    pub claim_status: bool,
    /// Whether device metadata files are written for containers.
    pub device_metadata: bool,
    /// Boot ID file.
    pub boot_id_path: PathBuf,
    /// DeviceClasses to apply.
    pub device_classes: Vec<kubedev_apiserver::DeviceClassSpec>,
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
            message: kubedev_allocator::yaml::describe_error(&e, &serde_saphyr::Budget::default()),
        })?;
        config.registry = registry;
        config.validate(path).map_err(|e| e.locate(text))?;
        Ok(config)
    }

    /// The node's name as configured: `nodeName`, else the `NODE_NAME` variable of `env`; an
    /// empty value counts as unset. DRA requires it; the backends' pools fall back to the host
    /// name without it ([`crate::runtime::node_name`]).
    pub fn configured_node_name(&self, env: impl Fn(&str) -> Option<String>) -> Option<String> {
        let configured = self.node_name.clone().filter(|n| !n.is_empty());
        configured.or_else(|| env("NODE_NAME").filter(|n| !n.is_empty()))
    }

    /// The DRA settings, validated, with `NODE_NAME` and `POD_UID` from `env` when the file does
    /// not set them; `None` when DRA mode is off.
    pub fn dra(
        &self,
        path: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<DraSpec>, ConfigError> {
        let d = &self.dra;
        if !d.enabled {
            return Ok(None);
        }
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: None,
            field: field.to_string(),
            message,
        };
        let name = d.driver_name.clone().ok_or_else(|| {
            invalid(
                "dra.driverName",
                "required when DRA is enabled, e.g. gpu.example.com".into(),
            )
        })?;
        let driver = kubedev_core::DriverName::new(name)
            .map_err(|e| invalid("dra.driverName", kubedev_core::echo::chain(&e)))?;
        let node_name = self.configured_node_name(&env).ok_or_else(|| {
            invalid(
                "nodeName",
                "required for DRA: set it or the NODE_NAME environment variable".into(),
            )
        })?;
        kubedev_core::check_dns_subdomain(&node_name, 253)
            .map_err(|e| invalid("nodeName", format!("{node_name:?} {e}")))?;
        let plugin_dir = d.plugin_dir.clone().unwrap_or_else(|| {
            Path::new(kubedev_kubelet_grpc::dra::DEFAULT_PLUGINS_DIR).join(driver.as_str())
        });
        let pod_uid = d
            .pod_uid
            .clone()
            .or_else(|| env("POD_UID"))
            .filter(|u| !u.is_empty());
        if let Some(uid) = &pod_uid
            && !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(invalid("dra.podUid", format!("{uid:?} is not a UID")));
        }
        // Both sockets must fit in a Unix socket address (names are shortened on their own; only
        // a directory that leaves no room fails).
        let sockets = kubedev_kubelet_grpc::dra::DraPluginConfig::new(driver.clone())
            .plugin_dir(&plugin_dir)
            .registry_dir(&d.registry_dir)
            .pod_uid(pod_uid.clone().unwrap_or_default());
        sockets
            .dra_socket()
            .map_err(|e| invalid("dra.pluginDir", kubedev_core::echo::chain(&e)))?;
        sockets
            .registration_socket()
            .map_err(|e| invalid("dra.registryDir", kubedev_core::echo::chain(&e)))?;
        let mut device_classes = Vec::new();
        for (i, c) in d.device_classes.iter().enumerate() {
            let field = |f: &str| format!("dra.deviceClasses[{i}].{f}");
            kubedev_core::check_dns_subdomain(&c.name, 253)
                .map_err(|e| invalid(&field("name"), format!("{:?} {e}", c.name)))?;
            if let Some(ext) = &c.extended_resource_name {
                ExtendedResourceName::new(ext.clone()).map_err(|e| {
                    invalid(
                        &field("extendedResourceName"),
                        kubedev_core::echo::chain(&e),
                    )
                })?;
            }
            let mut selectors = vec![format!("device.driver == {:?}", driver.as_str())];
            if let Some(cel) = &c.cel {
                kubedev_allocator::cel::validate_new(cel)
                    .map_err(|e| invalid(&field("cel"), kubedev_core::echo::chain(&e)))?;
                selectors.push(cel.clone());
            }
            device_classes.push(kubedev_apiserver::DeviceClassSpec {
                name: c.name.clone(),
                selectors,
                extended_resource_name: c.extended_resource_name.clone(),
            });
        }
        Ok(Some(DraSpec {
            device_classes,
            state_dir: d.state_dir.clone().unwrap_or_else(|| plugin_dir.clone()),
            driver,
            node_name,
            kubeconfig: d.kubeconfig.clone(),
            plugin_dir,
            registry_dir: d.registry_dir.clone(),
            cdi_dir: d.cdi_dir.clone(),
            pod_uid,
            health: d.health,
            unhealthy_devices: d.unhealthy_devices.into(),
            claim_status: d.claim_status,
            device_metadata: d.device_metadata,
            boot_id_path: d.boot_id_path.clone(),
        }))
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        self.dra(path, |k| std::env::var(k).ok())?;
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: None,
            field,
            message,
        };
        if let Some(kind) = self
            .backends
            .keys()
            .find(|k| self.registry.get(k).is_none())
        {
            return Err(invalid(
                format!("backends.{kind}"),
                self.registry.why_not(kind),
            ));
        }
        #[cfg(not(feature = "wasm"))]
        {
            let no_wasm = "this kubedev was built without the `wasm` feature (selection policies); \
                           rebuild with `cargo build --features wasm`";
            if self.device_plugin.policy_dir.is_some() {
                return Err(invalid("devicePlugin.policyDir".into(), no_wasm.into()));
            }
            if let Some(i) = self
                .device_plugin
                .resources
                .iter()
                .position(|r| r.policy.is_some())
            {
                return Err(invalid(
                    format!("devicePlugin.resources[{i}].policy"),
                    no_wasm.into(),
                ));
            }
        }
        self.resources(path)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, r) in self.device_plugin.resources.iter().enumerate() {
            if !names.insert(r.name.as_str()) {
                return Err(invalid(
                    format!("devicePlugin.resources[{i}].name"),
                    format!("{:?} is configured twice", r.name),
                ));
            }
            if let Ok(name) = ExtendedResourceName::new(r.name.clone()) {
                kubedev_kubelet_grpc::device_plugin::DevicePluginConfig::new(name)
                    .plugin_dir(&self.device_plugin.directory)
                    .socket_path()
                    .map_err(|e| {
                        invalid(
                            "devicePlugin.directory".into(),
                            kubedev_core::echo::chain(&e),
                        )
                    })?;
            }
        }
        if (self.dra.enabled
            || (self.device_plugin.enabled && !self.device_plugin.resources.is_empty()))
            && self.backends.is_empty()
        {
            return Err(invalid(
                "backends".into(),
                "no backend is configured, so there would be no devices to serve".into(),
            ));
        }
        self.validate_sections(path)
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
                        line: None,
                        field: format!("devicePlugin.resources[{i}].name"),
                        message: kubedev_core::echo::chain(&e),
                    }
                })?;
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
                    .map_err(|message| ConfigError::Invalid {
                        path: path.to_path_buf(),
                        line: None,
                        field: format!("devicePlugin.resources[{i}].selector.cel"),
                        message,
                    })?;
                let replicas = r.replicas.unwrap_or(1);
                if !(1..=MAX_REPLICAS).contains(&replicas) {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        line: None,
                        field: format!("devicePlugin.resources[{i}].replicas"),
                        message: format!("{replicas} is not between 1 and {MAX_REPLICAS}"),
                    });
                }
                Ok(ResourceSpec {
                    replicas,
                    name,
                    filter: crate::selector::ResourceFilter {
                        attributes: AttributeMatch {
                            attributes: r.selector.attributes.clone(),
                        },
                        cel,
                    },
                    policy: r.policy.clone(),
                })
            })
            .collect()
    }
}
