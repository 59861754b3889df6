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
use crate::Error;
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
    let incoming = crate::authority::incoming(listener, socket);
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
    let mut watch = match DirWatch::watching(&config.plugin_dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(%resource, error = %kubedev_core::echo::Chain(&e), "cannot watch for kubelet restarts; relying on retries");
            None
        }
    };
    let pre_start = handler.needs_pre_start();
    let mut serving: Option<Serving> = None;
    let mut attempt = 0usize;
    // The inode of the kubelet socket we last registered with: a "created" event for the same
    // socket (seen after we already registered with it) needs no second registration.
    let mut registered_with: Option<(u64, i64, i64)> = None;
    // When to try registering next; `None` while registered.
    let mut next_try: Option<Instant> = Some(Instant::now());
    loop {
        if serving
            .as_ref()
            .is_none_or(|s| !s.guard.still_ours() || s.task.is_finished())
        {
            if let Some(old) = serving.take() {
                tracing::info!(%resource, "socket gone or server stopped; serving again");
                old.shutdown().await;
            }
            match serve(&config, &socket, &handler, &devices, &cancel) {
                Ok(s) => {
                    tracing::info!(%resource, socket = %s.guard.path().display(), "serving");
                    serving = Some(s);
                    next_try = Some(Instant::now());
                    status.send_modify(|st| st.registered = false);
                }
                Err(e) => {
                    tracing::error!(%resource, error = %kubedev_core::echo::Chain(&e), "cannot serve; retrying");
                    status.send_modify(|st| st.last_error = Some(kubedev_core::echo::chain(&e)));
                    next_try = None;
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        }
        if let Some(at) = next_try
            && at <= Instant::now()
        {
            let kubelet_ino = socket_ino(&config.kubelet_socket_path());
            match register(&config, &socket, pre_start).await {
                Ok(()) => {
                    registered_with = kubelet_ino;
                    tracing::info!(%resource, "registered with the kubelet");
                    attempt = 0;
                    next_try = None;
                    status.send_modify(|st| {
                        st.registered = true;
                        st.registrations += 1;
                        st.last_error = None;
                    });
                }
                Err(e) => {
                    let delay =
                        config.register_backoff[attempt.min(config.register_backoff.len() - 1)];
                    attempt += 1;
                    tracing::warn!(%resource, error = %kubedev_core::echo::Chain(&e), retry_in = ?delay, "registration failed");
                    next_try = Some(Instant::now() + delay);
                    status.send_modify(|st| {
                        st.registered = false;
                        st.last_error = Some(kubedev_core::echo::chain(&e));
                    });
                }
            }
        }
        let sleep_until = next_try.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(sleep_until) => {}
            ev = async {
                match watch.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            } => match ev {
                DirEvent::Created { name, .. } if name == kubelet_name => {
                    let same = registered_with.is_some()
                        && registered_with == socket_ino(&config.kubelet_socket_path())
                        && status.borrow().registered;
                    if !same {
                        tracing::info!(%resource, "kubelet socket created; registering again");
                        attempt = 0;
                        next_try = Some(Instant::now());
                    }
                }
                DirEvent::Deleted { name, .. } if name == socket_name => {
                    // The kubelet removes plugin sockets when it restarts. The loop's top serves
                    // again if the socket now missing is the one we serve (not an older one
                    // already replaced), and registers when the kubelet's socket is back.
                }
                DirEvent::Rescan => {
                    attempt = 0;
                    next_try = Some(Instant::now());
                }
                _ => {}
            },
        }
    }
    if let Some(s) = serving.take() {
        s.shutdown().await;
    }
    status.send_modify(|st| st.registered = false);
    tracing::info!(%resource, "device-plugin server stopped");
}
