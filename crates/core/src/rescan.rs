//! The whole [`DeviceSource::watch`](crate::source::DeviceSource::watch) of a backend that notices
//! changes by looking again: [`watch_health`] (the backend says what its devices' health is
//! now), [`watch_by_polling`] and [`watch_by_rescan`] (the backend says what changed).

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::dirwatch::DirWatch;
use crate::error::SourceError;
use crate::model::{DeviceRef, Health};
use crate::source::{EventSender, SourceEvent};

/// The shortest `period` [`watch_by_rescan`] waits, so a zero period does not spin.
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// Runs a backend's [`DeviceSource::watch`](crate::source::DeviceSource::watch) by looking again:
/// calls `rescan` at once, then after every change in a directory `dirs` names and at the
/// latest every `period`, and sends the events each call returns, in order.
///
/// - `rescan` compares what it finds with what the backend last reported (by discovery or an
///   earlier rescan) and returns the differences: [`SourceEvent::Health`] for a device whose
///   health changed, [`SourceEvent::Rediscover`] when devices appeared or disappeared. It must
///   not hold a lock the backend's `discover` takes across an `.await`.
/// - `dirs` names the directories whose entries coming and going mean "look again" (the
///   directories of device nodes or sockets), as real paths on this machine
///   ([`HostFs::resolve`](crate::hostfs::HostFs::resolve) gives them). It is asked again before every
///   wait, so a directory that appears later or is created again is watched from then on. A
///   change wakes the loop once however many entries changed at once (inotify, through
///   [`DirWatch`]; polling every `period` when inotify is unavailable). Return an empty list
///   (pass `Vec::new`) to look again every `period` only.
///
/// Returns `Ok(())` once nobody listens any more (the channel is closed); the runtime also stops
/// it by dropping the future. Call it as the body of `watch`:
///
/// ```
/// # use std::time::Duration;
/// # use kubedev_core::{SourceEvent, SourceError, watch_by_rescan};
/// # struct Backend;
/// # impl Backend {
/// #     fn health_changes(&self) -> Vec<SourceEvent> { Vec::new() }
/// # }
/// # async fn watch(b: &Backend, events: tokio::sync::mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
/// // In `impl DeviceSource for Backend`:
/// // async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
/// watch_by_rescan(events, Duration::from_secs(1), Vec::new, || async { b.health_changes() }).await
/// # }
/// ```
pub async fn watch_by_rescan<F>(
    events: EventSender,
    period: Duration,
    mut dirs: impl FnMut() -> Vec<PathBuf>,
    mut rescan: impl FnMut() -> F,
) -> Result<(), SourceError>
where
    F: Future<Output = Vec<SourceEvent>>,
{
    let period = period.max(MIN_PERIOD);
    // Made once there is a directory to watch: a backend that only polls needs no inotify.
    let mut watch: Option<DirWatch> = None;
    loop {
        let dirs = dirs();
        if !dirs.is_empty() {
            let w = watch.get_or_insert_with(DirWatch::new);
            for dir in &dirs {
                w.watch(dir);
            }
        }
        for ev in rescan().await {
            if events.send(ev).await.is_err() {
                return Ok(());
            }
        }
        match &mut watch {
            Some(w) => w.wait(period).await,
            None => tokio::time::sleep(period).await,
        }
        if events.is_closed() {
            return Ok(());
        }
    }
}

/// [`watch_by_rescan`] without directories: calls `rescan` at once and then every `period`,
/// and sends the events each call returns.
pub async fn watch_by_polling<F>(
    events: EventSender,
    period: Duration,
    rescan: impl FnMut() -> F,
) -> Result<(), SourceError>
where
    F: Future<Output = Vec<SourceEvent>>,
{
    watch_by_rescan(events, period, Vec::new, rescan).await
}

