//! kubedev USB backend: USB devices found in sysfs, offered as resources of one or more devices.
//!
//! A resource is a name (`example.com/yubikey-pair`) and a list of `vendor:product` selectors
//! that one instance needs all of; see [`groups`] for how instances are formed (deterministically,
//! by bus and port path). Each instance is one device of the pool `<node>-usb`; it is healthy
//! while all its device nodes exist.
//!
//! # Discovery
//!
//! `/sys/bus/usb/devices` under the host root, skipping root hubs (`usbN`) and interfaces
//! (`1-1:1.0`): `idVendor`, `idProduct`, `bcdDevice`, `busnum`, `devnum`, `serial`,
//! `manufacturer`, `product`, and the device node from the uevent's `DEVNAME`
//! (`/dev/bus/usb/BBB/DDD`). A device whose files are broken is logged and skipped.
//!
//! # Attributes (domain `usb.kubedev.io`)
//!
//! | attribute | type | value |
//! |---|---|---|
//! | `resource` | string | the resource name, e.g. `example.com/yubikey` (left out if longer than 64 bytes) |
//! | `deviceCount` | int | how many USB devices the instance holds |
//! | `busnum` | int | the bus number of the first device |
//! | `vendorId` | string | `idVendor` as four lower-case hex digits, e.g. `1050` |
//! | `productId` | string | `idProduct`, e.g. `0407` |
//! | `bcdDevice` | string | `bcdDevice`, e.g. `0512` |
//! | `busDev` | string | `bus:dev` in decimal, e.g. `1:2` |
//! | `portPath` | string | the sysfs name (bus and port chain), e.g. `1-1.4` |
//! | `serial` | string | the serial number, if any |
//! | `manufacturer` | string | the manufacturer string, if any |
//! | `product` | string | the product string, if any |
//! | `resource.kubernetes.io/pcieRoot` | string | the PCIe root complex of the USB controller (`pci0000:00`), when every member hangs off the same one |
//! | `resource.kubernetes.io/numaNode` | int | the USB controller's NUMA node, when the kernel knows it and every member agrees |
//!
//! For an instance of several devices, the string attributes list the members' values in
//! selector order, joined with `,` (a member without the value contributes an empty string);
//! an attribute whose list would be ambiguous (a value containing `,`) or longer than 64 bytes is
//! left out.
//!
//! # Preparing
//!
//! Every member's device node with cgroup permissions `mrw`, and the env variable
//! `USB_RESOURCE_<NAME>=<bus>:<dev>,…` (NAME = resource name upper-cased, `/` and `.` → `_`;
//! bus and device numbers in decimal). Several instances of one resource in one container give
//! one variable listing them all.
//!
//! # Hot-plug
//!
//! `watch` uses inotify on `/dev/bus/usb` and its bus directories (re-checking every
//! `resyncSeconds` as a safety net): an instance whose node disappears turns Unhealthy and
//! recovers when the node is back; a node discovery has not seen (a device plugged in, or
//! re-plugged under a new device number) triggers [`SourceEvent::Rediscover`].
//!
//! ```
//! use kubedev_usb::{UsbBackend, UsbConfig};
//!
//! let config: UsbConfig = serde_json::from_str(
//!     r#"{"resources": [{"name": "example.com/yubikey", "selectors": ["1050:0407"]}]}"#,
//! )?;
//! let ctx = kubedev_core::BackendContext::new(kubedev_core::HostFs::new("/nonexistent-root"), "/nonexistent-state", "node-a");
//! let backend = UsbBackend::new(config, &ctx)?;
//! assert_eq!(backend.pool_name().as_str(), "node-a-usb");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod config;
mod discover;
mod error;
pub mod factory;
pub mod groups;

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::factory::own_pool_name;
use kubedev_core::hostfs::HostFs;
use kubedev_core::{
    BackendContext, ContainerEdits, DeviceName, DeviceNode, DeviceRef, DeviceSource, Health, Pool,
    PoolName, PrepareError, SourceError, SourceEvent, StatelessPreparer, watch_by_rescan,
};
use tokio::sync::mpsc;

