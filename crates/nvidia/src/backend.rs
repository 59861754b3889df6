//! The backend: NVML state, discovery, the health watcher and prepare.

use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubedev_core::{
    AllocatedDevice, BackendContext, ClaimRef, Consumer, ContainerEdits, DeviceName, DeviceRef,
    DeviceSource, Health, Pool, PoolName, PrepareError, PreparedDevice, Preparer, SourceError,
    SourceEvent, blocking,
};
use nvml_wrapper::Nvml;
use tokio::sync::mpsc;

use crate::NvidiaError;
use crate::config::{MigStrategy, NvidiaConfig};
use crate::devices::{Built, DeviceKind, Owned, build_pool, instance_of};
use crate::driver::{DriverFiles, DriverLocation};
use crate::edits::{EditSource, gpu_edits, mig_edits, read_mig_minors};
use crate::ffi;
use crate::health::{HealthTracker, Probe};
use crate::records::{MigRecord, RecordState, RecordStore};
use crate::sharing::{Sharing, Strategy, Target, device_sharing};
use crate::snapshot::{GpuInfo, MachineInfo, MigProfile, Placement};
use crate::topology::Topology;

mod claims;

const BACKEND: &str = "nvidia";

/// The version of the loaded NVIDIA kernel module.
const MODULE_VERSION: &str = "/sys/module/nvidia/version";

/// The longest single wait on the event set: how quickly a dropped `watch` stops.
const MAX_WAIT_MS: u64 = 200;

/// The NVIDIA backend. Cheap to clone (clones share state).
#[derive(Clone)]
pub struct NvidiaBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NvidiaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvidiaBackend")
            .field("pool", &self.inner.pool)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// One discovery's result, shared by prepare and the watcher.
#[derive(Debug)]
struct Discovered {
    machine: MachineInfo,
    topology: Topology,
    built: Built,
}

struct Inner {
    config: NvidiaConfig,
    ctx: BackendContext,
    pool: PoolName,
    nvml: Mutex<Option<Arc<Nvml>>>,
    discovered: RwLock<Option<Arc<Discovered>>>,
    health: Mutex<HealthTracker>,
    /// The health each device was last reported with, by discovery or by the watcher, so a
    /// change between the two is never lost or repeated.
    reported: Mutex<BTreeMap<DeviceName, Health>>,
    records: RecordStore,
    /// Serialises MIG creation and destruction (NVML placements are per GPU; one lock is
    /// simple and MIG changes are rare).
    mig: Mutex<()>,
    /// GPU sharing (time-slicing, MPS) per claim.
    sharing: Sharing,
    /// The driver's user-space files for the running driver version, found at discovery.
    driver: RwLock<Arc<DriverState>>,
}

/// The driver files of one driver version and what they give a container.
#[derive(Debug, Default)]
struct DriverState {
    /// The files found.
    files: DriverFiles,
    /// Their mounts and hooks.
    edits: ContainerEdits,
    /// The host directory whose `dev/` holds the device nodes.
    dev_root: std::path::PathBuf,
}

impl NvidiaBackend {
    /// A backend with `config`, keeping its MIG records in `ctx.state_dir` and publishing the
    /// pool `<ctx.node_name>-nvidia`.
    ///
    /// Fails on invalid configuration or when the state directory cannot be created. A missing
    /// or failing NVML is *not* an error here: `discover` reports it (see the crate docs).
    pub fn new(config: NvidiaConfig, ctx: &BackendContext) -> Result<Self, NvidiaError> {
        config.validate()?;
        let pool = PoolName::new(format!("{}-{BACKEND}", ctx.node_name)).map_err(|e| {
            NvidiaError::Config {
                field: "nodeName",
                value: ctx.node_name.clone(),
                reason: kubedev_core::echo::chain(&e),
            }
        })?;
        let records = RecordStore::open(&ctx.state_dir)?;
        let health = HealthTracker::new(
            config.ignored_xids.clone(),
            Duration::from_secs(config.health_recheck_seconds),
        );
        let sharing = Sharing::new(
            &config.nvidia_smi_path,
            &config.mps_control_path,
            &ctx.state_dir,
        );
        let inner = Inner {
            config,
            ctx: ctx.clone(),
            pool,
            nvml: Mutex::new(None),
            discovered: RwLock::new(None),
            health: Mutex::new(health),
            reported: Mutex::new(BTreeMap::new()),
            records,
            mig: Mutex::new(()),
            sharing,
            driver: RwLock::new(Arc::new(DriverState {
                dev_root: "/".into(),
                ..DriverState::default()
            })),
        };
        // Load NVML now so a crash's leftovers are repaired before anything is served; a
        // failure is reported by discovery.
        if let Err(e) = inner.nvml() {
            tracing::warn!(error = %kubedev_core::echo::Chain(&e), "NVIDIA backend starts without NVML");
        }
        Ok(NvidiaBackend {
            inner: Arc::new(inner),
        })
    }

