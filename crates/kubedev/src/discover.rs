//! `kubedev discover`: what the configured backends find on this host, which API serves each
//! device, and the ResourceSlices DRA would publish.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use kubedev_core::{DeviceFilter, HealthState, Inventory};

use crate::config::Config;
use crate::runtime::{Backends, BuildMode, build_backends};

/// Which kubelet API serves a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServedBy {
    /// The device-plugin resource whose selector takes it.
    DevicePlugin(String),
    /// DRA publishes it in a ResourceSlice.
    Dra,
    /// Neither: DRA is off and no device-plugin resource selects it.
    Nobody,
}

impl std::fmt::Display for ServedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServedBy::DevicePlugin(r) => write!(f, "device-plugin {r}"),
            ServedBy::Dra => f.write_str("dra"),
            ServedBy::Nobody => f.write_str("-"),
        }
    }
}

/// What discovery found.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The backends that ran.
    pub backends: Vec<String>,
    /// Everything they found.
    pub inventory: Inventory,
    /// Per pool, per device (in inventory order): who serves it.
    pub served_by: Vec<Vec<ServedBy>>,
    /// The node name used for pools and slices.
    pub node: String,
    /// The backends themselves, owning the pools found (for questions about their devices).
    pub set: Backends,
}

/// Runs every configured backend's discovery once and splits the devices between the APIs as
/// the daemon would.
pub async fn discover(config: &Config, path: &Path) -> anyhow::Result<Discovery> {
    let backends = Backends::new(build_backends(config, BuildMode::Inspect)?);
    let inventory = backends.discover_all().await;
    let resources = if config.device_plugin.enabled {
        config.resources(path)?
    } else {
        Vec::new()
    };
    let served_by = inventory
        .pools
        .iter()
        .map(|pool| {
            pool.devices
                .iter()
                .map(|d| {
                    resources
                        .iter()
                        .find(|r| r.filter.matches(pool, d).unwrap_or(false))
                        .map(|r| ServedBy::DevicePlugin(r.name.to_string()))
                        .unwrap_or(if config.dra.enabled {
                            ServedBy::Dra
                        } else {
                            ServedBy::Nobody
                        })
                })
                .collect()
        })
        .collect();
    Ok(Discovery {
        backends: backends
            .list()
            .iter()
            .map(|(_, b)| b.kind.to_string())
            .collect(),
        inventory,
        served_by,
        node: config.node_name_or_host(),
        set: backends,
    })
}

impl Discovery {
    /// The number of devices found.
    pub fn device_count(&self) -> usize {
        self.inventory.pools.iter().map(|p| p.devices.len()).sum()
    }

    /// A table: one row per device with its pool, who serves it, health, NUMA node and
    /// attributes; or a plain sentence when there is nothing.
    pub fn table(&self) -> String {
        if self.device_count() == 0 {
            return if self.backends.is_empty() {
                "No backend is configured, so there is nothing to discover.\n".to_string()
            } else {
                format!(
                    "No devices found: the {} backend{} found nothing to offer on this host.\n",
                    self.backends.join(", "),
                    if self.backends.len() == 1 { "" } else { "s" }
                )
            };
        }
        let mut rows = vec![[
            "POOL".to_string(),
            "DEVICE".to_string(),
            "SERVED BY".to_string(),
            "HEALTH".to_string(),
            "NUMA".to_string(),
            "ATTRIBUTES".to_string(),
        ]];
        for (pool, served) in self.inventory.pools.iter().zip(&self.served_by) {
            for (d, by) in pool.devices.iter().zip(served) {
                let health = match (&d.health.state, &d.health.reason) {
                    (HealthState::Healthy, _) => "Healthy".to_string(),
                    (state, Some(reason)) => format!("{state:?} ({reason})"),
                    (state, None) => format!("{state:?}"),
                };
                let attrs: Vec<String> = d
                    .attributes
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                rows.push([
                    pool.name.to_string(),
                    d.name.to_string(),
                    by.to_string(),
                    health,
                    d.numa_node.map_or("-".to_string(), |n| n.to_string()),
                    attrs.join(" "),
                ]);
            }
        }
        let mut out = crate::table::columns(&rows);
        let _ = writeln!(
            out,
            "\n{} device(s) in {} pool(s) from {}.",
            self.device_count(),
            self.inventory.pools.len(),
            self.backends.join(", ")
        );
        out
    }

    /// The ResourceSlices DRA would publish (only the devices DRA serves), as a `v1/List`.
    pub fn slices(&self, config: &Config) -> anyhow::Result<serde_json::Value> {
        let mut view = self.inventory.clone();
        for (pool, served) in view.pools.iter_mut().zip(&self.served_by) {
            let mut keep = served.iter().map(|s| *s == ServedBy::Dra);
            pool.devices.retain(|_| keep.next().unwrap_or(false));
        }
        let driver = kubedev_core::DriverName::new(
            config
                .dra
                .driver_name
                .clone()
                .unwrap_or_else(|| "kubedev.local".to_string()),
        )
        .context("dra.driverName")?;
        let slices = kubedev_apiserver::render_slices(
            &view,
            &driver,
            &self.node,
            kubedev_apiserver::UnhealthyDevices::Omit,
        )
        .context("rendering ResourceSlices")?;
        let items = slices
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .context("encoding ResourceSlices")?;
        Ok(serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
    }
}
