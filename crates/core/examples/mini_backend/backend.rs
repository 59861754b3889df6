//! A complete kubedev backend against `kubedev-core` alone: USB serial ports (`/dev/ttyUSB*`)
//! found in `/sys/class/tty` through `HostFs`, watched for health and hot-plug, prepared as a
//! device node and an env variable. Walked through in docs/writing-a-backend.md.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::{
    AllocatedDevice, AttributeValue, BackendContext, ClaimRef, Consumer, ContainerEdits, Device,
    DeviceName, DeviceNode, DeviceRef, DeviceSource, Health, HostFs, NameError, Pool, PoolName,
    PrepareError, PreparedDevice, Preparer, QualifiedName, SourceError, SourceEvent,
};
use tokio::sync::mpsc;

const CLASS: &str = "/sys/class/tty";

fn bad(e: impl ToString) -> SourceError {
    let (backend, reason) = ("serial".to_string(), e.to_string());
    SourceError::Unavailable { backend, reason }
}

/// Serial ports of one node, published in the pool `<node>-serial`.
#[derive(Debug)]
pub(crate) struct SerialBackend {
    host: HostFs,
    pool: PoolName,
    /// sysfs name (`ttyUSB0`) → health last reported; discover and watch share it.
    known: Mutex<BTreeMap<String, Health>>,
}

impl SerialBackend {
    pub(crate) fn new(ctx: &BackendContext) -> Result<Self, SourceError> {
        let pool = PoolName::new(format!("{}-serial", ctx.node_name)).map_err(bad)?;
        let (host, known) = (ctx.host.clone(), Mutex::default());
        Ok(Self { host, pool, known })
    }

    /// `(sysfs name, driver)` of every `ttyUSB*`; an entry that cannot be used is skipped.
    fn ports(&self) -> Vec<(String, String)> {
        let (fs, names) = (&self.host, self.host.list_dir(CLASS).unwrap_or_default());
        let driver = |n: &str| fs.read_link_name(format!("{CLASS}/{n}/device/driver"));
        // A real backend logs with tracing::warn!; core has no logger, so stderr here.
        let read = |n: String| driver(&n).map(|d| (n, d)).inspect_err(|e| eprintln!("{e}"));
        let ok = |n: &String| n.starts_with("ttyUSB") && self.device_ref(n).is_ok();
        let usb = names.into_iter().filter(ok);
        usb.filter_map(|n| read(n).ok()).collect()
    }

    fn health(&self, port: &str) -> Health {
        match self.host.exists(format!("/dev/{port}")) {
            true => Health::healthy(),
            false => Health::unhealthy(format!("/dev/{port} is missing")),
        }
    }

    fn known(&self) -> MutexGuard<'_, BTreeMap<String, Health>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Device names are DNS labels: `ttyUSB0` is published as `ttyusb0`.
    pub(crate) fn device_ref(&self, port: &str) -> Result<DeviceRef, NameError> {
        let (pool, device) = (self.pool.clone(), DeviceName::new(port.to_lowercase())?);
        Ok(DeviceRef { pool, device })
    }
}

#[async_trait]
impl DeviceSource for SerialBackend {
    fn name(&self) -> &str {
        "serial"
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        let (mut devices, mut known) = (Vec::new(), BTreeMap::new());
        for (port, driver) in self.ports() {
            let name = self.device_ref(&port).map_err(bad)?.device;
            let key = QualifiedName::new("driver").map_err(bad)?;
            let value = AttributeValue::string(driver).map_err(bad)?; // at most 64 bytes
            let mut d = Device::new(name).with_attribute(key, value);
            d.health = self.health(&port);
            known.insert(port, d.health.clone());
            devices.push(d);
        }
        *self.known() = known;
        Ok(vec![Pool::new(self.pool.clone(), devices)])
    }

    /// Polls (a real backend would use inotify): a device node that comes or goes is a health
    /// event; a port that appears or vanishes asks the runtime to discover again.
    async fn watch(&self, events: mpsc::Sender<SourceEvent>) -> Result<(), SourceError> {
        let mut seen: Vec<String> = self.known().keys().cloned().collect();
        loop {
            let mut out = Vec::new();
            let ports: Vec<String> = self.ports().into_iter().map(|(n, _)| n).collect();
            for port in &ports {
                let health = self.health(port);
                let old = self.known().insert(port.clone(), health.clone());
                if old.is_some_and(|old| old != health) {
                    let device = self.device_ref(port).map_err(bad)?;
                    out.push(SourceEvent::Health { device, health });
                }
            }
            if ports != seen {
                out.push(SourceEvent::Rediscover);
                seen = ports;
            }
            for ev in out {
                if events.send(ev).await.is_err() {
                    return Ok(()); // nobody listens any more
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[async_trait]
impl Preparer for SerialBackend {
    /// Changes nothing on the host, so preparing again gives the same answer.
    async fn prepare(
        &self,
        _: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let (ports, mut out) = (self.ports(), Vec::new());
        for a in devices {
            let id = a.device.to_string();
            let is = |p: &&(String, String)| self.device_ref(&p.0).ok().as_ref() == Some(&a.device);
            let Some((port, _)) = ports.iter().find(is) else {
                return Err(PrepareError::UnknownDevice { device: id });
            };
            if let Some(reason) = self.health(port).reason {
                return Err(PrepareError::Unhealthy { device: id, reason });
            }
            let (node, mut edits) = (format!("/dev/{port}"), ContainerEdits::default());
            edits.env.insert("SERIAL_PORTS".into(), node.clone());
            edits.device_nodes.push(DeviceNode::new(node, "rw"));
            let device = a.clone();
            out.push(PreparedDevice { device, edits });
        }
        Ok(out)
    }

    /// Nothing to undo; succeeds for claims never prepared, as the contract asks.
    async fn unprepare(&self, _: &ClaimRef, _: &[AllocatedDevice]) -> Result<(), PrepareError> {
        Ok(())
    }
}
