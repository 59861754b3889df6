//! The daemon's runtime: backends in, kubelet servers and publishers out.
//!
//! It discovers every backend's devices into one inventory, publishes it (device-plugin
//! resources, ResourceSlices), applies the backends' health and hot-plug events, and routes the
//! kubelet's requests to the backend that owns each device.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use kubedev_core::cdi::CdiWriter;
use kubedev_core::checkpoint::CheckpointStore;
use kubedev_core::{
    AllocatedDevice, Consumer, ContainerEdits, DeviceFilter, DeviceRef, Health, Inventory,
    PrepareError, Publisher, SourceEvent,
};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandle, DevicePluginHandler,
    DevicePluginPublisher, PluginDevice, PreferenceRequest, ResourceDevices,
};
use kubedev_kubelet_grpc::dra::{DeviceHealthReport, DraPlugin, DraPluginConfig, DraPluginHandle};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use crate::backends::{Backend, Backends};
use crate::config::Config;
use crate::dra_driver::{ClaimSource, DraDriver};
use crate::http::Probes;
use crate::metrics::Metrics;
use crate::policy::{PolicySource, PolicyState};

pub use kubedev_core::factory::BuildMode;

/// Builds the backends the configuration names, in the order of its registry.
pub fn build_backends(config: &Config, mode: BuildMode) -> anyhow::Result<Vec<Backend>> {
    let mut out = Vec::new();
    for kind in config.registry.kinds() {
        out.extend(build_backend(config, kind, mode)?);
    }
    Ok(out)
}

/// Builds the backend `kind` (a kind of the configuration's registry) when the configuration
/// names it. Each backend gets the host root, its own state directory `<stateDir>/<kind>`
/// (created here) and the node's name.
pub fn build_backend(
    config: &Config,
    kind: &str,
    mode: BuildMode,
) -> anyhow::Result<Option<Backend>> {
    let (Some(section), Some(factory)) = (config.backends.get(kind), config.registry.get(kind))
    else {
        return Ok(None);
    };
    let state_dir = config.state_dir.join(kind);
    kubedev_core::safefs::create_private_dir_all(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let context = kubedev_core::factory::BuildContext::new(
        kubedev_core::BackendContext {
            host: kubedev_core::HostFs::new(&config.host_root),
            state_dir,
            node_name: node_name(config),
        },
        mode,
    );
    let built = factory
        .build(section, &context)
        .map_err(|e| anyhow::anyhow!("backends.{kind}: {e}"))?;
    Ok(Some(Backend {
        source: built.source,
        preparer: built.preparer,
    }))
}

/// Whether the backend `kind` must be rebuilt to go from `old` to `new`: its section changed,
/// or (for a backend with a pool of its own) the host root, state directory or node.
fn backend_changed(old: &Config, new: &Config, kind: &str) -> bool {
    let section = old.backends.get(kind) != new.backends.get(kind);
    let host_side = new.registry.get(kind).is_some_and(|f| f.own_pool())
        && (old.host_root != new.host_root
            || old.state_dir != new.state_dir
            || node_name(old) != node_name(new));
    section || host_side
}

/// The node's name: from the configuration, else `NODE_NAME`, else the host name.
pub fn node_name(config: &Config) -> String {
    config
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_string())
}

/// What the DRA mode needs from the cluster: where claims are read and where slices are written.
/// The binary builds them from the API server; tests pass their own.
#[derive(Clone)]
pub struct ClusterServices {
    /// Reads the allocation of a claim.
    pub claims: Arc<dyn ClaimSource>,
    /// Publishes the inventory as ResourceSlices.
    pub slices: Arc<dyn Publisher>,
    /// Records Kubernetes Events about the node (what recovery lost and rebuilt), when the API
    /// server is reachable.
    pub events: Option<kubedev_apiserver::NodeEvents>,
    /// What the API server keeps of what kubedev writes (its version, the gated features it
    /// drops and what was published instead), when the slices go to an API server.
    pub api: Option<kubedev_apiserver::ApiStatus>,
}

impl std::fmt::Debug for ClusterServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterServices")
    }
}

/// Answers the kubelet's `Allocate` for one resource through the owning backends' preparers, and
/// `GetPreferredAllocation` through the resource's selection policy, if it has one.
struct ResourceHandler {
    resource: Arc<ResourceDevices>,
    backends: Backends,
    policy: Option<PolicySource>,
    inventory: Arc<std::sync::RwLock<Inventory>>,
    cdi: Option<DevicePluginCdi>,
    metrics: Arc<Metrics>,
}

/// CDI mode of one device-plugin resource: every device ever allocated gets a CDI device in one
/// spec file for the resource (kind `k8s.<resource domain>/claim`, devices `dp-<name>-<device>`),
/// so `Allocate` can answer with CDI names. The kubelet never releases device-plugin devices
/// explicitly, so the spec only grows while the daemon runs; a device's edits do not change.
struct DevicePluginCdi {
    writer: CdiWriter,
    key: String,
    devices: std::sync::Mutex<std::collections::BTreeMap<DeviceRef, kubedev_core::PreparedDevice>>,
}

