//! Feeding device-plugin servers from the inventory.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use kubedev_core::{
    DeviceFilter, DeviceRef, ExtendedResourceName, Inventory, PublishError, Publisher,
};
use tokio::sync::watch;

use super::PluginDevice;

/// The devices of one extended resource, each naming the inventory device it stands for.
#[derive(Debug)]
pub struct ResourceDevices {
    name: ExtendedResourceName,
    filter: Box<dyn DeviceFilter>,
    tx: watch::Sender<Vec<PluginDevice>>,
    /// Devices the selector failed on at the last publish, so each failure is logged once.
    failing: Mutex<std::collections::BTreeSet<String>>,
    /// How many times each device is advertised (time-slicing); 1 = once, under its name.
    replicas: u32,
}

impl ResourceDevices {
    /// The resource name.
    pub fn name(&self) -> &ExtendedResourceName {
        &self.name
    }

    /// A receiver of the resource's device list, for [`super::DevicePlugin::start`].
    pub fn subscribe(&self) -> watch::Receiver<Vec<PluginDevice>> {
        self.tx.subscribe()
    }
}

/// A [`Publisher`] that turns the inventory into one device list per extended resource: a device
/// belongs to a resource when the resource's filter matches it, and its device ID is its name.
#[derive(Debug, Default)]
pub struct DevicePluginPublisher {
    resources: Vec<Arc<ResourceDevices>>,
}

impl DevicePluginPublisher {
    /// A publisher with no resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a resource defined by `filter`; returns its device list for the server.
    pub fn add_resource(
        &mut self,
        name: ExtendedResourceName,
        filter: Box<dyn DeviceFilter>,
    ) -> Arc<ResourceDevices> {
        self.add_shared_resource(name, filter, 1)
    }

    /// Adds a resource whose devices are each advertised `replicas` times (time-slicing: several
    /// containers share one device), with device IDs `<device>::<n>`; `replicas` of 0 or 1
    /// advertises each device once under its name.
    pub fn add_shared_resource(
        &mut self,
        name: ExtendedResourceName,
        filter: Box<dyn DeviceFilter>,
        replicas: u32,
    ) -> Arc<ResourceDevices> {
        let (tx, _) = watch::channel(Vec::new());
        let r = Arc::new(ResourceDevices {
            name,
            filter,
            tx,
            failing: Mutex::default(),
            replicas: replicas.max(1),
        });
        self.resources.push(r.clone());
        r
    }

    /// Removes a resource (its server should be stopped); false when there was none.
    pub fn remove_resource(&mut self, name: &ExtendedResourceName) -> bool {
        let before = self.resources.len();
        self.resources.retain(|r| &r.name != name);
        self.resources.len() != before
    }

    /// The resources, in the order they were added.
    pub fn resources(&self) -> &[Arc<ResourceDevices>] {
        &self.resources
    }

    /// Which devices of `inventory` each resource takes: every resource's selector evaluated
    /// once per device. A selector that fails on a device leaves that device out of the
    /// resource; each such failure is logged once, until the selector works on it again.
    pub fn select(&self, inventory: &Inventory) -> Selection {
        let shape = inventory
            .pools
            .iter()
            .map(|p| (p.name.clone(), p.devices.len()))
            .collect();
        let mut taken = Vec::with_capacity(self.resources.len());
        for r in &self.resources {
            let mut failing = r.failing.lock();
            let mut now_failing = std::collections::BTreeSet::new();
            let mut mine = Vec::new();
            for (p, pool) in inventory.pools.iter().enumerate() {
                for (d, dev) in pool.devices.iter().enumerate() {
                    match r.filter.matches(pool, dev) {
                        Ok(true) => mine.push((p, d)),
                        Ok(false) => {}
                        Err(e) => {
                            let key = format!("{}/{}", pool.name, dev.name);
                            if !failing.contains(&key) {
                                tracing::warn!(resource = %r.name, error = %kubedev_core::echo::Chain(&e), "selector failed; device left out");
                            }
                            now_failing.insert(key);
                        }
                    }
                }
            }
            *failing = now_failing;
            taken.push((r.name.clone(), mine));
        }
        Selection { shape, taken }
    }

    /// Publishes `inventory` to every resource as `selection` (made by [`Self::select`]) says.
    /// A selection made for an inventory of another shape (pools or devices added, removed or
    /// reordered) or for other resources is made again.
    pub fn publish_selected(
        &self,
        inventory: &Inventory,
        selection: &Selection,
    ) -> Result<(), PublishError> {
        if !selection.fits(inventory, &self.resources) {
            return self.publish_selected(inventory, &self.select(inventory));
        }
        // Compute everything first so one bad resource does not leave others half-updated.
        let mut updates = Vec::with_capacity(self.resources.len());
        for (r, (_, taken)) in self.resources.iter().zip(&selection.taken) {
            updates.push(Self::devices_of(r, inventory, taken)?);
        }
        for (r, list) in self.resources.iter().zip(updates) {
            r.tx.send_if_modified(|cur| {
                if *cur == list {
                    false
                } else {
                    *cur = list;
                    true
                }
            });
        }
        Ok(())
    }

