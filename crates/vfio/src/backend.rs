//! The backend: discovery, health watching and preparation over PCI units and mdev instances.

use kubedev_core::factory::InvalidValue;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use kubedev_core::dirwatch::{DirEvent, DirWatch};
use kubedev_core::factory::own_pool_name;
use kubedev_core::{
    AllocatedDevice, BackendContext, ClaimRef, Consumer, ContainerEdits, DeviceName, DeviceNode,
    DeviceRef, DeviceSource, Health, HostFs, Pool, PoolName, PrepareError, PreparedDevice,
    Preparer, SourceError, SourceEvent, blocking,
};

use crate::bind;
use crate::config::{Checked, VfioConfig};
use crate::error::VfioError;
use crate::mdev::{MdevTypeManager, MdevUnit, mdev_device, scan_mdevs, select_mdevs};
use crate::naming::BACKEND_NAME;
use crate::naming::{MDEV_PCI_RESOURCE_PREFIX, PCI_RESOURCE_PREFIX, resource_env_name};
use crate::pci::{
    PciKind, PciUnit, SelectOptions, VFIO_CONTAINER, container_missing, scan, select, unit_device,
    unit_health,
};

/// One offered device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// A PCI function or IOMMU group.
    Pci(PciUnit),
    /// An mdev instance.
    Mdev(MdevUnit),
}

/// What a prepared device tells the cluster in its claim's status: the IOMMU group and the PCI
/// addresses of its functions, or for an mdev its UUID, type and parent, which is what a VM
/// launcher (KubeVirt's DRA path) needs to find the device.
fn status_data(o: &Offered) -> serde_json::Value {
    match o {
        Offered::Pci(u) => serde_json::json!({
            "iommuGroup": u.group,
            "pciAddresses": u.functions.iter().map(|f| f.address.to_string()).collect::<Vec<_>>(),
        }),
        Offered::Mdev(m) => serde_json::json!({
            "iommuGroup": m.group,
            "mdevUUID": m.instance.uuid,
            "mdevType": m.instance.type_name,
            "parentPCIAddress": m.instance.parent.to_string(),
        }),
    }
}

impl Offered {
    /// The IOMMU group.
    pub fn group(&self) -> u32 {
        match self {
            Offered::Pci(u) => u.group,
            Offered::Mdev(u) => u.group,
        }
    }

    /// `/dev/vfio/<group>`.
    pub fn group_node(&self) -> String {
        format!("/dev/vfio/{}", self.group())
    }

    /// The resource name from the configuration.
    pub fn resource(&self) -> &str {
        match self {
            Offered::Pci(u) => &u.resource,
            Offered::Mdev(u) => &u.resource,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    offered: BTreeMap<DeviceName, Offered>,
    reported: BTreeMap<DeviceName, Health>,
    discovered: bool,
}

#[derive(Debug)]
struct Inner {
    config: VfioConfig,
    checked: Checked,
    host: HostFs,
    state_dir: PathBuf,
    pool: PoolName,
    state: Mutex<State>,
    /// Serialises driver rebinding: `drivers_probe` is one file for the whole bus.
    bind_lock: Mutex<()>,
    /// Tells the watcher to look at every device again after a driver was rebound (a group
    /// node and a driver link change in an order inotify alone cannot follow).
    rebound: tokio::sync::Notify,
}

/// The VFIO backend: PCI passthrough devices and mediated devices in one pool named
/// `<node>-vfio`.
///
/// Device names: `pci-<domain>-<bus>-<device>-<function>` after the first offered function of an
/// IOMMU group (`0000:3b:00.0` → `pci-0000-3b-00-0`), `mdev-<uuid>` for an mdev instance.
#[derive(Debug, Clone)]
pub struct VfioBackend {
    inner: Arc<Inner>,
}

impl VfioBackend {
    /// A backend for `config` on the host and node of `ctx`. Checks the configuration (the error
    /// names the field and the value) and the pool name.
    pub fn new(config: VfioConfig, ctx: &BackendContext) -> Result<Self, VfioError> {
        let checked = config.check()?;
        let pool = own_pool_name(&ctx.node_name, BACKEND_NAME).map_err(|e| {
            VfioError::Config(InvalidValue {
                field: "nodeName".into(),
                value: ctx.node_name.clone(),
                reason: format!("pool name {:?}: {}", e.pool, e.reason),
            })
        })?;
        Ok(VfioBackend {
            inner: Arc::new(Inner {
                config,
                checked,
                host: ctx.host.clone(),
                state_dir: ctx.state_dir.clone(),
                pool,
                state: Mutex::default(),
                bind_lock: Mutex::new(()),
                rebound: tokio::sync::Notify::new(),
            }),
        })
    }

    /// The pool this backend publishes.
    pub fn pool_name(&self) -> &PoolName {
        &self.inner.pool
    }

    /// The mdev type manager for this backend's configuration and host (see
    /// [`MdevTypeManager`]); the daemon runs [`MdevTypeManager::apply`] on start.
    pub fn type_manager(&self) -> MdevTypeManager {
        MdevTypeManager::from_checked(
            self.inner.host.clone(),
            self.inner.checked.desired.clone(),
            self.inner.timeout(),
        )
    }

    /// Discovers now, on the calling thread (what [`DeviceSource::discover`] runs on a blocking
    /// thread).
    pub fn discover_blocking(&self) -> Result<Pool, VfioError> {
        self.inner.discover()
    }

    /// What the last discovery offered, by device name.
    pub fn offered(&self) -> BTreeMap<DeviceName, Offered> {
        self.inner.lock().offered.clone()
    }
}

impl Inner {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.settle_timeout_ms)
    }

