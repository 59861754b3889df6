//! [`watch_by_rescan`]: the whole [`DeviceSource::watch`](crate::DeviceSource::watch) of a
//! backend that notices changes by looking again.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::dirwatch::DirWatch;
use crate::{SourceError, SourceEvent};

/// The shortest `period` [`watch_by_rescan`] waits, so a zero period does not spin.
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// Runs a backend's [`DeviceSource::watch`](crate::DeviceSource::watch) by looking again:
/// calls `rescan` at once, then after every change in a directory `dirs` names and at the
/// latest every `period`, and sends the events each call returns, in order.
///
/// - `rescan` compares what it finds with what the backend last reported (by discovery or an
///   earlier rescan) and returns the differences: [`SourceEvent::Health`] for a device whose
///   health changed, [`SourceEvent::Rediscover`] when devices appeared or disappeared. It must
///   not hold a lock the backend's `discover` takes across an `.await`.
/// - `dirs` names the directories whose entries coming and going mean "look again" (the
///   directories of device nodes or sockets), as real paths on this machine
///   ([`HostFs::resolve`](crate::HostFs::resolve) gives them). It is asked again before every
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
/// // async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
/// watch_by_rescan(events, Duration::from_secs(1), Vec::new, || async { b.health_changes() }).await
/// # }
/// ```
pub async fn watch_by_rescan<F>(
    events: mpsc::Sender<SourceEvent>,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

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
}
