//! The device-plugin half of the kubelet emulator.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubedev_core::ExtendedResourceName;
use kubedev_kubelet_grpc::pb::deviceplugin::v1beta1 as api;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::{KubeletDialing, KubeletRelease};

/// The versions of the device-plugin API this kubelet accepts.
const SUPPORTED_VERSIONS: &[&str] = &["v1beta1"];

/// One device as the kubelet last saw it in a ListAndWatch snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// Health string as sent (`Healthy` or `Unhealthy`).
    pub health: String,
    /// NUMA nodes from the topology.
    pub numa_nodes: Vec<i64>,
}

/// What the kubelet knows about one extended resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceState {
    /// The plugin's socket file name, from its registration.
    pub endpoint: String,
    /// Options from the registration request.
    pub pre_start_required: bool,
    /// Options from the registration request.
    pub preferred_allocation_available: bool,
    /// Devices from the latest snapshot, by ID.
    pub devices: BTreeMap<String, DeviceState>,
    /// Number of devices (the node's capacity for the resource).
    pub capacity: usize,
    /// Number of healthy devices (the node's allocatable).
    pub allocatable: usize,
    /// Snapshots received on the current stream.
    pub snapshots: u64,
    /// True while the ListAndWatch stream is open.
    pub connected: bool,
    /// The error that ended the last stream, if any.
    pub stream_error: Option<String>,
}

/// One registration attempt as the kubelet judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationRecord {
    /// The resource name sent.
    pub resource: String,
    /// The endpoint sent.
    pub endpoint: String,
    /// The version sent.
    pub version: String,
    /// `None` when accepted, else the rejection message.
    pub rejected: Option<String>,
    /// When it arrived, relative to the emulator's start.
    pub at: Duration,
}

#[derive(Debug, Default)]
struct State {
    resources: BTreeMap<String, ResourceState>,
    registrations: Vec<RegistrationRecord>,
    /// Bumped on every restart, so streams of an old kubelet life stop updating.
    epoch: u64,
}

#[derive(Clone)]
struct Shared {
    dir: PathBuf,
    dialing: Arc<KubeletDialing>,
    started: Instant,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    cancel: CancellationToken,
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock());
        self.changed.send_modify(|n| *n += 1);
        r
    }
}

/// The kubelet emulator; see the module docs.
pub struct KubeletEmulator {
    shared: Shared,
    server_cancel: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for KubeletEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletEmulator")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// Dials a plugin's socket as the kubelet's device manager does.
async fn dial_plugin(shared: &Shared, endpoint: &str) -> Result<Channel, Status> {
    let path = shared.dir.join(endpoint);
    kubedev_kubelet_grpc::authority::dial(
        &path,
        shared.dialing.device_plugin.clone(),
        Duration::from_secs(5),
    )
    .await
    .map_err(|e| Status::unavailable(format!("dialing plugin: {}", kubedev_core::echo::chain(&e))))
}

impl KubeletEmulator {
    /// Starts serving `Registration` on `<dir>/kubelet.sock`; `dir` must exist.
    pub async fn start(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        Self::start_release(dir, KubeletRelease::default()).await
    }

    /// Like [`start`](Self::start), dialing plugins as the kubelet of `release` does.
    pub async fn start_release(
        dir: impl Into<PathBuf>,
        release: KubeletRelease,
    ) -> std::io::Result<Self> {
        let (changed, _) = watch::channel(0);
        let shared = Shared {
            dir: dir.into(),
            dialing: Arc::new(release.dialing()),
            started: Instant::now(),
            state: Arc::default(),
            changed,
            cancel: CancellationToken::new(),
        };
        let mut emu = KubeletEmulator {
            shared,
            server_cancel: CancellationToken::new(),
            server: None,
        };
        emu.listen()?;
        Ok(emu)
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The kubelet's socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.shared.dir.join("kubelet.sock")
    }

    fn listen(&mut self) -> std::io::Result<()> {
        let path = self.socket_path();
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        self.server_cancel = self.shared.cancel.child_token();
        let svc = RegistrationService {
            shared: self.shared.clone(),
        };
        let stop = self.server_cancel.clone();
        // The kubelet's grpc-go server takes any :authority, as the layer does.
        let incoming = kubedev_kubelet_grpc::authority::incoming(listener, &path);
        self.server = Some(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(api::registration_server::RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await;
        }));
        Ok(())
    }

