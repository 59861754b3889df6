//! The Device Plugin API (kubelet API `v1beta1`): one gRPC server per extended resource.
//!
//! [`DevicePlugin::start`] serves a resource on its own Unix socket in the device-plugin
//! directory, registers it with the kubelet, and keeps it registered across kubelet restarts.
//! The devices it offers come from a [`tokio::sync::watch`] channel of [`PluginDevice`]s, usually
//! fed by the [`DevicePluginPublisher`]; container requests go to a [`DevicePluginHandler`].

mod lifecycle;
mod preferred;
mod publisher;
pub(crate) mod service;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::{ContainerEdits, DeviceRef, ExtendedResourceName, Health, PrepareError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use preferred::{PreferenceRequest, check_preference, default_preference};
pub use publisher::{DevicePluginPublisher, ResourceDevices, Selection};

use crate::error::Error;
use crate::uds::fit_socket_path;

/// The API version this crate speaks to the kubelet's Registration service.
pub const API_VERSION: &str = "v1beta1";

/// The kubelet's default device-plugin directory.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The kubelet's registration socket name inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The kubelet's limit on one gRPC message, which bounds a ListAndWatch snapshot.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// One device as the kubelet sees it through the device-plugin API.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginDevice {
    /// The device ID the kubelet allocates by.
    pub id: String,
    /// The inventory device this ID stands for (several IDs stand for one device when it is
    /// shared by time-slicing).
    pub device: DeviceRef,
    /// Health; anything but healthy is reported as `Unhealthy`.
    pub health: Health,
    /// NUMA node, reported as topology.
    pub numa_node: Option<i64>,
}

impl PluginDevice {
    /// A healthy device with ID `id` standing for `device`, with no NUMA node.
    pub fn new(id: impl Into<String>, device: DeviceRef) -> Self {
        PluginDevice {
            id: id.into(),
            device,
            health: Health::healthy(),
            numa_node: None,
        }
    }

    /// The same device with `health`.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// The same device on NUMA node `node`.
    pub fn with_numa_node(mut self, node: Option<i64>) -> Self {
        self.numa_node = node;
        self
    }
}

/// What one container gets for its devices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    /// Environment, mounts, device nodes and annotations.
    pub edits: ContainerEdits,
    /// Fully qualified CDI device names (`vendor/class=name`), when CDI mode is on.
    pub cdi_devices: Vec<String>,
}

/// The driver side of one extended resource.
#[async_trait]
pub trait DevicePluginHandler: Send + Sync + 'static {
    /// Container edits for one container given `devices` (already checked to be known and
    /// healthy; each names the inventory device it stands for). Called again with the same devices when the kubelet re-offers them, and must
    /// give the same answer.
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError>;

    /// Runs before a container with `devices` starts; only called when
    /// [`needs_pre_start`](Self::needs_pre_start) is true.
    async fn pre_start(&self, devices: &[PluginDevice]) -> Result<(), PrepareError> {
        let _ = devices;
        Ok(())
    }

    /// Whether the kubelet must call `PreStartContainer`.
    fn needs_pre_start(&self) -> bool {
        false
    }

    /// A selection policy's choice for `GetPreferredAllocation`, or `None` for the default
    /// (NUMA packing). An answer that breaks the API's rules is replaced by the default.
    fn preferred_allocation(&self, request: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        let _ = request;
        None
    }
}

/// How one device-plugin server runs.
#[derive(Debug, Clone)]
pub struct DevicePluginConfig {
    resource: ExtendedResourceName,
    plugin_dir: PathBuf,
    kubelet_socket: Option<PathBuf>,
    instance: String,
    register_backoff: Vec<Duration>,
    pre_start_timeout: Duration,
    observer: Option<crate::authority::RequestObserver>,
}

impl DevicePluginConfig {
    /// A server for `resource` in the default directory, with an instance ID unique to this
    /// process.
    pub fn new(resource: ExtendedResourceName) -> Self {
        DevicePluginConfig {
            resource,
            plugin_dir: PathBuf::from(DEFAULT_PLUGIN_DIR),
            kubelet_socket: None,
            instance: instance_id(),
            register_backoff: [1, 2, 5, 10].map(Duration::from_secs).to_vec(),
            pre_start_timeout: Duration::from_secs(20),
            observer: None,
        }
    }

    /// Tells `observer` of every request the kubelet sends on the plugin's socket.
    pub fn observe_requests(mut self, observer: crate::authority::RequestObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The device-plugin directory (default `/var/lib/kubelet/device-plugins`).
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dir = dir.into();
        self
    }

