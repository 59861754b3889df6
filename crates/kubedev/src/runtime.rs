//! The daemon's runtime: backends in, kubelet servers and publishers out.
//!
//! It discovers every backend's devices into one inventory, publishes it (device-plugin
//! resources, ResourceSlices), applies the backends' health and hot-plug events, and routes the
//! kubelet's requests to the backend that owns each device.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use kubedev_core::cdi::CdiWriter;
use kubedev_core::checkpoint::CheckpointStore;
use kubedev_core::static_backend::StaticBackend;
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

/// Builds the backends the configuration names.
pub fn build_backends(config: &Config) -> anyhow::Result<Vec<Backend>> {
    let mut out = Vec::new();
    if let Some(s) = &config.backends.static_devices {
        let b = Arc::new(StaticBackend::new(s.clone()).context("backends.static")?);
        out.push(Backend {
            source: b.clone(),
            preparer: b,
        });
    }
    // What each host backend is given: the host root, its own state directory, the node.
    #[allow(unused_variables)]
    let context = |name: &str| -> anyhow::Result<kubedev_core::BackendContext> {
        let state_dir = config.state_dir.join(name);
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating state directory {}", state_dir.display()))?;
        Ok(kubedev_core::BackendContext {
            host: kubedev_core::HostFs::new(&config.host_root),
            state_dir,
            node_name: node_name(config),
        })
    };
    macro_rules! host_backend {
        ($feature:literal, $field:ident, $ty:path) => {
            #[cfg(feature = $feature)]
            if let Some(c) = &config.backends.$field {
                let b = Arc::new(
                    <$ty>::new(c.clone(), &context($feature)?)
                        .context(concat!("backends.", $feature))?,
                );
                out.push(Backend {
                    source: b.clone(),
                    preparer: b,
                });
            }
        };
    }
    host_backend!("nvidia", nvidia, kubedev_nvidia::NvidiaBackend);
    #[cfg(feature = "vfio")]
    if let Some(c) = &config.backends.vfio {
        let b = kubedev_vfio::VfioBackend::new(c.clone(), &context("vfio")?)
            .context("backends.vfio")?;
        if !c.desired_mdev_types.is_empty() {
            // Before discovery, so the mediated devices it creates are offered at once.
            match b.type_manager().apply() {
                Ok(report) => {
                    tracing::info!(
                        created = report.created.len(),
                        removed = report.removed.len(),
                        "mediated device types applied"
                    );
                    for e in &report.errors {
                        tracing::error!(error = %e, "mediated device type change failed");
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "applying backends.vfio.desiredMdevTypes failed")
                }
            }
        }
        let b = Arc::new(b);
        out.push(Backend {
            source: b.clone(),
            preparer: b,
        });
    }
    host_backend!("usb", usb, kubedev_usb::UsbBackend);
    host_backend!("host", host, kubedev_host::HostBackend);
    Ok(out)
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

/// Where a resource's selection policy comes from.
enum PolicySource {
    /// A module loaded once at start.
    Fixed(kubedev_sandbox::WasmPolicy),
    /// A module of the watched policy directory, looked up at every call so a reload takes
    /// effect at once (a bad new module leaves the old one in place).
    Dir(Arc<kubedev_sandbox::PolicyDir>, String),
}

impl PolicySource {
    fn current(&self) -> Option<kubedev_sandbox::WasmPolicy> {
        match self {
            PolicySource::Fixed(p) => Some(p.clone()),
            PolicySource::Dir(dir, name) => dir.get(name),
        }
    }
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

impl ResourceHandler {
    fn policy_choice(
        &self,
        policy: &kubedev_sandbox::WasmPolicy,
        request: &PreferenceRequest<'_>,
    ) -> Option<Vec<String>> {
        let inventory = self.inventory.read().unwrap_or_else(|e| e.into_inner());
        let domain = self
            .resource
            .name()
            .as_str()
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let refs: Vec<DeviceRef> = request
            .available
            .iter()
            .map(|id| self.resource.device_ref(id))
            .collect::<Option<_>>()?;
        let mut candidates = Vec::with_capacity(refs.len());
        for r in &refs {
            let device = inventory.device(r)?;
            candidates.push(kubedev_sandbox::Candidate::inventory(
                &domain,
                r.pool.as_str(),
                device,
            ));
        }
        let claim = format!("device-plugin/{}", self.resource.name());
        let input = kubedev_sandbox::PolicyInput::new(&claim, "", request.size, candidates);
        let must: Vec<usize> = request
            .must_include
            .iter()
            .filter_map(|m| request.available.iter().position(|a| a == m))
            .collect();
        let outcome = policy.evaluate(&input);
        self.metrics
            .policy_calls
            .get_or_create(&crate::metrics::PolicyLabels {
                resource: self.resource.name().to_string(),
                result: if outcome.is_ok() { "ok" } else { "error" }.to_string(),
            })
            .inc();
        match outcome {
            Ok(eval) => eval.decision.preferred(request.size, &must).map(|idx| {
                idx.into_iter()
                    .map(|i| request.available[i].clone())
                    .collect()
            }),
            Err(e) => {
                tracing::warn!(resource = %self.resource.name(), error = %e, "selection policy failed; using NUMA packing");
                None
            }
        }
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
            allocated.push(AllocatedDevice {
                device: r,
                request: String::new(),
                share_id: None,
                config: Vec::new(),
            });
        }
        let consumer = Consumer::Container {
            resource: self.resource.name().to_string(),
        };
        let prepared = self.backends.prepare(&consumer, &allocated).await?;
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
        let policy = self.policy.as_ref()?.current()?;
        self.policy_choice(&policy, request)
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
    cluster: Option<ClusterServices>,
    cancel: &CancellationToken,
    obs: &Observe,
) -> anyhow::Result<Option<Dra>> {
    let Some(spec) = config.dra(config_path, |k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let cluster = cluster.context("DRA mode needs the API server, and none was configured")?;
    std::fs::create_dir_all(&spec.state_dir)
        .with_context(|| format!("creating {}", spec.state_dir.display()))?;
    let (state_dir, boot) = (spec.state_dir.clone(), spec.boot_id_path.clone());
    let (store, outcome) =
        tokio::task::spawn_blocking(move || CheckpointStore::open(&state_dir, &boot))
            .await?
            .context("opening the checkpoint")?;
    tracing::info!(checkpoint = %store.path().display(), "{outcome}");
    let cdi = CdiWriter::new(&spec.cdi_dir, &spec.driver);
    let driver = Arc::new(
        DraDriver::new(backends.clone(), cluster.claims.clone(), store, cdi)
            .with_metrics(obs.metrics.clone()),
    );
    let rec = driver
        .recover()
        .await
        .map_err(anyhow::Error::msg)
        .context("start-up recovery")?;
    if rec != Default::default() {
        tracing::warn!(rolled_back = ?rec.rolled_back, cdi_rewritten = ?rec.cdi_rewritten, cdi_removed = ?rec.cdi_removed, "recovered from an unclean stop");
    }
    let (health, health_rx) = watch::channel(Vec::new());
    let mut cfg = DraPluginConfig::new(spec.driver.clone())
        .plugin_dir(&spec.plugin_dir)
        .registry_dir(&spec.registry_dir)
        .health(spec.health);
    if let Some(uid) = &spec.pod_uid {
        cfg = cfg.pod_uid(uid);
    }
    let handle = DraPlugin::start(cfg, driver, health_rx, cancel.child_token())
        .context("starting the DRA plugin")?;
    tracing::info!(driver = %spec.driver, socket = %handle.dra_socket().display(), "DRA plugin started");
    obs.probes.add_socket(handle.dra_socket().to_path_buf());
    obs.probes
        .add_socket(handle.registration_socket().to_path_buf());
    obs.probes
        .set_dra(spec.driver.to_string(), handle.watch_status());
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

/// Runs the daemon until `cancel` fires; stops every server and removes its sockets on the way
/// out. `cluster` is needed when DRA mode is on.
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
    let backends = Backends::new(build_backends(&config)?);
    let resources = config.resources(config_path)?;
    let mut inventory = backends.discover_all().await;
    let shared_inventory = Arc::new(std::sync::RwLock::new(inventory.clone()));
    let mut sandbox: Option<kubedev_sandbox::Sandbox> = None;
    let mut policy_dir: Option<Arc<kubedev_sandbox::PolicyDir>> = None;
    // Keeps the policy directory's reload thread alive for the daemon's life.
    let mut policy_watch: Option<kubedev_sandbox::DirWatcher> = None;
    tracing::info!(
        backends = backends.list().len(),
        pools = inventory.pools.len(),
        devices = inventory.devices().count(),
        "discovered"
    );

    let mut dp_publisher: Option<DevicePluginPublisher> = None;
    let mut ownership = Ownership::default();
    let mut servers: Vec<DevicePluginHandle> = Vec::new();
    if config.device_plugin.enabled && !resources.is_empty() {
        let dp = &config.device_plugin;
        let mut publisher = DevicePluginPublisher::new();
        let mut resource_devices = Vec::new();
        for r in resources {
            let policy = match &r.policy {
                Some(path) => {
                    if sandbox.is_none() {
                        sandbox = Some(kubedev_sandbox::Sandbox::new(
                            kubedev_sandbox::Limits::default(),
                        )?);
                    }
                    let sb = sandbox.as_ref().context("sandbox missing")?;
                    let bare = path.components().count() == 1 && path.extension().is_none();
                    match (&dp.policy_dir, bare) {
                        (Some(dir), true) => {
                            if policy_dir.is_none() {
                                let (opened, report) = kubedev_sandbox::PolicyDir::open(sb, dir)
                                    .with_context(|| {
                                        format!("devicePlugin.policyDir {}", dir.display())
                                    })?;
                                if !report.is_empty() {
                                    tracing::info!(dir = %dir.display(), ?report, "policies loaded");
                                }
                                let opened = Arc::new(opened);
                                policy_watch = Some(opened.watch(Duration::from_secs(2))?);
                                policy_dir = Some(opened);
                            }
                            let dir = policy_dir.clone().context("policy directory missing")?;
                            let name = path.to_string_lossy().into_owned();
                            if dir.get(&name).is_none() {
                                tracing::warn!(resource = %r.name, policy = %name, "no such policy in the policy directory yet; NUMA packing until it appears");
                            }
                            Some(PolicySource::Dir(dir, name))
                        }
                        _ => Some(PolicySource::Fixed(sb.load_file(path).with_context(
                            || {
                                format!(
                                    "devicePlugin resource {}: loading the selection policy {}",
                                    r.name,
                                    path.display()
                                )
                            },
                        )?)),
                    }
                }
                None => None,
            };
            ownership.device_plugin.push(r.filter.clone());
            resource_devices.push((publisher.add_resource(r.name, Box::new(r.filter)), policy));
        }
        // Before the servers start, so the kubelet's first snapshot is complete, and so a
        // resource whose selector makes device IDs clash stops the daemon with the reason.
        publisher
            .publish(&inventory)
            .await
            .context("publishing the inventory to the device-plugin resources")?;
        for (rd, policy) in resource_devices {
            let mut cfg = DevicePluginConfig::new(rd.name().clone()).plugin_dir(&dp.directory);
            if let Some(k) = &dp.kubelet_socket {
                cfg = cfg.kubelet_socket(k);
            }
            let handler = Arc::new(ResourceHandler {
                resource: rd.clone(),
                backends: backends.clone(),
                policy,
                inventory: shared_inventory.clone(),
                cdi: if dp.cdi {
                    Some(DevicePluginCdi::new(&dp.cdi_dir, rd.name())?)
                } else {
                    None
                },
                metrics: obs.metrics.clone(),
            });
            let server = DevicePlugin::start(cfg, handler, rd.subscribe(), cancel.child_token())
                .with_context(|| format!("starting the device-plugin server for {}", rd.name()))?;
            tracing::info!(resource = %rd.name(), socket = %server.socket_path().display(), "device-plugin server started");
            obs.probes.add_socket(server.socket_path().to_path_buf());
            obs.probes
                .add_device_plugin(rd.name().to_string(), server.watch_status());
            count_registrations(
                &obs.metrics,
                "device-plugin",
                rd.name().to_string(),
                server.watch_status(),
                |s| s.registrations,
            );
            servers.push(server);
        }
        dp_publisher = Some(publisher);
    }

    let dra = start_dra(&config, config_path, &backends, cluster, &cancel, &obs).await?;
    let mut clock = HealthClock::default();
    publish_all(
        dp_publisher.as_ref(),
        dra.as_ref(),
        &ownership,
        &mut clock,
        &inventory,
        &obs,
    )
    .await;

    // Backend watchers feed one event channel.
    let (tx, mut rx) = mpsc::channel::<(usize, SourceEvent)>(256);
    let mut watchers = JoinSet::new();
    for (i, b) in backends.list().iter().enumerate() {
        let (btx, mut brx) = mpsc::channel(64);
        let source = b.source.clone();
        let name = source.name().to_string();
        let stop = cancel.clone();
        watchers.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                r = source.watch(btx) => if let Err(e) = r {
                    tracing::error!(backend = %name, error = %e, "watch failed");
                },
            }
        });
        let tx = tx.clone();
        watchers.spawn(async move {
            while let Some(ev) = brx.recv().await {
                if tx.send((i, ev)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);

    loop {
        let (i, ev) = tokio::select! {
            _ = cancel.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                None => { cancel.cancelled().await; break; }
            },
        };
        let changed = match ev {
            SourceEvent::Health { device, health } => {
                tracing::info!(%device, state = %health.state, reason = health.reason.as_deref().unwrap_or(""), "health changed");
                inventory.set_health(&device, health)
            }
            SourceEvent::Rediscover => backends.rediscover(i, &mut inventory).await,
            _ => false,
        };
        if changed {
            *shared_inventory.write().unwrap_or_else(|e| e.into_inner()) = inventory.clone();
            publish_all(
                dp_publisher.as_ref(),
                dra.as_ref(),
                &ownership,
                &mut clock,
                &inventory,
                &obs,
            )
            .await;
        }
    }

    tracing::info!("stopping");
    drop(policy_watch);
    watchers.shutdown().await;
    let stop_all = async {
        if let Some(d) = dra {
            d.handle.stop().await;
        }
        for s in servers {
            s.stop().await;
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
