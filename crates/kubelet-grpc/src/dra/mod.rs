//! The DRA kubelet plugin: plugin registration, the DRA API (`v1` and `v1beta1`) and resource
//! health streaming (`v1alpha1` and `v1`).
//!
//! [`DraPlugin::start`] serves the DRA socket first and the registration socket second, as the
//! kubelet expects. Each claim of a `NodePrepareResources` call is handed to the
//! [`DraHandler`] concurrently; its failure goes in that claim's entry, never in the call's status.

mod claim_error;
mod health;
mod registration;
pub(crate) mod service;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use kubedev_core::{ClaimRef, DriverName, Health};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::uds::{SocketGuard, bind_private, fit_socket_path};
pub use claim_error::{ClaimError, Retry};
pub use health::KUBELET_DEFAULT_HEALTH_TIMEOUT;
use kubedev_core::echo::chain as error_chain;

/// The kubelet's default plugin registry directory.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// The kubelet's default directory under which each driver has its own plugin directory.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// The DRA services this plugin implements, in order of preference, as advertised in `GetInfo`.
pub const SUPPORTED_DRA_SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// The health services advertised when health streaming is on.
pub const HEALTH_SERVICES: [&str; 2] = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// One prepared device as the kubelet needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedClaimDevice {
    /// The requests this device satisfies (base request names, without subrequests).
    pub request_names: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Fully qualified CDI device IDs for the container runtime.
    pub cdi_device_ids: Vec<String>,
    /// The share ID when the device allows multiple allocations.
    pub share_id: Option<String>,
}

/// The driver side of DRA: what happens to one claim.
#[async_trait]
pub trait DraHandler: Send + Sync + 'static {
    /// Prepares one claim. Called concurrently for different claims; the handler serialises work
    /// on the same claim UID. Idempotent. The error's [`ClaimError::kubelet_message`] goes to the
    /// kubelet in that claim's entry.
    async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedClaimDevice>, ClaimError>;

    /// Unprepares one claim; an unknown claim is success. Idempotent.
    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError>;
}

/// One device's health for the health stream.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceHealthReport {
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Health and reason.
    pub health: Health,
    /// When the health was last determined, in seconds since the Unix epoch.
    pub last_updated: i64,
    /// How many seconds the kubelet keeps this health without a new report before it shows
    /// `Unknown`; 0 for the kubelet's default (30 s). The stream repeats its snapshot within a
    /// third of the smallest timeout.
    pub timeout_seconds: i64,
}

/// How the DRA plugin runs.
#[derive(Debug, Clone)]
pub struct DraPluginConfig {
    driver: DriverName,
    plugin_dir: PathBuf,
    registry_dir: PathBuf,
    pod_uid: Option<String>,
    health: bool,
    observer: Option<crate::authority::RequestObserver>,
}

impl DraPluginConfig {
    /// A plugin for `driver` with the kubelet's default directories.
    pub fn new(driver: DriverName) -> Self {
        let plugin_dir = Path::new(DEFAULT_PLUGINS_DIR).join(driver.as_str());
        DraPluginConfig {
            driver,
            plugin_dir,
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            pod_uid: None,
            health: false,
            observer: None,
        }
    }

    /// The driver's plugin directory, where the DRA socket lives (default
    /// `/var/lib/kubelet/plugins/<driver>`); created when missing.
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dir = dir.into();
        self
    }

    /// The kubelet's plugin registry directory (default `/var/lib/kubelet/plugins_registry`).
    pub fn registry_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registry_dir = dir.into();
        self
    }

    /// The pod UID, for rolling updates: sockets get per-pod names so two instances can overlap.
    pub fn pod_uid(mut self, uid: impl Into<String>) -> Self {
        let uid = uid.into();
        self.pod_uid = (!uid.is_empty()).then_some(uid);
        self
    }

    /// Serves the health services and advertises them.
    pub fn health(mut self, on: bool) -> Self {
        self.health = on;
        self
    }

    /// Tells `observer` of every request the kubelet sends on the DRA and registration sockets.
    pub fn observe_requests(mut self, observer: crate::authority::RequestObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The DRA socket: `<plugin_dir>/dra.sock`, or `dra-<podUID>.sock` with a pod UID (the UID
    /// cut to fit the socket path limit). Fails when the plugin directory leaves no room.
    pub fn dra_socket(&self) -> Result<PathBuf, Error> {
        fit_socket_path(&self.plugin_dir, "dra", self.pod_uid.as_deref(), ".sock")
    }

    /// The registration socket: `<registry_dir>/<driver>-reg.sock`, or with a pod UID
    /// `<driver>-<podUID>-reg.sock`. When that does not fit a Unix socket path, the UID is cut
    /// first, then the driver name (followed by a hash of the whole name, so names stay
    /// distinct); the kubelet finds plugins by listing the directory, whatever the names.
    /// Fails when the registry directory leaves no room.
    pub fn registration_socket(&self) -> Result<PathBuf, Error> {
        fit_socket_path(
            &self.registry_dir,
            self.driver.as_str(),
            self.pod_uid.as_deref(),
            "-reg.sock",
        )
    }

    fn supported_versions(&self) -> Vec<String> {
        let mut v: Vec<String> = SUPPORTED_DRA_SERVICES
            .iter()
            .map(|s| s.to_string())
            .collect();
        if self.health {
            v.extend(HEALTH_SERVICES.iter().map(|s| s.to_string()));
        }
        v
    }
}

/// What the kubelet last said about our registration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraStatus {
    /// True when the kubelet's latest `NotifyRegistrationStatus` accepted the plugin.
    pub registered: bool,
    /// How many times the kubelet reported success.
    pub registrations: u64,
    /// The kubelet's latest error, if it rejected the plugin.
    pub last_error: Option<String>,
}