    /// Restarts like the kubelet does: stop serving, drop every plugin connection, delete every
    /// socket in the directory, and listen on a fresh `kubelet.sock`.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.server_cancel.cancel();
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        self.shared.update(|st| {
            st.epoch += 1;
            for r in st.resources.values_mut() {
                r.connected = false;
            }
        });
        for entry in std::fs::read_dir(&self.shared.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_socket() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        self.listen()
    }

    /// Stops the emulator and every stream it follows; removes `kubelet.sock`.
    pub async fn stop(mut self) {
        self.shared.cancel.cancel();
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
        let _ = std::fs::remove_file(self.socket_path());
    }

    /// A copy of what the kubelet knows about `resource`.
    pub fn resource(&self, resource: &str) -> Option<ResourceState> {
        self.shared.state.lock().resources.get(resource).cloned()
    }

    /// Every registration attempt so far, in order.
    pub fn registrations(&self) -> Vec<RegistrationRecord> {
        self.shared.state.lock().registrations.clone()
    }

    /// Waits until `cond` holds for `resource`'s state (absent counts as default), at most
    /// `timeout`; returns the state that satisfied it.
    pub async fn wait_for(
        &self,
        resource: &str,
        timeout: Duration,
        cond: impl Fn(&ResourceState) -> bool,
    ) -> Option<ResourceState> {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let st = self.resource(resource).unwrap_or_default();
            if cond(&st) {
                return Some(st);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// Time since the emulator started (the clock of [`RegistrationRecord::at`]).
    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Waits until a registration of `resource` made after `since` (emulator uptime) was
    /// accepted, at most `timeout`.
    pub async fn wait_registered_since(
        &self,
        resource: &str,
        since: Duration,
        timeout: Duration,
    ) -> bool {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self
                .registrations()
                .iter()
                .any(|r| r.resource == resource && r.rejected.is_none() && r.at >= since)
            {
                return true;
            }
            if !matches!(
                tokio::time::timeout_at(deadline, rx.changed()).await,
                Ok(Ok(()))
            ) {
                return false;
            }
        }
    }

    /// Waits until `n` registrations were accepted in all, at most `timeout`.
    pub async fn wait_registrations(&self, n: usize, timeout: Duration) -> bool {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let accepted = self
                .registrations()
                .iter()
                .filter(|r| r.rejected.is_none())
                .count();
            if accepted >= n {
                return true;
            }
            if !matches!(
                tokio::time::timeout_at(deadline, rx.changed()).await,
                Ok(Ok(()))
            ) {
                return false;
            }
        }
    }

    async fn client(
        &self,
        resource: &str,
    ) -> Result<api::device_plugin_client::DevicePluginClient<Channel>, Status> {
        let st = self
            .resource(resource)
            .ok_or_else(|| Status::not_found(format!("resource {resource} is not registered")))?;
        let channel = dial_plugin(&self.shared, &st.endpoint).await?;
        Ok(api::device_plugin_client::DevicePluginClient::new(channel))
    }

    /// Calls `Allocate` for one container with `ids`, as the kubelet does.
    pub async fn allocate(
        &self,
        resource: &str,
        ids: &[&str],
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let mut c = self.client(resource).await?;
        let req = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        let mut resp = c.allocate(req).await?.into_inner();
        if resp.container_responses.len() != 1 {
            return Err(Status::internal(format!(
                "plugin answered {} container responses for 1 request",
                resp.container_responses.len()
            )));
        }
        Ok(resp.container_responses.remove(0))
    }

    /// Calls `Allocate` with a raw request (for malformed-input tests).
    pub async fn allocate_raw(
        &self,
        resource: &str,
        req: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, Status> {
        Ok(self
            .client(resource)
            .await?
            .allocate(req)
            .await?
            .into_inner())
    }

    /// Calls `GetPreferredAllocation` for one container.
    pub async fn preferred_allocation(
        &self,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let mut c = self.client(resource).await?;
        let req = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must_include.to_vec(),
                allocation_size: size,
            }],
        };
        let mut resp = c.get_preferred_allocation(req).await?.into_inner();
        if resp.container_responses.len() != 1 {
            return Err(Status::internal("wrong number of container responses"));
        }
        Ok(resp.container_responses.remove(0).device_i_ds)
    }

    /// Calls `PreStartContainer`.
    pub async fn pre_start(&self, resource: &str, ids: &[&str]) -> Result<(), Status> {
        let mut c = self.client(resource).await?;
        c.pre_start_container(api::PreStartContainerRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        })
        .await?;
        Ok(())
    }

    /// Calls `GetDevicePluginOptions`.
    pub async fn options(&self, resource: &str) -> Result<api::DevicePluginOptions, Status> {
        let mut c = self.client(resource).await?;
        Ok(c.get_device_plugin_options(api::Empty {})
            .await?
            .into_inner())
    }
}

