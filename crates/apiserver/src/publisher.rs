//! `SlicePublisher`: publishes an inventory as `resource.k8s.io/v1` ResourceSlices of one driver
//! on one node, and keeps them that way.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kubedev_core::ratelimit::TokenBucket;
use kubedev_core::{DriverName, Inventory, PublishError, Publisher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::Error;
use crate::convert::{DesiredPool, UnhealthyDevices, desired_pools_in};
use crate::degrade::adapt;
use crate::error::api_code;
use crate::features::{
    ApiCapabilities, ApiFeature, ApiStatus, CounterLayout, ServerVersion, dropped_from_slice,
};
use crate::plan::{Accepted, Identity, content_key, desired_spec, plan};
use crate::ratelimit::{Backoff, request_limit};
use crate::retry::{FailureLog, FailureReport, RetrySchedule, jitter_unit};

/// How long our own writes override the watch cache when the watch has not shown them yet.
const WRITE_CACHE_TTL: Duration = Duration::from_secs(60);
/// How often a Node that could not be read is looked up again (for the owner reference).
const NODE_LOOKUP_RETRY: Duration = Duration::from_secs(30);
/// Conflicts in a row that are retried at once; after that they back off like other errors.
const MAX_IMMEDIATE_CONFLICTS: u32 = 8;
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
        self.desired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pools `inventory` becomes with what the API server keeps now, and what had to be
    /// published in place of a feature it lacks.
    fn derive(
        &self,
        inventory: &Inventory,
    ) -> Result<(Vec<DesiredPool>, BTreeMap<ApiFeature, String>), Error> {
        let caps = self.api.caps();
        let (adapted, actions) = adapt(inventory, &caps, &*self.api.in_use());
        let pools = desired_pools_in(&adapted, &self.driver, self.unhealthy, caps.layout)?;
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
/// NUMA: a device's `numa_node` is published as the integer attribute `numaNode` in the
/// driver's own domain, unless the device sets that attribute itself. Unhealthy devices: see [`UnhealthyDevices`].
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

    /// What to do with unhealthy devices (default: leave them out).
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
        let (pools, actions) = self
            .shared
            .derive(inventory)
            .map_err(|e| PublishError::Invalid(e.to_string()))?;
        if self.shared.status.borrow().stopped {
            return Err(PublishError::Transport(self.stopped_error().to_string()));
        }
        self.shared.api.set_slice_actions(&actions);
        {
            let mut desired = self.shared.desired();
            desired.inventory = Some(Arc::new(inventory.clone()));
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
            warn!(error = %e, "ResourceSlice publisher task ended abnormally");
        }
    }
}