    fn health(&self, o: &Offered) -> Health {
        match o {
            Offered::Pci(u) => unit_health(&self.host, u, self.config.bind_on_prepare),
            Offered::Mdev(u) => {
                if let Some(h) = container_missing(&self.host) {
                    return h;
                }
                let node = u.group_node();
                match self.host.presence(&node) {
                    Ok(true) => Health::healthy(),
                    Ok(false) => Health::unhealthy(format!("{node} is missing")),
                    Err(e) => Health::unknown(format!(
                        "cannot tell whether {node} exists: {}",
                        kubedev_core::echo::chain(&e)
                    )),
                }
            }
        }
    }

    fn discover(&self) -> Result<Pool, VfioError> {
        let functions = scan(&self.host)?;
        let units = select(
            &functions,
            &self.checked,
            SelectOptions {
                bind_on_prepare: self.config.bind_on_prepare,
                include_vgpu_vfs: self.config.include_vgpu_vfs,
            },
        );
        let instances = scan_mdevs(&self.host)?;
        let mdevs = select_mdevs(&instances, &self.checked.mdev);
        let mut offered = BTreeMap::new();
        let mut reported = BTreeMap::new();
        let mut devices = Vec::with_capacity(units.len() + mdevs.len());
        for u in units {
            let h = unit_health(&self.host, &u, self.config.bind_on_prepare);
            devices.push(unit_device(&u, h.clone()));
            reported.insert(u.name.clone(), h);
            offered.insert(u.name.clone(), Offered::Pci(u));
        }
        for u in mdevs {
            let h = self.health(&Offered::Mdev(u.clone()));
            devices.push(mdev_device(&u, h.clone()));
            reported.insert(u.name.clone(), h);
            offered.insert(u.name.clone(), Offered::Mdev(u));
        }
        let pool = Pool::new(self.pool.clone(), devices);
        if let Err(e) = pool.validate() {
            return Err(VfioError::Unsupported(format!(
                "inconsistent inventory: {e}"
            )));
        }
        let mut st = self.lock();
        st.offered = offered;
        st.reported = reported;
        st.discovered = true;
        Ok(pool)
    }

    /// The offered device for `r`, discovering again once if it is not known (e.g. after a
    /// restart, before the first discovery).
    fn find(&self, r: &DeviceRef) -> Result<Offered, PrepareError> {
        let unknown = || PrepareError::UnknownDevice {
            device: r.to_string(),
        };
        if r.pool != self.pool {
            return Err(unknown());
        }
        if let Some(o) = self.lock().offered.get(&r.device) {
            return Ok(o.clone());
        }
        self.discover()
            .map_err(|e| e.into_prepare("discovering devices", &r.to_string()))?;
        self.lock()
            .offered
            .get(&r.device)
            .cloned()
            .ok_or_else(unknown)
    }

    /// Prepares one device (blocking: may rebind drivers).
    fn prepare_one(
        &self,
        consumer: &Consumer,
        a: &AllocatedDevice,
    ) -> Result<PreparedDevice, PrepareError> {
        let o = self.find(&a.device)?;
        let device = a.device.to_string();
        if let Offered::Pci(u) = &o
            && self.config.bind_on_prepare
            && u.kind == PciKind::Passthrough
        {
            let _guard = self.bind_lock.lock();
            let addrs: Vec<_> = u.functions.iter().map(|f| f.address).collect();
            bind::bind_to_vfio(
                &self.host,
                &self.state_dir,
                u.name.as_str(),
                &addrs,
                &u.group_node(),
                self.timeout(),
            )
            .map_err(|e| e.into_prepare("binding to vfio-pci", &device))?;
            self.rebound.notify_one();
        }
        let resource = match consumer {
            Consumer::Container { resource } => resource.as_str(),
            _ => o.resource(),
        };
        Ok(
            PreparedDevice::new(a.clone(), self.edits_for(&o, &device, resource)?)
                .with_status_data(status_data(&o)),
        )
    }

