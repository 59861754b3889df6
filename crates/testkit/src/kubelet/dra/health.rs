//! The resource health stream as the kubelet follows it: what it shows for each device (with
//! the report's timeout), one stream to a driver's health service, and `v1alpha1` read as `v1`.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kubedev_kubelet_grpc::authority::ClientAuthority;
use kubedev_kubelet_grpc::pb::drahealth;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{DEFAULT_HEALTH_TIMEOUT, DeviceHealthSeen, DraState, connect};

/// One device's health with the time the kubelet received it.
#[derive(Debug, Clone)]
pub(super) struct HealthEntry {
    seen: DeviceHealthSeen,
    received: std::time::Instant,
}

impl HealthEntry {
    /// What the kubelet shows now.
    pub(super) fn shown(&self) -> DeviceHealthSeen {
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

/// How long the kubelet waits before it opens a failed or ended health stream again.
pub(super) const HEALTH_RETRY: Duration = Duration::from_secs(5);

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

/// Follows one health stream of `driver` (at `endpoint`, `service` the health service
/// version) until it ends or `cancel` fires, keeping what it reports in `state`; the status
/// code it failed with, if it did. When it ends, the driver's devices are forgotten unless a
/// newer stream of the driver has taken over.
pub(super) async fn follow_health(
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
            Ok(resp) => follow(resp.into_inner(), &cancel, |m| apply(seen(m.into()))).await,
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