/// Runs a backend's [`DeviceSource::watch`](crate::source::DeviceSource::watch) from snapshots: calls
/// `health` at once and then every `period`; each call says what the health of the backend's
/// devices is now.
///
/// - Every snapshot is sent as [`SourceEvent::Health`] events; the runtime keeps what differs
///   from the health it holds (from discovery or an earlier event) and drops the rest, so the
///   backend keeps no record of what it reported.
/// - A device that appears in a snapshot or leaves it means devices came or went: one
///   [`SourceEvent::Rediscover`] follows, and the runtime calls `discover` again.
///
/// Returns `Ok(())` once nobody listens any more.
///
/// ```
/// # use std::time::Duration;
/// # use kubedev_core::{DeviceRef, EventSender, Health, SourceError, watch_health};
/// # struct Backend { cards: Vec<DeviceRef> }
/// # impl Backend {
/// #     fn health(&self, card: &DeviceRef) -> Health { Health::healthy() }
/// # }
/// # async fn watch(b: &Backend, events: EventSender) -> Result<(), SourceError> {
/// // In `impl DeviceSource for Backend`:
/// // async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
/// let now = || b.cards.iter().map(|c| (c.clone(), b.health(c))).collect();
/// watch_health(events, Duration::from_secs(1), now).await
/// # }
/// ```
pub async fn watch_health(
    events: EventSender,
    period: Duration,
    mut health: impl FnMut() -> Vec<(DeviceRef, Health)>,
) -> Result<(), SourceError> {
    let mut last: Option<BTreeSet<DeviceRef>> = None;
    watch_by_polling(events, period, || {
        let now = health();
        let devices: BTreeSet<DeviceRef> = now.iter().map(|(d, _)| d.clone()).collect();
        let came_or_went = last.as_ref().is_some_and(|l| *l != devices);
        last = Some(devices);
        let mut events: Vec<SourceEvent> = now
            .into_iter()
            .map(|(device, health)| SourceEvent::Health { device, health })
            .collect();
        if came_or_went {
            events.push(SourceEvent::Rediscover);
        }
        std::future::ready(events)
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::mpsc;

    use super::*;

    #[tokio::test]
    async fn looks_again_on_a_directory_change_before_the_period_and_stops_when_nobody_listens() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        let rescans = AtomicUsize::new(0);
        let (tx, mut rx) = mpsc::channel(4);
        let watcher = watch_by_rescan(
            tx,
            Duration::from_secs(3600),
            || vec![dir.clone()],
            || async {
                let n = rescans.fetch_add(1, Ordering::SeqCst);
                if n == 0 {
                    Vec::new()
                } else {
                    vec![SourceEvent::Rediscover]
                }
            },
        );
        let driver = async {
            // The first rescan (at once) found nothing; a new entry makes it look again.
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::fs::write(root.path().join("node"), "").unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
            assert_eq!(ev.unwrap(), Some(SourceEvent::Rediscover));
            drop(rx);
            std::fs::write(root.path().join("node2"), "").unwrap();
        };
        let (result, ()) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(watcher, driver)
        })
        .await
        .unwrap();
        result.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn without_directories_it_looks_again_every_period() {
        let rescans = AtomicUsize::new(0);
        let (tx, _rx) = mpsc::channel(4);
        let watcher = watch_by_rescan(tx, Duration::from_secs(10), Vec::new, || async {
            rescans.fetch_add(1, Ordering::SeqCst);
            Vec::new()
        });
        let _ = tokio::time::timeout(Duration::from_secs(35), watcher).await;
        assert_eq!(rescans.load(Ordering::SeqCst), 4, "at 0, 10, 20 and 30 s");
    }

    fn card(name: &str) -> DeviceRef {
        DeviceRef {
            pool: crate::names::PoolName::new("node-a-fpga").unwrap(),
            device: crate::names::DeviceName::new(name).unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn health_snapshots_are_sent_whole_and_a_changed_device_set_asks_for_rediscovery() {
        let snapshots = parking_lot::Mutex::new(vec![
            vec![
                (card("fpga0"), Health::healthy()),
                (card("fpga1"), Health::healthy()),
            ],
            vec![
                (card("fpga0"), Health::healthy()),
                (card("fpga1"), Health::unhealthy("hot")),
            ],
            // fpga1 recovers while fpga2 appears: the recovery and one rediscovery.
            vec![
                (card("fpga0"), Health::healthy()),
                (card("fpga1"), Health::healthy()),
                (card("fpga2"), Health::healthy()),
            ],
            // fpga0 is gone.
            vec![
                (card("fpga1"), Health::healthy()),
                (card("fpga2"), Health::healthy()),
            ],
        ]);
        let (tx, mut rx) = mpsc::channel(16);
        let now = || {
            let mut s = snapshots.lock();
            if s.is_empty() {
                Vec::new()
            } else {
                s.remove(0)
            }
        };
        let watcher = watch_health(tx, Duration::from_secs(1), now);
        let _ = tokio::time::timeout(Duration::from_millis(3500), watcher).await;
        let mut got = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            got.push(ev);
        }
        let health = |name: &str, h: Health| SourceEvent::Health {
            device: card(name),
            health: h,
        };
        let ok = Health::healthy;
        assert_eq!(
            got,
            vec![
                health("fpga0", ok()),
                health("fpga1", ok()),
                health("fpga0", ok()),
                health("fpga1", Health::unhealthy("hot")),
                health("fpga0", ok()),
                health("fpga1", ok()),
                health("fpga2", ok()),
                SourceEvent::Rediscover,
                health("fpga1", ok()),
                health("fpga2", ok()),
                SourceEvent::Rediscover,
            ]
        );
    }
}