    /// The edits `prepare` gives a DRA claim for `device`, without binding anything: `None`
    /// while a function still waits for `bindOnPrepare` to put it on `vfio-pci`.
    fn planned_one(&self, device: &DeviceRef) -> Result<Option<ContainerEdits>, PrepareError> {
        let o = self.find(device)?;
        if let Offered::Pci(u) = &o
            && self.config.bind_on_prepare
            && u.kind == PciKind::Passthrough
            && !self.host.exists(o.group_node())
        {
            return Ok(None);
        }
        self.edits_for(&o, &device.to_string(), o.resource())
            .map(Some)
    }

    /// Device nodes and environment for an offered device requested as `resource`.
    fn edits_for(
        &self,
        o: &Offered,
        device: &str,
        resource: &str,
    ) -> Result<ContainerEdits, PrepareError> {
        let node = o.group_node();
        if !self.host.exists(&node) {
            return Err(PrepareError::Unhealthy {
                device: device.to_string(),
                reason: format!("{node} is missing"),
            });
        }
        let mut edits = ContainerEdits::default();
        edits
            .device_nodes
            .push(DeviceNode::new(VFIO_CONTAINER, "mrw"));
        edits.device_nodes.push(DeviceNode::new(node, "mrw"));
        match &o {
            Offered::Pci(u) => {
                edits.env.insert(
                    resource_env_name(PCI_RESOURCE_PREFIX, resource),
                    u.addresses(),
                );
            }
            Offered::Mdev(u) => {
                edits.env.insert(
                    resource_env_name(MDEV_PCI_RESOURCE_PREFIX, resource),
                    u.instance.uuid.clone(),
                );
            }
        }
        Ok(edits)
    }

    fn unprepare_one(&self, a: &AllocatedDevice) -> Result<(), PrepareError> {
        if a.device.pool != self.pool {
            return Ok(());
        }
        let _guard = self.bind_lock.lock();
        let restored = bind::restore(
            &self.host,
            &self.state_dir,
            a.device.device.as_str(),
            self.timeout(),
        );
        // Also after a failure: some function may have moved.
        self.rebound.notify_one();
        restored
            .map(|_| ())
            .map_err(|e| e.into_prepare("restoring the original driver", &a.device.to_string()))
    }

    /// Recomputes the health of the devices `which` selects and returns those that changed.
    fn recheck(&self, which: impl Fn(&Offered) -> bool) -> Vec<(DeviceName, Health)> {
        let offered: Vec<(DeviceName, Offered)> = self
            .lock()
            .offered
            .iter()
            .filter(|(_, o)| which(o))
            .map(|(n, o)| (n.clone(), o.clone()))
            .collect();
        let mut changed = Vec::new();
        for (name, o) in offered {
            let h = self.health(&o);
            let mut st = self.lock();
            if st.reported.get(&name) != Some(&h) {
                st.reported.insert(name.clone(), h.clone());
                changed.push((name, h));
            }
        }
        changed
    }

    fn knows_group(&self, group: u32) -> bool {
        self.lock().offered.values().any(|o| o.group() == group)
    }
}

