//! Serving, registering and re-registering one device-plugin server across kubelet restarts.

use std::sync::Arc;
use std::time::Duration;

use kubedev_core::dirwatch::{DirEvent, DirWatch};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::service::Service;
use super::{
    API_VERSION, DevicePluginConfig, DevicePluginHandler, KUBELET_SOCKET, PluginDevice,
    PluginStatus,
};
use crate::error::Error;
use crate::pb::deviceplugin::v1beta1 as api;
use crate::uds::{SocketGuard, bind_private, dial};
use kubedev_core::echo::chain as error_chain;

/// A serving generation: the socket and the server task behind it.
struct Serving {
    guard: SocketGuard,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Serving {
    async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
        drop(self.guard);
    }
}

fn serve(
    config: &DevicePluginConfig,
    socket: &std::path::Path,
    handler: &Arc<dyn DevicePluginHandler>,
    devices: &watch::Receiver<Vec<PluginDevice>>,
    cancel: &CancellationToken,
) -> Result<Serving, Error> {
    let (listener, guard) = bind_private(socket)?;
    let stop = cancel.child_token();
    let service = Service {
        resource: config.resource.to_string(),
        devices: devices.clone(),
        handler: handler.clone(),
        pre_start_timeout: config.pre_start_timeout,
        shutdown: stop.clone(),
    };
    let server = tonic::transport::Server::builder()
        .add_service(api::device_plugin_server::DevicePluginServer::new(service));
    let signal = stop.clone();
    let resource = config.resource.to_string();
    let incoming = crate::authority::incoming_observed(listener, socket, config.observer.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = server
            .serve_with_incoming_shutdown(incoming, signal.cancelled_owned())
            .await
        {
            tracing::error!(%resource, error = %error_chain(&e), "device-plugin server failed");
        }
    });
    Ok(Serving { guard, stop, task })
}

async fn register(
    config: &DevicePluginConfig,
    socket: &std::path::Path,
    pre_start: bool,
) -> Result<(), Error> {
    let kubelet = config.kubelet_socket_path();
    let endpoint = socket
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let channel = dial(&kubelet, Duration::from_secs(5)).await?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    let request = api::RegisterRequest {
        version: API_VERSION.to_string(),
        endpoint,
        resource_name: config.resource.to_string(),
        options: Some(api::DevicePluginOptions {
            pre_start_required: pre_start,
            get_preferred_allocation_available: true,
        }),
    };
    client
        .register(request)
        .await
        .map(|_| ())
        .map_err(|s| Error::Register {
            resource: config.resource.to_string(),
            path: kubelet.clone(),
            message: s.message().to_string(),
        })
}

/// Identifies one incarnation of a socket file: inode plus change time, so a re-created socket
/// that reuses the inode still counts as new.
fn socket_ino(path: &std::path::Path) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Runs until `cancel`: serve, register, and start over whenever the kubelet restarts.
pub(super) async fn run(
    config: DevicePluginConfig,
    socket: std::path::PathBuf,
    handler: Arc<dyn DevicePluginHandler>,
    devices: watch::Receiver<Vec<PluginDevice>>,
    status: watch::Sender<PluginStatus>,
    cancel: CancellationToken,
) {
    let mut plugin = Lifecycle::new(config, socket, handler, devices, status, cancel);
    loop {
        match plugin.serve_if_gone().await {
            Served::Serving => {}
            Served::Retry => continue,
            Served::Cancelled => break,
        }
        plugin.register_if_due().await;
        match plugin.wait().await {
            Wake::Cancelled => break,
            Wake::Timer => {}
            Wake::Dir(event) => plugin.on_dir_event(event),
        }
    }
    plugin.stop().await;
}

/// One device-plugin server's state across kubelet restarts.
struct Lifecycle {
    config: DevicePluginConfig,
    socket: std::path::PathBuf,
    handler: Arc<dyn DevicePluginHandler>,
    devices: watch::Receiver<Vec<PluginDevice>>,
    status: watch::Sender<PluginStatus>,
    cancel: CancellationToken,
    resource: String,
    /// The file name of our socket in the plugin directory.
    socket_name: std::ffi::OsString,
    /// The file name of the kubelet's registration socket.
    kubelet_name: std::ffi::OsString,
    /// The plugin directory's changes; `None` when it cannot be watched (retries only).
    watch: Option<DirWatch>,
    pre_start: bool,
    serving: Option<Serving>,
    /// Failed registrations in a row: the index into the backoff schedule.
    attempt: usize,
    /// The inode of the kubelet socket we last registered with: a "created" event for the
    /// same socket (seen after we already registered with it) needs no second registration.
    registered_with: Option<(u64, i64, i64)>,
    /// When to try registering next; `None` while registered.
    next_try: Option<Instant>,
}

/// The server's state after [`Lifecycle::serve_if_gone`].
enum Served {
    /// Serving: go on to registration.
    Serving,
    /// Serving failed and a second went by: try again.
    Retry,
    /// Cancelled while waiting to retry.
    Cancelled,
}

/// What ended a [`Lifecycle::wait`].
enum Wake {
    /// The plugin is stopping.
    Cancelled,
    /// The next registration attempt is due (or an hour went by).
    Timer,
    /// Something changed in the plugin directory.
    Dir(DirEvent),
}

