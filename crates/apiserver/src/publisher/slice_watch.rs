//! The ResourceSlice watch: feeds the cache the worker plans from, wakes it on every change,
//! and retries a failing list or watch with jittered, growing delays and rate-limited logs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Shared;
use super::overlay::resource_version;
use crate::error::Error;
use crate::retry::{FailureLog, FailureReport, RetrySchedule, jitter_unit};

/// The first delay before the ResourceSlice watch is tried again after a failure.
const WATCH_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// The longest delay between two attempts of the ResourceSlice watch.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(30);
/// How far each watch retry delay is spread either way, as a fraction.
const WATCH_RETRY_JITTER: f64 = 0.25;
/// How long the watch must stay healthy after delivering data before its retry delays start
/// from [`WATCH_RETRY_INITIAL`] again.
const WATCH_HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// While the watch keeps failing, at most one log line per this interval.
const WATCH_LOG_EVERY: Duration = Duration::from_secs(60);

/// Feeds the watch cache and wakes the worker on every change. Runs until the worker ends.
///
/// A failed list or watch is retried after [`WATCH_RETRY_INITIAL`], doubling to
/// [`WATCH_RETRY_MAX`] with ±[`WATCH_RETRY_JITTER`]; the delays start over once the watch has
/// delivered data and stayed healthy for [`WATCH_HEALTHY_AFTER`]. The first failure is logged,
/// then one summary at most every [`WATCH_LOG_EVERY`], and the recovery.
pub(super) async fn watch_slices(
    api: Api<ResourceSlice>,
    shared: Arc<Shared>,
    writer: reflector::store::Writer<ResourceSlice>,
    observed: Arc<AtomicU64>,
    wake: Arc<Notify>,
) {
    let selector = format!(
        "spec.driver={},spec.nodeName={}",
        shared.driver, shared.node
    );
    // No backoff from kube-runtime: its backoff starts over at every event, and a re-list
    // that then fails still begins with one, so it would retry about once a second forever.
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default().fields(&selector)),
    );
    futures::pin_mut!(stream);
    let mut retry = RetrySchedule::new(
        WATCH_RETRY_INITIAL,
        WATCH_RETRY_MAX,
        WATCH_RETRY_JITTER,
        WATCH_HEALTHY_AFTER,
    );
    let mut log = FailureLog::new(WATCH_LOG_EVERY);
    let delivered = |retry: &mut RetrySchedule, log: &mut FailureLog| {
        let now = Instant::now();
        retry.delivered(now);
        if let Some(r) = log.succeeded(now) {
            // The server may have been upgraded or reconfigured meanwhile.
            shared.reprobe.store(true, Ordering::SeqCst);
            shared.wake.notify_one();
            info!(
                driver = %shared.driver,
                node = %shared.node,
                failures = r.failures,
                outage = ?r.outage,
                "ResourceSlice watch recovered"
            );
        }
    };
    let mut listed = 0;
    while let Some(item) = stream.next().await {
        match item {
            Ok(Event::Apply(slice) | Event::Delete(slice)) => {
                observed.fetch_max(resource_version(&slice).unwrap_or(0), Ordering::SeqCst);
                delivered(&mut retry, &mut log);
                wake.notify_one();
            }
            Ok(Event::Init) => listed = 0,
            Ok(Event::InitApply(slice)) => {
                listed = listed.max(resource_version(&slice).unwrap_or(0))
            }
            Ok(Event::InitDone) => {
                observed.fetch_max(listed, Ordering::SeqCst);
                delivered(&mut retry, &mut log);
                wake.notify_one();
            }
            Err(e) => {
                let error = Error::Watch {
                    driver: shared.driver.to_string(),
                    node: shared.node.clone(),
                    message: kubedev_core::echo::chain(&e),
                };
                let now = Instant::now();
                let retry_in = retry.failed(now, jitter_unit());
                match log.failed(now) {
                    FailureReport::First => {
                        warn!(%error, ?retry_in, "ResourceSlice watch failed; retrying");
                    }
                    FailureReport::Summary {
                        failures,
                        suppressed,
                    } => warn!(
                        %error,
                        failures,
                        suppressed,
                        ?retry_in,
                        "ResourceSlice watch still failing; retrying"
                    ),
                    FailureReport::Suppressed => {
                        debug!(%error, ?retry_in, "ResourceSlice watch failed; retrying");
                    }
                }
                shared
                    .status
                    .send_modify(|s| s.last_error = Some(kubedev_core::echo::chain(&error)));
                tokio::time::sleep(retry_in).await;
            }
        }
    }
}
