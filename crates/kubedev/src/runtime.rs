//! The daemon's runtime: backends in, kubelet servers and publishers out.
//!
//! It discovers every backend's devices into one inventory, publishes it (device-plugin
//! resources, ResourceSlices), applies the backends' health and hot-plug events, and routes the
//! kubelet's requests to the backend that owns each device.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cdi::CdiWriter;
use crate::checkpoint::CheckpointStore;
use anyhow::Context as _;
use async_trait::async_trait;
use kubedev_core::{
    AllocatedDevice, Consumer, ContainerEdits, DeviceRef, Health, Inventory, Pool, PoolName,
    PrepareError, Publisher, SourceEvent,
};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandle, DevicePluginHandler,
    DevicePluginPublisher, PluginDevice, PreferenceRequest, ResourceDevices, Selection,
};
use kubedev_kubelet_grpc::dra::{DeviceHealthReport, DraPlugin, DraPluginConfig, DraPluginHandle};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod build;
mod device_plugin;
mod dra;
mod publish;
mod reload;

use build::backend_changed;
pub use build::{BuildMode, build_backend, build_backends};
use device_plugin::*;
use dra::*;
use publish::*;

pub use crate::backends::{Backend, Backends};
pub use crate::cluster::ClusterServices;
use crate::cluster::connect_cluster;
use crate::config::Config;
use crate::dra_driver::DraDriver;
use crate::http::Probes;
use crate::metrics::Metrics;
use crate::policy::{PolicySource, PolicyState};

/// Metrics and probes, shared by every part of the runtime.
#[derive(Clone)]
struct Observe {
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
}

/// What a backend slot's watcher tells the main loop.
#[derive(Debug)]
enum Watched {
    /// An event the backend sent.
    Event(SourceEvent),
    /// The backend's watch failed with this error; it is started again after a pause.
    Failed(String),
}

/// The first pause before a failed watch is started again; it doubles after each failure that
/// follows a short run, up to [`WATCH_RETRY_MAX`].
const WATCH_RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest pause before a failed watch is started again.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(300);
/// A watch that ran this long before failing starts again after [`WATCH_RETRY_FIRST`].
const WATCH_RAN_WELL: Duration = Duration::from_secs(60);

/// Starts the watcher of the backend in `slot`; it stops when `stop` fires. A watch that fails
/// is reported as [`Watched::Failed`] and started again after a pause, preceded by a
/// rediscovery so the devices' health is read afresh; a watch that returns `Ok` has nothing
/// to watch and is not started again. A failed discovery of the slot is tried again
/// ([`retry_failed_discovery`]).
fn spawn_watcher(
    watchers: &mut JoinSet<()>,
    slot: usize,
    backend: &Backend,
    backends: &Backends,
    tx: mpsc::Sender<(usize, Watched)>,
    stop: CancellationToken,
) {
    let (btx, mut brx) = mpsc::channel(64);
    watchers.spawn(retry_failed_discovery(
        slot,
        backend.kind.clone(),
        backends.failed_discoveries(),
        btx.clone(),
        stop.clone(),
    ));
    let source = backend.source.clone();
    let name = backend.kind.clone();
    let failures = tx.clone();
    watchers.spawn(async move {
        let mut pause = WATCH_RETRY_FIRST;
        let mut first = true;
        loop {
            let started = tokio::time::Instant::now();
            let result = if std::mem::take(&mut first) && crate::failpoint::fails("backend-watch") {
                Err(kubedev_core::SourceError::Unavailable {
                    backend: name.to_string(),
                    reason: "fail point backend-watch".into(),
                })
            } else {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = source.watch(btx.clone()) => r,
                }
            };
            let Err(e) = result else { return };
            if started.elapsed() >= WATCH_RAN_WELL {
                pause = WATCH_RETRY_FIRST;
            }
            tracing::error!(backend = %name, error = %kubedev_core::echo::Chain(&e), retry_in = ?pause, "watch failed; the kubelet sees this backend's DRA devices as Unknown until it runs again");
            if failures.send((slot, Watched::Failed(kubedev_core::echo::chain(&e)))).await.is_err() {
                return;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(WATCH_RETRY_MAX);
            if btx.send(SourceEvent::Rediscover).await.is_err() {
                return;
            }
        }
    });
    watchers.spawn(async move {
        while let Some(ev) = brx.recv().await {
            if tx.send((slot, Watched::Event(ev))).await.is_err() {
                break;
            }
        }
    });
}