impl DevicePluginCdi {
    fn new(dir: &Path, resource: &kubedev_core::ExtendedResourceName) -> anyhow::Result<Self> {
        let (domain, name) = resource
            .as_str()
            .split_once('/')
            .context("extended resource names have a domain")?;
        let driver = kubedev_core::DriverName::new(domain).with_context(|| {
            format!("CDI mode for {resource}: the domain must be a driver name")
        })?;
        let key = format!("dp-{}", name.replace(['.', '_'], "-").to_ascii_lowercase());
        Ok(DevicePluginCdi {
            writer: CdiWriter::new(dir, &driver),
            key,
            devices: Default::default(),
        })
    }

    /// Adds `prepared` to the resource's spec and returns their CDI names.
    fn write(
        &self,
        prepared: &[kubedev_core::PreparedDevice],
    ) -> Result<Vec<String>, PrepareError> {
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        for p in prepared {
            devices.insert(p.device.device.clone(), p.clone());
        }
        let all: Vec<_> = devices.values().cloned().collect();
        let written = self
            .writer
            .write_claim(&self.key, &all)
            .map_err(|e| PrepareError::Other(format!("writing the CDI spec: {e}")))?;
        let mut names = Vec::new();
        for p in prepared {
            let i = all
                .iter()
                .position(|a| a.device.device == p.device.device)
                .unwrap_or_default();
            if let Some(Some(id)) = written.device_ids.get(i) {
                names.push(id.clone());
            }
        }
        Ok(names)
    }
}

#[async_trait]
impl DevicePluginHandler for ResourceHandler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        let mut allocated = Vec::with_capacity(devices.len());
        for d in devices {
            let r = self
                .resource
                .device_ref(&d.id)
                .ok_or_else(|| PrepareError::UnknownDevice {
                    device: d.id.clone(),
                })?;
            // Replicas of one time-sliced device are one device to prepare.
            if allocated.iter().any(|a: &AllocatedDevice| a.device == r) {
                continue;
            }
            allocated.push(AllocatedDevice {
                admin_access: false,
                device: r,
                request: String::new(),
                share_id: None,
                config: Vec::new(),
            });
        }
        let consumer = Consumer::Container {
            resource: self.resource.name().to_string(),
        };
        let span = tracing::info_span!("allocate", resource = %self.resource.name());
        let prepared =
            tracing::Instrument::instrument(self.backends.prepare(&consumer, &allocated), span)
                .await?;
        if let Some(cdi) = &self.cdi {
            let cdi_devices = cdi.write(&prepared)?;
            return Ok(Allocation {
                edits: ContainerEdits::default(),
                cdi_devices,
            });
        }
        let mut edits = ContainerEdits::default();
        for p in prepared {
            edits.merge(&p.edits);
        }
        Ok(Allocation {
            edits,
            cdi_devices: Vec::new(),
        })
    }

    async fn pre_start(&self, devices: &[PluginDevice]) -> Result<(), PrepareError> {
        let refs = devices
            .iter()
            .map(|d| {
                self.resource
                    .device_ref(&d.id)
                    .ok_or_else(|| PrepareError::UnknownDevice {
                        device: d.id.clone(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.backends.pre_start(&refs).await
    }

    fn needs_pre_start(&self) -> bool {
        self.backends.needs_pre_start()
    }

    fn preferred_allocation(&self, request: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        let inventory = self.inventory.read().unwrap_or_else(|e| e.into_inner());
        self.policy
            .as_ref()?
            .choose(&self.resource, &inventory, request, &self.metrics)
    }
}

/// Health of every device with the time it last changed, for the DRA health stream.
#[derive(Debug, Default)]
struct HealthClock(HashMap<DeviceRef, (Health, i64)>);

impl HealthClock {
    fn reports(&mut self, inventory: &Inventory) -> Vec<DeviceHealthReport> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (pool, dev) in inventory.devices() {
            let r = DeviceRef {
                pool: pool.name.clone(),
                device: dev.name.clone(),
            };
            let since = match self.0.get(&r) {
                Some((h, t)) if *h == dev.health => *t,
                _ => now,
            };
            out.push(DeviceHealthReport {
                pool: pool.name.to_string(),
                device: dev.name.to_string(),
                health: dev.health.clone(),
                last_updated: since,
            });
            seen.insert(r, (dev.health.clone(), since));
        }
        self.0 = seen;
        out
    }
}

/// Who serves which device: device-plugin resources take the devices their selectors match, DRA
/// publishes only the rest, so the scheduler never hands one device to a device-plugin pod and a
/// DRA claim.
#[derive(Debug, Default)]
struct Ownership {
    device_plugin: Vec<crate::selector::ResourceFilter>,
}

impl Ownership {
    /// The inventory DRA publishes: every device no device-plugin resource takes.
    fn dra_view(&self, inventory: &Inventory) -> Inventory {
        if self.device_plugin.is_empty() {
            return inventory.clone();
        }
        let mut view = inventory.clone();
        for pool in &mut view.pools {
            let snapshot = pool.clone();
            pool.devices.retain(|d| {
                !self
                    .device_plugin
                    .iter()
                    .any(|f| f.matches(&snapshot, d).unwrap_or(false))
            });
        }
        view
    }
}

/// Publishes the full inventory to the device-plugin publisher, and the DRA view to the slices
/// and the DRA health stream; counts devices by API, resource, pool and health.
async fn publish_all(
    dp: Option<&DevicePluginPublisher>,
    dra: Option<&Dra>,
    ownership: &Ownership,
    clock: &mut HealthClock,
    inventory: &Inventory,
    obs: &Observe,
) {
    obs.metrics.devices.clear();
    if let Some(p) = dp {
        if let Err(e) = p.publish(inventory).await {
            tracing::error!(error = %e, "device-plugin publishing failed");
        }
        for r in p.resources() {
            let mut counts: std::collections::BTreeMap<(String, String), i64> = Default::default();
            for d in r.subscribe().borrow().iter() {
                let pool = r
                    .device_ref(&d.id)
                    .map(|x| x.pool.to_string())
                    .unwrap_or_default();
                *counts
                    .entry((pool, d.health.state.to_string()))
                    .or_default() += 1;
            }
            for ((pool, health), n) in counts {
                obs.metrics
                    .devices
                    .get_or_create(&crate::metrics::DeviceLabels {
                        api: "device-plugin".into(),
                        resource: r.name().to_string(),
                        pool,
                        health,
                    })
                    .set(n);
            }
        }
    }
    let Some(dra) = dra else {
        return;
    };
    let view = ownership.dra_view(inventory);
    for pool in &view.pools {
        let mut counts: std::collections::BTreeMap<String, i64> = Default::default();
        for d in &pool.devices {
            *counts.entry(d.health.state.to_string()).or_default() += 1;
        }
        for (health, n) in counts {
            obs.metrics
                .devices
                .get_or_create(&crate::metrics::DeviceLabels {
                    api: "dra".into(),
                    resource: dra.driver.clone(),
                    pool: pool.name.to_string(),
                    health,
                })
                .set(n);
        }
    }
    let published = dra.slices.publish(&view).await;
    obs.metrics
        .slice_publishes
        .get_or_create(&crate::metrics::ResultLabels {
            result: if published.is_ok() { "ok" } else { "error" }.into(),
        })
        .inc();
    obs.probes.set_published(published.is_ok());
    if let Err(e) = published {
        tracing::error!(error = %e, "ResourceSlice publishing failed");
    }
    dra.health.send_replace(clock.reports(&view));
}

/// Counts the kubelet's accepted registrations of one server into the registrations metric.
fn count_registrations<S: Send + Sync + 'static>(
    metrics: &Arc<Metrics>,
    api: &'static str,
    resource: String,
    mut status: watch::Receiver<S>,
    registrations: fn(&S) -> u64,
) {
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let labels = crate::metrics::RegistrationLabels {
            api: api.into(),
            resource,
        };
        let mut seen = 0u64;
        loop {
            let now = registrations(&status.borrow_and_update());
            if now > seen {
                metrics
                    .registrations
                    .get_or_create(&labels)
                    .inc_by(now - seen);
                seen = now;
            }
            if status.changed().await.is_err() {
                break;
            }
        }
    });
}

