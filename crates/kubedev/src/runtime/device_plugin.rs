//! Device-plugin serving: the resources' servers, `Allocate` through the owning backends,
//! CDI mode, and starting and stopping resources on reload.

use super::*;

/// Answers the kubelet's `Allocate` for one resource through the owning backends' preparers, and
/// `GetPreferredAllocation` through the resource's selection policy, if it has one.
pub(super) struct ResourceHandler {
    pub(super) resource: Arc<ResourceDevices>,
    pub(super) backends: Backends,
    pub(super) policy: Option<PolicySource>,
    pub(super) inventory: Arc<parking_lot::RwLock<Inventory>>,
    pub(super) cdi: Option<DevicePluginCdi>,
    pub(super) metrics: Arc<Metrics>,
}

/// CDI mode of one device-plugin resource: every `Allocate` gets one CDI device in one spec file
/// for the resource (kind `k8s.<resource domain>/claim`), holding the edits of exactly the
/// devices allocated together, so `Allocate` can answer with its CDI name: `dp-<name>-<device>`
/// for one device, `dp-<name>-alloc-<hash of the device names>` for several. Variables are never
/// joined across allocations, so a container only learns its own devices. The kubelet never
/// releases device-plugin devices explicitly, so the spec only grows while the daemon runs; an
/// allocation's edits do not change.
pub(super) struct DevicePluginCdi {
    pub(super) writer: CdiWriter,
    pub(super) key: kubedev_core::ClaimUid,
    pub(super) allocations:
        parking_lot::Mutex<std::collections::BTreeMap<String, kubedev_core::PreparedDevice>>,
}

/// FNV-1a over the sorted device names: a short, stable name for a set of devices.
fn allocation_hash(names: &[&str]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for n in names {
        for b in n.bytes().chain(std::iter::once(0)) {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    h
}

impl DevicePluginCdi {
    pub(super) fn new(
        dir: &Path,
        resource: &kubedev_core::ExtendedResourceName,
    ) -> anyhow::Result<Self> {
        let (domain, name) = resource
            .as_str()
            .split_once('/')
            .context("extended resource names have a domain")?;
        let driver = kubedev_core::DriverName::new(domain).with_context(|| {
            format!("CDI mode for {resource}: the domain must be a driver name")
        })?;
        let key = format!("dp-{}", name.replace(['.', '_'], "-").to_ascii_lowercase());
        let key = kubedev_core::ClaimUid::new(key).with_context(|| {
            format!("CDI mode for {resource}: the resource's spec needs a name of its own")
        })?;
        Ok(DevicePluginCdi {
            writer: CdiWriter::new(dir, &driver).with_independent_devices(),
            key,
            allocations: Default::default(),
        })
    }

    /// Adds the allocation of `prepared` to the resource's spec and returns its CDI name (none
    /// when the devices need no container edits).
    pub(super) fn write(
        &self,
        prepared: &[kubedev_core::PreparedDevice],
    ) -> Result<Vec<String>, PrepareError> {
        let Some(first) = prepared.first() else {
            return Ok(Vec::new());
        };
        let mut entry = first.clone();
        if prepared.len() > 1 {
            let mut names: Vec<&str> = prepared
                .iter()
                .map(|p| p.device.device.device.as_str())
                .collect();
            names.sort_unstable();
            let name = format!("alloc-{:08x}", allocation_hash(&names));
            entry.device.device.device = kubedev_core::DeviceName::new(&name).map_err(|e| {
                PrepareError::Other(format!(
                    "naming the CDI device {name}: {}",
                    kubedev_core::echo::chain(&e)
                ))
            })?;
            entry.device.share_id = None;
            entry.edits = ContainerEdits::default();
            for p in prepared {
                entry.edits.merge(&p.edits);
            }
        }
        let mut allocations = self.allocations.lock();
        let key = entry.device.device.device.to_string();
        allocations.insert(key.clone(), entry);
        let all: Vec<_> = allocations.values().cloned().collect();
        let written = self.writer.write_claim(&self.key, &all).map_err(|e| {
            PrepareError::Other(format!(
                "writing the CDI spec: {}",
                kubedev_core::echo::chain(&e)
            ))
        })?;
        let i = all
            .iter()
            .position(|a| a.device.device.device.as_str() == key)
            .unwrap_or_default();
        Ok(written
            .device_ids
            .get(i)
            .cloned()
            .flatten()
            .into_iter()
            .collect())
    }
}

#[async_trait]
impl DevicePluginHandler for ResourceHandler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        let mut allocated: Vec<AllocatedDevice> = Vec::with_capacity(devices.len());
        for d in devices {
            // Replicas of one time-sliced device are one device to prepare.
            if !allocated.iter().any(|a| a.device == d.device) {
                allocated.push(AllocatedDevice::new(d.device.clone()));
            }
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
        let refs: Vec<DeviceRef> = devices.iter().map(|d| d.device.clone()).collect();
        self.backends.pre_start(&refs).await
    }

    fn needs_pre_start(&self) -> bool {
        self.backends.needs_pre_start()
    }

    fn preferred_allocation(&self, request: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        let inventory = self.inventory.read();
        self.policy
            .as_ref()?
            .choose(&self.resource, &inventory, request, &self.metrics)
    }
}

/// One running device-plugin resource.
pub(super) struct DpServer {
    pub(super) name: kubedev_core::ExtendedResourceName,
    /// Its configuration as written, to tell what a reload changes.
    pub(super) config: crate::config::ResourceConfig,
    pub(super) handle: DevicePluginHandle,
}

/// The device-plugin side: the publisher feeding every resource, and the running servers.
#[derive(Default)]
pub(super) struct DevicePlugins {
    pub(super) publisher: DevicePluginPublisher,
    pub(super) servers: BTreeMap<String, DpServer>,
    pub(super) policies: PolicyState,
}

/// What the runtime shares with every part it starts.
pub(super) struct Shared<'a> {
    pub(super) backends: &'a Backends,
    pub(super) inventory: &'a Arc<parking_lot::RwLock<Inventory>>,
    pub(super) obs: &'a Observe,
    pub(super) cancel: &'a CancellationToken,
}

impl DevicePlugins {
    /// Adds `specs` to the publisher, publishes `inventory` to every resource (so each server's
    /// first snapshot is complete, and a selector that makes device IDs clash is refused), then
    /// starts their servers. On an error the new resources are taken out again.
    pub(super) async fn start(
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
                let mut cfg = DevicePluginConfig::new(devices.name().clone())
                    .plugin_dir(&dp.directory)
                    .observe_requests(sh.obs.metrics.request_observer());
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
                |s| (s.registrations, s.registered),
            );
            self.servers.insert(
                r.name.to_string(),
                DpServer {
                    name: r.name.clone(),
                    config: raw,
                    handle,
                },
            );
        }
        Ok(())
    }

    /// Takes the resources of `names` that have no running server out of the publisher.
    pub(super) fn forget_unstarted(&mut self, names: &[kubedev_core::ExtendedResourceName]) {
        for n in names {
            if !self.servers.contains_key(n.as_str()) {
                self.publisher.remove_resource(n);
            }
        }
    }

    /// Stops the server of `name` and takes its resource out of the publisher.
    pub(super) async fn stop(&mut self, name: &str, obs: &Observe) {
        if let Some(s) = self.servers.remove(name) {
            obs.probes.remove_socket(s.handle.socket_path());
            obs.probes.remove_device_plugin(name);
            self.publisher.remove_resource(&s.name);
            s.handle.stop().await;
            tracing::info!(resource = %name, "device-plugin server stopped");
        }
    }
}