    /// The pool this backend publishes.
    pub fn pool_name(&self) -> &PoolName {
        &self.inner.pool
    }

    /// The GPU topology of the last discovery (`None` before the first one).
    pub fn topology(&self) -> Option<Topology> {
        self.inner.current().map(|d| d.topology.clone())
    }
}

impl Inner {
    /// The NVML handle, loading the library on first use (and again after a failure). The
    /// first successful load reconciles the MIG records.
    fn nvml(&self) -> Result<Arc<Nvml>, NvidiaError> {
        let mut slot = self.nvml.lock();
        if let Some(n) = slot.as_ref() {
            return Ok(n.clone());
        }
        let nvml = Arc::new(
            ffi::init(self.config.library_path.as_deref()).map_err(NvidiaError::Unavailable)?,
        );
        *slot = Some(nvml.clone());
        drop(slot);
        // Records exist only if the partitionable strategy was used, perhaps before a config
        // change: reconcile whatever the strategy is now.
        self.reconcile(&nvml);
        Ok(nvml)
    }

    /// The driver files in use now.
    fn driver(&self) -> Arc<DriverState> {
        self.driver.read().clone()
    }

    /// Finds the driver files of `version` when it is not the version found last (the first
    /// discovery, a driver upgrade or reload); what is missing is logged once per version.
    fn refresh_driver(&self, version: Option<&str>) {
        let Some(version) = version else { return };
        let current = self.driver();
        if current.files.version == version {
            return;
        }
        let root = self.config.driver_root.as_path();
        let dev_root = match &self.config.dev_root {
            Some(d) => d.clone(),
            None if root != std::path::Path::new("/")
                && self.ctx.host.exists(root.join("dev/nvidiactl")) =>
            {
                root.to_path_buf()
            }
            None => "/".into(),
        };
        let files = DriverLocation {
            host: &self.ctx.host,
            root,
            layout: self.config.library_layout,
            hook: self.config.cdi_hook_path.as_deref(),
        }
        .find(version);
        if !current.files.version.is_empty() {
            tracing::warn!(
                from = %current.files.version, to = %version,
                "the NVIDIA driver version changed; containers get the new version's files"
            );
        }
        tracing::info!(
            version = %version,
            driver_root = %root.display(),
            libraries = files.libraries.len(),
            binaries = files.binaries.len(),
            firmware = files.firmware.is_some(),
            sockets = files.ipc.len(),
            hooks = files.hook.is_some(),
            "NVIDIA driver files found"
        );
        for m in &files.missing {
            tracing::warn!(driver_root = %root.display(), "NVIDIA driver file not found: {m}");
        }
        let edits = files.edits();
        *self.driver.write() = Arc::new(DriverState {
            files,
            edits,
            dev_root,
        });
    }

    fn current(&self) -> Option<Arc<Discovered>> {
        self.discovered.read().clone()
    }