/// Keeps the held-devices metric current from the kubelet's pod resources API, so device metrics
/// carry pod, namespace and container labels. A missing socket is skipped quietly (the kubelet
/// may not serve it, or may be restarting); other failures are logged once per change.
async fn watch_holders(config: Config, metrics: Arc<Metrics>, cancel: CancellationToken) {
    use kubedev_kubelet_grpc::pod_resources::{Holding, PodResourcesClient, device_uses};
    let socket = config.metrics.pod_resources_socket.clone();
    let every = Duration::from_secs(config.metrics.pod_resources_interval_seconds.max(1));
    let mut last_error: Option<String> = None;
    loop {
        if socket.exists() {
            let listed = async {
                let mut c = PodResourcesClient::connect(&socket, Duration::from_secs(5)).await?;
                c.list().await
            }
            .await;
            match listed {
                Ok(pods) => {
                    last_error = None;
                    let rows = crate::who_uses::filter(device_uses(&pods), Some(&config), &[]);
                    metrics.held_devices.clear();
                    for r in rows {
                        let (api, resource, device) = match r.holding {
                            Holding::DevicePlugin { resource, device } => {
                                ("device-plugin", resource, device)
                            }
                            Holding::Dra {
                                driver,
                                pool,
                                device,
                                ..
                            } => ("dra", driver, format!("{pool}/{device}")),
                        };
                        metrics
                            .held_devices
                            .get_or_create(&crate::metrics::HolderLabels {
                                api: api.into(),
                                resource,
                                device,
                                namespace: r.namespace,
                                pod: r.pod,
                                container: r.container,
                            })
                            .set(1);
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    if last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(error = %e, "reading the kubelet's pod resources failed");
                        last_error = Some(e);
                    }
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Metrics and probes, shared by every part of the runtime.
#[derive(Clone)]
struct Observe {
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
}

struct Dra {
    driver: String,
    handle: DraPluginHandle,
    health: watch::Sender<Vec<DeviceHealthReport>>,
    slices: Arc<dyn Publisher>,
}

async fn start_dra(
    config: &Config,
    config_path: &Path,
    backends: &Backends,
    inventory: &Arc<std::sync::RwLock<Inventory>>,
    cluster: Option<ClusterServices>,
    cancel: &CancellationToken,
    obs: &Observe,
) -> anyhow::Result<Option<Dra>> {
    let Some(spec) = config.dra(config_path, |k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let cluster = cluster.context("DRA mode needs the API server, and none was configured")?;
    kubedev_core::safefs::create_private_dir_all(&spec.state_dir)
        .with_context(|| format!("creating {}", spec.state_dir.display()))?;
    let (state_dir, boot) = (spec.state_dir.clone(), spec.boot_id_path.clone());
    let (store, outcome) =
        tokio::task::spawn_blocking(move || CheckpointStore::open(&state_dir, &boot))
            .await?
            .context("opening the checkpoint")?;
    match &outcome {
        kubedev_core::checkpoint::LoadOutcome::Corrupt { .. } => {
            tracing::error!(checkpoint = %store.path().display(), "{outcome}");
        }
        _ => tracing::info!(checkpoint = %store.path().display(), "{outcome}"),
    }
    let cdi = CdiWriter::new(&spec.cdi_dir, &spec.driver);
    let driver = Arc::new(
        DraDriver::new(backends.clone(), cluster.claims.clone(), store, cdi)
            .with_metrics(obs.metrics.clone())
            .with_inventory(inventory.clone()),
    );
    let rec = driver
        .recover(&outcome)
        .await
        .map_err(anyhow::Error::msg)
        .context("start-up recovery")?;
    report_recovery(&rec, spec.driver.as_ref(), cluster.events.as_ref(), obs).await;
    if rec.cluster_error.is_some() {
        tokio::spawn(finish_recovery(
            driver.clone(),
            obs.metrics.clone(),
            obs.probes.clone(),
            cancel.child_token(),
        ));
    }
    let (health, health_rx) = watch::channel(Vec::new());
    let mut cfg = DraPluginConfig::new(spec.driver.clone())
        .plugin_dir(&spec.plugin_dir)
        .registry_dir(&spec.registry_dir)
        .health(spec.health);
    if let Some(uid) = &spec.pod_uid {
        cfg = cfg.pod_uid(uid);
    }
    let in_use = driver.clone();
    let handle = DraPlugin::start(cfg, driver, health_rx, cancel.child_token())
        .context("starting the DRA plugin")?;
    tracing::info!(driver = %spec.driver, socket = %handle.dra_socket().display(), "DRA plugin started");
    obs.probes.add_socket(handle.dra_socket().to_path_buf());
    obs.probes
        .add_socket(handle.registration_socket().to_path_buf());
    obs.probes
        .set_dra(spec.driver.to_string(), handle.watch_status());
    obs.probes.set_slices(cluster.slices.clone());
    obs.metrics.track_slice_writes(cluster.slices.clone());
    if let Some(api) = &cluster.api {
        api.set_in_use(move |pool, device| in_use.device_in_use(pool, device));
        tokio::spawn(report_api_features(
            api.subscribe(),
            spec.driver.to_string(),
            cluster.events.clone(),
            obs.clone(),
            cancel.child_token(),
        ));
    }
    count_registrations(
        &obs.metrics,
        "dra",
        spec.driver.to_string(),
        handle.watch_status(),
        |s| s.registrations,
    );
    Ok(Some(Dra {
        driver: spec.driver.to_string(),
        handle,
        health,
        slices: cluster.slices,
    }))
}

/// Reports each gated API feature the published devices need and the API server drops, as
/// long as that lasts: an ERROR line when it starts (INFO when it ends), the
/// `kubedev_api_feature_unavailable` gauge, a `FeatureUnavailable` Warning Event on the Node and
/// a `/readyz` note saying what was published instead.
async fn report_api_features(
    mut reports: watch::Receiver<kubedev_apiserver::ApiReport>,
    driver: String,
    events: Option<kubedev_apiserver::NodeEvents>,
    obs: Observe,
    cancel: CancellationToken,
) {
    let mut shown: std::collections::BTreeMap<
        kubedev_apiserver::ApiFeature,
        kubedev_apiserver::Degradation,
    > = Default::default();
    loop {
        let report = reports.borrow_and_update().clone();
        let version = report
            .version
            .as_ref()
            .map(|v| format!("Kubernetes {v} ({})", v.git_version))
            .unwrap_or_else(|| "the API server".into());
        for (feature, d) in &report.degraded {
            if shown.get(feature) == Some(d) {
                continue;
            }
            let summary = format!(
                "DRA driver {driver} needs {} (feature gate {}), but {}. Instead: {}.",
                feature.fields(),
                feature.gate(),
                d.found,
                d.action
            );
            tracing::error!(feature = feature.gate(), server = %version, "{summary}");
            obs.metrics
                .api_feature_unavailable
                .get_or_create(&crate::metrics::FeatureLabels {
                    feature: feature.gate().into(),
                })
                .set(1);
            obs.probes.set_notice(
                &format!("api-feature/{}", feature.gate()),
                Some(summary.clone()),
            );
            if let Some(events) = &events
                && let Err(e) = events.warn("FeatureUnavailable", "Publish", &summary).await
            {
                tracing::warn!(error = %e, "could not record the missing API feature as an Event");
            }
        }
        for feature in shown.keys() {
            if !report.degraded.contains_key(feature) {
                tracing::info!(
                    feature = feature.gate(),
                    server = %version,
                    "the API server keeps {} again (or nothing published needs them); publishing everything",
                    feature.fields()
                );
                obs.metrics
                    .api_feature_unavailable
                    .get_or_create(&crate::metrics::FeatureLabels {
                        feature: feature.gate().into(),
                    })
                    .set(0);
                obs.probes
                    .set_notice(&format!("api-feature/{}", feature.gate()), None);
            }
        }
        shown = report.degraded.clone();
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = reports.changed() => if changed.is_err() { return },
        }
    }
}

/// Logs, counts and (after a lost checkpoint) reports to the cluster what start-up recovery
/// did: an ERROR log, the `kubedev_dra_recovery_total` metric, a Warning Event on the Node and
/// a line on `/readyz`.
async fn report_recovery(
    rec: &crate::dra_driver::Recovery,
    driver: &str,
    events: Option<&kubedev_apiserver::NodeEvents>,
    obs: &Observe,
) {
    let count = |outcome: &str, n: usize| {
        if n > 0 {
            obs.metrics
                .recovery
                .get_or_create(&crate::metrics::RecoveryLabels {
                    outcome: outcome.into(),
                })
                .inc_by(n as u64);
        }
    };
    count("rolled_back", rec.rolled_back.len());
    count("cdi_repaired", rec.cdi_repaired.len());
    count("cdi_removed", rec.cdi_removed.len());
    count("rebuilt", rec.rebuilt.len());
    count("rebuild_failed", rec.rebuild_failed.len());
    count("kept_unverified", rec.kept_unverified.len());
    let Some(lost) = &rec.checkpoint_lost else {
        if rec != &Default::default() {
            tracing::warn!(rolled_back = ?rec.rolled_back, cdi_repaired = ?rec.cdi_repaired, cdi_removed = ?rec.cdi_removed, cdi_temp_removed = ?rec.cdi_temp_removed, left_to_other_instance = ?rec.left_to_other_instance, "recovered from an unclean stop");
        }
        return;
    };
    count("checkpoint_lost", 1);
    let mut summary = format!(
        "DRA driver {driver} lost its record of prepared claims ({lost}). Rebuilt {} claim(s) from the API server",
        rec.rebuilt.len()
    );
    if !rec.rebuild_failed.is_empty() {
        summary.push_str(&format!(
            "; {} could not be prepared again ({})",
            rec.rebuild_failed.len(),
            rec.rebuild_failed
                .iter()
                .map(|(uid, e)| format!("{uid}: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(e) = &rec.cluster_error {
        summary.push_str(&format!(
            "; the API server could not be asked ({e}), so {} CDI spec(s) with no record were kept unverified",
            rec.kept_unverified.len()
        ));
    }
    summary.push_str(&format!(
        "; removed {} CDI spec(s) of claims the API server no longer lists as reserved on this node.",
        rec.cdi_removed.len()
    ));
    tracing::error!(
        rebuilt = ?rec.rebuilt,
        rebuild_failed = ?rec.rebuild_failed,
        kept_unverified = ?rec.kept_unverified,
        cdi_removed = ?rec.cdi_removed,
        cdi_repaired = ?rec.cdi_repaired,
        "{summary}"
    );
    obs.probes.add_notice(summary.clone());
    if let Some(events) = events
        && let Err(e) = events.warn("CheckpointLost", "Recover", &summary).await
    {
        tracing::warn!(error = %e, "could not record the lost checkpoint as an Event");
    }
}

/// After a lost checkpoint whose rebuild could not ask the API server: tries again, 5 s after
/// start and then with the wait doubling up to 5 minutes, until the API server answers; then
/// logs and counts what it rebuilt and removed, and updates the `/readyz` note.
async fn finish_recovery(
    driver: Arc<DraDriver>,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
    cancel: CancellationToken,
) {
    let mut wait = Duration::from_secs(5);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(300));
        let rec = match driver.retry_rebuild().await {
            Ok(rec) if rec.cluster_error.is_none() => rec,
            Ok(rec) => {
                tracing::debug!(error = ?rec.cluster_error, "the API server still cannot list the claims to rebuild");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "finishing the recovery of a lost checkpoint failed; trying again");
                continue;
            }
        };
        for (outcome, n) in [
            ("rebuilt", rec.rebuilt.len()),
            ("rebuild_failed", rec.rebuild_failed.len()),
            ("cdi_removed", rec.cdi_removed.len()),
        ] {
            if n > 0 {
                metrics
                    .recovery
                    .get_or_create(&crate::metrics::RecoveryLabels {
                        outcome: outcome.into(),
                    })
                    .inc_by(n as u64);
            }
        }
        let summary = format!(
            "the API server answered: rebuilt {} more claim(s), {} could not be prepared again, removed {} CDI spec(s) of claims it does not list as reserved on this node",
            rec.rebuilt.len(),
            rec.rebuild_failed.len(),
            rec.cdi_removed.len()
        );
        tracing::warn!(rebuilt = ?rec.rebuilt, rebuild_failed = ?rec.rebuild_failed, cdi_removed = ?rec.cdi_removed, "finished the recovery of a lost checkpoint: {summary}");
        probes.add_notice(format!("recovery finished later: {summary}"));
        return;
    }
}

/// One running device-plugin resource.
struct DpServer {
    name: kubedev_core::ExtendedResourceName,
    /// Its configuration as written, to tell what a reload changes.
    config: crate::config::ResourceConfig,
    filter: crate::selector::ResourceFilter,
    handle: DevicePluginHandle,
}

/// The device-plugin side: the publisher feeding every resource, and the running servers.
#[derive(Default)]
struct DevicePlugins {
    publisher: DevicePluginPublisher,
    servers: BTreeMap<String, DpServer>,
    policies: PolicyState,
}

/// What the runtime shares with every part it starts.
struct Shared<'a> {
    backends: &'a Backends,
    inventory: &'a Arc<std::sync::RwLock<Inventory>>,
    obs: &'a Observe,
    cancel: &'a CancellationToken,
}

impl DevicePlugins {
    /// The filters of the running resources: what DRA must not publish.
    fn ownership(&self) -> Ownership {
        Ownership {
            device_plugin: self.servers.values().map(|s| s.filter.clone()).collect(),
        }
    }

    /// Adds `specs` to the publisher, publishes `inventory` to every resource (so each server's
    /// first snapshot is complete, and a selector that makes device IDs clash is refused), then
    /// starts their servers. On an error the new resources are taken out again.
    async fn start(
        &mut self,
        specs: Vec<(
            crate::config::ResourceSpec,
            crate::config::ResourceConfig,
            Option<PolicySource>,
        )>,
        dp: &crate::config::DevicePluginSection,
        inventory: &Inventory,
        sh: &Shared<'_>,
    ) -> anyhow::Result<()> {
        let mut added = Vec::new();
        for (r, raw, policy) in specs {
            let devices = self.publisher.add_shared_resource(
                r.name.clone(),
                Box::new(r.filter.clone()),
                r.replicas,
            );
            added.push((r, raw, policy, devices));
        }
        let names: Vec<_> = added.iter().map(|(r, ..)| r.name.clone()).collect();
        // The kubelet creates its device-plugin directory at start; one that does not exist yet
        // (the kubelet starts later, or a workstation run) is created here, as the kubelet would.
        if !added.is_empty() && !dp.directory.is_dir() {
            if let Err(e) = kubedev_core::safefs::create_private_dir_all(&dp.directory) {
                self.forget_unstarted(&names);
                return Err(e).with_context(|| {
                    format!(
                        "creating the device-plugin directory {}",
                        dp.directory.display()
                    )
                });
            }
            tracing::info!(directory = %dp.directory.display(), "created the device-plugin directory");
        }
        if let Err(e) = self.publisher.publish(inventory).await {
            self.forget_unstarted(&names);
            return Err(e).context("publishing the inventory to the device-plugin resources");
        }
        for (r, raw, policy, devices) in added {
            let started = (|| -> anyhow::Result<DevicePluginHandle> {
                let mut cfg =
                    DevicePluginConfig::new(devices.name().clone()).plugin_dir(&dp.directory);
                if let Some(k) = &dp.kubelet_socket {
                    cfg = cfg.kubelet_socket(k);
                }
                let handler = Arc::new(ResourceHandler {
                    resource: devices.clone(),
                    backends: sh.backends.clone(),
                    policy,
                    inventory: sh.inventory.clone(),
                    cdi: if dp.cdi {
                        Some(DevicePluginCdi::new(&dp.cdi_dir, devices.name())?)
                    } else {
                        None
                    },
                    metrics: sh.obs.metrics.clone(),
                });
                DevicePlugin::start(cfg, handler, devices.subscribe(), sh.cancel.child_token())
                    .with_context(|| {
                        format!("starting the device-plugin server for {}", devices.name())
                    })
            })();
            let handle = match started {
                Ok(h) => h,
                Err(e) => {
                    self.forget_unstarted(&names);
                    return Err(e);
                }
            };
            tracing::info!(resource = %r.name, socket = %handle.socket_path().display(), "device-plugin server started");
            sh.obs.probes.add_socket(handle.socket_path().to_path_buf());
            sh.obs
                .probes
                .add_device_plugin(r.name.to_string(), handle.watch_status());
            count_registrations(
                &sh.obs.metrics,
                "device-plugin",
                r.name.to_string(),
                handle.watch_status(),
                |s| s.registrations,
            );
            self.servers.insert(
                r.name.to_string(),
                DpServer {
                    name: r.name.clone(),
                    config: raw,
                    filter: r.filter,
                    handle,
                },
            );
        }
        Ok(())
    }

    /// Takes the resources of `names` that have no running server out of the publisher.
    fn forget_unstarted(&mut self, names: &[kubedev_core::ExtendedResourceName]) {
        for n in names {
            if !self.servers.contains_key(n.as_str()) {
                self.publisher.remove_resource(n);
            }
        }
    }

    /// Stops the server of `name` and takes its resource out of the publisher.
    async fn stop(&mut self, name: &str, obs: &Observe) {
        if let Some(s) = self.servers.remove(name) {
            obs.probes.remove_socket(s.handle.socket_path());
            obs.probes.remove_device_plugin(name);
            self.publisher.remove_resource(&s.name);
            s.handle.stop().await;
            tracing::info!(resource = %name, "device-plugin server stopped");
        }
    }
}

/// Starts the watcher of the backend in `slot`; it stops when `stop` fires.
fn spawn_watcher(
    watchers: &mut JoinSet<()>,
    slot: usize,
    backend: &Backend,
    tx: mpsc::Sender<(usize, SourceEvent)>,
    stop: CancellationToken,
) {
    let (btx, mut brx) = mpsc::channel(64);
    let source = backend.source.clone();
    let name = source.name().to_string();
    watchers.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            r = source.watch(btx) => if let Err(e) = r {
                tracing::error!(backend = %name, error = %e, "watch failed");
            },
        }
    });
    watchers.spawn(async move {
        while let Some(ev) = brx.recv().await {
            if tx.send((slot, ev)).await.is_err() {
                break;
            }
        }
    });
}

/// Watches the configuration file: every change that parses and validates is sent on; one that
/// does not is logged with the reason (and counted), and the running configuration stays.
async fn watch_config(
    path: PathBuf,
    registry: crate::registry::Registry,
    tx: mpsc::Sender<Config>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let read = |p: &Path| std::fs::read(p).ok();
    let mut last = read(&path);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
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
                tracing::error!(error = %e, "configuration change rejected; the running configuration stays");
            }
        }
    }
}

