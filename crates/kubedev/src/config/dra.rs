//! DRA mode: the `dra` section of the file, and the settings it gives once validated with
//! defaults and the environment applied ([`DraSpec`]).

use std::path::{Path, PathBuf};

use kubedev_core::{DriverName, ExtendedResourceName};
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError, default_cdi_dir, yes};

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
    /// How fast the ResourceSlice publisher may send requests to the API server.
    #[serde(default)]
    pub slice_requests: SliceRequests,
    /// DeviceClasses the driver applies to the cluster (server-side apply, so every node's
    /// daemon may apply the same ones).
    #[serde(default)]
    pub device_classes: Vec<DeviceClassConfig>,
}

/// The ResourceSlice publisher's request rate (`dra.sliceRequests`): on average `qps` requests
/// a second, in bursts of up to `burst` (client-go's defaults, 5 and 10, which the kubelet
/// plugins of other drivers use too). `qps: 0` lifts the limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SliceRequests {
    /// Requests a second on average.
    #[serde(default = "default_slice_qps")]
    pub qps: f64,
    /// Requests sent at once before the average applies.
    #[serde(default = "default_slice_burst")]
    pub burst: u32,
}

fn default_slice_qps() -> f64 {
    5.0
}

fn default_slice_burst() -> u32 {
    10
}

impl Default for SliceRequests {
    fn default() -> Self {
        SliceRequests {
            qps: default_slice_qps(),
            burst: default_slice_burst(),
        }
    }
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
            slice_requests: SliceRequests::default(),
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
    /// The ResourceSlice publisher's request rate.
    pub slice_requests: SliceRequests,
    /// DeviceClasses to apply.
    pub device_classes: Vec<kubedev_apiserver::DeviceClassSpec>,
}

impl Config {
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
        let driver = d.driver(path)?;
        let node_name = self.configured_node_name(&env).ok_or_else(|| {
            ConfigError::invalid(
                path,
                "nodeName",
                "required for DRA: set it or the NODE_NAME environment variable",
            )
        })?;
        kubedev_core::check_dns_subdomain(&node_name, 253)
            .map_err(|e| ConfigError::invalid(path, "nodeName", format!("{node_name:?} {e}")))?;
        let plugin_dir = d.plugin_dir.clone().unwrap_or_else(|| {
            Path::new(kubedev_kubelet_grpc::dra::DEFAULT_PLUGINS_DIR).join(driver.as_str())
        });
        let pod_uid = d.pod_uid(path, &env)?;
        d.check_sockets(path, &driver, &plugin_dir, pod_uid.as_deref())?;
        let device_classes = d.device_class_specs(path, &driver)?;
        let rate = d.slice_requests;
        if !(rate.qps.is_finite() && rate.qps >= 0.0) {
            return Err(ConfigError::invalid(
                path,
                "dra.sliceRequests.qps",
                format!("{} is not a rate: use 0 (no limit) or more", rate.qps),
            ));
        }
        if rate.burst == 0 {
            return Err(ConfigError::invalid(
                path,
                "dra.sliceRequests.burst",
                "0 would send nothing: use 1 or more",
            ));
        }
        Ok(Some(DraSpec {
            slice_requests: rate,
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
}

impl DraSection {
    /// `driverName`, required and validated.
    fn driver(&self, path: &Path) -> Result<DriverName, ConfigError> {
        let invalid = |message: String| ConfigError::invalid(path, "dra.driverName", message);
        let name = self
            .driver_name
            .clone()
            .ok_or_else(|| invalid("required when DRA is enabled, e.g. gpu.example.com".into()))?;
        DriverName::new(name).map_err(|e| invalid(kubedev_core::echo::chain(&e)))
    }

    /// The pod UID: `podUid`, else the `POD_UID` variable of `env`; an empty value counts as
    /// unset, and one that is not a UID is an error.
    fn pod_uid(
        &self,
        path: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        let pod_uid = self
            .pod_uid
            .clone()
            .or_else(|| env("POD_UID"))
            .filter(|u| !u.is_empty());
        if let Some(uid) = &pod_uid
            && !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(ConfigError::invalid(
                path,
                "dra.podUid",
                format!("{uid:?} is not a UID"),
            ));
        }
        Ok(pod_uid)
    }

    /// Both sockets must fit in a Unix socket address (names are shortened on their own; only
    /// a directory that leaves no room fails).
    fn check_sockets(
        &self,
        path: &Path,
        driver: &DriverName,
        plugin_dir: &Path,
        pod_uid: Option<&str>,
    ) -> Result<(), ConfigError> {
        let sockets = kubedev_kubelet_grpc::dra::DraPluginConfig::new(driver.clone())
            .plugin_dir(plugin_dir)
            .registry_dir(&self.registry_dir)
            .pod_uid(pod_uid.unwrap_or_default());
        sockets.dra_socket().map_err(|e| {
            ConfigError::invalid(path, "dra.pluginDir", kubedev_core::echo::chain(&e))
        })?;
        sockets.registration_socket().map_err(|e| {
            ConfigError::invalid(path, "dra.registryDir", kubedev_core::echo::chain(&e))
        })?;
        Ok(())
    }

    /// `deviceClasses`, validated, each with the selector that matches `driver` first.
    fn device_class_specs(
        &self,
        path: &Path,
        driver: &DriverName,
    ) -> Result<Vec<kubedev_apiserver::DeviceClassSpec>, ConfigError> {
        let mut device_classes = Vec::new();
        for (i, c) in self.device_classes.iter().enumerate() {
            let invalid = |f: &str, message: String| {
                ConfigError::invalid(path, format!("dra.deviceClasses[{i}].{f}"), message)
            };
            kubedev_core::check_dns_subdomain(&c.name, 253)
                .map_err(|e| invalid("name", format!("{:?} {e}", c.name)))?;
            if let Some(ext) = &c.extended_resource_name {
                ExtendedResourceName::new(ext.clone())
                    .map_err(|e| invalid("extendedResourceName", kubedev_core::echo::chain(&e)))?;
            }
            let mut selectors = vec![format!("device.driver == {:?}", driver.as_str())];
            if let Some(cel) = &c.cel {
                kubedev_allocator::cel::validate_new(cel)
                    .map_err(|e| invalid("cel", kubedev_core::echo::chain(&e)))?;
                selectors.push(cel.clone());
            }
            device_classes.push(kubedev_apiserver::DeviceClassSpec {
                name: c.name.clone(),
                selectors,
                extended_resource_name: c.extended_resource_name.clone(),
            });
        }
        Ok(device_classes)
    }
}