#[async_trait]
impl DeviceSource for VfioBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        let inner = self.inner.clone();
        let pool = blocking(move || inner.discover())
            .await
            .map_err(|e| SourceError::unavailable(BACKEND_NAME, &e))?
            .map_err(VfioError::into_source)?;
        Ok(vec![pool])
    }

    /// Watches `/dev/vfio` with inotify: a group node removed makes its device Unhealthy, back
    /// makes it Healthy; a node for a group no offered device has asks for a rediscovery.
    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let unavailable = |reason: String| SourceError::Unavailable {
            backend: BACKEND_NAME.into(),
            reason,
        };
        if !self.inner.lock().discovered {
            let inner = self.inner.clone();
            blocking(move || inner.discover())
                .await
                .map_err(|e| unavailable(e.to_string()))?
                .map_err(VfioError::into_source)?;
        }
        let host = &self.inner.host;
        let dev = match host.resolve("/dev") {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %kubedev_core::echo::Chain(&e), "no /dev under the host root: not watching VFIO nodes");
                return Ok(());
            }
        };
        let mut w = DirWatch::try_new()
            .map_err(|e| unavailable(format!("inotify: {}", kubedev_core::echo::chain(&e))))?;
        w.try_watch(&dev)
            .map_err(|e| unavailable(kubedev_core::echo::chain(&e)))?;
        let watch_vfio = |w: &mut DirWatch| -> Option<PathBuf> {
            let p = host.resolve("/dev/vfio").ok()?;
            match w.try_watch(&p) {
                Ok(()) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %kubedev_core::echo::Chain(&e), "cannot watch /dev/vfio");
                    None
                }
            }
        };
        let mut vfio = watch_vfio(&mut w);
        // Changes between discovery and now.
        if !self.send(&events, self.inner.recheck(|_| true)).await {
            return Ok(());
        }
        loop {
            let ev = tokio::select! {
                ev = w.next() => ev,
                // Nobody listens any more.
                () = events.closed() => return Ok(()),
                () = self.inner.rebound.notified() => DirEvent::Rescan,
            };
            let Some((dir, name)) = ev.entry() else {
                // Events lost, or a driver rebound: look at every device.
                if !self.send(&events, self.inner.recheck(|_| true)).await {
                    return Ok(());
                }
                continue;
            };
            let created = matches!(ev, DirEvent::Created { .. });
            let name = name.to_str();
            let mut rediscover = false;
            let changed = if dir == dev {
                if name != Some("vfio") {
                    continue;
                }
                if created {
                    vfio = watch_vfio(&mut w);
                    rediscover = true;
                }
                self.inner.recheck(|_| true)
            } else if Some(dir) == vfio.as_deref() && name == Some("vfio") {
                // The container node: every device depends on it.
                self.inner.recheck(|_| true)
            } else if Some(dir) == vfio.as_deref() {
                let Some(group) = name.and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if created && !self.inner.knows_group(group) {
                    rediscover = true;
                }
                self.inner.recheck(|o| o.group() == group)
            } else {
                continue;
            };
            if !self.send(&events, changed).await {
                return Ok(());
            }
            if rediscover && events.send(SourceEvent::Rediscover).await.is_err() {
                return Ok(());
            }
        }
    }
}

impl VfioBackend {
    /// Sends health changes; false when nobody listens any more.
    async fn send(
        &self,
        events: &mpsc::Sender<SourceEvent>,
        changed: Vec<(DeviceName, Health)>,
    ) -> bool {
        for (device, health) in changed {
            tracing::info!(device = %device, health = %health.state, reason = ?health.reason, "VFIO device health changed");
            let ev = SourceEvent::Health {
                device: DeviceRef::new(self.inner.pool.clone(), device),
                health,
            };
            if events.send(ev).await.is_err() {
                return false;
            }
        }
        true
    }
}

#[async_trait]
impl Preparer for VfioBackend {
    /// Device nodes `/dev/vfio/vfio` and `/dev/vfio/<group>` (`mrw`) and the variable KubeVirt's
    /// launcher reads: `PCI_RESOURCE_<NAME>=<addr>,...` for PCI devices,
    /// `MDEV_PCI_RESOURCE_<NAME>=<uuid>` for mdev instances. NAME is the extended resource name
    /// the kubelet asked for (device-plugin API) or the device's configured resource name (DRA,
    /// the `resourceName` attribute), upper-cased with `/` and `.` as `_`; several devices of one
    /// resource join their values with `,`. With `bindOnPrepare`, functions not on `vfio-pci`
    /// are bound to it first.
    async fn prepare(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let inner = self.inner.clone();
        let consumer = consumer.clone();
        let devices = devices.to_vec();
        blocking(move || {
            devices
                .iter()
                .map(|a| inner.prepare_one(&consumer, a))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(PrepareError::from)?
    }

    /// The DRA form of `prepare`'s edits; `None` for a function `bindOnPrepare` has not bound
    /// to `vfio-pci` yet (its group node appears only then).
    async fn planned_edits(
        &self,
        device: &DeviceRef,
    ) -> Result<Option<ContainerEdits>, PrepareError> {
        let inner = self.inner.clone();
        let device = device.clone();
        blocking(move || inner.planned_one(&device))
            .await
            .map_err(PrepareError::from)?
    }

    /// Gives rebound functions back to their original drivers (from the records written before
    /// they were rebound); devices that were not rebound need nothing.
    async fn unprepare(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        let inner = self.inner.clone();
        let devices = devices.to_vec();
        blocking(move || {
            let mut first_err = None;
            for a in &devices {
                if let Err(e) = inner.unprepare_one(a) {
                    tracing::warn!(device = %a.device, error = %kubedev_core::echo::Chain(&e), "unprepare failed");
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
        .await
        .map_err(PrepareError::from)?
    }
}