/// Asks for the discovery of backend slot `slot` again while its latest one failed (at start
/// or after a change its watch reported): [`WATCH_RETRY_FIRST`] after the failure, then with the
/// pause doubling up to [`WATCH_RETRY_MAX`], and from the first pause again once one succeeds.
/// Without it, a backend whose discovery failed would serve no devices until its watch noticed a
/// change.
async fn retry_failed_discovery(
    slot: usize,
    name: Arc<str>,
    mut failed: tokio::sync::watch::Receiver<std::collections::BTreeSet<usize>>,
    events: kubedev_core::EventSender,
    stop: CancellationToken,
) {
    let mut pause = WATCH_RETRY_FIRST;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            seen = failed.wait_for(|f| f.contains(&slot)) => if seen.is_err() { return },
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if !failed.borrow().contains(&slot) {
            pause = WATCH_RETRY_FIRST;
            continue;
        }
        tracing::info!(backend = %name, "discovering again after a failed discovery");
        if events.send(SourceEvent::Rediscover).await.is_err() {
            return;
        }
        pause = (pause * 2).min(WATCH_RETRY_MAX);
    }
}

/// How often the configuration file is read again when nothing was noticed: a safety net where
/// inotify works, the only way to notice changes where it does not.
const CONFIG_RESYNC: Duration = Duration::from_secs(10);
const CONFIG_POLL: Duration = Duration::from_secs(1);
/// How long a change is let settle before the file is read: a file created and then written
/// is read once it is whole.
const CONFIG_SETTLE: Duration = Duration::from_millis(50);

/// Watches the configuration file (its directory: a file replaced by a rename, as editors and
/// ConfigMap volumes do, is noticed as well as one written in place): every change that parses
/// and validates is sent on; one that does not is logged with the reason (and counted), and the
/// running configuration stays.
async fn watch_config(
    path: PathBuf,
    registry: crate::registry::Registry,
    tx: mpsc::Sender<Config>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let read = |p: &Path| std::fs::read(p).ok();
    let mut last = read(&path);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut watch = kubedev_core::dirwatch::DirWatch::new().noticing_writes();
    loop {
        watch.watch(&dir);
        let resync = if watch.is_polling() {
            CONFIG_POLL
        } else {
            CONFIG_RESYNC
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = async {
                watch.wait(resync).await;
                tokio::time::sleep(CONFIG_SETTLE).await;
            } => {}
        }
        let now = read(&path);
        if now.is_none() || now == last {
            continue;
        }
        last = now;
        match Config::load_with(&path, registry.clone()) {
            Ok(c) => {
                if tx.send(c).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                metrics.reload("rejected");
                tracing::error!(error = %kubedev_core::echo::Chain(&e), "configuration change rejected; the running configuration stays");
            }
        }
    }
}

/// Metrics and probes, served over HTTP when `metrics.address` is set (with the held-device
/// metrics read from the kubelet's pod resources).
async fn observe(config: &Config, cancel: &CancellationToken) -> anyhow::Result<Observe> {
    let obs = Observe {
        metrics: Metrics::new(),
        probes: Probes::new(),
    };
    if let Some(address) = &config.metrics.address {
        let bound = crate::http::serve(
            address,
            obs.metrics.clone(),
            obs.probes.clone(),
            cancel.child_token(),
        )
        .await?;
        tracing::info!(address = %bound, "serving /metrics, /healthz and /readyz");
        tokio::spawn(watch_holders(
            config.clone(),
            obs.metrics.clone(),
            cancel.child_token(),
        ));
    }
    Ok(obs)
}

