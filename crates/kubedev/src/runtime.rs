//! The daemon's runtime: backends in, kubelet servers out.
//!
//! It discovers every backend's devices into one inventory, publishes it to the device-plugin
//! servers, applies the backends' health and hot-plug events, and routes the kubelet's requests
//! to the backend that owns each device.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use kubedev_core::static_backend::StaticBackend;
use kubedev_core::{
    AllocatedDevice, Consumer, ContainerEdits, DeviceSource, Inventory, Pool, PoolName,
    PrepareError, Preparer, Publisher, SourceEvent,
};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandle, DevicePluginHandler,
    DevicePluginPublisher, PluginDevice, ResourceDevices,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A backend: its device source and its preparer (usually the same object).
#[derive(Clone)]
pub struct Backend {
    /// Where devices come from.
    pub source: Arc<dyn DeviceSource>,
    /// How they are handed to containers.
    pub preparer: Arc<dyn Preparer>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.source.name())
            .finish()
    }
}

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
    Ok(out)
}

/// Which backend owns which pool.
#[derive(Debug, Default, Clone)]
struct Owners(HashMap<PoolName, usize>);

/// Discovers all backends into one inventory; a backend that fails is logged and left out.
async fn discover_all(backends: &[Backend]) -> (Inventory, Owners) {
    let mut pools: Vec<Pool> = Vec::new();
    let mut owners = Owners::default();
    for (i, b) in backends.iter().enumerate() {
        match b.source.discover().await {
            Ok(found) => {
                for p in found {
                    if owners.0.contains_key(&p.name) {
                        tracing::error!(backend = b.source.name(), pool = %p.name, "pool name already used by another backend; pool left out");
                        continue;
                    }
                    if let Err(e) = p.validate() {
                        tracing::error!(backend = b.source.name(), error = %e, "invalid pool left out");
                        continue;
                    }
                    owners.0.insert(p.name.clone(), i);
                    pools.push(p);
                }
            }
            Err(e) => tracing::error!(backend = b.source.name(), error = %e, "discovery failed"),
        }
    }
    (Inventory::new(pools), owners)
}

/// Answers the kubelet's `Allocate` for one resource through the owning backends' preparers.
struct ResourceHandler {
    resource: Arc<ResourceDevices>,
    backends: Vec<Backend>,
    owners: Arc<std::sync::RwLock<Owners>>,
}

#[async_trait]
impl DevicePluginHandler for ResourceHandler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        // Group the devices by backend, keeping the kubelet's order within each.
        let mut groups: Vec<(usize, Vec<AllocatedDevice>)> = Vec::new();
        for d in devices {
            let r = self
                .resource
                .device_ref(&d.id)
                .ok_or_else(|| PrepareError::UnknownDevice {
                    device: d.id.clone(),
                })?;
            let owner = self
                .owners
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .get(&r.pool)
                .copied()
                .ok_or_else(|| PrepareError::UnknownDevice {
                    device: r.to_string(),
                })?;
            let alloc = AllocatedDevice {
                device: r,
                request: String::new(),
                share_id: None,
                config: Vec::new(),
            };
            match groups.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, g)) => g.push(alloc),
                None => groups.push((owner, vec![alloc])),
            }
        }
        let consumer = Consumer::Container {
            resource: self.resource.name().to_string(),
        };
        let mut edits = ContainerEdits::default();
        for (owner, group) in groups {
            let prepared = self.backends[owner]
                .preparer
                .prepare(&consumer, &group)
                .await?;
            for p in prepared {
                edits.merge(&p.edits);
            }
        }
        Ok(Allocation {
            edits,
            cdi_devices: Vec::new(),
        })
    }
}

/// Runs the daemon until `cancel` fires; stops every server and removes its socket on the way out.
pub async fn run(
    config: Config,
    config_path: &Path,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let backends = build_backends(&config)?;
    let resources = config.resources(config_path)?;
    let (mut inventory, owners) = discover_all(&backends).await;
    tracing::info!(
        backends = backends.len(),
        pools = inventory.pools.len(),
        devices = inventory.devices().count(),
        "discovered"
    );
    let owners = Arc::new(std::sync::RwLock::new(owners));

    let mut publisher = DevicePluginPublisher::new();
    let mut servers: Vec<DevicePluginHandle> = Vec::new();
    if config.device_plugin.enabled {
        let dp = &config.device_plugin;
        let resource_devices: Vec<_> = resources
            .into_iter()
            .map(|r| publisher.add_resource(r.name, Box::new(r.filter)))
            .collect();
        publisher
            .publish(&inventory)
            .await
            .context("publishing the inventory to the device-plugin resources")?;
        for rd in resource_devices {
            let mut cfg = DevicePluginConfig::new(rd.name().clone()).plugin_dir(&dp.directory);
            if let Some(k) = &dp.kubelet_socket {
                cfg = cfg.kubelet_socket(k);
            }
            let handler = Arc::new(ResourceHandler {
                resource: rd.clone(),
                backends: backends.clone(),
                owners: owners.clone(),
            });
            let server = DevicePlugin::start(cfg, handler, rd.subscribe(), cancel.child_token())
                .with_context(|| format!("starting the device-plugin server for {}", rd.name()))?;
            tracing::info!(resource = %rd.name(), socket = %server.socket_path().display(), "device-plugin server started");
            servers.push(server);
        }
    }

    // Backend watchers feed one event channel.
    let (tx, mut rx) = mpsc::channel::<(usize, SourceEvent)>(256);
    let mut watchers = JoinSet::new();
    for (i, b) in backends.iter().enumerate() {
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
            SourceEvent::Rediscover => {
                let b = &backends[i];
                match b.source.discover().await {
                    Ok(found) => {
                        let mut own = owners.write().unwrap_or_else(|e| e.into_inner());
                        inventory.pools.retain(|p| own.0.get(&p.name) != Some(&i));
                        own.0.retain(|_, o| *o != i);
                        for p in found {
                            if own.0.contains_key(&p.name) || p.validate().is_err() {
                                tracing::error!(pool = %p.name, "pool left out after rediscovery");
                                continue;
                            }
                            own.0.insert(p.name.clone(), i);
                            inventory.pools.push(p);
                        }
                        true
                    }
                    Err(e) => {
                        tracing::error!(backend = b.source.name(), error = %e, "rediscovery failed");
                        false
                    }
                }
            }
            _ => false,
        };
        if changed && let Err(e) = publisher.publish(&inventory).await {
            tracing::error!(error = %e, "publishing failed");
        }
    }

    tracing::info!("stopping");
    watchers.shutdown().await;
    let stop_all = async {
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