    /// Finishes or rolls back MIG work a crash interrupted (see the crate docs).
    fn reconcile(&self, nvml: &Nvml) {
        let _g = self.mig.lock();
        let records = match self.records.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot read MIG records; not reconciled");
                return;
            }
        };
        for rec in records {
            match rec.state {
                RecordState::Creating | RecordState::Destroying => {
                    let what = if rec.state == RecordState::Creating {
                        "rolling back an unfinished MIG creation"
                    } else {
                        "finishing an unfinished MIG destruction"
                    };
                    tracing::info!(device = %rec.device, claim = %rec.claim_uid, "{what}");
                    match ffi::destroy_instance(
                        nvml,
                        &rec.gpu_uuid,
                        rec.profile_id,
                        rec.placement(),
                    ) {
                        Ok(()) => {
                            if let Err(e) = self.records.remove(&rec.device) {
                                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot remove MIG record");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(device = %rec.device, error = %kubedev_core::echo::Chain(&e), "{what} failed")
                        }
                    }
                }
                RecordState::Created => {
                    match ffi::find_instance(nvml, &rec.gpu_uuid, rec.profile_id, rec.placement()) {
                        Ok(Some(found)) if !found.ci_ids.is_empty() => {}
                        Ok(_) => tracing::warn!(
                            device = %rec.device, claim = %rec.claim_uid,
                            "the MIG instance prepared for this claim is gone; preparing it again recreates it"
                        ),
                        Err(e) => {
                            tracing::warn!(device = %rec.device, error = %kubedev_core::echo::Chain(&e), "cannot check MIG instance")
                        }
                    }
                }
            }
        }
    }

    /// Placements kubedev created (or is creating) for claims, with their GPU instance ids.
    fn owned_placements(&self) -> Owned {
        match self.records.all() {
            Ok(records) => records
                .into_iter()
                .map(|r| ((r.gpu_uuid.clone(), r.placement()), r.gi_id))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot read MIG records");
                Owned::new()
            }
        }
    }

    fn unavailable(e: &NvidiaError) -> SourceError {
        SourceError::Unavailable {
            backend: BACKEND.into(),
            reason: e.to_string(),
        }
    }

    fn discover_blocking(&self) -> Result<Arc<Discovered>, SourceError> {
        if self.module_changed() {
            tracing::warn!(
                module = ?self.module_version(),
                "the NVIDIA kernel module changed version; loading NVML again"
            );
            *self.nvml.lock() = None;
        }
        let nvml = self.nvml().map_err(|e| Self::unavailable(&e))?;
        let mig = self.config.mig_strategy != MigStrategy::None;
        let read = ffi::read_machine(&nvml, &self.ctx.host, mig).map_err(|e| match &e {
            NvidiaError::Unavailable(_) => Self::unavailable(&e),
            _ => SourceError::Unavailable {
                backend: BACKEND.into(),
                reason: format!("NVML unavailable: {}", kubedev_core::echo::chain(&e)),
            },
        })?;
        let mut machine = read.machine;
        self.refresh_driver(machine.driver_version.as_deref());
        let previous = self.current();
        let now = Instant::now();
        for (index, err) in read.failed {
            let lost = matches!(err, NvidiaError::Nvml { gpu_lost: true, .. });
            let known = previous
                .as_ref()
                .and_then(|p| p.machine.gpus.iter().find(|g| g.index == index).cloned());
            match (lost, known) {
                (true, Some(gpu)) => {
                    // Keep publishing a lost GPU under its name, unhealthy, so its claims see it.
                    self.health.lock().on_probe(
                        &gpu.uuid,
                        &Probe::Lost(kubedev_core::echo::chain(&err)),
                        now,
                    );
                    machine.gpus.push(gpu);
                }
                _ => {
                    tracing::warn!(gpu = index, error = %kubedev_core::echo::Chain(&err), "GPU skipped")
                }
            }
        }
        machine.gpus.sort_by_key(|g| g.index);
        if machine.ancestor_levels.len() != machine.gpus.len() {
            // A GPU was carried over from the last discovery: the level matrix no longer lines
            // up; rebuild it from the last one where possible.
            machine.ancestor_levels = realign_levels(&machine, previous.as_deref());
        }
        let topology = Topology::from_machine(&machine);
        let owned = self.owned_placements();
        let built = {
            let health = self.health.lock();
            let (built, errors) = build_pool(
                self.pool.clone(),
                &self.config,
                &machine,
                &topology,
                &|uuid, gi| health.health(uuid, gi),
                &owned,
            );
            for e in errors {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "device skipped");
            }
            // Recorded while the tracker is locked, so the watcher compares its next change with
            // exactly what this discovery publishes.
            *self.reported.lock() = built
                .pool
                .devices
                .iter()
                .map(|dev| (dev.name.clone(), dev.health.clone()))
                .collect();
            built
        };
        built.pool.validate().map_err(|error| SourceError::Model {
            backend: BACKEND.into(),
            error,
        })?;
        let d = Arc::new(Discovered {
            machine,
            topology,
            built,
        });
        *self.discovered.write() = Some(d.clone());
        Ok(d)
    }

    fn discovered_or_discover(&self) -> Result<Arc<Discovered>, SourceError> {
        match self.current() {
            Some(d) => Ok(d),
            None => self.discover_blocking(),
        }
    }

    /// The health of every published device of GPU `gpu_uuid` now.
    fn device_healths(&self, d: &Discovered, gpu_uuid: &str) -> Vec<(DeviceName, Health)> {
        let Some(pos) = d.machine.gpus.iter().position(|g| g.uuid == gpu_uuid) else {
            return Vec::new();
        };
        let owned = if d
            .built
            .kinds
            .values()
            .any(|k| matches!(k, DeviceKind::Placement { .. }))
        {
            self.owned_placements()
        } else {
            Owned::new()
        };
        let health = self.health.lock();
        d.built
            .kinds
            .iter()
            .filter(|(_, k)| k.gpu() == pos)
            .map(|(name, k)| {
                let gi = instance_of(gpu_uuid, k, &owned);
                (name.clone(), health.health(gpu_uuid, gi))
            })
            .collect()
    }

    /// The watcher loop, on a blocking thread until `stop` is set or nobody listens. After a
    /// driver reload it waits for discovery to load NVML again and watches the new handle.
    fn watch_blocking(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        stop: &AtomicBool,
    ) -> Result<(), SourceError> {
        while self.watch_round(events, stop)? {
            while self.module_changed() {
                if stop.load(Ordering::Relaxed) || events.is_closed() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(MAX_WAIT_MS));
            }
        }
        Ok(())
    }

    /// One watch on one NVML handle: `Ok(true)` when the driver changed under it and watching
    /// must start again on a new handle, `Ok(false)` when the watch is over.
    fn watch_round(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        stop: &AtomicBool,
    ) -> Result<bool, SourceError> {
        let nvml = self.nvml().map_err(|e| Self::unavailable(&e))?;
        let discovered = self.discovered_or_discover()?;
        let uuids: Vec<String> = discovered
            .machine
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect();
        let xids = ffi::XidEvents::open(&nvml, &uuids).map_err(|e| SourceError::Unavailable {
            backend: BACKEND.into(),
            reason: kubedev_core::echo::chain(&e),
        })?;
        tracing::debug!(gpus = ?xids.watched().collect::<Vec<_>>(), "watching Xid events");
        let poll = Duration::from_millis(self.config.health_poll_millis);
        let wait_ms = u32::try_from(self.config.health_poll_millis.min(MAX_WAIT_MS)).unwrap_or(200);
        let mut last_probe = Instant::now();
        let mut failures = 0u32;
        // Sends the devices of `gpus` whose health differs from what was last reported; false
        // when nobody listens any more.
        let send = |gpus: &[String]| -> bool {
            let d = self.current().unwrap_or_else(|| discovered.clone());
            for uuid in gpus {
                for (name, h) in self.device_healths(&d, uuid) {
                    {
                        let mut reported = self.reported.lock();
                        if reported.get(&name) == Some(&h) {
                            continue;
                        }
                        reported.insert(name.clone(), h.clone());
                    }
                    let ev = SourceEvent::Health {
                        device: DeviceRef {
                            pool: self.pool.clone(),
                            device: name,
                        },
                        health: h,
                    };
                    if events.blocking_send(ev).is_err() {
                        return false;
                    }
                }
            }
            true
        };
        loop {
            if stop.load(Ordering::Relaxed) || events.is_closed() {
                return Ok(false);
            }
            let mut probe_now = false;
            match xids.wait(&nvml, wait_ms) {
                ffi::Wait::Xid { gpu_uuid, gi, xid } => {
                    failures = 0;
                    let changed = self
                        .health
                        .lock()
                        .on_xid(&gpu_uuid, gi, xid, Instant::now());
                    if changed {
                        tracing::warn!(gpu = %gpu_uuid, gpu_instance = ?gi, xid = ?xid, "GPU Xid error");
                        if !send(std::slice::from_ref(&gpu_uuid)) {
                            return Ok(false);
                        }
                    }
                }
                ffi::Wait::Lost => probe_now = true,
                ffi::Wait::Timeout => failures = 0,
                ffi::Wait::Failed(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "waiting for NVML events failed");
                    }
                    std::thread::sleep(Duration::from_millis(MAX_WAIT_MS));
                }
            }
            if probe_now || last_probe.elapsed() >= poll {
                last_probe = Instant::now();
                if self.module_changed() {
                    // Discovery loads NVML again and finds the new version's files; this
                    // watcher's handle is stale.
                    tracing::warn!("the NVIDIA driver was reloaded or upgraded; discovering again");
                    return Ok(events.blocking_send(SourceEvent::Rediscover).is_ok());
                }
                let mut changed = Vec::new();
                for uuid in &uuids {
                    let p = ffi::probe(&nvml, uuid);
                    if self.health.lock().on_probe(uuid, &p, Instant::now()) {
                        tracing::info!(gpu = %uuid, probe = ?p, "GPU health changed");
                        changed.push(uuid.clone());
                    }
                }
                if !send(&changed) {
                    return Ok(false);
                }
            }
        }
    }

    fn prepare_blocking(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let d = self
            .discovered_or_discover()
            .map_err(|e| PrepareError::Other(kubedev_core::echo::chain(&e)))?;
        let claim = match consumer {
            Consumer::Claim(c) => Some(c),
            _ => None,
        };
        // Every configuration is read before anything on the host changes.
        let mut sharing = Vec::with_capacity(devices.len());
        for a in devices {
            let s = match claim {
                Some(c) => device_sharing(a).map_err(|e| PrepareError::config(c, e))?,
                None => None,
            };
            sharing.push(s);
        }
        let minors = read_mig_minors(&self.ctx.host);
        let mut out = Vec::with_capacity(devices.len());
        let mut targets = Vec::with_capacity(devices.len());
        for (a, sharing) in devices.iter().zip(sharing) {
            let unknown = || PrepareError::UnknownDevice {
                device: a.device.to_string(),
            };
            if a.device.pool != self.pool {
                return Err(unknown());
            }
            let kind = d.built.kinds.get(&a.device.device).ok_or_else(unknown)?;
            let gpu = d.machine.gpus.get(kind.gpu()).ok_or_else(unknown)?;
            let mut data = serde_json::json!({"gpuUUID": gpu.uuid});
            if let DeviceKind::Mig { instance, .. } = kind {
                data["migUUID"] = serde_json::json!(instance.uuid);
                data["gpuInstance"] = instance.gi_id.into();
                data["computeInstance"] = instance.ci_id.into();
            }
            let edits = match kind {
                DeviceKind::Gpu { .. } | DeviceKind::Mig { .. } => {
                    self.existing_edits(kind, gpu, &minors, &a.device)?
                }
                DeviceKind::Placement {
                    profile, placement, ..
                } => {
                    let Consumer::Claim(claim) = consumer else {
                        return Err(PrepareError::Other(format!(
                            "device {}: MIG placements are created for DRA claims only; the \
                             device-plugin API never unprepares, so it cannot use them",
                            a.device
                        )));
                    };
                    let (gi, ci, uuid) = self
                        .prepare_placement(
                            claim,
                            a.device.device.as_str(),
                            gpu,
                            profile,
                            *placement,
                        )
                        .map_err(|e| PrepareError::Other(format!("device {}: {e}", a.device)))?;
                    data["migUUID"] = serde_json::json!(uuid);
                    data["gpuInstance"] = gi.into();
                    data["computeInstance"] = ci.into();
                    let driver = self.driver();
                    mig_edits(
                        &self.edit_source(&driver),
                        &minors,
                        gpu.minor,
                        &uuid,
                        gi,
                        ci,
                    )
                }
            };
            let whole_gpu = matches!(kind, DeviceKind::Gpu { .. });
            let uuid = data
                .get("migUUID")
                .or(data.get("gpuUUID"))
                .and_then(|u| u.as_str())
                .unwrap_or_default()
                .to_string();
            if let Some(s) = &sharing {
                data["sharing"] = serde_json::json!(match s.strategy {
                    Strategy::TimeSlicing => "TimeSlicing",
                    Strategy::Mps => "MPS",
                });
            }
            targets.push(Target {
                uuid,
                whole_gpu,
                sharing,
            });
            out.push(PreparedDevice::new(a.clone(), edits).with_status_data(data));
        }
        if let Some(claim) = claim {
            self.share(claim, devices, &targets, &mut out)?;
        }
        Ok(out)
    }

    /// `prepared`'s edits with the current driver files in place of those it was prepared
    /// with: every mount but the claim's MPS pipe directory and every hook are the driver's.
    /// `None` when nothing changes or no driver version is known yet.
    fn refreshed(&self, prepared: &PreparedDevice) -> Option<ContainerEdits> {
        if prepared.device.device.pool != self.pool {
            return None;
        }
        let driver = self.driver();
        if driver.files.version.is_empty() {
            return None;
        }
        let old = &prepared.edits;
        let mut new = old.clone();
        let own: Vec<_> = old
            .mounts
            .iter()
            .filter(|m| m.container_path == crate::sharing::MPS_CONTAINER_PIPE_DIR)
            .cloned()
            .collect();
        new.mounts = driver.edits.mounts.clone();
        new.mounts.extend(own);
        new.hooks = driver.edits.hooks.clone();
        (new != *old).then_some(new)
    }

    /// The version of the loaded kernel module, from sysfs (`None` when it cannot be read).
    fn module_version(&self) -> Option<String> {
        self.ctx
            .host
            .read_attr_opt(MODULE_VERSION)
            .ok()
            .flatten()
            .filter(|v| !v.is_empty())
    }

    /// True when the kernel module now runs another version than the one NVML was loaded for
    /// (the driver was upgraded or reloaded): the NVML handle is stale.
    fn module_changed(&self) -> bool {
        let known = self.driver();
        !known.files.version.is_empty()
            && self
                .module_version()
                .is_some_and(|v| v != known.files.version)
    }

    fn edit_source<'a>(&'a self, driver: &'a DriverState) -> EditSource<'a> {
        EditSource {
            host: &self.ctx.host,
            dev_root: &driver.dev_root,
            driver: &driver.edits,
        }
    }

    /// Edits of a whole GPU or of a MIG instance that exists already; a MIG placement has
    /// none until `prepare` creates its instance.
    fn existing_edits(
        &self,
        kind: &DeviceKind,
        gpu: &GpuInfo,
        minors: &BTreeMap<String, u32>,
        device: &DeviceRef,
    ) -> Result<ContainerEdits, PrepareError> {
        let driver = self.driver();
        let src = self.edit_source(&driver);
        match kind {
            DeviceKind::Gpu { .. } => Ok(gpu_edits(&src, gpu.minor, &gpu.uuid)),
            DeviceKind::Mig { instance, .. } => {
                let uuid = instance
                    .uuid
                    .as_deref()
                    .ok_or_else(|| PrepareError::Unhealthy {
                        device: device.to_string(),
                        reason: "NVML lists no MIG device (UUID) for this compute instance".into(),
                    })?;
                Ok(mig_edits(
                    &src,
                    minors,
                    gpu.minor,
                    uuid,
                    instance.gi_id,
                    instance.ci_id,
                ))
            }
            DeviceKind::Placement { .. } => Err(PrepareError::Other(format!(
                "device {device}: a MIG placement has no instance before it is prepared"
            ))),
        }
    }

    /// `prepare`'s edits for whole GPUs and existing MIG instances; `None` for a MIG placement,
    /// whose instance only `prepare` creates.
    fn planned_blocking(&self, device: &DeviceRef) -> Result<Option<ContainerEdits>, PrepareError> {
        let d = self
            .discovered_or_discover()
            .map_err(|e| PrepareError::Other(kubedev_core::echo::chain(&e)))?;
        let unknown = || PrepareError::UnknownDevice {
            device: device.to_string(),
        };
        if device.pool != self.pool {
            return Err(unknown());
        }
        let kind = d.built.kinds.get(&device.device).ok_or_else(unknown)?;
        let gpu = d.machine.gpus.get(kind.gpu()).ok_or_else(unknown)?;
        if matches!(kind, DeviceKind::Placement { .. }) {
            return Ok(None);
        }
        let minors = read_mig_minors(&self.ctx.host);
        self.existing_edits(kind, gpu, &minors, device).map(Some)
    }

    /// Creates (or finds, when already prepared) the MIG instance of a placement for a claim.
    /// Returns (GI id, CI id, MIG UUID).
    fn prepare_placement(
        &self,
        claim: &ClaimRef,
        device: &str,
        gpu: &GpuInfo,
        profile: &MigProfile,
        placement: Placement,
    ) -> Result<(u32, u32, String), NvidiaError> {
        let nvml = self.nvml()?;
        let _g = self.mig.lock();
        let existing = self.records.get(device)?;
        if let Some(rec) = &existing
            && rec.claim_uid != claim.uid
        {
            return Err(NvidiaError::Nvml {
                call: "creating a MIG instance",
                target: format!(
                    "{} placement {}+{}",
                    gpu.uuid, placement.start, placement.size
                ),
                message: format!(
                    "the placement is prepared for claim {}; it cannot be prepared for {claim}",
                    rec.claim_uid
                ),
                gpu_lost: false,
            });
        }
        let found = ffi::find_instance(&nvml, &gpu.uuid, profile.id, placement)?;
        if existing.is_none() && found.is_some() {
            return Err(NvidiaError::Nvml {
                call: "creating a MIG instance",
                target: format!(
                    "{} placement {}+{}",
                    gpu.uuid, placement.start, placement.size
                ),
                message: "a MIG instance kubedev did not create occupies the placement".into(),
                gpu_lost: false,
            });
        }
        let mut rec = existing.unwrap_or_else(|| MigRecord {
            claim_uid: claim.uid.to_string(),
            device: device.to_string(),
            gpu_uuid: gpu.uuid.clone(),
            profile_index: profile.index,
            profile_id: profile.id,
            start: placement.start,
            size: placement.size,
            state: RecordState::Creating,
            gi_id: None,
            ci_id: None,
            mig_uuid: None,
        });
        // Already there and complete (a repeated prepare, or a crash after creating): adopt it.
        if let Some(f) = &found
            && let (Some(&ci), Some(uuid)) = (f.ci_ids.first(), f.mig_uuid.clone())
        {
            if rec.state != RecordState::Created || rec.mig_uuid.as_deref() != Some(&uuid) {
                rec.state = RecordState::Created;
                rec.gi_id = Some(f.gi_id);
                rec.ci_id = Some(ci);
                rec.mig_uuid = Some(uuid.clone());
                self.records.put(&rec)?;
            }
            return Ok((f.gi_id, ci, uuid));
        }
        rec.state = RecordState::Creating;
        self.records.put(&rec)?;
        if found.is_some() {
            // Half made (a GPU instance without a compute instance): start over.
            ffi::destroy_instance(&nvml, &gpu.uuid, profile.id, placement)?;
        }
        let created = match ffi::create_instance(&nvml, &gpu.uuid, profile.index, placement) {
            Ok(c) => c,
            Err(e) => {
                // Nothing was left behind (create rolls back its own GPU instance).
                if let Err(re) = self.records.remove(device) {
                    tracing::warn!(error = %kubedev_core::echo::Chain(&re), "cannot remove MIG record after a failed create");
                }
                return Err(e);
            }
        };
        let ci = created.ci_ids.first().copied().unwrap_or(0);
        let Some(uuid) = created.mig_uuid.clone() else {
            return Err(NvidiaError::Nvml {
                call: "nvmlDeviceGetMigDeviceHandleByIndex",
                target: format!(
                    "{} GPU instance {} compute instance {ci}",
                    gpu.uuid, created.gi_id
                ),
                message: "NVML lists no MIG device for the new compute instance".into(),
                gpu_lost: false,
            });
        };
        rec.state = RecordState::Created;
        rec.gi_id = Some(created.gi_id);
        rec.ci_id = Some(ci);
        rec.mig_uuid = Some(uuid.clone());
        self.records.put(&rec)?;
        Ok((created.gi_id, ci, uuid))
    }
}