    /// The device list of `r`: the devices at `taken` (pool index, device index) of
    /// `inventory`, each once per replica.
    fn devices_of(
        r: &ResourceDevices,
        inventory: &Inventory,
        taken: &[(usize, usize)],
    ) -> Result<Vec<PluginDevice>, PublishError> {
        let mut list = Vec::with_capacity(taken.len() * r.replicas as usize);
        let mut refs: BTreeMap<String, DeviceRef> = BTreeMap::new();
        for &(p, d) in taken {
            let pool = &inventory.pools[p];
            let dev = &pool.devices[d];
            let here = DeviceRef::new(pool.name.clone(), dev.name.clone());
            let ids: Vec<String> = if r.replicas == 1 {
                vec![dev.name.to_string()]
            } else {
                (0..r.replicas)
                    .map(|n| format!("{}::{n}", dev.name))
                    .collect()
            };
            for id in ids {
                if let Some(other) = refs.get(&id) {
                    return Err(PublishError::Invalid(format!(
                        "resource {}: devices {other} and {here} would both have device ID \
                         {id:?}; narrow the selector",
                        r.name
                    )));
                }
                refs.insert(id.clone(), here.clone());
                list.push(
                    PluginDevice::new(id, here.clone())
                        .with_health(dev.health.clone())
                        .with_numa_node(dev.numa_node),
                );
            }
        }
        Ok(list)
    }
}

/// Which devices of one inventory each device-plugin resource takes, from
/// [`DevicePluginPublisher::select`]. Selectors see a device's attributes and capacity, never
/// its health, so a selection stays right while only health changes: publishing it again
/// evaluates no selector.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// The inventory it was made for: each pool's name and device count.
    shape: Vec<(kubedev_core::PoolName, usize)>,
    /// Each resource, in the publisher's order, with the (pool index, device index) of the
    /// devices it takes.
    taken: Vec<(ExtendedResourceName, Vec<(usize, usize)>)>,
}

impl Selection {
    /// Whether this selection was made for an inventory of `inventory`'s shape and for
    /// `resources`.
    fn fits(&self, inventory: &Inventory, resources: &[Arc<ResourceDevices>]) -> bool {
        self.shape.len() == inventory.pools.len()
            && self
                .shape
                .iter()
                .zip(&inventory.pools)
                .all(|((name, n), p)| *name == p.name && *n == p.devices.len())
            && self.taken.len() == resources.len()
            && self
                .taken
                .iter()
                .zip(resources)
                .all(|((name, _), r)| *name == r.name)
    }

    /// For each pool of the inventory it was made for, whether any resource takes each device
    /// (by index).
    pub fn taken_by_any(&self) -> Vec<Vec<bool>> {
        let mut out: Vec<Vec<bool>> = self.shape.iter().map(|(_, n)| vec![false; *n]).collect();
        for (_, taken) in &self.taken {
            for &(p, d) in taken {
                out[p][d] = true;
            }
        }
        out
    }

    /// Whether any resource takes a device.
    pub fn is_empty(&self) -> bool {
        self.taken.iter().all(|(_, t)| t.is_empty())
    }
}

