//! `SlicePublisher`: publishes an inventory as `resource.k8s.io/v1` ResourceSlices of one driver
//! on one node, and keeps them that way.
//!
//! This file holds the handle: its options, `publish` (which only records the desired state),
//! and the task it starts. The task itself lives in the submodules: `worker` runs the
//! reconcile passes, `slice_watch` feeds the watch cache, `overlay` lays our own writes over it,
//! `writes` sends the creates, updates and deletes, and `probe` learns what the API server
//! keeps.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kube::Client;
use kubedev_core::{DriverName, Inventory, PublishError, Publisher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::convert::{DesiredPool, UnhealthyDevices, desired_pools_in};
use crate::error::Error;
use crate::features::{ApiFeature, ApiStatus};

mod overlay;
mod probe;
mod slice_watch;
mod worker;
mod writes;

use worker::run;

/// Counters of the publisher's API writes, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PublishStats {
    /// ResourceSlices created.
    pub creates: u64,
    /// ResourceSlices updated.
    pub updates: u64,
    /// ResourceSlices deleted.
    pub deletes: u64,
    /// Writes that met a conflict (409) and were retried after re-reading.
    pub conflicts: u64,
    /// Failed reconcile passes (retried with backoff).
    pub errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    creates: AtomicU64,
    updates: AtomicU64,
    deletes: AtomicU64,
    conflicts: AtomicU64,
    errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The desired state, as `publish` last set it.
#[derive(Debug, Default)]
struct Desired {
    /// Goes up by one whenever the desired content changes.
    rev: u64,
    /// `None` until the first `publish`: nothing is touched before that.
    pools: Option<Arc<Vec<DesiredPool>>>,
    /// The inventory `pools` came from, kept to derive them again when what the API server
    /// keeps changes.
    inventory: Option<Arc<Inventory>>,
}

#[derive(Debug, Clone, Default)]
struct SyncStatus {
    /// The desired revision the last converged pass saw.
    synced_rev: u64,
    last_error: Option<String>,
    stopped: bool,
}

struct Shared {
    client: Client,
    driver: DriverName,
    node: String,
    desired: Mutex<Desired>,
    wake: Notify,
    status: watch::Sender<SyncStatus>,
    counters: Counters,
    started: AtomicBool,
    /// What the API server keeps, shared with whoever reports it.
    api: ApiStatus,
    /// Set when the API server must be asked again what it keeps (at start and after the
    /// watch recovers from a failure: the server may have been upgraded or reconfigured).
    reprobe: AtomicBool,
    unhealthy: UnhealthyDevices,
}

impl Shared {
    fn desired(&self) -> MutexGuard<'_, Desired> {
        self.desired.lock()
    }

    /// The pools `inventory` becomes with what the API server keeps now, and what had to be
    /// published in place of a feature it lacks.
    fn derive(
        &self,
        inventory: &Inventory,
    ) -> Result<(Vec<DesiredPool>, BTreeMap<ApiFeature, String>), Error> {
        let caps = self.api.caps();
        let in_use = self.api.in_use();
        let (adapted, actions) =
            crate::degrade::published(inventory, self.unhealthy, &caps, &*in_use);
        let pools = desired_pools_in(&adapted, &self.driver, caps.layout)?;
        Ok((pools, actions))
    }

    /// Derives the desired pools again from the last inventory; bumps the revision when they
    /// change.
    fn rederive(&self) -> Result<(), Error> {
        let Some(inventory) = self.desired().inventory.clone() else {
            return Ok(());
        };
        let (pools, actions) = self.derive(&inventory)?;
        self.api.set_slice_actions(&actions);
        let mut desired = self.desired();
        if desired.pools.as_deref() != Some(&pools) {
            desired.pools = Some(Arc::new(pools));
            desired.rev += 1;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Settings {
    qps: f64,
    burst: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    sync_delay: Duration,
    reprobe_every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            qps: 5.0,
            burst: 10,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            sync_delay: Duration::from_secs(1),
            reprobe_every: Duration::from_secs(600),
        }
    }
}

/// Publishes one driver's devices on one node as `resource.k8s.io/v1` ResourceSlices.
///
/// Each pool of the inventory becomes one or more slices with `spec.nodeName` set to the node,
/// chunked to the API's limits (128 devices, 64 when a device in the slice has taints or
/// consumes counters; shared counter sets in slices of their own, eight per slice). Slices are
/// named from `generateName` `<index>-<driver>-<node>-`, the index (hex, five digits) first so
/// that their order is stable, and owned by the Node (looked up once; without it slices are
/// published with no owner and the lookup is retried). The pool's generation goes up when its
/// content changes and never for a publish that changes nothing.
///
/// [`publish`](Publisher::publish) only records the desired state and wakes the background
/// task that [`start`](Self::start) runs: that task watches our slices (field selectors on
/// driver and node), deletes obsolete slices, then updates changed ones, then creates missing
/// ones, retries conflicts after re-reading, backs off on other errors, limits its request
/// rate, and puts back slices that someone else edits or deletes. Nothing is written before
/// the first `publish`, so a restart does not churn slices that are already right.
///
/// While the API server cannot be listed or watched, the watch is tried again after 0.5 s,
/// then 1, 2, 4 ... up to 30 s between attempts, each delay spread by ±25%; the delays start
/// from 0.5 s again only after the watch has delivered data and stayed healthy for a minute.
/// The first failure is logged (WARN), then at most one summary line a minute with the count
/// of failures left out, and one line (INFO) when the watch works again.
///
/// The publisher is a cheap handle: clones share the same state. Set options before `start`.
///
/// NUMA: a device's `numa_node` is published as the standard integer attribute
/// `resource.kubernetes.io/numaNode`, unless the device sets that attribute itself. Unhealthy devices: see [`UnhealthyDevices`].
#[derive(Clone)]
pub struct SlicePublisher {
    shared: Arc<Shared>,
    settings: Settings,
    unhealthy: UnhealthyDevices,
    api: ApiStatus,
}

impl fmt::Debug for SlicePublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlicePublisher")
            .field("driver", &self.shared.driver)
            .field("node", &self.shared.node)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl SlicePublisher {
    /// A publisher for `driver` on `node` (a Kubernetes node name), talking through `client`.
    pub fn new(client: Client, driver: DriverName, node: impl Into<String>) -> Result<Self, Error> {
        let node = node.into();
        kubedev_core::check_dns_subdomain(&node, 253).map_err(|reason| Error::InvalidNodeName {
            node: node.clone(),
            reason,
        })?;
        let api = ApiStatus::new();
        Ok(SlicePublisher {
            shared: Self::shared(
                client,
                driver,
                node,
                api.clone(),
                UnhealthyDevices::default(),
            ),
            settings: Settings::default(),
            unhealthy: UnhealthyDevices::default(),
            api,
        })
    }

    fn shared(
        client: Client,
        driver: DriverName,
        node: String,
        api: ApiStatus,
        unhealthy: UnhealthyDevices,
    ) -> Arc<Shared> {
        let (status, _) = watch::channel(SyncStatus::default());
        Arc::new(Shared {
            client,
            driver,
            node,
            desired: Mutex::new(Desired::default()),
            wake: Notify::new(),
            status,
            counters: Counters::default(),
            started: AtomicBool::new(false),
            api,
            reprobe: AtomicBool::new(true),
            unhealthy,
        })
    }

    /// Rebuilds the shared state with the options set so far (before `start` and `publish`).
    fn reshape(mut self) -> Self {
        self.shared = Self::shared(
            self.shared.client.clone(),
            self.shared.driver.clone(),
            self.shared.node.clone(),
            self.api.clone(),
            self.unhealthy,
        );
        self
    }

    /// What to do with unhealthy devices (default: taint them where the API server keeps
    /// device taints, leave them out where it does not).
    pub fn with_unhealthy_devices(mut self, policy: UnhealthyDevices) -> Self {
        self.unhealthy = policy;
        self.reshape()
    }

    /// Shares `status` as the record of what the API server keeps (by default the publisher
    /// has its own; see [`api_status`](Self::api_status)).
    pub fn with_api_status(mut self, status: ApiStatus) -> Self {
        self.api = status;
        self.reshape()
    }

    /// The record of what the API server keeps: its version, the counter layout written, and
    /// the features kubedev had to do without, with what it published instead.
    pub fn api_status(&self) -> ApiStatus {
        self.api.clone()
    }

    /// Limits API requests to `qps` per second on average with bursts of `burst` (default 5/s,
    /// bursts of 10). A `qps` of zero means no limit.
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> Self {
        self.settings.qps = qps;
        self.settings.burst = burst;
        self
    }

    /// Backoff after a failed pass: `initial`, doubling up to `max` (default 200 ms to 30 s).
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.settings.backoff_initial = initial;
        self.settings.backoff_max = max;
        self
    }

    /// How long to wait after a watch event before checking the slices again (default 1 s);
    /// events come in bursts, and one check after a burst is enough.
    pub fn with_sync_delay(mut self, delay: Duration) -> Self {
        self.settings.sync_delay = delay;
        self
    }

    /// How often to ask the API server again which gated fields it keeps (default 10 minutes);
    /// it is also asked at start and whenever the ResourceSlice watch recovers from a failure.
    pub fn with_reprobe_interval(mut self, every: Duration) -> Self {
        self.settings.reprobe_every = every;
        self
    }

    /// The driver this publisher writes for.
    pub fn driver(&self) -> &DriverName {
        &self.shared.driver
    }

    /// The node this publisher writes for.
    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// Starts the background task that watches and reconciles the slices. Needs a Tokio
    /// runtime; may be called once per publisher (and its clones).
    pub fn start(&self) -> Result<PublisherTask, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        if self.shared.started.swap(true, Ordering::SeqCst) {
            return Err(Error::AlreadyStarted {
                driver: self.shared.driver.to_string(),
                node: self.shared.node.clone(),
            });
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let join = runtime.spawn(run(self.shared.clone(), self.settings.clone(), stop_rx));
        Ok(PublisherTask {
            stop: stop_tx,
            join: Some(join),
        })
    }

    /// Waits until the slices match the last published inventory, or `timeout` passes.
    ///
    /// "Match" means a reconcile pass found nothing to write after the last `publish` that
    /// changed something. Before any `publish` this returns at once.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), Error> {
        let target = self.shared.desired().rev;
        let mut rx = self.shared.status.subscribe();
        let waited = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| s.synced_rev >= target || s.stopped),
        )
        .await;
        match waited {
            Ok(Ok(status)) if status.synced_rev >= target => Ok(()),
            Ok(_) => Err(self.stopped_error()),
            Err(_) => Err(Error::NotSynced {
                timeout,
                last_error: self.shared.status.borrow().last_error.clone(),
            }),
        }
    }

    /// Operation counters since the publisher was made.
    pub fn stats(&self) -> PublishStats {
        let c = &self.shared.counters;
        PublishStats {
            creates: c.creates.load(Ordering::Relaxed),
            updates: c.updates.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }

    /// The last error the background task met, cleared when a pass converges.
    pub fn last_error(&self) -> Option<String> {
        self.shared.status.borrow().last_error.clone()
    }

    fn stopped_error(&self) -> Error {
        Error::Stopped {
            driver: self.shared.driver.to_string(),
            node: self.shared.node.clone(),
        }
    }
}