/// The level matrix for `machine.gpus` from the last discovery's, by UUID.
fn realign_levels(machine: &MachineInfo, previous: Option<&Discovered>) -> Vec<Vec<Option<u32>>> {
    let n = machine.gpus.len();
    let mut out = vec![vec![None; n]; n];
    let Some(prev) = previous else { return out };
    let pos = |uuid: &str| prev.machine.gpus.iter().position(|g| g.uuid == uuid);
    for (i, a) in machine.gpus.iter().enumerate() {
        for (j, b) in machine.gpus.iter().enumerate() {
            if let (Some(pi), Some(pj)) = (pos(&a.uuid), pos(&b.uuid)) {
                out[i][j] = prev
                    .machine
                    .ancestor_levels
                    .get(pi)
                    .and_then(|r| r.get(pj))
                    .copied()
                    .flatten();
            }
        }
    }
    out
}

/// Sets the flag when dropped: stops the blocking watcher when `watch` is cancelled.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl DeviceSource for NvidiaBackend {
    fn name(&self) -> &str {
        BACKEND
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        let inner = self.inner.clone();
        let d = blocking(move || inner.discover_blocking())
            .await
            .map_err(|e| SourceError::Unavailable {
                backend: BACKEND.into(),
                reason: e.to_string(),
            })??;
        Ok(vec![d.built.pool.clone()])
    }

    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let stop = Arc::new(AtomicBool::new(false));
        let _guard = StopOnDrop(stop.clone());
        let inner = self.inner.clone();
        blocking(move || inner.watch_blocking(&events, &stop))
            .await
            .map_err(|e| SourceError::Unavailable {
                backend: BACKEND.into(),
                reason: e.to_string(),
            })?
    }
}

#[async_trait]
impl Preparer for NvidiaBackend {
    async fn prepare(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let inner = self.inner.clone();
        let consumer = consumer.clone();
        let devices = devices.to_vec();
        blocking(move || inner.prepare_blocking(&consumer, &devices)).await?
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        let inner = self.inner.clone();
        let claim = claim.clone();
        let devices = devices.to_vec();
        blocking(move || inner.unprepare_blocking(&claim, &devices)).await?
    }

    /// The prepared device's edits with the driver files of the driver version running now,
    /// when they differ (a driver upgrade or reload under a running daemon).
    async fn refreshed_edits(
        &self,
        prepared: &PreparedDevice,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        Ok(self.inner.refreshed(prepared))
    }

    /// Whole GPUs and existing MIG instances; `None` for MIG placements (created by prepare).
    async fn planned_edits(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        let inner = self.inner.clone();
        let device = device.clone();
        blocking(move || inner.planned_blocking(&device)).await?
    }
}