/// Runs the daemon until `cancel` fires; stops every server and removes its sockets on the way
/// out. `cluster` is needed when DRA mode is on. Changes to the configuration file are applied
/// while it runs (see `Running::reload`).
pub async fn run(
    config: Config,
    config_path: &Path,
    cluster: Option<ClusterServices>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let obs = observe(&config, &cancel).await?;
    let backends = Backends::new(Vec::new());
    for (slot, kind) in config.registry.kinds().enumerate() {
        if let Some(b) = build_backend(&config, kind, BuildMode::Serve)? {
            backends.set(slot, Some(b));
        }
    }
    let inventory = backends.discover_all().await;
    tracing::info!(
        backends = backends.list().len(),
        pools = inventory.pools.len(),
        devices = inventory.devices().count(),
        "discovered"
    );
    let inventory = Arc::new(parking_lot::RwLock::new(inventory));
    let sh = Shared {
        backends: &backends,
        inventory: &inventory,
        obs: &obs,
        cancel: &cancel,
    };
    let registry = config.registry.clone();
    let mut running = Running::start(config, config_path, cluster, &sh).await?;
    running.publish(&obs).await;
    // Every configured server is started and known to the probes: from now on `/readyz`
    // answers from their registrations.
    obs.probes.set_started();

    // Backend watchers feed one event channel.
    let (tx, mut rx) = mpsc::channel::<(usize, Watched)>(256);
    let mut watchers = JoinSet::new();
    for (slot, b) in backends.list() {
        let stop = cancel.child_token();
        spawn_watcher(&mut watchers, slot, &b, &backends, tx.clone(), stop.clone());
        running.watcher_stops.insert(slot, stop);
    }
    let (config_tx, mut config_rx) = mpsc::channel::<Config>(1);
    tokio::spawn(watch_config(
        config_path.to_path_buf(),
        registry,
        config_tx,
        obs.metrics.clone(),
        cancel.child_token(),
    ));

    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            Some(new) = config_rx.recv() => {
                match running.reload(new, &sh, &mut watchers, &tx).await {
                    Ok(summary) => {
                        obs.metrics.reload("applied");
                        tracing::info!(%summary, "configuration reloaded");
                    }
                    Err(e) => {
                        obs.metrics.reload("rejected");
                        tracing::error!(error = format!("{e:#}"), "configuration change rejected; the running configuration stays");
                    }
                }
            }
            Some((slot, ev)) = rx.recv() => running.apply(slot, ev, &backends, &obs).await,
            // A watcher stopped by a reload has ended: reaped here, as the set keeps every
            // task it spawned until then (three per backend and reload, for the daemon's life).
            Some(ended) = watchers.join_next(), if !watchers.is_empty() => {
                if let Err(e) = ended
                    && e.is_panic()
                {
                    tracing::error!(error = %kubedev_core::echo::Chain(&e), "a backend watcher panicked");
                }
            }
        }
    }

    tracing::info!("stopping");
    watchers.shutdown().await;
    running.stop().await;
    Ok(())
}

/// The running daemon's state that a configuration reload changes.
struct Running {
    config: Config,
    path: PathBuf,
    /// The inventory, shared with the kubelet servers' handlers. Only this loop writes it, and
    /// a health change is made in place.
    inventory: Arc<parking_lot::RwLock<Inventory>>,
    /// Which devices the device-plugin resources take of the inventory, kept while only health
    /// changes; `None` after anything else changed, until the next publish.
    selection: Option<Selection>,
    dps: DevicePlugins,
    dra: Option<Dra>,
    clock: HealthClock,
    /// Stops each backend slot's watcher.
    watcher_stops: BTreeMap<usize, CancellationToken>,
}

impl Running {
    /// Starts the configured servers on the discovered inventory: the device-plugin resources
    /// (with their selection policies) and the DRA plugin.
    async fn start(
        config: Config,
        config_path: &Path,
        cluster: Option<ClusterServices>,
        sh: &Shared<'_>,
    ) -> anyhow::Result<Running> {
        let resources = config.resources(config_path)?;
        let mut dps = DevicePlugins::default();
        if config.device_plugin.enabled && !resources.is_empty() {
            let mut specs = Vec::new();
            for (r, raw) in resources
                .into_iter()
                .zip(config.device_plugin.resources.iter())
            {
                let policy = dps
                    .policies
                    .load(&r, &config.device_plugin, sh.cancel)
                    .await?;
                specs.push((r, raw.clone(), policy));
            }
            let snapshot = sh.inventory.read().clone();
            dps.start(specs, &config.device_plugin, &snapshot, sh)
                .await?;
        }
        let dra = start_dra(
            &config,
            config_path,
            sh.backends,
            sh.inventory,
            cluster,
            sh.cancel,
            sh.obs,
        )
        .await?;
        Ok(Running {
            config,
            path: config_path.to_path_buf(),
            inventory: sh.inventory.clone(),
            selection: None,
            dps,
            dra,
            clock: HealthClock::default(),
            watcher_stops: BTreeMap::new(),
        })
    }

    /// Applies what the watcher of backend slot `slot` reported, and publishes when the
    /// inventory or its health changed.
    async fn apply(&mut self, slot: usize, ev: Watched, backends: &Backends, obs: &Observe) {
        let mut rediscovered = false;
        let changed = match ev {
            Watched::Failed(why) => {
                let pools = backends.pools_of(slot);
                let name = backends
                    .get(slot)
                    .map(|b| b.kind.to_string())
                    .unwrap_or_default();
                self.clock.set_stale(
                    slot,
                    &pools,
                    format!("the {name} backend's health watch failed: {why}"),
                );
                true
            }
            Watched::Event(SourceEvent::Health { device, health }) => {
                let (state, reason) = (health.state, health.reason.clone());
                // Changed in place: the device-plugin selection stays right (selectors do not
                // see health), and nothing is copied until the DRA view.
                let changed = self.inventory.write().set_health(&device, health);
                if changed {
                    tracing::info!(%device, %state, reason = reason.as_deref().unwrap_or(""), "health changed");
                }
                changed
            }
            Watched::Event(SourceEvent::Rediscover) => {
                rediscovered = true;
                let changed = self.rediscover(backends, slot).await;
                self.clock.clear_stale(slot) || changed
            }
            _ => false,
        };
        if changed {
            self.publish(obs).await;
        }
        if let Some(dra) = self.dra.as_ref().filter(|_| rediscovered) {
            // A driver upgrade shows as a rediscovery: specs of prepared claims must mount the
            // new version's files, and their device metadata must say what the devices are now.
            let driver = dra.prepared.clone();
            tokio::spawn(async move { driver.refresh_edits().await });
        }
    }