#[async_trait]
impl Publisher for SlicePublisher {
    /// Records `inventory` as the desired state and wakes the background task. Returns
    /// [`PublishError::Invalid`] when the inventory breaks a ResourceSlice rule (nothing is
    /// changed then), and [`PublishError::Transport`] once the task was stopped. API failures
    /// are retried by the task itself; see [`SlicePublisher::wait_synced`] and
    /// [`SlicePublisher::last_error`].
    async fn publish(&self, inventory: &Inventory) -> Result<(), PublishError> {
        self.publish_shared(Arc::new(inventory.clone())).await
    }

    /// As [`SlicePublisher::publish`], keeping `inventory` itself to derive the slices again
    /// when what the API server keeps changes.
    async fn publish_shared(&self, inventory: Arc<Inventory>) -> Result<(), PublishError> {
        let (pools, actions) = self
            .shared
            .derive(&inventory)
            .map_err(|e| PublishError::Invalid(kubedev_core::echo::chain(&e)))?;
        if self.shared.status.borrow().stopped {
            return Err(PublishError::Transport(self.stopped_error().to_string()));
        }
        self.shared.api.set_slice_actions(&actions);
        {
            let mut desired = self.shared.desired();
            desired.inventory = Some(inventory);
            if desired.pools.as_deref() == Some(&pools) {
                return Ok(());
            }
            desired.pools = Some(Arc::new(pools));
            desired.rev += 1;
        }
        self.shared.wake.notify_one();
        Ok(())
    }

