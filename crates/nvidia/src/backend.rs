//! The backend: NVML state, discovery, the health watcher and prepare.
//!
//! This module holds the backend's state and its `DeviceSource` and `Preparer` faces; the
//! blocking work each of them does is in the submodules: `discovery`, `watch`, `prepare`
//! (with `claims` for sharing and undoing), `mig` (MIG instances and their records) and
//! `driver_files` (the driver version's user-space files).

use kubedev_core::factory::InvalidValue;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::factory::own_pool_name;
use kubedev_core::{
    AllocatedDevice, BackendContext, ClaimRef, Consumer, ContainerEdits, DeviceName, DeviceRef,
    DeviceSource, Health, Pool, PoolName, PrepareError, PreparedDevice, Preparer, SourceError,
    SourceEvent, blocking,
};
use nvml_wrapper::Nvml;
use tokio::sync::mpsc;

use crate::config::NvidiaConfig;
use crate::devices::Built;
use crate::error::NvidiaError;
use crate::ffi;
use crate::health::HealthTracker;
use crate::records::RecordStore;
use crate::sharing::Sharing;
use crate::snapshot::MachineInfo;
use crate::topology::Topology;

use driver_files::DriverState;
use watch::StopOnDrop;

mod claims;
mod discovery;
mod driver_files;
mod mig;
mod prepare;
mod watch;

const BACKEND: &str = "nvidia";

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

impl NvidiaBackend {
    /// A backend with `config`, keeping its MIG records in `ctx.state_dir` and publishing the
    /// pool `<ctx.node_name>-nvidia`.
    ///
    /// Fails on invalid configuration or when the state directory cannot be created. A missing
    /// or failing NVML is *not* an error here: `discover` reports it (see the crate docs).
    pub fn new(config: NvidiaConfig, ctx: &BackendContext) -> Result<Self, NvidiaError> {
        config.validate()?;
        let pool = own_pool_name(&ctx.node_name, BACKEND).map_err(|e| {
            NvidiaError::Config(InvalidValue {
                field: "nodeName".into(),
                value: ctx.node_name.clone(),
                reason: e.reason,
            })
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

    /// The last discovery's result (`None` before the first one).
    fn current(&self) -> Option<Arc<Discovered>> {
        self.discovered.read().clone()
    }

    /// The last discovery's result, discovering now when there is none yet.
    fn discovered_or_discover(&self) -> Result<Arc<Discovered>, SourceError> {
        match self.current() {
            Some(d) => Ok(d),
            None => self.discover_blocking(),
        }
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
            .map_err(|e| SourceError::unavailable(BACKEND, &e))??;
        Ok(vec![d.built.pool.clone()])
    }

    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let stop = Arc::new(AtomicBool::new(false));
        let _guard = StopOnDrop(stop.clone());
        let inner = self.inner.clone();
        // As long as the daemon runs: on a thread of its own, not one for blocking work.
        kubedev_core::dedicated("nvml-events", move || inner.watch_blocking(&events, &stop))
            .await
            .map_err(|e| SourceError::unavailable(BACKEND, &e))?
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