    /// The kubelet's registration socket (default `<plugin_dir>/kubelet.sock`).
    pub fn kubelet_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubelet_socket = Some(path.into());
        self
    }

    /// The instance ID in the socket name; two processes serving the same resource at once (a
    /// rolling update) must use different IDs.
    pub fn instance(mut self, id: impl Into<String>) -> Self {
        self.instance = id.into();
        self
    }

    /// Delays between registration attempts while the kubelet is absent; the last one repeats.
    pub fn register_backoff(mut self, delays: Vec<Duration>) -> Self {
        if !delays.is_empty() {
            self.register_backoff = delays;
        }
        self
    }

    /// The bound on `PreStartContainer` (default 20 s, under the kubelet's 30 s).
    pub fn pre_start_timeout(mut self, timeout: Duration) -> Self {
        self.pre_start_timeout = timeout;
        self
    }

    /// The resource served.
    pub fn resource(&self) -> &ExtendedResourceName {
        &self.resource
    }

    /// The socket this server listens on: `kubedev-<resource>-<instance>.sock` (`/` as `_`),
    /// shortened when the resource name is too long for a Unix socket path (see the DRA
    /// registration socket). Fails when the directory leaves no room.
    pub fn socket_path(&self) -> Result<PathBuf, Error> {
        let name = self.resource.as_str().replace('/', "_");
        fit_socket_path(
            &self.plugin_dir,
            &format!("kubedev-{name}"),
            Some(&self.instance),
            ".sock",
        )
    }

    fn kubelet_socket_path(&self) -> PathBuf {
        self.kubelet_socket
            .clone()
            .unwrap_or_else(|| self.plugin_dir.join(KUBELET_SOCKET))
    }
}

/// An ID unique to this process instance, for socket names.
fn instance_id() -> String {
    let random = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .ok()
        .map(|u| u.trim().replace('-', "")[..8].to_string());
    random.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{:x}{:x}", std::process::id(), nanos)
    })
}

/// The registration state of one server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginStatus {
    /// True once the kubelet accepted the latest registration.
    pub registered: bool,
    /// How many times the kubelet accepted a registration (1 + re-registrations).
    pub registrations: u64,
    /// The latest registration error, if the latest attempt failed.
    pub last_error: Option<String>,
}

/// A running device-plugin server.
#[derive(Debug)]
pub struct DevicePluginHandle {
    socket: PathBuf,
    status: watch::Receiver<PluginStatus>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl DevicePluginHandle {
    /// The socket the server listens on.
    pub fn socket_path(&self) -> &std::path::Path {
        &self.socket
    }

    /// The current registration state.
    pub fn status(&self) -> PluginStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every registration state change.
    pub fn watch_status(&self) -> watch::Receiver<PluginStatus> {
        self.status.clone()
    }

    /// Waits until the kubelet accepted a registration, at most `timeout`.
    pub async fn wait_registered(&self, timeout: Duration) -> bool {
        let mut rx = self.status.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.registered))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stops serving and removes the socket.
    pub async fn stop(self) {
        self.cancel.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %kubedev_core::echo::Chain(&e), "device-plugin task failed while stopping");
        }
    }
}

/// Entry point of the device-plugin server.
#[derive(Debug)]
pub struct DevicePlugin;

impl DevicePlugin {
    /// Serves `config.resource()` with `handler`, offering the devices of `devices`, and registers
    /// with the kubelet (retrying with backoff while it is absent, and again after every kubelet
    /// restart). The server stops when the handle is stopped or `cancel` is cancelled.
    pub fn start(
        config: DevicePluginConfig,
        handler: Arc<dyn DevicePluginHandler>,
        devices: watch::Receiver<Vec<PluginDevice>>,
        cancel: CancellationToken,
    ) -> Result<DevicePluginHandle, Error> {
        if !config.plugin_dir.is_dir() {
            return Err(Error::Config(format!(
                "device-plugin directory {} does not exist",
                config.plugin_dir.display()
            )));
        }
        let socket = config.socket_path()?;
        let (status_tx, status) = watch::channel(PluginStatus::default());
        let task = tokio::spawn(lifecycle::run(
            config,
            socket.clone(),
            handler,
            devices,
            status_tx,
            cancel.clone(),
        ));
        Ok(DevicePluginHandle {
            socket,
            status,
            cancel,
            task,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use super::*;

    fn longest(tail: char) -> ExtendedResourceName {
        // The longest name the kubelet takes: a 244-character domain and a 63-character name.
        let label = "a".repeat(60);
        let domain = format!("{label}.{label}.{label}.{}{tail}", "b".repeat(60));
        assert_eq!(domain.len(), 244);
        ExtendedResourceName::new(format!("{domain}/{}", "g".repeat(63))).unwrap()
    }

    #[test]
    fn the_longest_resource_names_get_distinct_sockets_that_fit() {
        let a = DevicePluginConfig::new(longest('x')).instance("1f2e3d4c");
        let b = DevicePluginConfig::new(longest('y')).instance("1f2e3d4c");
        let a2 = DevicePluginConfig::new(longest('x')).instance("99887766");
        let paths: Vec<PathBuf> = [&a, &b, &a2]
            .iter()
            .map(|c| c.socket_path().unwrap())
            .collect();
        for p in &paths {
            assert!(
                p.as_os_str().len() <= crate::uds::MAX_SOCKET_PATH_LEN,
                "{}",
                p.display()
            );
            assert!(p.starts_with(DEFAULT_PLUGIN_DIR));
        }
        assert_ne!(paths[0], paths[1]);
        assert_ne!(paths[0], paths[2]);
        assert!(paths[2].to_str().unwrap().ends_with("-99887766.sock"));
        // A short name is left as it is.
        let short = DevicePluginConfig::new(ExtendedResourceName::new("example.com/gpu").unwrap())
            .instance("1f2e3d4c");
        assert_eq!(
            short.socket_path().unwrap(),
            Path::new(DEFAULT_PLUGIN_DIR).join("kubedev-example.com_gpu-1f2e3d4c.sock")
        );
    }
}