/// Runs the daemon until `cancel` fires; stops every server and removes its sockets on the way
/// out. `cluster` is needed when DRA mode is on. Changes to the configuration file are applied
/// while it runs (see [`Running::reload`]).
pub async fn run(
    config: Config,
    config_path: &Path,
    cluster: Option<ClusterServices>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
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
    let backends = Backends::new(Vec::new());
    for (slot, kind) in config.registry.kinds().enumerate() {
        if let Some(b) = build_backend(&config, kind, BuildMode::Serve)? {
            backends.set(slot, Some(b));
        }
    }
    let resources = config.resources(config_path)?;
    let inventory = backends.discover_all().await;
    let shared_inventory = Arc::new(std::sync::RwLock::new(inventory.clone()));
    tracing::info!(
        backends = backends.list().len(),
        pools = inventory.pools.len(),
        devices = inventory.devices().count(),
        "discovered"
    );

    let sh = Shared {
        backends: &backends,
        inventory: &shared_inventory,
        obs: &obs,
        cancel: &cancel,
    };
    let mut dps = DevicePlugins::default();
    if config.device_plugin.enabled && !resources.is_empty() {
        let mut specs = Vec::new();
        for (r, raw) in resources
            .into_iter()
            .zip(config.device_plugin.resources.iter())
        {
            let policy = dps
                .policies
                .load(&r, &config.device_plugin, &cancel)
                .await?;
            specs.push((r, raw.clone(), policy));
        }
        dps.start(specs, &config.device_plugin, &inventory, &sh)
            .await?;
    }

    let dra = start_dra(
        &config,
        config_path,
        &backends,
        &shared_inventory,
        cluster,
        &cancel,
        &obs,
    )
    .await?;
    let registry = config.registry.clone();
    let mut running = Running {
        config,
        path: config_path.to_path_buf(),
        inventory,
        dps,
        dra,
        clock: HealthClock::default(),
        watcher_stops: BTreeMap::new(),
    };
    running.publish(&obs).await;
    // Every configured server is started and known to the probes: from now on `/readyz`
    // answers from their registrations.
    obs.probes.set_started();

    // Backend watchers feed one event channel.
    let (tx, mut rx) = mpsc::channel::<(usize, SourceEvent)>(256);
    let mut watchers = JoinSet::new();
    for (slot, b) in backends.list() {
        let stop = cancel.child_token();
        spawn_watcher(&mut watchers, slot, &b, tx.clone(), stop.clone());
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
            Some((slot, ev)) = rx.recv() => {
                let changed = match ev {
                    SourceEvent::Health { device, health } => {
                        tracing::info!(%device, state = %health.state, reason = health.reason.as_deref().unwrap_or(""), "health changed");
                        running.inventory.set_health(&device, health)
                    }
                    SourceEvent::Rediscover => backends.rediscover(slot, &mut running.inventory).await,
                    _ => false,
                };
                if changed {
                    *shared_inventory.write().unwrap_or_else(|e| e.into_inner()) =
                        running.inventory.clone();
                    running.publish(&obs).await;
                }
            }
        }
    }

    tracing::info!("stopping");
    watchers.shutdown().await;
    let Running { dps, dra, .. } = running;
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
    Ok(())
}