    /// Stops every server (within 10 s) and removes their sockets.
    async fn stop(self) {
        let Running { dps, dra, .. } = self;
        let stop_all = async {
            if let Some(d) = dra {
                d.handle.stop().await;
            }
            for (_, s) in dps.servers {
                s.handle.stop().await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), stop_all)
            .await
            .is_err()
        {
            tracing::warn!("servers did not stop within 10 s");
        }
    }

    /// Publishes the inventory to both APIs. The device-plugin selectors are evaluated once,
    /// and not at all when only health changed since the last publish; the DRA view is the one
    /// copy of the inventory made.
    async fn publish(&mut self, obs: &Observe) {
        let dp = (!self.dps.servers.is_empty()).then_some(&self.dps.publisher);
        let (dp_published, view) = {
            let inventory = self.inventory.read();
            let dp_published = dp.map(|p| {
                let selection = self
                    .selection
                    .take()
                    .unwrap_or_else(|| p.select(&inventory));
                let published = p.publish_selected(&inventory, &selection);
                self.selection = Some(selection);
                published
            });
            let view = self.dra.as_ref().map(|_| {
                Arc::new(dra_view(
                    &inventory,
                    self.selection.as_ref().filter(|_| dp.is_some()),
                ))
            });
            (dp_published, view)
        };
        publish_all(
            dp_published,
            dp,
            self.dra.as_ref(),
            view,
            &mut self.clock,
            obs,
        )
        .await;
    }

    /// Discovers slot `slot` again into the inventory; false when discovery failed and nothing
    /// changed.
    async fn rediscover(&mut self, backends: &Backends, slot: usize) -> bool {
        let mut inventory = self.inventory.read().clone();
        let changed = backends.rediscover(slot, &mut inventory).await;
        if changed {
            *self.inventory.write() = inventory;
            self.selection = None;
        }
        // Only now: whoever waits for a discovery (a rebuild of lost claims) reads the devices'
        // attributes from the inventory.
        backends.note_discovery(slot, changed);
        changed
    }
}

/// Serves `config` (read from `path`) until `cancel`: connects to the API server in DRA mode,
/// runs the daemon, stops the ResourceSlice publisher.
pub async fn serve(
    config: crate::config::Config,
    path: &std::path::Path,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let cluster = match config.dra(path, |k| std::env::var(k).ok())? {
        Some(spec) => Some(connect_cluster(&spec).await?),
        None => None,
    };
    let (services, task) = match cluster {
        Some((s, t)) => (Some(s), Some(t)),
        None => (None, None),
    };
    let result = run(config, path, services, cancel).await;
    if let Some(t) = task {
        t.stop().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend whose discovery failed is asked to discover again 5 s later, then with the
    /// pause doubling; once one succeeds it is asked no more, and a later failure starts again
    /// from the first pause.
    #[tokio::test(start_paused = true)]
    async fn a_failed_discovery_is_tried_again_with_growing_pauses_until_one_succeeds() {
        let backends = Backends::new(Vec::new());
        let (tx, mut rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        tokio::spawn(retry_failed_discovery(
            3,
            "usb".into(),
            backends.failed_discoveries(),
            tx,
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(
            rx.try_recv().is_err(),
            "asked to discover while none failed"
        );

        backends.note_discovery(2, false);
        backends.note_discovery(3, false);
        let failed = tokio::time::Instant::now();
        let mut asked = Vec::new();
        for _ in 0..3 {
            assert_eq!(rx.recv().await, Some(SourceEvent::Rediscover));
            asked.push(failed.elapsed().as_secs());
        }
        assert_eq!(asked, [5, 15, 35]);

        backends.note_discovery(3, true);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(
            rx.try_recv().is_err(),
            "asked again after a discovery succeeded"
        );

        backends.note_discovery(3, false);
        let again = tokio::time::Instant::now();
        assert_eq!(rx.recv().await, Some(SourceEvent::Rediscover));
        assert_eq!(again.elapsed().as_secs(), 5);
        stop.cancel();
    }
}