/// A running DRA plugin.
#[derive(Debug)]
pub struct DraPluginHandle {
    dra_socket: PathBuf,
    registration_socket: PathBuf,
    status: watch::Receiver<DraStatus>,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    guards: Vec<SocketGuard>,
}

impl DraPluginHandle {
    /// The DRA socket.
    pub fn dra_socket(&self) -> &Path {
        &self.dra_socket
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> &Path {
        &self.registration_socket
    }

    /// The registration state.
    pub fn status(&self) -> DraStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every change of the registration state.
    pub fn watch_status(&self) -> watch::Receiver<DraStatus> {
        self.status.clone()
    }

    /// Waits until the kubelet reported a successful registration, at most `timeout`.
    pub async fn wait_registered(&self, timeout: std::time::Duration) -> bool {
        let mut rx = self.status.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.registered))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stops both servers and removes both sockets (registration first, so the kubelet
    /// deregisters before the DRA socket goes).
    pub async fn stop(mut self) {
        self.cancel.cancel();
        for t in self.tasks.drain(..).rev() {
            let _ = t.await;
        }
        // Guards drop in reverse creation order: registration socket first.
        while let Some(g) = self.guards.pop() {
            drop(g);
        }
    }
}

/// Entry point of the DRA plugin.
#[derive(Debug)]
pub struct DraPlugin;

impl DraPlugin {
    /// Serves the DRA API on the DRA socket, then the registration service on the registration
    /// socket. `health` feeds the health stream (used when the config enables health).
    pub fn start(
        config: DraPluginConfig,
        handler: Arc<dyn DraHandler>,
        health: watch::Receiver<Vec<DeviceHealthReport>>,
        cancel: CancellationToken,
    ) -> Result<DraPluginHandle, Error> {
        // Socket paths first: a configuration that cannot work creates nothing.
        let dra_socket = config.dra_socket()?;
        let registration_socket = config.registration_socket()?;
        for dir in [&config.plugin_dir, &config.registry_dir] {
            kubedev_core::safefs::create_private_dir_all(dir).map_err(|error| Error::Socket {
                op: "creating directory for",
                path: dir.clone(),
                error,
            })?;
        }
        let (status_tx, status) = watch::channel(DraStatus::default());
        let mut tasks = Vec::new();
        let mut guards = Vec::new();

        // DRA first.
        let (listener, guard) = bind_private(&dra_socket)?;
        guards.push(guard);
        let svc = Arc::new(service::Service {
            driver: config.driver.to_string(),
            handler,
        });
        let mut router = tonic::transport::Server::builder()
            .add_service(
                crate::pb::dra::v1::dra_plugin_server::DraPluginServer::from_arc(svc.clone()),
            )
            .add_service(
                crate::pb::dra::v1beta1::dra_plugin_server::DraPluginServer::from_arc(svc),
            );
        if config.health {
            let h = Arc::new(health::HealthService {
                devices: health,
                shutdown: cancel.clone(),
            });
            router = router
                .add_service(
                    crate::pb::drahealth::v1::dra_resource_health_server::DraResourceHealthServer::from_arc(h.clone()),
                )
                .add_service(
                    crate::pb::drahealth::v1alpha1::dra_resource_health_server::DraResourceHealthServer::from_arc(h),
                );
        }
        tasks.push(spawn_server(
            router,
            listener,
            &dra_socket,
            config.observer.clone(),
            cancel.clone(),
            "DRA",
        ));

        // Then registration.
        let (listener, guard) = bind_private(&registration_socket)?;
        guards.push(guard);
        let reg = registration::RegistrationService {
            info: crate::pb::pluginregistration::PluginInfo {
                r#type: "DRAPlugin".into(),
                name: config.driver.to_string(),
                endpoint: dra_socket.display().to_string(),
                supported_versions: config.supported_versions(),
            },
            status: status_tx,
        };
        let router = tonic::transport::Server::builder().add_service(
            crate::pb::pluginregistration::registration_server::RegistrationServer::new(reg),
        );
        tasks.push(spawn_server(
            router,
            listener,
            &registration_socket,
            config.observer.clone(),
            cancel.clone(),
            "registration",
        ));

        Ok(DraPluginHandle {
            dra_socket,
            registration_socket,
            status,
            cancel,
            tasks,
            guards,
        })
    }
}

fn spawn_server(
    router: tonic::transport::server::Router,
    listener: tokio::net::UnixListener,
    socket: &Path,
    observer: Option<crate::authority::RequestObserver>,
    cancel: CancellationToken,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    let incoming = crate::authority::incoming_observed(listener, socket, observer);
    tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
            .await
        {
            tracing::error!(server = what, error = %error_chain(&e), "server failed");
        }
    })
}