/// The running daemon's state that a configuration reload changes.
struct Running {
    config: Config,
    path: PathBuf,
    inventory: Inventory,
    dps: DevicePlugins,
    dra: Option<Dra>,
    clock: HealthClock,
    /// Stops each backend slot's watcher.
    watcher_stops: BTreeMap<usize, CancellationToken>,
}

impl Running {
    async fn publish(&mut self, obs: &Observe) {
        let dp = (!self.dps.servers.is_empty()).then_some(&self.dps.publisher);
        publish_all(
            dp,
            self.dra.as_ref(),
            &self.dps.ownership(),
            &mut self.clock,
            &self.inventory,
            obs,
        )
        .await;
    }

    /// Applies a new configuration: backends whose section changed are rebuilt (the others keep
    /// running), device-plugin resources that were added, removed or changed are started or
    /// stopped (the others keep serving). Everything that can fail — building backends, loading
    /// policies — happens before anything changes, so an error leaves the running set as it
    /// was. Changes to `dra`, `metrics` and `nodeName` in DRA mode take effect at the next
    /// restart; they are logged. Returns a summary of what changed.
    async fn reload(
        &mut self,
        new: Config,
        sh: &Shared<'_>,
        watchers: &mut JoinSet<()>,
        tx: &mpsc::Sender<(usize, SourceEvent)>,
    ) -> anyhow::Result<String> {
        let old = &self.config;
        // 1. Everything that can fail; backends last, since building one may act on the host
        //    (the vGPU type manager).
        let resources = new.resources(&self.path)?;
        let dp_wide_changed = {
            let (a, b) = (&old.device_plugin, &new.device_plugin);
            a.enabled != b.enabled
                || a.directory != b.directory
                || a.kubelet_socket != b.kubelet_socket
                || a.cdi != b.cdi
                || a.cdi_dir != b.cdi_dir
                || a.policy_dir != b.policy_dir
        };
        let wanted: BTreeMap<String, (crate::config::ResourceSpec, crate::config::ResourceConfig)> =
            if new.device_plugin.enabled {
                resources
                    .into_iter()
                    .zip(new.device_plugin.resources.iter().cloned())
                    .map(|(r, raw)| (r.name.to_string(), (r, raw)))
                    .collect()
            } else {
                BTreeMap::new()
            };
        let to_stop: Vec<String> = self
            .dps
            .servers
            .iter()
            .filter(|(name, s)| {
                dp_wide_changed || wanted.get(*name).is_none_or(|(_, raw)| *raw != s.config)
            })
            .map(|(name, _)| name.clone())
            .collect();
        let mut to_start = Vec::new();
        for (name, (r, raw)) in &wanted {
            if self.dps.servers.contains_key(name) && !to_stop.contains(name) {
                continue;
            }
            let policy = self
                .dps
                .policies
                .load(r, &new.device_plugin, sh.cancel)
                .await?;
            to_start.push((r.clone(), raw.clone(), policy));
        }
        let mut rebuilt = Vec::new();
        for (slot, kind) in new.registry.kinds().enumerate() {
            if backend_changed(old, &new, kind) {
                rebuilt.push((slot, kind.to_owned(), build_backend(&new, kind, BuildMode::Serve)?));
            }
        }
        let mut restart_needed = Vec::new();
        if old.dra != new.dra {
            restart_needed.push("dra");
        }
        if old.metrics != new.metrics {
            restart_needed.push("metrics");
        }
        if old.node_name != new.node_name && self.dra.is_some() {
            restart_needed.push("nodeName");
        }

        // 2. Backends: stop the old watcher, swap the slot, discover it again, watch it.
        let mut summary = Vec::new();
        for (slot, kind, backend) in rebuilt {
            if let Some(stop) = self.watcher_stops.remove(&slot) {
                stop.cancel();
            }
            let present = backend.is_some();
            sh.backends.set(slot, backend.clone());
            sh.backends.rediscover(slot, &mut self.inventory).await;
            if let Some(b) = &backend {
                let stop = sh.cancel.child_token();
                spawn_watcher(watchers, slot, b, tx.clone(), stop.clone());
                self.watcher_stops.insert(slot, stop);
            }
            summary.push(format!(
                "backend {kind} {}",
                if present { "(re)started" } else { "stopped" }
            ));
        }
        *sh.inventory.write().unwrap_or_else(|e| e.into_inner()) = self.inventory.clone();

        // 3. Device-plugin resources.
        for name in &to_stop {
            self.dps.stop(name, sh.obs).await;
            if !wanted.contains_key(name) {
                summary.push(format!("resource {name} stopped"));
            }
        }
        let started: Vec<String> = to_start.iter().map(|(r, ..)| r.name.to_string()).collect();
        if !to_start.is_empty() {
            self.dps
                .start(to_start, &new.device_plugin, &self.inventory, sh)
                .await?;
            summary.extend(started.iter().map(|n| format!("resource {n} started")));
        }
        if !restart_needed.is_empty() {
            tracing::warn!(
                sections = ?restart_needed,
                "these configuration changes take effect at the next restart"
            );
        }
        self.config = new;
        self.publish(sh.obs).await;
        Ok(if summary.is_empty() {
            "nothing to change".to_string()
        } else {
            summary.join(", ")
        })
    }
}
