//! The resource health stream (`DRAResourceHealth`, `v1alpha1` and `v1`).

use std::pin::Pin;

use futures::Stream;
use kubedev_core::HealthState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::DeviceHealthReport;
use crate::pb::drahealth::{v1, v1alpha1};

/// The kubelet's limit on a health message.
const MAX_MESSAGE_CHARS: usize = 1024;

pub(super) struct HealthService {
    pub(super) devices: watch::Receiver<Vec<DeviceHealthReport>>,
    pub(super) shutdown: CancellationToken,
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

fn v1_snapshot(devices: &[DeviceHealthReport]) -> v1::NodeWatchResourcesResponse {
    v1::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| v1::DeviceHealth {
                device: Some(v1::DeviceIdentifier {
                    pool_name: d.pool.clone(),
                    device_name: d.device.clone(),
                }),
                health: match d.health.state {
                    HealthState::Healthy => v1::HealthStatus::Healthy,
                    HealthState::Unhealthy => v1::HealthStatus::Unhealthy,
                    HealthState::Unknown => v1::HealthStatus::Unknown,
                } as i32,
                last_updated_time: d.last_updated,
                health_check_timeout_seconds: 0,
                message: truncate(d.health.reason.as_deref().unwrap_or("")),
            })
            .collect(),
    }
}

/// A stream of complete snapshots: one at once, then one per change, until shutdown.
fn snapshots<T: Send + 'static>(
    rx: watch::Receiver<Vec<DeviceHealthReport>>,
    shutdown: CancellationToken,
    convert: fn(&[DeviceHealthReport]) -> T,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> {
    Box::pin(futures::stream::unfold(
        (rx, false),
        move |(mut rx, sent)| {
            let shutdown = shutdown.clone();
            async move {
                if sent {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        r = rx.changed() => if r.is_err() { return None },
                    }
                }
                let msg = convert(&rx.borrow_and_update());
                Some((Ok(msg), (rx, true)))
            }
        },
    ))
}

type V1Stream = Pin<Box<dyn Stream<Item = Result<v1::NodeWatchResourcesResponse, Status>> + Send>>;
type V1Alpha1Stream =
    Pin<Box<dyn Stream<Item = Result<v1alpha1::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = V1Stream;

    async fn node_watch_resources(
        &self,
        _request: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(snapshots(
            self.devices.clone(),
            self.shutdown.clone(),
            v1_snapshot,
        )))
    }
}

fn v1alpha1_snapshot(devices: &[DeviceHealthReport]) -> v1alpha1::NodeWatchResourcesResponse {
    // The two versions are identical field for field; convert through the wire format's shape.
    let v1 = v1_snapshot(devices);
    v1alpha1::NodeWatchResourcesResponse {
        devices: v1
            .devices
            .into_iter()
            .map(|d| v1alpha1::DeviceHealth {
                device: d.device.map(|i| v1alpha1::DeviceIdentifier {
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

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = V1Alpha1Stream;

    async fn node_watch_resources(
        &self,
        _request: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(snapshots(
            self.devices.clone(),
            self.shutdown.clone(),
            v1alpha1_snapshot,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubedev_core::Health;

    #[test]
    fn snapshot_maps_states_and_truncates_messages() {
        let devs = vec![
            DeviceHealthReport {
                pool: "p".into(),
                device: "d0".into(),
                health: Health::unhealthy("é".repeat(2000)),
                last_updated: 7,
            },
            DeviceHealthReport {
                pool: "p".into(),
                device: "d1".into(),
                health: Health::unknown("no answer"),
                last_updated: 8,
            },
        ];
        let s = v1_snapshot(&devs);
        assert_eq!(s.devices[0].health, v1::HealthStatus::Unhealthy as i32);
        assert_eq!(s.devices[0].message.chars().count(), 1024);
        assert_eq!(s.devices[1].health, v1::HealthStatus::Unknown as i32);
        let a = v1alpha1_snapshot(&devs);
        assert_eq!(
            a.devices[1].device.as_ref().map(|d| d.device_name.as_str()),
            Some("d1")
        );
        assert_eq!(a.devices[0].last_updated_time, 7);
    }
}