pub use config::{UsbConfig, UsbResource, UsbSelector};
pub use discover::{DEV_BUS_USB, SYSFS_USB_DEVICES, UsbDevice, read_usb_devices};
pub use error::UsbError;
pub use groups::ATTRIBUTE_DOMAIN;

use groups::Instance;

/// The backend's name in logs and configuration.
pub const BACKEND_NAME: &str = "usb";

/// The cgroup permissions USB device nodes are given.
pub const NODE_PERMISSIONS: &str = "mrw";

/// What the last discovery found, and what has been reported since.
#[derive(Debug, Default)]
struct State {
    /// The instances of the last discovery, by device name.
    instances: BTreeMap<DeviceName, Instance>,
    /// The health last reported for each instance (by discovery or the watcher).
    reported: BTreeMap<DeviceName, Health>,
    /// Device nodes under `/dev/bus/usb` that discovery saw or the watcher already announced.
    known_nodes: BTreeSet<String>,
}

/// The USB backend: implements [`DeviceSource`] and [`Preparer`](kubedev_core::Preparer).
#[derive(Debug, Clone)]
pub struct UsbBackend {
    config: UsbConfig,
    host: HostFs,
    pool: PoolName,
    state: Arc<Mutex<State>>,
}

impl UsbBackend {
    /// A backend serving `config` from `ctx`'s host root, in the pool `<node>-usb`. Fails when
    /// the configuration is invalid (the error names the field and the value).
    pub fn new(config: UsbConfig, ctx: &BackendContext) -> Result<Self, UsbError> {
        config.validate()?;
        let pool = own_pool_name(&ctx.node_name, BACKEND_NAME).map_err(|e| UsbError::PoolName {
            pool: e.pool,
            reason: e.reason,
        })?;
        Ok(UsbBackend {
            config,
            host: ctx.host.clone(),
            pool,
            state: Arc::default(),
        })
    }

