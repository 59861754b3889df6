//! The plugin watcher and registration: every registration socket in the registry directory
//! is asked for its `GetInfo`, validated, given a DRA service version and told the outcome, as
//! the kubelet does; then the driver's health stream is opened as the emulated release opens
//! it.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubedev_kubelet_grpc::pb::pluginregistration as reg;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::health::{HEALTH_RETRY, follow_health};
use super::{DraDriverState, DraState, KubeletDialing, KubeletRelease, connect};

/// How long the kubelet waits before dialing a registration socket again after the connection
/// failed; each failure doubles it, up to [`REGISTRATION_RETRY_MAX`]. The kubelet's plugin
/// manager retries a failed registration the same way (from 500 ms), which is what lets a
/// plugin through whose socket it saw between the plugin's `bind` and `listen`.
const REGISTRATION_RETRY: Duration = Duration::from_millis(500);
const REGISTRATION_RETRY_MAX: Duration = Duration::from_secs(8);

/// Like the kubelet's choice: the first entry of the plugin's list that the kubelet supports.
pub(super) fn choose_version(kubelet: &[String], advertised: &[String]) -> Option<String> {
    advertised.iter().find(|v| kubelet.contains(v)).cloned()
}

/// Sends `NotifyRegistrationStatus` (errors ignored, as the kubelet does).
async fn notify(channel: Channel, ok: bool, error: String) {
    let mut c = reg::registration_client::RegistrationClient::new(channel);
    let _ = c
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: ok,
            error,
        })
        .await;
}

/// Records a change of the kubelet's state and wakes its waiters.
fn update(state: &Mutex<DraState>, changed: &watch::Sender<u64>, f: impl FnOnce(&mut DraState)) {
    f(&mut state.lock());
    changed.send_modify(|n| *n += 1);
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
    let Some((driver, registered)) =
        accept(&versions, &dialing, &socket, &state, &changed, &cancel).await
    else {
        return;
    };
    let endpoint_path = PathBuf::from(&registered.endpoint);
    let unadvertised = release.watches_health_unadvertised();
    let service = match registered.health_service {
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
        update(&state, &changed, |st| {
            st.health_calls
                .entry(driver.clone())
                .or_default()
                .push(outcome);
        });
        if !unadvertised && ended == Some(tonic::Code::Unimplemented) {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(HEALTH_RETRY) => {}
        }
    }
}

/// Registers the plugin behind `socket` as the kubelet does: GetInfo, validation, version
/// choice and `NotifyRegistrationStatus`. The driver's name and what the kubelet keeps of it
/// when accepted; `None`, with the reason among the rejections, when not. A socket that
/// refuses the connection is dialed again (each failure among the rejections) until it answers
/// or `cancel` fires: the socket is gone or replaced, or the kubelet stops.
async fn accept(
    versions: &[String],
    dialing: &KubeletDialing,
    socket: &Path,
    state: &Mutex<DraState>,
    changed: &watch::Sender<u64>,
    cancel: &CancellationToken,
) -> Option<(String, DraDriverState)> {
    let reject = |reason: String| {
        update(state, changed, |st| {
            st.rejected.push((socket.to_path_buf(), reason));
        });
    };
    let mut retry = REGISTRATION_RETRY;
    let channel = loop {
        match connect(socket, &dialing.registration).await {
            Ok(c) => break c,
            Err(e) => reject(e.message().to_string()),
        }
        tokio::select! {
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(REGISTRATION_RETRY_MAX);
    };
    let info = match reg::registration_client::RegistrationClient::new(channel.clone())
        .get_info(reg::InfoRequest {})
        .await
    {
        Ok(i) => i.into_inner(),
        Err(e) => {
            reject(format!("GetInfo: {}", e.message()));
            return None;
        }
    };
    let chosen = choose_version(versions, &info.supported_versions);
    if let Some(p) = registration_problem(&info, chosen.is_some(), versions) {
        reject(p.clone());
        notify(channel, false, p).await;
        return None;
    }
    let health_service = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
        .into_iter()
        .find(|h| info.supported_versions.iter().any(|v| v == h))
        .map(str::to_string);
    let registered = DraDriverState {
        registration_socket: socket.to_path_buf(),
        endpoint: info.endpoint.clone(),
        supported_versions: info.supported_versions.clone(),
        chosen: chosen.unwrap_or_default(),
        health_service,
    };
    let driver = info.name;
    update(state, changed, |st| {
        st.registrations += 1;
        st.drivers.insert(driver.clone(), registered.clone());
    });
    notify(channel, true, String::new()).await;
    Some((driver, registered))
}

/// Why the kubelet refuses the plugin `info` describes, if it does: not a DRA plugin, a driver
/// name that is not a DNS subdomain, a relative endpoint, or no advertised service the kubelet
/// speaks (`versions`; `supported` says whether one was chosen).
fn registration_problem(
    info: &reg::PluginInfo,
    supported: bool,
    versions: &[String],
) -> Option<String> {
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
    problem.or_else(|| {
        (!supported).then(|| {
            format!(
                "none of the advertised services {:?} is supported (kubelet: {:?})",
                info.supported_versions, versions
            )
        })
    })
}

/// The plugin watcher: every `*.sock` that appears in the registry directory is registered; a
/// removed socket deregisters its driver.
pub(super) async fn watch_registry(
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