    fn sync_state(&self) -> kubedev_core::SyncState {
        let rev = self.shared.desired().rev;
        let status = self.shared.status.borrow();
        if let Some(e) = &status.last_error {
            kubedev_core::SyncState::Failing(e.clone())
        } else if rev == 0 {
            kubedev_core::SyncState::NotStarted
        } else if status.synced_rev >= rev {
            kubedev_core::SyncState::Synced
        } else {
            kubedev_core::SyncState::Pending
        }
    }

    fn write_counts(&self) -> kubedev_core::WriteCounts {
        let s = self.stats();
        kubedev_core::WriteCounts::new(s.creates, s.updates, s.deletes, s.conflicts, s.errors)
    }
}

/// The running background task of a [`SlicePublisher`]. Dropping it stops the task too, without
/// waiting; slices stay as they are either way.
#[derive(Debug)]
pub struct PublisherTask {
    stop: watch::Sender<bool>,
    join: Option<JoinHandle<()>>,
}

impl PublisherTask {
    /// Stops the task and waits for it to end.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(join) = self.join.take()
            && let Err(e) = join.await
        {
            warn!(error = %kubedev_core::echo::Chain(&e), "ResourceSlice publisher task ended abnormally");
        }
    }
}

impl Drop for PublisherTask {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
