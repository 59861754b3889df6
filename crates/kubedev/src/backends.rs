//! The set of backends and which one owns which pool.

use parking_lot::RwLock;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kubedev_core::{
    AllocatedDevice, Consumer, Inventory, Pool, PoolName, PrepareError, PreparedDevice,
};

/// A backend: its kind, its device source and its preparer (usually the same object).
pub use kubedev_core::factory::BuiltBackend as Backend;

/// All backends of the daemon, and the pool → backend map of the latest discovery.
///
/// Each backend sits in a slot whose index never changes; a configuration reload replaces or
/// empties a slot, and every clone (the DRA driver's, the device-plugin handlers') sees it.
#[derive(Debug, Clone)]
pub struct Backends {
    slots: Arc<RwLock<Vec<Option<Backend>>>>,
    owners: Arc<RwLock<HashMap<PoolName, usize>>>,
    /// The slots whose latest discovery failed.
    failed: Arc<tokio::sync::watch::Sender<BTreeSet<usize>>>,
}

impl Backends {
    /// Wraps the backends, one slot each; nothing is discovered yet.
    pub fn new(list: Vec<Backend>) -> Self {
        Backends {
            slots: Arc::new(RwLock::new(list.into_iter().map(Some).collect())),
            owners: Arc::default(),
            failed: Arc::new(tokio::sync::watch::Sender::new(BTreeSet::new())),
        }
    }

    /// The slots whose latest discovery failed, as it changes: their pools are those of the
    /// discovery before, or none after a failed first one, until one succeeds.
    pub fn failed_discoveries(&self) -> tokio::sync::watch::Receiver<BTreeSet<usize>> {
        self.failed.subscribe()
    }

    /// Records whether the latest discovery of slot `i` succeeded (see
    /// [`Backends::failed_discoveries`]).
    pub fn note_discovery(&self, i: usize, ok: bool) {
        self.failed.send_if_modified(|failed| {
            if ok {
                failed.remove(&i)
            } else {
                failed.insert(i)
            }
        });
    }

