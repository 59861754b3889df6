//! The DRA half of the kubelet emulator: the plugin watcher, registration, prepare/unprepare and
//! the health stream.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubedev_kubelet_grpc::authority::ClientAuthority;
use kubedev_kubelet_grpc::pb::{dra, drahealth, pluginregistration as reg};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::Channel;

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

/// One device's health with the time the kubelet received it.
#[derive(Debug, Clone)]
struct HealthEntry {
    seen: DeviceHealthSeen,
    received: std::time::Instant,
}

impl HealthEntry {
    /// What the kubelet shows now.
    fn shown(&self) -> DeviceHealthSeen {
        let timeout = match u64::try_from(self.seen.timeout_seconds) {
            Ok(s) if s > 0 => Duration::from_secs(s),
            _ => DEFAULT_HEALTH_TIMEOUT,
        };
        if self.received.elapsed() > timeout {
            DeviceHealthSeen {
                health: "UNKNOWN".into(),
                message: String::new(),
                ..self.seen.clone()
            }
        } else {
            self.seen.clone()
        }
    }
}

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

    fn driver(&self, driver: &str) -> Result<DraDriverState, Status> {
        self.drivers()
            .get(driver)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("driver {driver} is not registered")))
    }

    /// Calls `NodePrepareResources` for `claims` (one pod's claims for one driver, batched as the
    /// kubelet does) in the version the kubelet chose; returns one answer per claim UID.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: &[ClaimId],
    ) -> Result<BTreeMap<String, PrepareAnswer>, Status> {
        let d = self.driver(driver)?;
        let channel = connect(Path::new(&d.endpoint), &self.dialing.dra).await?;
        let answer = |err: String| if err.is_empty() { None } else { Some(err) };
        if d.chosen == "v1.DRAPlugin" {
            let mut c = dra::v1::dra_plugin_client::DraPluginClient::new(channel);
            let req = dra::v1::NodePrepareResourcesRequest {
                claims: claims
                    .iter()
                    .map(|c| dra::v1::Claim {
                        namespace: c.namespace.clone(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    })
                    .collect(),
            };
            let resp = c.node_prepare_resources(req).await?.into_inner();
            Ok(resp
                .claims
                .into_iter()
                .map(|(uid, r)| {
                    let v = match answer(r.error) {
                        Some(e) => Err(e),
                        None => Ok(r
                            .devices
                            .into_iter()
                            .map(|d| PreparedDeviceAnswer {
                                request_names: d.request_names,
                                pool: d.pool_name,
                                device: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect()),
                    };
                    (uid, v)
                })
                .collect())
        } else {
            let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(channel);
            let req = dra::v1beta1::NodePrepareResourcesRequest {
                claims: claims
                    .iter()
                    .map(|c| dra::v1beta1::Claim {
                        namespace: c.namespace.clone(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    })
                    .collect(),
            };
            let resp = c.node_prepare_resources(req).await?.into_inner();
            Ok(resp
                .claims
                .into_iter()
                .map(|(uid, r)| {
                    let v = match answer(r.error) {
                        Some(e) => Err(e),
                        None => Ok(r
                            .devices
                            .into_iter()
                            .map(|d| PreparedDeviceAnswer {
                                request_names: d.request_names,
                                pool: d.pool_name,
                                device: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: None,
                            })
                            .collect()),
                    };
                    (uid, v)
                })
                .collect())
        }
    }

    /// Calls `NodeUnprepareResources`; returns one answer per claim UID.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[ClaimId],
    ) -> Result<BTreeMap<String, Result<(), String>>, Status> {
        let d = self.driver(driver)?;
        let channel = connect(Path::new(&d.endpoint), &self.dialing.dra).await?;
        let to_result = |e: String| if e.is_empty() { Ok(()) } else { Err(e) };
        if d.chosen == "v1.DRAPlugin" {
            let mut c = dra::v1::dra_plugin_client::DraPluginClient::new(channel);
            let req = dra::v1::NodeUnprepareResourcesRequest {
                claims: claims
                    .iter()
                    .map(|c| dra::v1::Claim {
                        namespace: c.namespace.clone(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    })
                    .collect(),
            };
            let resp = c.node_unprepare_resources(req).await?.into_inner();
            Ok(resp
                .claims
                .into_iter()
                .map(|(u, r)| (u, to_result(r.error)))
                .collect())
        } else {
            let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(channel);
            let req = dra::v1beta1::NodeUnprepareResourcesRequest {
                claims: claims
                    .iter()
                    .map(|c| dra::v1beta1::Claim {
                        namespace: c.namespace.clone(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    })
                    .collect(),
            };
            let resp = c.node_unprepare_resources(req).await?.into_inner();
            Ok(resp
                .claims
                .into_iter()
                .map(|(u, r)| (u, to_result(r.error)))
                .collect())
        }
    }
}

/// Like the kubelet's choice: the first entry of the plugin's list that the kubelet supports.
fn choose_version(kubelet: &[String], advertised: &[String]) -> Option<String> {
    advertised.iter().find(|v| kubelet.contains(v)).cloned()
}

async fn notify(channel: Channel, ok: bool, error: String) {
    let mut c = reg::registration_client::RegistrationClient::new(channel);
    let _ = c
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: ok,
            error,
        })
        .await;
}

/// Handles one registration socket: GetInfo, validation, version choice, notification, and
/// the health stream as `release`'s kubelet opens it.
async fn register(
    versions: Arc<Vec<String>>,
    release: KubeletRelease,
    dialing: Arc<KubeletDialing>,
    socket: PathBuf,
    state: Arc<Mutex<DraState>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
) {
    let update = |f: &mut dyn FnMut(&mut DraState)| {
        f(&mut state.lock());
        changed.send_modify(|n| *n += 1);
    };
    let reject = |reason: String| {
        let socket = socket.clone();
        let mut r = Some(reason);
        move |st: &mut DraState| {
            if let Some(reason) = r.take() {
                st.rejected.push((socket.clone(), reason));
            }
        }
    };
    let channel = match connect(&socket, &dialing.registration).await {
        Ok(c) => c,
        Err(e) => return update(&mut reject(e.message().to_string())),
    };
    let info = match reg::registration_client::RegistrationClient::new(channel.clone())
        .get_info(reg::InfoRequest {})
        .await
    {
        Ok(i) => i.into_inner(),
        Err(e) => return update(&mut reject(format!("GetInfo: {}", e.message()))),
    };
    let problem = if info.r#type != "DRAPlugin" {
        Some(format!("plugin type {:?} is not DRAPlugin", info.r#type))
    } else if kubedev_core::DriverName::new(info.name.clone()).is_err() {
        Some(format!(
            "driver name {:?} is not a DNS subdomain",
            info.name
        ))
    } else if !Path::new(&info.endpoint).is_absolute() {
        Some(format!(
            "endpoint {:?} is not an absolute path",
            info.endpoint
        ))
    } else {
        None
    };
    let chosen = choose_version(&versions, &info.supported_versions);
    let problem = problem.or_else(|| {
        chosen.is_none().then(|| {
            format!(
                "none of the advertised services {:?} is supported (kubelet: {:?})",
                info.supported_versions, versions
            )
        })
    });
    if let Some(p) = problem {
        update(&mut reject(p.clone()));
        notify(channel, false, p).await;
        return;
    }
    let health_service = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
        .into_iter()
        .find(|h| info.supported_versions.iter().any(|v| v == h))
        .map(str::to_string);
    let driver = info.name.clone();
    let endpoint_path = PathBuf::from(&info.endpoint);
    update(&mut |st| {
        st.registrations += 1;
        st.drivers.insert(
            driver.clone(),
            DraDriverState {
                registration_socket: socket.clone(),
                endpoint: info.endpoint.clone(),
                supported_versions: info.supported_versions.clone(),
                chosen: chosen.clone().unwrap_or_default(),
                health_service: health_service.clone(),
            },
        );
    });
    notify(channel, true, String::new()).await;
    let unadvertised = release.watches_health_unadvertised();
    let service = match health_service {
        _ if unadvertised => "v1alpha1.DRAResourceHealth".to_owned(),
        Some(h) => h,
        None => return,
    };
    loop {
        let ended = follow_health(
            driver.clone(),
            endpoint_path.clone(),
            dialing.dra.clone(),
            service.clone(),
            state.clone(),
            changed.clone(),
            cancel.clone(),
        )
        .await;
        if cancel.is_cancelled() {
            return;
        }
        let outcome = ended.map_or_else(|| "ended".to_owned(), |c| format!("{c:?}"));
        state
            .lock()
            .health_calls
            .entry(driver.clone())
            .or_default()
            .push(outcome);
        changed.send_modify(|n| *n += 1);
        if !unadvertised && ended == Some(tonic::Code::Unimplemented) {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(HEALTH_RETRY) => {}
        }
    }
}

/// How long the kubelet waits before it opens a failed or ended health stream again.
const HEALTH_RETRY: Duration = Duration::from_secs(5);

/// The health snapshot as the kubelet keeps it: `pool/device` → health.
fn seen(msg: drahealth::v1::NodeWatchResourcesResponse) -> Vec<(String, DeviceHealthSeen)> {
    let status_name = |h: i32| match h {
        1 => "HEALTHY",
        2 => "UNHEALTHY",
        _ => "UNKNOWN",
    };
    msg.devices
        .into_iter()
        .map(|d| {
            let id = d
                .device
                .map(|i| format!("{}/{}", i.pool_name, i.device_name))
                .unwrap_or_default();
            let seen = DeviceHealthSeen {
                health: status_name(d.health).into(),
                message: d.message,
                last_updated: d.last_updated_time,
                timeout_seconds: d.health_check_timeout_seconds,
            };
            (id, seen)
        })
        .collect()
}

/// v1alpha1 and v1 are the same message field for field.
fn v1_of(
    msg: drahealth::v1alpha1::NodeWatchResourcesResponse,
) -> drahealth::v1::NodeWatchResourcesResponse {
    drahealth::v1::NodeWatchResourcesResponse {
        devices: msg
            .devices
            .into_iter()
            .map(|d| drahealth::v1::DeviceHealth {
                device: d.device.map(|i| drahealth::v1::DeviceIdentifier {
                    pool_name: i.pool_name,
                    device_name: i.device_name,
                }),
                health: d.health,
                last_updated_time: d.last_updated_time,
                health_check_timeout_seconds: d.health_check_timeout_seconds,
                message: d.message,
            })
            .collect(),
    }
}

/// Hands every message of `stream` to `on` until the stream ends or `cancel` fires; the
/// status code it failed with, if it did.
async fn follow<T>(
    mut stream: tonic::Streaming<T>,
    cancel: &CancellationToken,
    mut on: impl FnMut(T),
) -> Option<tonic::Code> {
    loop {
        let msg = tokio::select! {
            _ = cancel.cancelled() => return None,
            m = stream.message() => m,
        };
        match msg {
            Ok(Some(m)) => on(m),
            Ok(None) => return None,
            Err(status) => return Some(status.code()),
        }
    }
}

async fn follow_health(
    driver: String,
    endpoint: PathBuf,
    authority: ClientAuthority,
    service: String,
    state: Arc<Mutex<DraState>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
) -> Option<tonic::Code> {
    let channel = match connect(&endpoint, &authority).await {
        Ok(c) => c,
        Err(status) => return Some(status.code()),
    };
    let stream_id = {
        let mut st = state.lock();
        let id = st.registrations;
        st.health_streams.insert(driver.clone(), id);
        id
    };
    let apply = |devices: Vec<(String, DeviceHealthSeen)>| {
        let received = std::time::Instant::now();
        let mut st = state.lock();
        if st.health_streams.get(&driver) != Some(&stream_id) {
            // A newer stream of the driver's reports.
            return;
        }
        let known = st.health.entry(driver.clone()).or_default();
        for (id, seen) in devices {
            known.insert(id, HealthEntry { seen, received });
        }
        *st.health_snapshots.entry(driver.clone()).or_default() += 1;
        drop(st);
        changed.send_modify(|n| *n += 1);
    };
    let ended = if service == "v1.DRAResourceHealth" {
        let mut c =
            drahealth::v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
        let req = drahealth::v1::NodeWatchResourcesRequest {};
        match c.node_watch_resources(req).await {
            Ok(resp) => follow(resp.into_inner(), &cancel, |m| apply(seen(m))).await,
            Err(status) => Some(status.code()),
        }
    } else {
        let mut c =
            drahealth::v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
        let req = drahealth::v1alpha1::NodeWatchResourcesRequest {};
        match c.node_watch_resources(req).await {
            Ok(resp) => follow(resp.into_inner(), &cancel, |m| apply(seen(v1_of(m)))).await,
            Err(status) => Some(status.code()),
        }
    };
    // The stream is over: the kubelet forgets the driver's devices (they show as unknown),
    // unless a newer stream of the driver has taken over.
    let mut st = state.lock();
    if st.health_streams.get(&driver) == Some(&stream_id) {
        st.health_streams.remove(&driver);
        st.health.remove(&driver);
    }
    drop(st);
    changed.send_modify(|n| *n += 1);
    ended
}

/// The plugin watcher: every `*.sock` that appears in the registry directory is registered; a
/// removed socket deregisters its driver.
async fn watch_registry(
    versions: Arc<Vec<String>>,
    release: KubeletRelease,
    dialing: Arc<KubeletDialing>,
    dir: PathBuf,
    state: Arc<Mutex<DraState>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
) {
    // Socket path → (its incarnation, the task following it). A socket re-created at the same
    // path (a plugin restart) is a new registration, as the kubelet's inotify watcher sees it.
    let mut known: BTreeMap<PathBuf, ((u64, i64, i64), CancellationToken)> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut present = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            let is_sock = p.extension().is_some_and(|x| x == "sock")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if is_sock {
                present.push(p);
            }
        }
        for p in &present {
            use std::os::unix::fs::MetadataExt;
            let Ok(meta) = std::fs::symlink_metadata(p) else {
                continue;
            };
            let ident = (meta.ino(), meta.ctime(), meta.ctime_nsec());
            if known.get(p).is_some_and(|(i, _)| *i == ident) {
                continue;
            }
            if let Some((_, old)) = known.remove(p) {
                old.cancel();
            }
            let token = cancel.child_token();
            known.insert(p.clone(), (ident, token.clone()));
            tokio::spawn(register(
                versions.clone(),
                release,
                dialing.clone(),
                p.clone(),
                state.clone(),
                changed.clone(),
                token,
            ));
        }
        let gone: Vec<PathBuf> = known
            .keys()
            .filter(|k| !present.contains(k))
            .cloned()
            .collect();
        for p in gone {
            if let Some((_, t)) = known.remove(&p) {
                t.cancel();
            }
            let mut st = state.lock();
            st.drivers.retain(|_, d| d.registration_socket != p);
            drop(st);
            changed.send_modify(|n| *n += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_the_first_advertised_version_it_supports() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let kubelet = v(&KUBELET_DRA_SERVICES);
        assert_eq!(
            choose_version(&kubelet, &v(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])).as_deref(),
            Some("v1beta1.DRAPlugin")
        );
        assert_eq!(
            choose_version(&kubelet, &v(&["v2.DRAPlugin", "v1.DRAPlugin"])).as_deref(),
            Some("v1.DRAPlugin")
        );
        assert_eq!(choose_version(&kubelet, &v(&["v1alpha4.DRAPlugin"])), None);
        let old = v(&["v1beta1.DRAPlugin"]);
        assert_eq!(
            choose_version(&old, &v(&["v1.DRAPlugin", "v1beta1.DRAPlugin"])).as_deref(),
            Some("v1beta1.DRAPlugin")
        );
    }
}