    /// The pool the devices are published in.
    pub fn pool_name(&self) -> &PoolName {
        &self.pool
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Healthy when every member's node exists, unhealthy when one is missing, unknown when
    /// whether one exists cannot be told; `nodes` is a listing of `/dev/bus/usb` taken just
    /// before (nodes elsewhere are looked up one by one).
    fn health_of(&self, instance: &Instance, nodes: Option<&BTreeSet<String>>) -> Health {
        let mut missing = Vec::new();
        let mut unknown = Vec::new();
        for m in &instance.members {
            let present = match nodes {
                Some(listed) if m.node.starts_with(DEV_BUS_USB) => Ok(listed.contains(&m.node)),
                _ => self.host.presence(&m.node),
            };
            match present {
                Ok(true) => {}
                Ok(false) => missing.push(format!("{} ({})", m.node, m.sysfs_name)),
                Err(e) => unknown.push(format!("{} ({}): {e}", m.node, m.sysfs_name)),
            }
        }
        if !missing.is_empty() {
            Health::unhealthy(format!("USB device node missing: {}", missing.join(", ")))
        } else if !unknown.is_empty() {
            Health::unknown(format!(
                "cannot tell whether USB device nodes exist: {}",
                unknown.join(", ")
            ))
        } else {
            Health::healthy()
        }
    }

    /// Reads sysfs, forms the instances and records them; returns the pool.
    fn refresh(&self) -> Result<Pool, SourceError> {
        let devices =
            read_usb_devices(&self.host).map_err(|e| SourceError::unavailable(BACKEND_NAME, &e))?;
        let nodes: BTreeSet<String> = discover::list_nodes(&self.host).into_iter().collect();
        let instances = groups::form_instances(&self.config.resources, &devices);
        let mut published = Vec::with_capacity(instances.len());
        let mut reported = BTreeMap::new();
        for inst in &instances {
            let mut dev = groups::device_of(inst, &self.config.resources[inst.resource]);
            dev.health = self.health_of(inst, Some(&nodes));
            reported.insert(inst.name.clone(), dev.health.clone());
            published.push(dev);
        }
        let pool = Pool::new(self.pool.clone(), published);
        pool.validate().map_err(|error| SourceError::Model {
            backend: BACKEND_NAME.into(),
            error,
        })?;
        let mut st = self.state();
        st.instances = instances.into_iter().map(|i| (i.name.clone(), i)).collect();
        st.reported = reported;
        st.known_nodes = nodes;
        Ok(pool)
    }

    /// Compares presence with what was reported; returns the events to send.
    fn check(&self) -> Vec<SourceEvent> {
        let nodes: BTreeSet<String> = discover::list_nodes(&self.host).into_iter().collect();
        let instances: Vec<Instance> = self.state().instances.values().cloned().collect();
        let health: Vec<(DeviceName, Health)> = instances
            .iter()
            .map(|i| (i.name.clone(), self.health_of(i, Some(&nodes))))
            .collect();
        let mut st = self.state();
        let mut out = Vec::new();
        for (name, h) in health {
            // Only instances still known: a discovery may have run meanwhile.
            if !st.instances.contains_key(&name) {
                continue;
            }
            if st.reported.get(&name) != Some(&h) {
                st.reported.insert(name.clone(), h.clone());
                out.push(SourceEvent::Health {
                    device: DeviceRef::new(self.pool.clone(), name),
                    health: h,
                });
            }
        }
        let new: Vec<String> = nodes
            .into_iter()
            .filter(|n| !st.known_nodes.contains(n))
            .collect();
        if !new.is_empty() {
            tracing::info!(nodes = ?new, "new USB device nodes; rediscovering");
            st.known_nodes.extend(new);
            out.push(SourceEvent::Rediscover);
        }
        out
    }

    /// The directories to watch, as real paths: `/dev/bus`, `/dev/bus/usb` and its buses.
    fn watch_dirs(&self) -> Vec<PathBuf> {
        let buses = self.host.list_dir(DEV_BUS_USB).unwrap_or_default();
        let buses = buses
            .into_iter()
            .map(|bus| Path::new(DEV_BUS_USB).join(bus));
        ["/dev/bus".into(), DEV_BUS_USB.into()]
            .into_iter()
            .chain(buses)
            .filter_map(|dir: PathBuf| self.host.resolve(dir).ok())
            .collect()
    }

    fn edits_for(&self, device: &DeviceRef) -> Result<Option<ContainerEdits>, PrepareError> {
        if device.pool != self.pool {
            return Err(PrepareError::UnknownDevice {
                device: device.to_string(),
            });
        }
        let Some(inst) = self.state().instances.get(&device.device).cloned() else {
            return Ok(None);
        };
        let health = self.health_of(&inst, None);
        if !health.is_healthy() {
            return Err(PrepareError::Unhealthy {
                device: device.to_string(),
                reason: health.reason.unwrap_or_default(),
            });
        }
        let resource = &self.config.resources[inst.resource];
        let list: Vec<String> = inst.members.iter().map(UsbDevice::bus_dev).collect();
        Ok(Some({
            let mut v = ContainerEdits::default();
            v.device_nodes = inst
                .members
                .iter()
                .map(|m| DeviceNode::new(m.node.clone(), NODE_PERMISSIONS))
                .collect();
            v.env = BTreeMap::from([(resource.env_name(), list.join(","))]);
            v
        }))
    }
}

#[async_trait]
impl DeviceSource for UsbBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        Ok(vec![self.refresh()?])
    }

    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let resync = Duration::from_secs(self.config.resync_seconds.max(1));
        let check = || async { self.check() };
        watch_by_rescan(events, resync, || self.watch_dirs(), check).await
    }
}

/// Preparing changes nothing on the host: `unprepare` has nothing to undo, and `cdi generate`
/// gets the same edits as `prepare`.
impl StatelessPreparer for UsbBackend {
    /// The nodes of the instance's devices and its resource's variable listing them.
    fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        let mut edits = self.edits_for(device)?;
        if edits.is_none() {
            // Not seen by the last discovery (or none ran yet): look again once.
            self.refresh().map_err(|e| {
                PrepareError::Other(format!(
                    "rediscovering USB devices: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
            edits = self.edits_for(device)?;
        }
        edits.ok_or_else(|| PrepareError::UnknownDevice {
            device: device.to_string(),
        })
    }
}