    /// The running backends with their slot indexes.
    pub fn list(&self) -> Vec<(usize, Backend)> {
        self.slots
            .read()
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.clone().map(|b| (i, b)))
            .collect()
    }

    /// The backend in slot `i`, if one runs there.
    pub fn get(&self, i: usize) -> Option<Backend> {
        self.slots.read().get(i).cloned().flatten()
    }

    /// Puts `backend` in slot `i` (a new slot when `i` is past the end), or empties the slot;
    /// the slot's pools stay in the owner map until [`Backends::rediscover`] replaces them.
    pub fn set(&self, i: usize, backend: Option<Backend>) {
        let mut slots = self.slots.write();
        if i >= slots.len() {
            slots.resize(i + 1, None);
        }
        slots[i] = backend;
    }

    /// The pools slot `i` published at its last discovery.
    pub fn pools_of(&self, i: usize) -> Vec<PoolName> {
        let mut pools: Vec<PoolName> = self
            .owners
            .read()
            .iter()
            .filter(|(_, o)| **o == i)
            .map(|(p, _)| p.clone())
            .collect();
        pools.sort();
        pools
    }

    /// Discovers all backends into one inventory; a backend that fails, a pool whose name another
    /// backend already uses, and an invalid pool are logged and left out (a failed backend is
    /// among [`Backends::failed_discoveries`] until it is discovered again).
    pub async fn discover_all(&self) -> Inventory {
        let mut pools: Vec<Pool> = Vec::new();
        let mut owners = HashMap::new();
        let mut outcomes = Vec::new();
        for (i, b) in self.list() {
            let discovered = if crate::failpoint::fails("startup-discovery") {
                Err(kubedev_core::SourceError::Unavailable {
                    backend: b.kind.to_string(),
                    reason: "fail point startup-discovery".into(),
                })
            } else {
                b.source.discover().await
            };
            match discovered {
                Ok(found) => {
                    Self::adopt(i, &b, found, &mut owners, &mut pools);
                    outcomes.push((i, true));
                }
                Err(e) => {
                    tracing::error!(backend = &*b.kind, error = %kubedev_core::echo::Chain(&e), "discovery failed");
                    outcomes.push((i, false));
                }
            }
        }
        *self.owners.write() = owners;
        for (i, ok) in outcomes {
            self.note_discovery(i, ok);
        }
        Inventory::new(pools)
    }

    /// Discovers slot `i` again and replaces its pools in `inventory` (an empty slot's pools are
    /// removed). False when discovery failed and nothing changed. The caller reports the
    /// outcome with [`Backends::note_discovery`] once `inventory` is the one in use.
    pub async fn rediscover(&self, i: usize, inventory: &mut Inventory) -> bool {
        let found = match self.get(i) {
            Some(b) => match b.source.discover().await {
                Ok(f) => Some((b, f)),
                Err(e) => {
                    tracing::error!(backend = &*b.kind, error = %kubedev_core::echo::Chain(&e), "rediscovery failed");
                    return false;
                }
            },
            None => None,
        };
        let mut owners = self.owners.write();
        inventory.pools.retain(|p| owners.get(&p.name) != Some(&i));
        owners.retain(|_, o| *o != i);
        if let Some((b, found)) = found {
            Self::adopt(i, &b, found, &mut owners, &mut inventory.pools);
        }
        true
    }

    fn adopt(
        i: usize,
        b: &Backend,
        found: Vec<Pool>,
        owners: &mut HashMap<PoolName, usize>,
        pools: &mut Vec<Pool>,
    ) {
        for p in found {
            if owners.contains_key(&p.name) {
                tracing::error!(backend = &*b.kind, pool = %p.name, "pool name already used by another backend; pool left out");
                continue;
            }
            if let Err(e) = p.validate() {
                tracing::error!(backend = &*b.kind, error = %kubedev_core::echo::Chain(&e), "invalid pool left out");
                continue;
            }
            owners.insert(p.name.clone(), i);
            pools.push(p);
        }
    }

    /// The backend slot owning `pool`.
    pub fn owner(&self, pool: &PoolName) -> Option<usize> {
        self.owners.read().get(pool).copied()
    }

    fn backend(&self, owner: usize, device: &AllocatedDevice) -> Result<Backend, PrepareError> {
        self.get(owner).ok_or_else(|| PrepareError::UnknownDevice {
            device: device.device.to_string(),
        })
    }

    /// Groups devices by owning backend, keeping their order; an unowned device is an error.
    fn group(
        &self,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<(usize, Vec<AllocatedDevice>)>, PrepareError> {
        let mut groups: Vec<(usize, Vec<AllocatedDevice>)> = Vec::new();
        for d in devices {
            let owner = self
                .owner(&d.device.pool)
                .ok_or_else(|| PrepareError::UnknownDevice {
                    device: d.device.to_string(),
                })?;
            match groups.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, g)) => g.push(d.clone()),
                None => groups.push((owner, vec![d.clone()])),
            }
        }
        Ok(groups)
    }

    /// Prepares devices through their backends; the answer is in the order of `devices`. When a
    /// backend fails, the groups already prepared are unprepared again (for a claim).
    pub async fn prepare(
        &self,
        consumer: &Consumer,
        devices: &[AllocatedDevice],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let groups = self.group(devices)?;
        let mut done: Vec<(usize, Vec<AllocatedDevice>)> = Vec::new();
        let mut prepared = Vec::with_capacity(devices.len());
        for (owner, group) in groups {
            let backend = self.backend(owner, &group[0])?;
            match backend.preparer.prepare(consumer, &group).await {
                Ok(p) => {
                    prepared.extend(p);
                    done.push((owner, group));
                }
                Err(e) => {
                    if let Consumer::Claim(claim) = consumer {
                        for (o, g) in done {
                            let Some(b) = self.get(o) else { continue };
                            if let Err(u) = b.preparer.unprepare(claim, &g).await {
                                tracing::error!(claim = %claim, error = %kubedev_core::echo::Chain(&u), "rolling back a partial prepare failed");
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        // Back into the caller's order.
        let mut ordered = Vec::with_capacity(prepared.len());
        for d in devices {
            if let Some(i) = prepared.iter().position(|p| p.device.device == d.device) {
                ordered.push(prepared.swap_remove(i));
            }
        }
        Ok(ordered)
    }

    /// The edits the owning backend's `prepare` would give `device`, without changing the host
    /// (`None` when only `prepare` can tell).
    pub async fn planned_edits(
        &self,
        device: &kubedev_core::DeviceRef,
    ) -> Result<Option<kubedev_core::ContainerEdits>, PrepareError> {
        let unknown = || PrepareError::UnknownDevice {
            device: device.to_string(),
        };
        let owner = self.owner(&device.pool).ok_or_else(unknown)?;
        let backend = self.get(owner).ok_or_else(unknown)?;
        backend.preparer.planned_edits(device).await
    }

    /// The owning backend's current edits for a device it prepared earlier, when they changed
    /// (`None` when they still hold or no backend owns the device's pool any more).
    pub async fn refreshed_edits(
        &self,
        prepared: &PreparedDevice,
    ) -> Result<Option<kubedev_core::ContainerEdits>, PrepareError> {
        let Some(backend) = self
            .owner(&prepared.device.device.pool)
            .and_then(|o| self.get(o))
        else {
            return Ok(None);
        };
        backend.preparer.refreshed_edits(prepared).await
    }

    /// Whether any backend wants `PreStartContainer` calls.
    pub fn needs_pre_start(&self) -> bool {
        self.slots
            .read()
            .iter()
            .flatten()
            .any(|b| b.preparer.needs_pre_start())
    }

    /// Runs the owning backends' pre-start hooks for `devices` (a container is about to start).
    pub async fn pre_start(&self, devices: &[kubedev_core::DeviceRef]) -> Result<(), PrepareError> {
        let allocated: Vec<AllocatedDevice> = devices
            .iter()
            .map(|d| AllocatedDevice::new(d.clone()))
            .collect();
        for (owner, group) in self.group(&allocated)? {
            let backend = self.backend(owner, &group[0])?;
            let refs: Vec<_> = group.into_iter().map(|a| a.device).collect();
            backend.preparer.pre_start(&refs).await?;
        }
        Ok(())
    }

    /// Unprepares a claim's devices through their backends; devices of pools no backend owns any
    /// more are skipped (their backend is gone).
    pub async fn unprepare(
        &self,
        claim: &kubedev_core::ClaimRef,
        devices: &[AllocatedDevice],
    ) -> Result<(), PrepareError> {
        let known: Vec<AllocatedDevice> = devices
            .iter()
            .filter(|d| self.owner(&d.device.pool).is_some())
            .cloned()
            .collect();
        for (owner, group) in self.group(&known)? {
            // A slot emptied by a reload: its backend is gone, and so is what it prepared.
            let Some(backend) = self.get(owner) else {
                continue;
            };
            backend.preparer.unprepare(claim, &group).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use parking_lot::Mutex;

    use async_trait::async_trait;
    use kubedev_core::{
        ClaimRef, Device, DeviceName, DeviceRef, DeviceSource, Pool, PoolName, PreparedDevice,
        Preparer, SourceError,
    };

    use super::*;

    /// A backend with one pool of two devices that records pre-start calls.
    #[derive(Debug)]
    struct Recorder {
        pool: &'static str,
        pre_start: bool,
        calls: Mutex<Vec<Vec<String>>>,
    }

    #[async_trait]
    impl DeviceSource for Recorder {
        fn name(&self) -> &str {
            self.pool
        }
        async fn discover(&self) -> Result<Vec<Pool>, SourceError> {
            let devices = ["d0", "d1"]
                .map(|d| Device::new(DeviceName::new(d).unwrap()))
                .to_vec();
            Ok(vec![Pool::new(PoolName::new(self.pool).unwrap(), devices)])
        }
    }

    #[async_trait]
    impl Preparer for Recorder {
        async fn prepare(
            &self,
            _: &Consumer,
            devices: &[AllocatedDevice],
        ) -> Result<Vec<PreparedDevice>, PrepareError> {
            Ok(devices
                .iter()
                .map(|d| PreparedDevice::new(d.clone(), Default::default()))
                .collect())
        }
        async fn unprepare(&self, _: &ClaimRef, _: &[AllocatedDevice]) -> Result<(), PrepareError> {
            Ok(())
        }
        async fn pre_start(&self, devices: &[DeviceRef]) -> Result<(), PrepareError> {
            self.calls
                .lock()
                .push(devices.iter().map(ToString::to_string).collect());
            Ok(())
        }
        fn needs_pre_start(&self) -> bool {
            self.pre_start
        }
    }

    fn r(pool: &str, dev: &str) -> DeviceRef {
        DeviceRef::new(PoolName::new(pool).unwrap(), DeviceName::new(dev).unwrap())
    }

    #[tokio::test]
    async fn pre_start_goes_to_the_owning_backends_only() {
        let a = Arc::new(Recorder {
            pool: "a",
            pre_start: true,
            calls: Mutex::default(),
        });
        let b = Arc::new(Recorder {
            pool: "b",
            pre_start: false,
            calls: Mutex::default(),
        });
        let backends = Backends::new(vec![
            Backend::from_parts("a", a.clone(), a.clone()),
            Backend::from_parts("b", b.clone(), b.clone()),
        ]);
        assert!(backends.needs_pre_start());
        let inventory = backends.discover_all().await;
        assert_eq!(inventory.devices().count(), 4);
        backends
            .pre_start(&[r("a", "d1"), r("b", "d0"), r("a", "d0")])
            .await
            .unwrap();
        assert_eq!(
            *a.calls.lock(),
            [vec!["a/d1".to_string(), "a/d0".to_string()]]
        );
        assert_eq!(*b.calls.lock(), [vec!["b/d0".to_string()]]);
        let err = backends.pre_start(&[r("zz", "d0")]).await.unwrap_err();
        assert!(err.to_string().contains("zz/d0"), "{err}");
    }
}
