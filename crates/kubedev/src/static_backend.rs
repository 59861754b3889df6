//! The `static` example backend: devices described in configuration.
//!
//! It implements [`DeviceSource`] and [`StatelessPreparer`] like any real backend and is what the
//! tests and the demo use. A device may name a `presence_path`: the device is healthy while that
//! file exists and unhealthy while it does not (checked every `poll_interval`, through
//! `watch_health`), which is how the demo turns a device unhealthy and back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use kubedev_core::factory::{BackendFactory, BuildContext, Section, SectionError, typed};

use kubedev_core::{
    AttributeValue, ContainerEdits, Device, DeviceName, DeviceNode, DeviceRef, DeviceSource,
    EventSender, Health, Mount, Pool, PoolName, PrepareError, QualifiedName, Quantity, SourceError,
    StatelessPreparer, watch_health,
};

/// One device of the static backend, as written in configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticDevice {
    /// The device name (a DNS label).
    pub name: DeviceName,
    /// Typed attributes, e.g. `model: {string: "x1"}`.
    #[serde(default)]
    pub attributes: BTreeMap<QualifiedName, AttributeValue>,
    /// Capacities, e.g. `memory: 16Gi`.
    #[serde(default)]
    pub capacity: BTreeMap<QualifiedName, Quantity>,
    /// NUMA node.
    #[serde(default)]
    pub numa_node: Option<i64>,
    /// Device nodes given to the container (`rw`).
    #[serde(default)]
    pub device_nodes: Vec<String>,
    /// Environment variables given to the container.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Read-only bind mounts, host path → container path.
    #[serde(default)]
    pub mounts: BTreeMap<String, String>,
    /// A host file whose presence means the device is healthy.
    #[serde(default)]
    pub presence_path: Option<PathBuf>,
}

/// Configuration of the static backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticConfig {
    /// The pool the devices are published in.
    pub pool: PoolName,
    /// The devices.
    pub devices: Vec<StaticDevice>,
    /// How often presence paths are checked, in milliseconds (default 200).
    #[serde(default = "default_poll_ms")]
    pub poll_interval_ms: u64,
}

fn default_poll_ms() -> u64 {
    200
}

/// The static backend.
#[derive(Debug, Clone)]
pub struct StaticBackend {
    config: StaticConfig,
}

/// The env variable that lists the static devices a container got.
pub const STATIC_VISIBLE_DEVICES: &str = "STATIC_VISIBLE_DEVICES";

impl StaticBackend {
    /// A backend serving the configured devices. Fails when two devices share a name.
    pub fn new(config: StaticConfig) -> Result<Self, SourceError> {
        let backend = StaticBackend { config };
        backend
            .pool()
            .validate()
            .map_err(|error| SourceError::Model {
                backend: "static".into(),
                error,
            })?;
        Ok(backend)
    }

    fn health_of(dev: &StaticDevice) -> Health {
        let Some(p) = &dev.presence_path else {
            return Health::healthy();
        };
        match p.try_exists() {
            Ok(true) => Health::healthy(),
            Ok(false) => Health::unhealthy(format!("{} is missing", p.display())),
            Err(e) => Health::unknown(format!("cannot tell whether {} exists: {e}", p.display())),
        }
    }

    fn pool(&self) -> Pool {
        let devices = self
            .config
            .devices
            .iter()
            .map(|d| {
                let mut dev = Device::new(d.name.clone());
                dev.attributes = d.attributes.clone();
                for (k, v) in &d.capacity {
                    dev = dev.with_capacity(k.clone(), *v);
                }
                dev.numa_node = d.numa_node;
                dev.health = Self::health_of(d);
                dev
            })
            .collect();
        Pool::new(self.config.pool.clone(), devices)
    }

    /// The health of the devices with a presence path, now.
    fn watched_health(&self) -> Vec<(DeviceRef, Health)> {
        let watched = self
            .config
            .devices
            .iter()
            .filter(|d| d.presence_path.is_some());
        watched
            .map(|d| {
                let device = DeviceRef::new(self.config.pool.clone(), d.name.clone());
                (device, Self::health_of(d))
            })
            .collect()
    }
}

#[async_trait]
impl DeviceSource for StaticBackend {
    fn name(&self) -> &str {
        "static"
    }

    async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
        Ok(vec![self.pool()])
    }

    /// Checks the presence paths every `pollIntervalMs`.
    async fn watch(&self, events: EventSender) -> Result<(), SourceError> {
        if !self
            .config
            .devices
            .iter()
            .any(|d| d.presence_path.is_some())
        {
            return Ok(());
        }
        let period = Duration::from_millis(self.config.poll_interval_ms.max(10));
        watch_health(events, period, || self.watched_health()).await
    }
}

impl StatelessPreparer for StaticBackend {
    /// The configured nodes, env and mounts, and the device's name in
    /// [`STATIC_VISIBLE_DEVICES`].
    fn device_edits(&self, device: &DeviceRef) -> Result<ContainerEdits, PrepareError> {
        let unknown = || PrepareError::UnknownDevice {
            device: device.to_string(),
        };
        if device.pool != self.config.pool {
            return Err(unknown());
        }
        let d = self
            .config
            .devices
            .iter()
            .find(|d| d.name == device.device)
            .ok_or_else(unknown)?;
        let mut edits = ContainerEdits::default();
        edits
            .env
            .insert(STATIC_VISIBLE_DEVICES.into(), d.name.to_string());
        edits.env.extend(d.env.clone());
        edits.device_nodes = d
            .device_nodes
            .iter()
            .map(|p| DeviceNode::new(p.clone(), "rw"))
            .collect();
        edits.mounts = d
            .mounts
            .iter()
            .map(|(h, c)| Mount::bind(h.clone(), c.clone(), true))
            .collect();
        Ok(edits)
    }