impl Lifecycle {
    fn new(
        config: DevicePluginConfig,
        socket: std::path::PathBuf,
        handler: Arc<dyn DevicePluginHandler>,
        devices: watch::Receiver<Vec<PluginDevice>>,
        status: watch::Sender<PluginStatus>,
        cancel: CancellationToken,
    ) -> Self {
        let resource = config.resource.to_string();
        let socket_name = socket
            .file_name()
            .map(|f| f.to_os_string())
            .unwrap_or_default();
        let kubelet_name = config
            .kubelet_socket_path()
            .file_name()
            .map(|f| f.to_os_string())
            .unwrap_or_else(|| KUBELET_SOCKET.into());
        let watch = match DirWatch::watching(&config.plugin_dir) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(%resource, error = %kubedev_core::echo::Chain(&e), "cannot watch for kubelet restarts; relying on retries");
                None
            }
        };
        let pre_start = handler.needs_pre_start();
        Lifecycle {
            config,
            socket,
            handler,
            devices,
            status,
            cancel,
            resource,
            socket_name,
            kubelet_name,
            watch,
            pre_start,
            serving: None,
            attempt: 0,
            registered_with: None,
            next_try: Some(Instant::now()),
        }
    }

    /// Serves (again) when not serving, the socket is gone or the server stopped.
    async fn serve_if_gone(&mut self) -> Served {
        if !self
            .serving
            .as_ref()
            .is_none_or(|s| !s.guard.still_ours() || s.task.is_finished())
        {
            return Served::Serving;
        }
        let resource = &self.resource;
        if let Some(old) = self.serving.take() {
            tracing::info!(%resource, "socket gone or server stopped; serving again");
            old.shutdown().await;
        }
        match serve(
            &self.config,
            &self.socket,
            &self.handler,
            &self.devices,
            &self.cancel,
        ) {
            Ok(s) => {
                tracing::info!(%resource, socket = %s.guard.path().display(), "serving");
                self.serving = Some(s);
                self.next_try = Some(Instant::now());
                self.status.send_modify(|st| st.registered = false);
                Served::Serving
            }
            Err(e) => {
                tracing::error!(%resource, error = %kubedev_core::echo::Chain(&e), "cannot serve; retrying");
                self.status
                    .send_modify(|st| st.last_error = Some(kubedev_core::echo::chain(&e)));
                self.next_try = None;
                tokio::select! {
                    _ = self.cancel.cancelled() => Served::Cancelled,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => Served::Retry,
                }
            }
        }
    }

    /// Registers with the kubelet when an attempt is due; a failure schedules the next one.
    async fn register_if_due(&mut self) {
        let Some(at) = self.next_try else {
            return;
        };
        if at > Instant::now() {
            return;
        }
        let resource = &self.resource;
        let kubelet_ino = socket_ino(&self.config.kubelet_socket_path());
        match register(&self.config, &self.socket, self.pre_start).await {
            Ok(()) => {
                self.registered_with = kubelet_ino;
                tracing::info!(%resource, "registered with the kubelet");
                self.attempt = 0;
                self.next_try = None;
                self.status.send_modify(|st| {
                    st.registered = true;
                    st.registrations += 1;
                    st.last_error = None;
                });
            }
            Err(e) => {
                let backoff = &self.config.register_backoff;
                let delay = backoff[self.attempt.min(backoff.len() - 1)];
                self.attempt += 1;
                tracing::warn!(%resource, error = %kubedev_core::echo::Chain(&e), retry_in = ?delay, "registration failed");
                self.next_try = Some(Instant::now() + delay);
                self.status.send_modify(|st| {
                    st.registered = false;
                    st.last_error = Some(kubedev_core::echo::chain(&e));
                });
            }
        }
    }

    /// Waits for cancellation, the next registration attempt or a change in the plugin
    /// directory.
    async fn wait(&mut self) -> Wake {
        let sleep_until = self
            .next_try
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let (cancel, watch) = (&self.cancel, &mut self.watch);
        tokio::select! {
            _ = cancel.cancelled() => Wake::Cancelled,
            _ = tokio::time::sleep_until(sleep_until) => Wake::Timer,
            ev = async {
                match watch.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            } => Wake::Dir(ev),
        }
    }

    /// A change in the plugin directory: a new kubelet socket or a rescan asks for a
    /// registration now.
    fn on_dir_event(&mut self, event: DirEvent) {
        let resource = &self.resource;
        match event {
            DirEvent::Created { name, .. } if name == self.kubelet_name => {
                let same = self.registered_with.is_some()
                    && self.registered_with == socket_ino(&self.config.kubelet_socket_path())
                    && self.status.borrow().registered;
                if !same {
                    tracing::info!(%resource, "kubelet socket created; registering again");
                    self.attempt = 0;
                    self.next_try = Some(Instant::now());
                }
            }
            DirEvent::Deleted { name, .. } if name == self.socket_name => {
                // The kubelet removes plugin sockets when it restarts. The loop's top serves
                // again if the socket now missing is the one we serve (not an older one
                // already replaced), and registers when the kubelet's socket is back.
            }
            DirEvent::Rescan => {
                self.attempt = 0;
                self.next_try = Some(Instant::now());
            }
            _ => {}
        }
    }

    /// Stops serving and says so.
    async fn stop(mut self) {
        if let Some(s) = self.serving.take() {
            s.shutdown().await;
        }
        self.status.send_modify(|st| st.registered = false);
        tracing::info!(resource = %self.resource, "device-plugin server stopped");
    }
}
