//! The resource health stream (`DRAResourceHealth`, `v1alpha1` and `v1`).
//!
//! The kubelet (1.35 and later) keeps each device's health for the device's
//! `health_check_timeout_seconds` after it received it (30 s when the plugin gives none) and
//! shows `Unknown` after that, so the stream sends the complete snapshot at once, again on every
//! change, and again whenever a third of the smallest timeout has passed without one.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use kubedev_core::HealthState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::DeviceHealthReport;
use crate::pb::drahealth::{v1, v1alpha1};

/// The kubelet's limit on a health message.
const MAX_MESSAGE_CHARS: usize = 1024;
/// What a cut message ends with, as the kubelet cuts one.
const CUT_MARK: &str = "...";
/// The kubelet's timeout for a device whose report gives none.
pub const KUBELET_DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest time between two repeats of an unchanged snapshot.
const MIN_REPEAT: Duration = Duration::from_secs(1);

pub(super) struct HealthService {
    pub(super) devices: watch::Receiver<Vec<DeviceHealthReport>>,
    pub(super) shutdown: CancellationToken,
}

/// `s` within the kubelet's limit: a longer message keeps its first 1021 characters and ends
/// with `...`, as the kubelet would show it.
fn truncate(s: &str) -> String {
    if s.chars().nth(MAX_MESSAGE_CHARS).is_none() {
        return s.to_string();
    }
    let keep = MAX_MESSAGE_CHARS - CUT_MARK.chars().count();
    let end = s.char_indices().nth(keep).map_or(s.len(), |(i, _)| i);
    format!("{}{CUT_MARK}", &s[..end])
}

/// How often an unchanged snapshot is sent again: a third of the smallest timeout of its
/// devices (the kubelet's default for those without one), at least a second.
fn repeat_interval(devices: &[DeviceHealthReport]) -> Duration {
    let smallest = devices
        .iter()
        .map(|d| match u64::try_from(d.timeout_seconds) {
            Ok(s) if s > 0 => Duration::from_secs(s),
            _ => KUBELET_DEFAULT_HEALTH_TIMEOUT,
        })
        .min()
        .unwrap_or(KUBELET_DEFAULT_HEALTH_TIMEOUT);
    (smallest / 3).max(MIN_REPEAT)
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
                health_check_timeout_seconds: d.timeout_seconds.max(0),
                message: truncate(d.health.reason.as_deref().unwrap_or("")),
            })
            .collect(),
    }
}

/// A stream of complete snapshots: one at once, then one per change and one whenever
/// [`repeat_interval`] passes without a change, until shutdown.
fn snapshots<T: Send + 'static>(
    rx: watch::Receiver<Vec<DeviceHealthReport>>,
    shutdown: CancellationToken,
    convert: fn(&[DeviceHealthReport]) -> T,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> {
    Box::pin(futures::stream::unfold(
        (rx, None::<Duration>),
        move |(mut rx, repeat)| {
            let shutdown = shutdown.clone();
            async move {
                if let Some(repeat) = repeat {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        r = rx.changed() => if r.is_err() { return None },
                        _ = tokio::time::sleep(repeat) => {}
                    }
                }
                let (msg, repeat) = {
                    let devices = rx.borrow_and_update();
                    (convert(&devices), repeat_interval(&devices))
                };
                Some((Ok(msg), (rx, Some(repeat))))
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
    v1_snapshot(devices).into()
}

/// Converts a health snapshot between the two versions, which are the same message field for
/// field.
macro_rules! same_snapshot {
    ($from:ident => $to:ident) => {
        impl From<$from::NodeWatchResourcesResponse> for $to::NodeWatchResourcesResponse {
            fn from(msg: $from::NodeWatchResourcesResponse) -> Self {
                $to::NodeWatchResourcesResponse {
                    devices: msg
                        .devices
                        .into_iter()
                        .map(|d| $to::DeviceHealth {
                            device: d.device.map(|i| $to::DeviceIdentifier {
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
        }
    };
}

same_snapshot!(v1 => v1alpha1);
same_snapshot!(v1alpha1 => v1);

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
#[allow(clippy::unwrap_used)]
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
                timeout_seconds: 45,
            },
            DeviceHealthReport {
                pool: "p".into(),
                device: "d1".into(),
                health: Health::unknown("no answer"),
                last_updated: 8,
                timeout_seconds: 0,
            },
        ];
        let s = v1_snapshot(&devs);
        assert_eq!(s.devices[0].health, v1::HealthStatus::Unhealthy as i32);
        assert_eq!(s.devices[0].message.chars().count(), 1024);
        assert!(
            s.devices[0].message.ends_with("é..."),
            "{}",
            s.devices[0].message
        );
        assert_eq!(s.devices[0].health_check_timeout_seconds, 45);
        assert_eq!(s.devices[1].health_check_timeout_seconds, 0);
        assert_eq!(s.devices[1].message, "no answer");
        assert_eq!(s.devices[1].health, v1::HealthStatus::Unknown as i32);
        let a = v1alpha1_snapshot(&devs);
        assert_eq!(
            a.devices[1].device.as_ref().map(|d| d.device_name.as_str()),
            Some("d1")
        );
        assert_eq!(a.devices[0].last_updated_time, 7);
        assert_eq!(a.devices[0].health_check_timeout_seconds, 45);
    }

    #[test]
    fn messages_within_the_limit_are_kept_whole() {
        let exact = "x".repeat(MAX_MESSAGE_CHARS);
        assert_eq!(truncate(&exact), exact);
        assert_eq!(truncate(""), "");
    }

    fn report(timeout_seconds: i64) -> DeviceHealthReport {
        DeviceHealthReport {
            pool: "p".into(),
            device: "d".into(),
            health: Health::healthy(),
            last_updated: 0,
            timeout_seconds,
        }
    }

    #[test]
    fn snapshots_repeat_within_a_third_of_the_smallest_timeout() {
        assert_eq!(repeat_interval(&[]), Duration::from_secs(10));
        assert_eq!(repeat_interval(&[report(0)]), Duration::from_secs(10));
        assert_eq!(repeat_interval(&[report(-5)]), Duration::from_secs(10));
        assert_eq!(
            repeat_interval(&[report(0), report(9), report(60)]),
            Duration::from_secs(3)
        );
        assert_eq!(repeat_interval(&[report(1)]), MIN_REPEAT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_snapshot_is_sent_again_before_the_kubelet_would_time_it_out() {
        use futures::StreamExt;
        let (tx, rx) = watch::channel(vec![report(6)]);
        let shutdown = CancellationToken::new();
        let mut stream = snapshots(rx, shutdown.clone(), v1_snapshot);
        let start = tokio::time::Instant::now();
        assert!(stream.next().await.is_some());
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(stream.next().await.is_some());
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // A change goes out at once, and the repeat follows the new timeout.
        tx.send_replace(vec![report(30)]);
        let changed = stream.next().await.unwrap().unwrap();
        assert_eq!(changed.devices[0].health_check_timeout_seconds, 30);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(stream.next().await.is_some());
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        shutdown.cancel();
        assert!(stream.next().await.is_none());
    }
}