    /// The device's configured device nodes, for the claim's status.
    fn device_status_data(&self, device: &DeviceRef) -> Option<serde_json::Value> {
        let d = self
            .config
            .devices
            .iter()
            .find(|d| d.name == device.device)?;
        Some(serde_json::json!({"deviceNodes": d.device_nodes}))
    }
}

impl Section for StaticConfig {
    fn validate(&self) -> Result<(), SectionError> {
        for (i, d) in self.devices.iter().enumerate() {
            if let Some(j) = self.devices[..i].iter().position(|o| o.name == d.name) {
                return Err(SectionError::new(
                    format!("devices[{i}].name"),
                    format!(
                        "{:?} is also the name of devices[{j}]; device names must be unique",
                        d.name.as_str()
                    ),
                ));
            }
        }
        StaticBackend::new(self.clone())
            .map(|_| ())
            .map_err(|e| SectionError::new("", kubedev_core::echo::chain(&e)))
    }
}

/// The factory of the `static` backend (devices listed in the configuration); it names its
/// pool itself.
pub fn factory() -> impl BackendFactory {
    typed("static", |config: StaticConfig, _ctx: &BuildContext| {
        StaticBackend::new(config).map_err(|e| SectionError::new("", kubedev_core::echo::chain(&e)))
    })
    .names_its_pools()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{AllocatedDevice, Consumer, Preparer, SourceEvent};
    use tokio::sync::mpsc;

    fn config(dir: &std::path::Path) -> StaticConfig {
        let yaml = serde_json::json!({
            "pool": "node-a",
            "pollIntervalMs": 10,
            "devices": [
                {"name": "dev-0", "attributes": {"model": {"string": "x1"}}, "numaNode": 0,
                 "deviceNodes": ["/dev/null"], "env": {"FOO": "bar"},
                 "presencePath": dir.join("dev-0").to_str().unwrap()},
                {"name": "dev-1", "capacity": {"memory": "16Gi"}, "numaNode": 1}
            ]
        });
        serde_json::from_value(yaml).unwrap()
    }

    #[tokio::test]
    async fn a_presence_path_nobody_can_look_up_gives_unknown_health() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // A link to itself: whether it exists cannot be told.
        std::os::unix::fs::symlink(dir.join("dev-0"), dir.join("dev-0")).unwrap();
        let b = StaticBackend::new(config(dir)).unwrap();
        let pools = b.discover().await.unwrap();
        let h = &pools[0].devices[0].health;
        assert_eq!(h.state, kubedev_core::HealthState::Unknown, "{h:?}");
        assert!(
            h.reason
                .as_deref()
                .unwrap_or("")
                .contains("cannot tell whether"),
            "{h:?}"
        );
    }

    #[tokio::test]
    async fn discovers_configured_devices_with_health_from_presence() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let b = StaticBackend::new(config(dir)).unwrap();
        let pools = b.discover().await.unwrap();
        assert_eq!(pools.len(), 1);
        let devs = &pools[0].devices;
        assert_eq!(devs.len(), 2);
        assert!(!devs[0].health.is_healthy(), "presence file missing");
        assert!(devs[1].health.is_healthy());
        assert_eq!(devs[1].numa_node, Some(1));

        let (tx, mut rx) = mpsc::channel(4);
        let watcher = tokio::spawn({
            let b = b.clone();
            async move { b.watch(tx).await }
        });
        // The watcher says what the watched device's health is now, every period.
        let mut next = async || match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await
        {
            Ok(Some(SourceEvent::Health { device, health })) => (device, health),
            other => panic!("unexpected event {other:?}"),
        };
        let (device, health) = next().await;
        assert_eq!(device.device.as_str(), "dev-0");
        assert!(!health.is_healthy());
        std::fs::write(dir.join("dev-0"), "").unwrap();
        loop {
            let (device, health) = next().await;
            assert_eq!(
                device.device.as_str(),
                "dev-0",
                "only dev-0 has a presence path"
            );
            if health.is_healthy() {
                break;
            }
        }
        watcher.abort();
    }

    #[tokio::test]
    async fn prepare_gives_nodes_env_and_rejects_unknown_devices() {
        let b = StaticBackend::new(config(std::path::Path::new("/nonexistent"))).unwrap();
        let alloc = |name: &str| {
            AllocatedDevice::new(DeviceRef::new(
                PoolName::new("node-a").unwrap(),
                DeviceName::new(name).unwrap(),
            ))
        };
        let consumer = Consumer::Container {
            resource: "example.com/dev".into(),
        };
        let out = b.prepare(&consumer, &[alloc("dev-0")]).await.unwrap();
        assert_eq!(out[0].edits.env[STATIC_VISIBLE_DEVICES], "dev-0");
        assert_eq!(out[0].edits.env["FOO"], "bar");
        assert_eq!(out[0].edits.device_nodes[0].path, "/dev/null");
        let err = b.prepare(&consumer, &[alloc("dev-9")]).await.unwrap_err();
        assert!(err.to_string().contains("node-a/dev-9"), "{err}");
    }

    #[test]
    fn duplicate_device_names_are_rejected() {
        let mut c = config(std::path::Path::new("/x"));
        c.devices[1].name = c.devices[0].name.clone();
        let err = StaticBackend::new(c).unwrap_err();
        assert!(err.to_string().contains("dev-0"), "{err}");
    }
}