#[async_trait]
impl Publisher for DevicePluginPublisher {
    async fn publish(&self, inventory: &Inventory) -> Result<(), PublishError> {
        self.publish_selected(inventory, &self.select(inventory))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubedev_core::{
        AttributeMatch, AttributeValue, Device, DeviceName, Health, Pool, PoolName, QualifiedName,
    };

    fn inventory(health: Health) -> Inventory {
        let model = QualifiedName::new("model").unwrap();
        let d = |n: &str, m: &str| {
            Device::new(DeviceName::new(n).unwrap())
                .with_attribute(model.clone(), AttributeValue::Bool(m == "a"))
                .with_numa_node(0)
        };
        let mut a0 = d("a0", "a");
        a0.health = health;
        Inventory::new(vec![Pool::new(
            PoolName::new("node").unwrap(),
            vec![a0, d("b0", "b"), d("a1", "a")],
        )])
    }

    fn only_a() -> Box<dyn DeviceFilter> {
        let mut m = AttributeMatch::default();
        m.attributes.insert(
            QualifiedName::new("model").unwrap(),
            AttributeValue::Bool(true),
        );
        Box::new(m)
    }

    #[tokio::test]
    async fn a_shared_resource_advertises_each_device_once_per_replica() {
        let mut p = DevicePluginPublisher::new();
        let r = p.add_shared_resource(
            ExtendedResourceName::new("example.com/a").unwrap(),
            only_a(),
            3,
        );
        p.publish(&inventory(Health::unhealthy("gone")))
            .await
            .unwrap();
        let list = r.subscribe().borrow().clone();
        let ids: Vec<_> = list.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a0::0", "a0::1", "a0::2", "a1::0", "a1::1", "a1::2"]);
        // Every replica points at its device and shares its health.
        assert_eq!(list[2].device.to_string(), "node/a0");
        assert_eq!(list[3].device.to_string(), "node/a1");
        assert!(
            list.iter()
                .filter(|d| d.id.starts_with("a0"))
                .all(|d| !d.health.is_healthy())
        );
    }

    #[tokio::test]
    async fn resources_get_matching_devices_and_notice_health_changes() {
        let mut p = DevicePluginPublisher::new();
        let r = p.add_resource(
            ExtendedResourceName::new("example.com/a").unwrap(),
            only_a(),
        );
        let mut rx = r.subscribe();
        p.publish(&inventory(Health::healthy())).await.unwrap();
        assert!(rx.has_changed().unwrap());
        let ids: Vec<_> = rx
            .borrow_and_update()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        assert_eq!(ids, ["a0", "a1"]);
        assert_eq!(rx.borrow()[1].device.to_string(), "node/a1");
        // Same inventory: no change notification.
        p.publish(&inventory(Health::healthy())).await.unwrap();
        assert!(!rx.has_changed().unwrap());
        p.publish(&inventory(Health::unhealthy("gone")))
            .await
            .unwrap();
        assert!(rx.has_changed().unwrap());
        assert!(
            !rx.borrow()
                .iter()
                .find(|d| d.id == "a0")
                .unwrap()
                .health
                .is_healthy()
        );
    }

    #[tokio::test]
    async fn clashing_device_ids_are_refused() {
        let mut p = DevicePluginPublisher::new();
        p.add_resource(
            ExtendedResourceName::new("example.com/all").unwrap(),
            Box::new(AttributeMatch::default()),
        );
        let mut inv = inventory(Health::healthy());
        let mut second = inv.pools[0].clone();
        second.name = PoolName::new("other").unwrap();
        inv.pools.push(second);
        let err = p.publish(&inv).await.unwrap_err();
        assert!(err.to_string().contains("node/a0"), "{err}");
        assert!(err.to_string().contains("other/a0"), "{err}");
    }

    /// A filter that counts how often it is asked.
    #[derive(Debug, Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl DeviceFilter for Counting {
        fn matches(
            &self,
            _pool: &kubedev_core::Pool,
            device: &kubedev_core::Device,
        ) -> Result<bool, kubedev_core::ModelError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(device.name.as_str().starts_with('a'))
        }
    }

    #[tokio::test]
    async fn a_kept_selection_publishes_health_without_asking_the_selectors_again() {
        let counting = Arc::new(Counting::default());
        #[derive(Debug)]
        struct Shared(Arc<Counting>);
        impl DeviceFilter for Shared {
            fn matches(
                &self,
                pool: &kubedev_core::Pool,
                device: &kubedev_core::Device,
            ) -> Result<bool, kubedev_core::ModelError> {
                self.0.matches(pool, device)
            }
        }
        let mut p = DevicePluginPublisher::new();
        let r = p.add_resource(
            ExtendedResourceName::new("example.com/a").unwrap(),
            Box::new(Shared(counting.clone())),
        );
        let asked = || counting.0.load(std::sync::atomic::Ordering::Relaxed);
        let healthy = inventory(Health::healthy());
        let selection = p.select(&healthy);
        assert_eq!(asked(), 3, "one question per device");
        assert_eq!(selection.taken_by_any(), [vec![true, false, true]]);
        p.publish_selected(&healthy, &selection).unwrap();
        p.publish_selected(&inventory(Health::unhealthy("gone")), &selection)
            .unwrap();
        assert_eq!(asked(), 3, "health changes ask no selector");
        assert!(!r.subscribe().borrow()[0].health.is_healthy());

        // A selection made for another inventory is made again.
        let mut grown = inventory(Health::healthy());
        grown.pools[0]
            .devices
            .push(kubedev_core::Device::new(DeviceName::new("a2").unwrap()));
        p.publish_selected(&grown, &selection).unwrap();
        assert_eq!(asked(), 7);
        let ids: Vec<_> = r
            .subscribe()
            .borrow()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        assert_eq!(ids, ["a0", "a1", "a2"]);
    }
}