/// The per-claim answers of one prepare call, keyed by claim UID.
pub(crate) type PrepareResults = BTreeMap<String, Result<Vec<PreparedClaimDevice>, ClaimError>>;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_follow_the_kubelet_layout() {
        let d = DriverName::new("gpu.example.com").unwrap();
        let c = DraPluginConfig::new(d.clone());
        assert_eq!(
            c.dra_socket().unwrap(),
            Path::new("/var/lib/kubelet/plugins/gpu.example.com/dra.sock")
        );
        assert_eq!(
            c.registration_socket().unwrap(),
            Path::new("/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock")
        );
        let uid = "0b4c6a8e-8c4f-4d7e-9d1e-3f6b2a1c9e77";
        let c = c.pod_uid(uid);
        assert_eq!(
            c.dra_socket().unwrap(),
            Path::new("/var/lib/kubelet/plugins/gpu.example.com").join(format!("dra-{uid}.sock"))
        );
        assert_eq!(
            c.registration_socket().unwrap(),
            Path::new("/var/lib/kubelet/plugins_registry")
                .join(format!("gpu.example.com-{uid}-reg.sock"))
        );
    }

    #[test]
    fn the_longest_driver_name_fits_the_kubelets_directories_with_a_pod_uid() {
        let uid = "0b4c6a8e-8c4f-4d7e-9d1e-3f6b2a1c9e77";
        let longest = DriverName::new(format!("{}.example.com", "a".repeat(51))).unwrap();
        assert_eq!(longest.as_str().len(), 63);
        for c in [
            DraPluginConfig::new(longest.clone()),
            DraPluginConfig::new(longest.clone()).pod_uid(uid),
        ] {
            for p in [c.dra_socket().unwrap(), c.registration_socket().unwrap()] {
                assert!(p.as_os_str().len() <= 107, "{}", p.display());
            }
        }
        let c = DraPluginConfig::new(longest).pod_uid(uid);
        // Still per instance: the UID's first 8 characters are in both names.
        assert!(c.dra_socket().unwrap().ends_with("dra-0b4c6a8e.sock"));
        assert!(
            c.registration_socket()
                .unwrap()
                .to_str()
                .unwrap()
                .ends_with("-0b4c6a8e-reg.sock")
        );
    }

    #[test]
    fn a_directory_that_leaves_no_room_is_refused_naming_the_path() {
        let c = DraPluginConfig::new(DriverName::new("gpu.example.com").unwrap())
            .registry_dir(format!("/{}", "r".repeat(100)));
        let e = c.registration_socket().unwrap_err().to_string();
        assert!(e.contains("/rrrr") && e.contains("107 bytes"), "{e}");
    }

    #[test]
    fn advertises_dra_versions_then_health() {
        let c = DraPluginConfig::new(DriverName::new("x.example.com").unwrap());
        assert_eq!(
            c.supported_versions(),
            ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        );
        let c = c.health(true);
        assert_eq!(c.supported_versions().len(), 4);
    }
}