impl Drop for PublisherTask {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The pool name of the dry-run probes (never stored).
const PROBE_POOL: &str = "kubedev-api-probe";

/// Dry-run ResourceSlices with one use of every gated field kubedev may write, in `layout`:
/// a counter set and a device consuming it, a tainted device, a device allowing several
/// allocations. What the server answers tells which of them it keeps.
fn probe_slices(id: &Identity, layout: CounterLayout) -> Vec<ResourceSlice> {
    use k8s_openapi::api::resource::v1 as res;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let one = || {
        BTreeMap::from([(
            "probe".to_owned(),
            res::Counter {
                value: Quantity("1".into()),
            },
        )])
    };
    let counter_set = res::CounterSet {
        name: "probe".into(),
        counters: one(),
    };
    let devices = vec![
        res::Device {
            name: "counters".into(),
            consumes_counters: Some(vec![res::DeviceCounterConsumption {
                counter_set: "probe".into(),
                counters: one(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        res::Device {
            name: "tainted".into(),
            taints: Some(vec![res::DeviceTaint {
                key: format!("{}/probe", id.driver),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        res::Device {
            name: "shared".into(),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        },
    ];
    let slice =
        |count: i64, devices: Option<Vec<res::Device>>, sets: Option<Vec<res::CounterSet>>| {
            ResourceSlice {
                metadata: ObjectMeta {
                    generate_name: Some("kubedev-api-probe-".into()),
                    ..Default::default()
                },
                spec: res::ResourceSliceSpec {
                    driver: id.driver.clone(),
                    node_name: Some(id.node.clone()),
                    pool: res::ResourcePool {
                        name: PROBE_POOL.into(),
                        generation: 0,
                        resource_slice_count: count,
                    },
                    devices,
                    shared_counters: sets,
                    ..Default::default()
                },
            }
        };
    match layout {
        CounterLayout::SameSlice => vec![slice(1, Some(devices), Some(vec![counter_set]))],
        CounterLayout::SeparateSlices => vec![
            slice(2, None, Some(vec![counter_set])),
            slice(2, Some(devices), None),
        ],
    }
}

fn resource_version(slice: &ResourceSlice) -> Option<u64> {
    slice.metadata.resource_version.as_deref()?.parse().ok()
}

/// Our own writes, laid over the watch cache until the watch shows them (or a TTL passes):
/// without it a pass right after a create would not see the new slice and create it again.
#[derive(Debug, Default)]
struct Overlay {
    entries: HashMap<String, OverlayEntry>,
}

#[derive(Debug)]
struct OverlayEntry {
    /// The object as the API server answered, or `None` for one we deleted (or found gone).
    object: Option<ResourceSlice>,
    rv: Option<u64>,
    expires: Instant,
}

impl Overlay {
    fn put(&mut self, object: ResourceSlice) {
        let Some(name) = object.metadata.name.clone() else {
            return;
        };
        let rv = resource_version(&object);
        self.entries.insert(
            name,
            OverlayEntry {
                object: Some(object),
                rv,
                expires: Instant::now() + WRITE_CACHE_TTL,
            },
        );
    }

    fn gone(&mut self, name: &str, rv: Option<u64>) {
        self.entries.insert(
            name.to_owned(),
            OverlayEntry {
                object: None,
                rv,
                expires: Instant::now() + WRITE_CACHE_TTL,
            },
        );
    }

    /// The slices as we know them: the watch cache with our newer writes on top. Entries the
    /// cache has caught up with are dropped. `observed` is the highest resourceVersion the
    /// watch has delivered: the cache reflects every change up to it.
    fn view(&mut self, cached: Vec<Arc<ResourceSlice>>, observed: u64) -> Vec<ResourceSlice> {
        let now = Instant::now();
        let mut by_name: BTreeMap<String, ResourceSlice> = cached
            .into_iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, (*s).clone())))
            .collect();
        self.entries.retain(|name, entry| {
            if now >= entry.expires {
                return false;
            }
            let cached = by_name.get(name);
            let cached_rv = cached.and_then(resource_version);
            match (&entry.object, entry.rv) {
                (Some(_), Some(rv)) => !(observed >= rv || cached_rv.is_some_and(|c| c >= rv)),
                (Some(_), None) => true,
                (None, rv) => match cached {
                    None => false,
                    Some(_) => !matches!((cached_rv, rv), (Some(c), Some(r)) if c > r),
                },
            }
        });
        for (name, entry) in &self.entries {
            match &entry.object {
                Some(object) => {
                    by_name.insert(name.clone(), object.clone());
                }
                None => {
                    by_name.remove(name);
                }
            }
        }
        by_name.into_values().collect()
    }

    fn next_expiry(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.expires).min()
    }
}

/// What one reconcile pass did.
enum Pass {
    /// Nothing published yet.
    Idle,
    /// Everything matched the desired state of this revision.
    Converged(u64),
    /// Writes were made; check again.
    Wrote,
    /// A write met a conflict; the object was re-read, check again.
    Conflict,
}

/// The outcome of one write.
enum Step {
    Done,
    Conflict,
}

struct Worker {
    shared: Arc<Shared>,
    settings: Settings,
    id: Identity,
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    cache: Store<ResourceSlice>,
    observed: Arc<AtomicU64>,
    overlay: Overlay,
    accepted: Accepted,
    accepted_rev: u64,
    owner: Option<OwnerReference>,
    node_checked: Option<Instant>,
    limiter: TokenBucket,
    backoff: Backoff,
    conflicts_in_row: u32,
    /// When the API server was last asked what it keeps.
    probed: Option<Instant>,
}

async fn run(shared: Arc<Shared>, settings: Settings, mut stop: watch::Receiver<bool>) {
    let slices: Api<ResourceSlice> = Api::all(shared.client.clone());
    let (cache, writer) = reflector::store();
    let observed = Arc::new(AtomicU64::new(0));
    let watch_wake = Arc::new(Notify::new());
    let watching = watch_slices(
        slices.clone(),
        shared.clone(),
        writer,
        observed.clone(),
        watch_wake.clone(),
    );
    let worker = Worker {
        id: Identity {
            driver: shared.driver.to_string(),
            node: shared.node.clone(),
        },
        nodes: Api::all(shared.client.clone()),
        slices,
        cache,
        observed,
        overlay: Overlay::default(),
        accepted: Accepted::new(),
        accepted_rev: 0,
        owner: None,
        node_checked: None,
        limiter: request_limit(settings.qps, settings.burst),
        backoff: Backoff::new(settings.backoff_initial, settings.backoff_max),
        conflicts_in_row: 0,
        probed: None,
        shared: shared.clone(),
        settings,
    };
    tokio::select! {
        () = watching => {}
        () = worker.run(&mut stop, &watch_wake) => {}
    }
    shared.status.send_modify(|s| s.stopped = true);
    debug!(driver = %shared.driver, node = %shared.node, "ResourceSlice publisher stopped");
}

/// Feeds the watch cache and wakes the worker on every change. Runs until the worker ends.
///
/// A failed list or watch is retried after [`WATCH_RETRY_INITIAL`], doubling to
/// [`WATCH_RETRY_MAX`] with ±[`WATCH_RETRY_JITTER`]; the delays start over once the watch has
/// delivered data and stayed healthy for [`WATCH_HEALTHY_AFTER`]. The first failure is logged,
/// then one summary at most every [`WATCH_LOG_EVERY`], and the recovery.
async fn watch_slices(
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
                    message: e.to_string(),
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
                    .send_modify(|s| s.last_error = Some(error.to_string()));
                tokio::time::sleep(retry_in).await;
            }
        }
    }
}

impl Worker {
    async fn run(mut self, stop: &mut watch::Receiver<bool>, watch_wake: &Notify) {
        tokio::select! {
            _ = stop.changed() => return,
            ready = self.cache.wait_until_ready() => {
                if ready.is_err() {
                    return;
                }
            }
        }
        let mut due = Some(Instant::now());
        loop {
            // Ask the server again what it keeps now and then: an upgrade or a change of
            // feature gates does not always break the watch.
            let probe_at = self.probed.map(|t| t + self.settings.reprobe_every);
            if let Some(at) = probe_at
                && at <= Instant::now()
            {
                self.shared.reprobe.store(true, Ordering::SeqCst);
                self.probed = Some(Instant::now());
                due = Some(due.map_or(Instant::now(), |d| d.min(Instant::now())));
            }
            let later = Instant::now() + Duration::from_secs(3600);
            let wake_at = due.unwrap_or(later).min(probe_at.unwrap_or(later));
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                () = self.shared.wake.notified() => due = Some(Instant::now()),
                () = watch_wake.notified() => {
                    let at = Instant::now() + self.settings.sync_delay;
                    due = Some(match due {
                        // While backing off, an event does not cut the wait short.
                        Some(d) if self.backoff.failing() => d,
                        Some(d) => d.min(at),
                        None => at,
                    });
                    continue;
                }
                () = tokio::time::sleep_until(wake_at) => {}
            }
            match due {
                Some(d) if d <= Instant::now() => {}
                _ => continue,
            }
            due = None;
            let pass = tokio::select! {
                _ = stop.changed() => break,
                pass = self.sync() => pass,
            };
            let now = Instant::now();
            match pass {
                Ok(Pass::Idle) => {}
                Ok(Pass::Converged(rev)) => {
                    self.backoff.reset();
                    self.conflicts_in_row = 0;
                    self.shared.status.send_modify(|s| {
                        s.synced_rev = s.synced_rev.max(rev);
                        s.last_error = None;
                    });
                    // Check again when our writes leave the overlay: one may have been undone
                    // before the watch showed it.
                    due = self.overlay.next_expiry();
                }
                Ok(Pass::Wrote) => {
                    self.backoff.reset();
                    self.conflicts_in_row = 0;
                    due = Some(now);
                }
                Ok(Pass::Conflict) => {
                    self.conflicts_in_row += 1;
                    due = Some(if self.conflicts_in_row > MAX_IMMEDIATE_CONFLICTS {
                        now + self.backoff.next_delay()
                    } else {
                        now
                    });
                }
                Err(error) => {
                    bump(&self.shared.counters.errors);
                    let delay = self.backoff.next_delay();
                    warn!(%error, retry_in = ?delay, "publishing ResourceSlices failed");
                    self.shared
                        .status
                        .send_modify(|s| s.last_error = Some(error.to_string()));
                    due = Some(now + delay);
                }
            }
        }
    }

    /// One reconcile pass: compare, then delete, update, create.
    async fn sync(&mut self) -> Result<Pass, Error> {
        let (rev, pools) = {
            let desired = self.shared.desired();
            (desired.rev, desired.pools.clone())
        };
        let Some(mut pools) = pools else {
            return Ok(Pass::Idle);
        };
        let mut rev = rev;
        let reprobe = self.shared.reprobe.swap(false, Ordering::SeqCst);
        // Without shared counters what is published depends on the devices in use.
        let fallback = !self
            .shared
            .api
            .caps()
            .keeps(ApiFeature::PartitionableDevices);
        if reprobe || fallback {
            if reprobe && let Err(e) = self.learn_api().await {
                self.shared.reprobe.store(true, Ordering::SeqCst);
                return Err(e);
            }
            self.shared.rederive()?;
            let desired = self.shared.desired();
            rev = desired.rev;
            if let Some(p) = &desired.pools {
                pools = p.clone();
            }
        }
        self.look_up_node().await;
        if rev != self.accepted_rev {
            self.forget_stale_acceptances(&pools);
            self.accepted_rev = rev;
        }
        let current: Vec<ResourceSlice> = self
            .overlay
            .view(self.cache.state(), self.observed.load(Ordering::SeqCst))
            .into_iter()
            .filter(|s| {
                s.spec.driver == self.id.driver
                    && s.spec.node_name.as_deref() == Some(self.id.node.as_str())
            })
            .collect();
        let plan = plan(
            &self.id,
            self.owner.as_ref(),
            &pools,
            &current,
            &self.accepted,
        );
        if plan.is_empty() {
            return Ok(Pass::Converged(rev));
        }
        debug!(
            driver = %self.id.driver,
            node = %self.id.node,
            deletes = plan.deletes.len(),
            updates = plan.updates.len(),
            creates = plan.creates.len(),
            "reconciling ResourceSlices"
        );
        for slice in &plan.deletes {
            if let Step::Conflict = self.delete(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        for slice in &plan.updates {
            if let Step::Conflict = self.update(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        for slice in &plan.creates {
            if let Step::Conflict = self.create(slice).await? {
                return Ok(Pass::Conflict);
            }
        }
        Ok(Pass::Wrote)
    }

    /// Keeps only the server-content records that can still apply to the desired slices.
    fn forget_stale_acceptances(&mut self, pools: &[DesiredPool]) {
        if self.accepted.is_empty() {
            return;
        }
        let id = &self.id;
        let keys: HashSet<String> = pools
            .iter()
            .flat_map(|p| {
                p.slices
                    .iter()
                    .map(move |s| content_key(&desired_spec(id, p, s, 0)))
            })
            .collect();
        self.accepted.retain(|k, _| keys.contains(k));
    }

    /// Looks the Node's UID up for the owner reference: once, and again every little while
    /// as long as it fails.
    async fn look_up_node(&mut self) {
        if self.owner.is_some()
            || self
                .node_checked
                .is_some_and(|t| t.elapsed() < NODE_LOOKUP_RETRY)
        {
            return;
        }
        self.node_checked = Some(Instant::now());
        self.limiter.acquire().await;
        match self.nodes.get(&self.id.node).await {
            Ok(node) => match node.metadata.uid {
                Some(uid) if !uid.is_empty() => {
                    self.owner = Some(OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: self.id.node.clone(),
                        uid,
                        controller: Some(true),
                        block_owner_deletion: None,
                    });
                }
                _ => warn!(
                    node = %self.id.node,
                    "the Node has no UID; publishing ResourceSlices without an owner reference"
                ),
            },
            Err(error) => {
                let error = Error::Node {
                    node: self.id.node.clone(),
                    error: Box::new(error),
                };
                warn!(%error, "publishing ResourceSlices without an owner reference for now");
            }
        }
    }

    /// Re-reads a slice after a conflict so the next pass plans from its current state.
    async fn reread(&mut self, name: &str) -> Result<(), Error> {
        self.limiter.acquire().await;
        match self.slices.get_opt(name).await {
            Ok(Some(slice)) => self.overlay.put(slice),
            Ok(None) => self.overlay.gone(name, None),
            Err(error) => {
                return Err(Error::Slice {
                    operation: "reading",
                    slice: name.to_owned(),
                    error: Box::new(error),
                });
            }
        }
        Ok(())
    }

    /// Asks the API server its version and, with dry-run creates that store nothing, which
    /// gated fields it keeps; derives the slices again if that changed what can be written.
    async fn learn_api(&mut self) -> Result<(), Error> {
        self.limiter.acquire().await;
        let info = self
            .shared
            .client
            .apiserver_version()
            .await
            .map_err(|e| Error::Version {
                message: crate::error::brief(&e),
            })?;
        let version =
            ServerVersion::from_info(&info).map_err(|message| Error::Version { message })?;
        if !version.supported() {
            error!(
                version = %version,
                git_version = %version.git_version,
                "the API server is older than Kubernetes 1.34, the first release with \
                 resource.k8s.io/v1, which kubedev writes"
            );
        }
        let layout = version.counter_layout();
        self.probed = Some(Instant::now());
        let mut unavailable = std::collections::BTreeSet::new();
        let mut found = BTreeMap::new();
        for probe in probe_slices(&self.id, layout) {
            self.limiter.acquire().await;
            let params = PostParams {
                dry_run: true,
                field_manager: None,
            };
            match self.slices.create(&params, &probe).await {
                Ok(stored) => {
                    for f in dropped_from_slice(&probe.spec, &stored.spec) {
                        unavailable.insert(f);
                        found.insert(
                            f,
                            format!(
                                "the API server ({version}) drops {} from ResourceSlices \
                                 (feature gate {} is off)",
                                f.fields(),
                                f.gate()
                            ),
                        );
                    }
                }
                Err(e) if api_code(&e) == Some(422) => {
                    // A server that refuses what its release should accept: write only what
                    // needs no feature gate, and say why.
                    let why = crate::error::brief(&e);
                    warn!(version = %version, error = %why, "the API server refused kubedev's dry-run ResourceSlice; publishing without gated fields");
                    for f in ApiFeature::IN_SLICES {
                        unavailable.insert(f);
                        found.insert(
                            f,
                            format!(
                                "the API server ({version}) refused a dry-run ResourceSlice \
                                 using {}: {why}",
                                f.fields()
                            ),
                        );
                    }
                }
                Err(e) if matches!(api_code(&e), Some(400 | 403 | 404 | 405)) => {
                    // Something in front of the server refuses dry runs (an admission webhook
                    // without dry-run support, a policy): assume the release's default gates
                    // and let the comparison of every write correct it.
                    let why = crate::error::brief(&e);
                    warn!(version = %version, error = %why, "the API server refused kubedev's dry-run ResourceSlice; assuming the release's default feature gates");
                    if version.slice_gates_off_by_default() {
                        for f in ApiFeature::IN_SLICES {
                            unavailable.insert(f);
                            found.insert(
                                f,
                                format!(
                                    "the API server ({version}) refused a dry run ({why}), and \
                                     {} is off by default in {version}",
                                    f.gate()
                                ),
                            );
                        }
                    }
                    break;
                }
                Err(e) => {
                    return Err(Error::Slice {
                        operation: "dry-run creating",
                        slice: probe.metadata.generate_name.clone().unwrap_or_default(),
                        error: Box::new(e),
                    });
                }
            }
        }
        let dropped: Vec<&str> = unavailable.iter().map(|f| f.gate()).collect();
        let known_before = self.shared.api.report().version;
        let changed = self.shared.api.learned(
            version.clone(),
            ApiCapabilities {
                layout,
                unavailable: unavailable.clone(),
            },
            found,
        );
        if changed || known_before.as_ref() != Some(&version) {
            info!(
                version = %version,
                git_version = %version.git_version,
                layout = ?layout,
                ?dropped,
                "learned what the API server keeps of ResourceSlices"
            );
        } else {
            debug!(version = %version, ?dropped, "the API server keeps what it kept");
        }
        Ok(())
    }

    /// Notes when the server stored something other than what we sent. A gated field it
    /// dropped marks its feature unavailable and the slices are derived again without it (the
    /// next pass rewrites them); any other difference (the server's spelling of a quantity) is
    /// accepted as it is.
    fn check_stored(&mut self, sent: &ResourceSlice, stored: &ResourceSlice) {
        let name = stored.metadata.name.as_deref().unwrap_or_default();
        let mut news = false;
        for f in dropped_from_slice(&sent.spec, &stored.spec) {
            let found = format!(
                "the API server dropped {} from ResourceSlice {name} (feature gate {} is off)",
                f.fields(),
                f.gate()
            );
            if self.shared.api.dropped(f, found) {
                warn!(slice = %name, feature = f.gate(), "the API server dropped {} from a ResourceSlice; publishing without them", f.fields());
                news = true;
            }
        }
        if news {
            if let Err(e) = self.shared.rederive() {
                warn!(error = %e, "deriving the ResourceSlices again failed");
            }
            return;
        }
        let sent_key = content_key(&sent.spec);
        let stored_key = content_key(&stored.spec);
        if sent_key != stored_key {
            debug!(slice = %name, "the API server stored the ResourceSlice in its own spelling");
            self.accepted.insert(sent_key, stored_key);
        }
    }

    async fn delete(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: slice.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        self.limiter.acquire().await;
        match self.slices.delete(&name, &params).await {
            Ok(_) => {
                bump(&self.shared.counters.deletes);
                debug!(slice = %name, "deleted ResourceSlice");
                self.overlay.gone(&name, resource_version(slice));
                Ok(Step::Done)
            }
            Err(error) => match api_code(&error) {
                Some(404) => {
                    self.overlay.gone(&name, resource_version(slice));
                    Ok(Step::Done)
                }
                Some(409) => {
                    bump(&self.shared.counters.conflicts);
                    debug!(slice = %name, "conflict deleting ResourceSlice; re-reading");
                    self.reread(&name).await?;
                    Ok(Step::Conflict)
                }
                _ => Err(Error::Slice {
                    operation: "deleting",
                    slice: name,
                    error: Box::new(error),
                }),
            },
        }
    }

    async fn update(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.limiter.acquire().await;
        match self
            .slices
            .replace(&name, &PostParams::default(), slice)
            .await
        {
            Ok(stored) => {
                bump(&self.shared.counters.updates);
                debug!(slice = %name, generation = stored.spec.pool.generation, "updated ResourceSlice");
                self.check_stored(slice, &stored);
                self.overlay.put(stored);
                Ok(Step::Done)
            }
            Err(error) => match api_code(&error) {
                Some(code @ (404 | 409)) => {
                    if code == 409 {
                        bump(&self.shared.counters.conflicts);
                    }
                    debug!(slice = %name, "conflict updating ResourceSlice; re-reading");
                    self.reread(&name).await?;
                    Ok(Step::Conflict)
                }
                _ => Err(Error::Slice {
                    operation: "updating",
                    slice: name,
                    error: Box::new(error),
                }),
            },
        }
    }

    async fn create(&mut self, slice: &ResourceSlice) -> Result<Step, Error> {
        self.limiter.acquire().await;
        match self.slices.create(&PostParams::default(), slice).await {
            Ok(stored) => {
                bump(&self.shared.counters.creates);
                info!(
                    slice = stored.metadata.name.as_deref().unwrap_or_default(),
                    pool = %stored.spec.pool.name,
                    generation = stored.spec.pool.generation,
                    "created ResourceSlice"
                );
                self.check_stored(slice, &stored);
                self.overlay.put(stored);
                Ok(Step::Done)
            }
            // A generated name that was taken: try again with a fresh one.
            Err(error) if api_code(&error) == Some(409) => {
                bump(&self.shared.counters.conflicts);
                Ok(Step::Conflict)
            }
            Err(error) => Err(Error::Slice {
                operation: "creating",
                slice: slice.metadata.generate_name.clone().unwrap_or_default(),
                error: Box::new(error),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn slice(name: &str, rv: u64, pool: &str) -> ResourceSlice {
        let mut s = ResourceSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.resource_version = Some(rv.to_string());
        s.spec.pool.name = pool.into();
        s
    }

    fn names(view: &[ResourceSlice]) -> Vec<(&str, &str)> {
        view.iter()
            .map(|s| {
                (
                    s.metadata.name.as_deref().unwrap(),
                    s.spec.pool.name.as_str(),
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_shows_writes_until_the_cache_catches_up() {
        let mut overlay = Overlay::default();
        let cached = vec![Arc::new(slice("a", 5, "old"))];
        overlay.put(slice("a", 7, "new"));
        overlay.put(slice("b", 8, "created"));
        // The watch has not shown either write.
        let view = overlay.view(cached.clone(), 5);
        assert_eq!(names(&view), vec![("a", "new"), ("b", "created")]);
        // The cache now holds a's update: a's entry goes, b's stays.
        let view = overlay.view(vec![Arc::new(slice("a", 7, "new"))], 7);
        assert_eq!(names(&view), vec![("a", "new"), ("b", "created")]);
        assert_eq!(overlay.entries.len(), 1);
        // The watch is past b's version but the cache has no b: someone deleted it.
        let view = overlay.view(vec![Arc::new(slice("a", 7, "new"))], 9);
        assert_eq!(names(&view), vec![("a", "new")]);
        assert!(overlay.entries.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_hides_deleted_slices_until_the_cache_drops_them() {
        let mut overlay = Overlay::default();
        overlay.gone("a", Some(5));
        let view = overlay.view(vec![Arc::new(slice("a", 5, "p"))], 100);
        assert!(view.is_empty());
        // A newer object of the same name (re-created by someone) is shown again.
        let view = overlay.view(vec![Arc::new(slice("a", 6, "p"))], 100);
        assert_eq!(names(&view), vec![("a", "p")]);
        assert!(overlay.entries.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_entries_expire() {
        let mut overlay = Overlay::default();
        overlay.put(slice("b", 8, "created"));
        assert_eq!(overlay.view(Vec::new(), 0).len(), 1);
        let expiry = overlay.next_expiry().unwrap();
        tokio::time::sleep_until(expiry).await;
        assert!(overlay.view(Vec::new(), 0).is_empty());
        assert_eq!(overlay.next_expiry(), None);
    }
}
