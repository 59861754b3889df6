//! The DRA half of the kubelet emulator: the plugin watcher and registration
//! ([`registration`]), prepare/unprepare ([`calls`]) and the health stream ([`health`]).

mod calls;
mod health;
mod registration;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubedev_kubelet_grpc::authority::ClientAuthority;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::Channel;

use self::health::HealthEntry;
use self::registration::watch_registry;
use super::{KubeletDialing, KubeletRelease};

/// The DRA service versions a current kubelet speaks.
pub const KUBELET_DRA_SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A claim as the kubelet names it in prepare and unprepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

impl ClaimId {
    /// A claim reference.
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        ClaimId {
            namespace: namespace.into(),
            uid: uid.into(),
            name: name.into(),
        }
    }
}

/// One device in a prepare answer (the same for both API versions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDeviceAnswer {
    /// Request names.
    pub request_names: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// CDI device IDs.
    pub cdi_device_ids: Vec<String>,
    /// Share ID (v1 only).
    pub share_id: Option<String>,
}

/// The kubelet's view of one claim's prepare answer.
pub type PrepareAnswer = Result<Vec<PreparedDeviceAnswer>, String>;

/// One registered DRA driver as the kubelet knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDriverState {
    /// The registration socket it was found on.
    pub registration_socket: PathBuf,
    /// The DRA endpoint from GetInfo.
    pub endpoint: String,
    /// The versions it advertised.
    pub supported_versions: Vec<String>,
    /// The DRA service version the kubelet chose.
    pub chosen: String,
    /// Whether it advertised a health service.
    pub health_service: Option<String>,
}

/// One device's health as the kubelet shows it from the health stream.
///
/// As the kubelet (1.35 and later) keeps it: each report updates only the devices it lists;
/// a device keeps its health for its `health_check_timeout_seconds` after the report arrived
/// (the kubelet's default, 30 s, when the plugin gave none or a negative value) and shows
/// `UNKNOWN` with no message after that; when the stream ends, the driver's devices are
/// forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthSeen {
    /// `HEALTHY`, `UNHEALTHY` or `UNKNOWN`.
    pub health: String,
    /// The message.
    pub message: String,
    /// Last-updated time from the plugin.
    pub last_updated: i64,
    /// The timeout the plugin gave, in seconds (0 or less: the kubelet's default).
    pub timeout_seconds: i64,
}

/// The kubelet's timeout for a device whose report gives none.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// What the kubelet knows of its DRA drivers.
#[derive(Debug, Default)]
struct DraState {
    drivers: BTreeMap<String, DraDriverState>,
    /// Rejections: (socket, reason).
    rejected: Vec<(PathBuf, String)>,
    /// driver → (pool/device → health).
    health: BTreeMap<String, BTreeMap<String, HealthEntry>>,
    health_snapshots: BTreeMap<String, u64>,
    /// driver → the health stream that last started for it (a plugin's new instance opens a
    /// new one while the old one may still be ending).
    health_streams: BTreeMap<String, u64>,
    /// driver → how each health stream the kubelet opened ended (`Unimplemented`, `ended`, …).
    health_calls: BTreeMap<String, Vec<String>>,
    registrations: u64,
}

/// The kubelet's DRA side: watches the plugin registry directory like the plugin watcher.
#[derive(Debug)]
pub struct DraKubelet {
    registry_dir: PathBuf,
    dialing: Arc<KubeletDialing>,
    state: Arc<Mutex<DraState>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Dials `path` sending the `:authority` the emulated kubelet sends on that kind of socket.
async fn connect(path: &Path, authority: &ClientAuthority) -> Result<Channel, Status> {
    kubedev_kubelet_grpc::authority::dial(path, authority.clone(), Duration::from_secs(5))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))
}

impl DraKubelet {
    /// Starts watching `registry_dir` (created if missing) for `*.sock` registration sockets.
    pub fn start(registry_dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        Self::start_with_versions(registry_dir, &KUBELET_DRA_SERVICES)
    }

    /// Like [`start`](Self::start), dialing as the kubelet of `release` does.
    pub fn start_release(
        registry_dir: impl Into<PathBuf>,
        release: KubeletRelease,
    ) -> std::io::Result<Self> {
        Self::start_full(registry_dir, &KUBELET_DRA_SERVICES, release)
    }

    /// Like [`start`](Self::start), for a kubelet that speaks only `versions` (e.g. an older
    /// kubelet with only `v1beta1.DRAPlugin`).
    pub fn start_with_versions(
        registry_dir: impl Into<PathBuf>,
        versions: &[&str],
    ) -> std::io::Result<Self> {
        Self::start_full(registry_dir, versions, KubeletRelease::default())
    }

    fn start_full(
        registry_dir: impl Into<PathBuf>,
        versions: &[&str],
        release: KubeletRelease,
    ) -> std::io::Result<Self> {
        let dialing = Arc::new(release.dialing());
        let versions: Arc<Vec<String>> = Arc::new(versions.iter().map(|v| v.to_string()).collect());
        let registry_dir = registry_dir.into();
        std::fs::create_dir_all(&registry_dir)?;
        let (changed, _) = watch::channel(0);
        let mut k = DraKubelet {
            registry_dir,
            dialing: dialing.clone(),
            state: Arc::default(),
            changed,
            cancel: CancellationToken::new(),
            task: None,
        };
        k.task = Some(tokio::spawn(watch_registry(
            versions,
            release,
            dialing,
            k.registry_dir.clone(),
            k.state.clone(),
            k.changed.clone(),
            k.cancel.clone(),
        )));
        Ok(k)
    }

    /// Stops the watcher and every health stream.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// The registered drivers.
    pub fn drivers(&self) -> BTreeMap<String, DraDriverState> {
        self.state.lock().drivers.clone()
    }

    /// How many registrations the kubelet accepted (a plugin that restarts registers again).
    pub fn registrations(&self) -> u64 {
        self.state.lock().registrations
    }

    /// Registration sockets the kubelet rejected, with the reason.
    pub fn rejected(&self) -> Vec<(PathBuf, String)> {
        self.state.lock().rejected.clone()
    }

    /// How each resource health stream this kubelet opened to `driver` ended, oldest first: a
    /// gRPC status code name (`Unimplemented`), or `ended` for a stream the plugin closed.
    pub fn health_calls(&self, driver: &str) -> Vec<String> {
        self.state
            .lock()
            .health_calls
            .get(driver)
            .cloned()
            .unwrap_or_default()
    }

    /// The health the kubelet shows now for `driver`'s devices (`pool/device` → health); see
    /// [`DeviceHealthSeen`] for how reports and timeouts combine.
    pub fn health(&self, driver: &str) -> BTreeMap<String, DeviceHealthSeen> {
        self.state
            .lock()
            .health
            .get(driver)
            .map(|devices| {
                devices
                    .iter()
                    .map(|(id, e)| (id.clone(), e.shown()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until `cond` holds on this kubelet, at most `timeout`.
    pub async fn wait_until(&self, timeout: Duration, cond: impl Fn(&DraKubelet) -> bool) -> bool {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if !matches!(
                tokio::time::timeout_at(deadline, rx.changed()).await,
                Ok(Ok(()))
            ) {
                return cond(self);
            }
        }
    }

    /// The registered driver `driver`; `NotFound` when the kubelet does not know it.
    fn driver(&self, driver: &str) -> Result<DraDriverState, Status> {
        self.drivers()
            .get(driver)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("driver {driver} is not registered")))
    }
}

#[cfg(test)]
mod tests;