struct RegistrationService {
    shared: Shared,
}

impl RegistrationService {
    fn validate(req: &api::RegisterRequest) -> Result<(), String> {
        if !SUPPORTED_VERSIONS.contains(&req.version.as_str()) {
            return Err(format!(
                "Unsupported API version: {:?}, supported: {SUPPORTED_VERSIONS:?}",
                req.version
            ));
        }
        ExtendedResourceName::new(req.resource_name.clone())
            .map_err(|e| format!("invalid resource name {:?}: {e}", req.resource_name))?;
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(format!(
                "endpoint {:?} must be a socket file name in the device-plugin directory",
                req.endpoint
            ));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let req = request.into_inner();
        let verdict = Self::validate(&req);
        let shared = self.shared.clone();
        let epoch = shared.update(|st| {
            st.registrations.push(RegistrationRecord {
                resource: req.resource_name.clone(),
                endpoint: req.endpoint.clone(),
                version: req.version.clone(),
                rejected: verdict.as_ref().err().cloned(),
                at: shared.started.elapsed(),
            });
            st.epoch
        });
        if let Err(msg) = verdict {
            return Err(Status::invalid_argument(msg));
        }
        // Like the kubelet: accept, then connect to the plugin in the background.
        tokio::spawn(follow_plugin(shared, req, epoch));
        Ok(Response::new(api::Empty {}))
    }
}

/// Dials the plugin, checks its options and follows its ListAndWatch stream.
async fn follow_plugin(shared: Shared, req: api::RegisterRequest, epoch: u64) {
    let resource = req.resource_name.clone();
    let opts = req.options.unwrap_or_default();
    let set_error = |shared: &Shared, msg: String| {
        shared.update(|st| {
            if st.epoch == epoch
                && let Some(r) = st.resources.get_mut(&resource)
                && r.endpoint == req.endpoint
            {
                r.connected = false;
                r.stream_error = Some(msg);
            }
        });
    };
    shared.update(|st| {
        let r = st.resources.entry(resource.clone()).or_default();
        r.endpoint = req.endpoint.clone();
        r.pre_start_required = opts.pre_start_required;
        r.preferred_allocation_available = opts.get_preferred_allocation_available;
        r.snapshots = 0;
        r.connected = false;
        r.stream_error = None;
    });
    let channel = match dial_plugin(&shared, &req.endpoint).await {
        Ok(c) => c,
        Err(s) => return set_error(&shared, s.message().to_string()),
    };
    let mut client = api::device_plugin_client::DevicePluginClient::new(channel);
    if let Err(s) = client.get_device_plugin_options(api::Empty {}).await {
        return set_error(&shared, format!("GetDevicePluginOptions: {}", s.message()));
    }
    let mut stream = match client.list_and_watch(api::Empty {}).await {
        Ok(s) => s.into_inner(),
        Err(s) => return set_error(&shared, format!("ListAndWatch: {}", s.message())),
    };
    loop {
        let msg = tokio::select! {
            _ = shared.cancel.cancelled() => return,
            m = stream.message() => m,
        };
        let still_current = |st: &State| {
            st.epoch == epoch
                && st
                    .resources
                    .get(&resource)
                    .is_some_and(|r| r.endpoint == req.endpoint)
        };
        match msg {
            Ok(Some(snapshot)) => {
                let stale = shared.update(|st| {
                    if !still_current(st) {
                        return true;
                    }
                    let r = st.resources.get_mut(&resource).expect("checked above");
                    r.devices = snapshot
                        .devices
                        .iter()
                        .map(|d| {
                            (
                                d.id.clone(),
                                DeviceState {
                                    health: d.health.clone(),
                                    numa_nodes: d
                                        .topology
                                        .as_ref()
                                        .map(|t| t.nodes.iter().map(|n| n.id).collect())
                                        .unwrap_or_default(),
                                },
                            )
                        })
                        .collect();
                    r.capacity = r.devices.len();
                    r.allocatable = r.devices.values().filter(|d| d.health == "Healthy").count();
                    r.snapshots += 1;
                    r.connected = true;
                    false
                });
                if stale {
                    return;
                }
            }
            Ok(None) => return set_error(&shared, "stream ended".into()),
            Err(s) => return set_error(&shared, s.message().to_string()),
        }
    }
}
