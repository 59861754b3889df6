//! From the core inventory to the ResourceSlice content we want: device mapping and chunking to
//! the API's limits. Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kubedev_core::{AttributeValue, Device, DriverName, HealthState, Inventory, Pool, TaintEffect};

use crate::Error;
use crate::features::CounterLayout;

/// Devices in one ResourceSlice.
pub(crate) const MAX_DEVICES: usize = 128;
/// Devices in one ResourceSlice when any of them has taints or consumes counters.
pub(crate) const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Counter sets in one ResourceSlice.
pub(crate) const MAX_COUNTER_SETS: usize = 8;
/// Counters in one counter set.
pub(crate) const MAX_COUNTERS_PER_SET: usize = 32;
/// Counter consumptions (one per counter set) of one device.
pub(crate) const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Counters in one device counter consumption.
pub(crate) const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;
/// Consumed counters over all devices of one slice (the `resource.k8s.io/v1` limit of
/// Kubernetes 1.34; later versions dropped it, keeping it costs nothing).
pub(crate) const MAX_CONSUMED_COUNTERS_PER_SLICE: usize = 1024;
/// Counters over all counter sets of one ResourceSlice in the Kubernetes 1.34 layout, where the
/// sets share a slice with the devices consuming them.
pub(crate) const MAX_SHARED_COUNTERS_1_34: usize = 32;
/// Attributes and capacities of one device, combined.
pub(crate) const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Taints of one device.
pub(crate) const MAX_TAINTS: usize = 16;
/// Taints of one device in Kubernetes 1.34.
pub(crate) const MAX_TAINTS_1_34: usize = 4;
/// Counters one device consumes over all its consumptions in Kubernetes 1.34.
pub(crate) const MAX_COUNTERS_PER_DEVICE_1_34: usize = 32;

/// The attribute that carries a device's NUMA node (an integer), in the driver's own domain
/// (`device.attributes["<driver>"].numaNode` in CEL). Kubernetes defines no standard NUMA
/// attribute (its standard ones, in `resource.kubernetes.io`, are `pcieRoot` and `pciBusID`), so
/// kubedev does not invent one there.
pub const NUMA_NODE_ATTRIBUTE: &str = "numaNode";

/// What the publisher does with devices whose health is `Unhealthy`.
///
/// Devices with `Unknown` health are published as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnhealthyDevices {
    /// Leave them out of the ResourceSlices, so nothing new is allocated on them (the default:
    /// safe on every cluster, including those where device taints are disabled).
    #[default]
    Omit,
    /// Publish them with a `NoSchedule` taint `<driver>/unhealthy`. Needs the
    /// `DRADeviceTaints` feature on the cluster; where it is off the API server drops taints
    /// and the device would look usable, so the publisher logs a warning when that happens.
    Taint,
}

/// The content of one ResourceSlice, without the pool's generation and slice count.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct DesiredSlice {
    pub(crate) devices: Vec<res::Device>,
    pub(crate) shared_counters: Vec<res::CounterSet>,
}

/// All slices of one pool, in index order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DesiredPool {
    pub(crate) name: String,
    pub(crate) slices: Vec<DesiredSlice>,
}

/// Maps and chunks every pool of `inventory` in the 1.35+ layout.
pub(crate) fn desired_pools(
    inventory: &Inventory,
    driver: &DriverName,
    unhealthy: UnhealthyDevices,
) -> Result<Vec<DesiredPool>, Error> {
    desired_pools_in(inventory, driver, unhealthy, CounterLayout::SeparateSlices)
}

/// Maps and chunks every pool of `inventory` with shared counters laid out as `layout` says.
pub(crate) fn desired_pools_in(
    inventory: &Inventory,
    driver: &DriverName,
    unhealthy: UnhealthyDevices,
    layout: CounterLayout,
) -> Result<Vec<DesiredPool>, Error> {
    inventory.validate().map_err(|e| Error::InvalidInventory {
        pool: String::new(),
        message: e.to_string(),
    })?;
    inventory
        .pools
        .iter()
        .map(|pool| desired_pool(pool, driver, unhealthy, layout))
        .collect()
}

fn invalid(pool: &Pool, message: String) -> Error {
    Error::InvalidInventory {
        pool: pool.name.to_string(),
        message,
    }
}

fn desired_pool(
    pool: &Pool,
    driver: &DriverName,
    unhealthy: UnhealthyDevices,
    layout: CounterLayout,
) -> Result<DesiredPool, Error> {
    let mut devices = Vec::with_capacity(pool.devices.len());
    for device in &pool.devices {
        if device.health.state == HealthState::Unhealthy && unhealthy == UnhealthyDevices::Omit {
            continue;
        }
        devices.push(map_device(pool, device, driver)?);
    }

    for set in &pool.shared_counters {
        if set.counters.is_empty() {
            return Err(invalid(
                pool,
                format!("counter set {} has no counters", set.name),
            ));
        }
        if set.counters.len() > MAX_COUNTERS_PER_SET {
            return Err(invalid(
                pool,
                format!(
                    "counter set {} has {} counters; at most {MAX_COUNTERS_PER_SET} are allowed",
                    set.name,
                    set.counters.len()
                ),
            ));
        }
    }
    let mut slices = match layout {
        CounterLayout::SeparateSlices => chunk_devices(devices),
        CounterLayout::SameSlice => return same_slice_layout(pool, devices),
    };
    // Counter sets go in slices of their own (a slice holds devices or counter sets, never
    // both), after the device slices.
    for sets in pool.shared_counters.chunks(MAX_COUNTER_SETS) {
        slices.push(DesiredSlice {
            devices: Vec::new(),
            shared_counters: sets
                .iter()
                .map(|set| res::CounterSet {
                    name: set.name.to_string(),
                    counters: counters(&set.counters),
                })
                .collect(),
        });
    }
    // A pool with nothing in it is still published as one empty slice: "empty" is not "gone".
    if slices.is_empty() {
        slices.push(DesiredSlice::default());
    }
    Ok(DesiredPool {
        name: pool.name.to_string(),
        slices,
    })
}

/// The Kubernetes 1.34 layout: each counter set in the same slice as every device consuming it.
/// Sets joined by a device that consumes from both stay together; such groups are packed into
/// slices up to 64 devices, [`MAX_SHARED_COUNTERS_1_34`] counters over all sets and
/// [`MAX_CONSUMED_COUNTERS_PER_SLICE`] consumed counters; devices that consume no counters are
/// chunked after them as in the later layout.
fn same_slice_layout(pool: &Pool, devices: Vec<res::Device>) -> Result<DesiredPool, Error> {
    for d in &devices {
        let taints = d.taints.as_ref().map_or(0, Vec::len);
        if taints > MAX_TAINTS_1_34 {
            return Err(invalid(
                pool,
                format!(
                    "device {} has {taints} taints; Kubernetes 1.34 allows at most {MAX_TAINTS_1_34}",
                    d.name
                ),
            ));
        }
        let consumed = consumed_counters(d);
        if consumed > MAX_COUNTERS_PER_DEVICE_1_34 {
            return Err(invalid(
                pool,
                format!(
                    "device {} consumes {consumed} counters; Kubernetes 1.34 allows at most \
                     {MAX_COUNTERS_PER_DEVICE_1_34} per device",
                    d.name
                ),
            ));
        }
    }
    // Groups of sets, in the order the sets are listed; each set's group index.
    let mut group_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut groups: Vec<(Vec<usize>, Vec<res::Device>)> = Vec::new();
    for (i, set) in pool.shared_counters.iter().enumerate() {
        group_of.insert(set.name.as_str(), groups.len());
        groups.push((vec![i], Vec::new()));
    }
    let mut plain = Vec::new();
    for device in devices {
        let mut sets: Vec<usize> = device
            .consumes_counters
            .iter()
            .flatten()
            .filter_map(|c| group_of.get(c.counter_set.as_str()).copied())
            .collect();
        sets.dedup();
        let Some(&first) = sets.first() else {
            plain.push(device);
            continue;
        };
        // Merge every other group this device touches into the first (indices are current:
        // `group_of` follows every merge, and a merge empties only the group merged away).
        for &other in sets[1..].iter().filter(|&&g| g != first) {
            let (moved_sets, moved_devices) = std::mem::take(&mut groups[other]);
            for &set in &moved_sets {
                group_of.insert(pool.shared_counters[set].name.as_str(), first);
            }
            groups[first].0.extend(moved_sets);
            groups[first].1.extend(moved_devices);
        }
        groups[first].1.push(device);
    }
    let mut slices = Vec::new();
    let mut current = DesiredSlice::default();
    let mut current_counters = 0;
    let mut current_consumed = 0;
    for (sets, group_devices) in groups.into_iter().filter(|(s, _)| !s.is_empty()) {
        let names = || {
            sets.iter()
                .map(|&s| pool.shared_counters[s].name.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let counters_in_sets: usize = sets
            .iter()
            .map(|&s| pool.shared_counters[s].counters.len())
            .sum();
        if counters_in_sets > MAX_SHARED_COUNTERS_1_34 {
            return Err(invalid(
                pool,
                format!(
                    "counter set(s) {} have {counters_in_sets} counters; Kubernetes 1.34 allows at \
                     most {MAX_SHARED_COUNTERS_1_34} in one ResourceSlice, where the sets must be \
                     with the devices consuming them",
                    names()
                ),
            ));
        }
        if group_devices.len() > MAX_DEVICES_WITH_TAINTS_OR_COUNTERS {
            return Err(invalid(
                pool,
                format!(
                    "{} devices consume counter set(s) {}; Kubernetes 1.34 needs them in one \
                     ResourceSlice, which holds at most {MAX_DEVICES_WITH_TAINTS_OR_COUNTERS}",
                    group_devices.len(),
                    names()
                ),
            ));
        }
        let consumed: usize = group_devices.iter().map(consumed_counters).sum();
        if consumed > MAX_CONSUMED_COUNTERS_PER_SLICE {
            return Err(invalid(
                pool,
                format!(
                    "the devices consuming counter set(s) {} consume {consumed} counters; \
                     Kubernetes 1.34 allows at most {MAX_CONSUMED_COUNTERS_PER_SLICE} in one \
                     ResourceSlice",
                    names()
                ),
            ));
        }
        let fits = current.devices.len() + group_devices.len()
            <= MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
            && current_counters + counters_in_sets <= MAX_SHARED_COUNTERS_1_34
            && current.shared_counters.len() + sets.len() <= MAX_COUNTER_SETS
            && current_consumed + consumed <= MAX_CONSUMED_COUNTERS_PER_SLICE;
        let empty = current.devices.is_empty() && current.shared_counters.is_empty();
        if !fits && !empty {
            slices.push(std::mem::take(&mut current));
            current_counters = 0;
            current_consumed = 0;
        }
        current_counters += counters_in_sets;
        current_consumed += consumed;
        current.devices.extend(group_devices);
        current
            .shared_counters
            .extend(sets.iter().map(|&s| res::CounterSet {
                name: pool.shared_counters[s].name.to_string(),
                counters: counters(&pool.shared_counters[s].counters),
            }));
    }
    if !(current.devices.is_empty() && current.shared_counters.is_empty()) {
        slices.push(current);
    }
    slices.extend(chunk_devices(plain));
    if slices.is_empty() {
        slices.push(DesiredSlice::default());
    }
    Ok(DesiredPool {
        name: pool.name.to_string(),
        slices,
    })
}

fn uses_taints_or_counters(device: &res::Device) -> bool {
    device.taints.as_ref().is_some_and(|t| !t.is_empty())
        || device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
}

fn consumed_counters(device: &res::Device) -> usize {
    device
        .consumes_counters
        .iter()
        .flatten()
        .map(|c| c.counters.len())
        .sum()
}

/// Splits devices into slices in order: a slice takes devices until the next one would break
/// the device limit (128, or 64 once any device in the slice has taints or consumes counters)
/// or the limit on consumed counters.
fn chunk_devices(devices: Vec<res::Device>) -> Vec<DesiredSlice> {
    let mut slices = Vec::new();
    let mut current: Vec<res::Device> = Vec::new();
    let mut advanced = false;
    let mut counters = 0;
    for device in devices {
        let device_advanced = uses_taints_or_counters(&device);
        let device_counters = consumed_counters(&device);
        let limit = if advanced || device_advanced {
            MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES
        };
        if !current.is_empty()
            && (current.len() + 1 > limit
                || counters + device_counters > MAX_CONSUMED_COUNTERS_PER_SLICE)
        {
            slices.push(DesiredSlice {
                devices: std::mem::take(&mut current),
                shared_counters: Vec::new(),
            });
            advanced = false;
            counters = 0;
        }
        advanced |= device_advanced;
        counters += device_counters;
        current.push(device);
    }
    if !current.is_empty() {
        slices.push(DesiredSlice {
            devices: current,
            shared_counters: Vec::new(),
        });
    }
    slices
}

fn counters(
    map: &BTreeMap<kubedev_core::CounterName, kubedev_core::Quantity>,
) -> BTreeMap<String, res::Counter> {
    map.iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                res::Counter {
                    value: K8sQuantity(value.to_string()),
                },
            )
        })
        .collect()
}

fn attribute(
    pool: &Pool,
    device: &Device,
    name: &str,
    value: &AttributeValue,
) -> Result<res::DeviceAttribute, Error> {
    value.validate().map_err(|e| {
        invalid(
            pool,
            format!("device {}: attribute {name}: {e}", device.name),
        )
    })?;
    let mut out = res::DeviceAttribute::default();
    match value {
        AttributeValue::Int(v) => out.int = Some(*v),
        AttributeValue::Bool(v) => out.bool = Some(*v),
        AttributeValue::String(v) => out.string = Some(v.clone()),
        AttributeValue::Version(v) => out.version = Some(v.to_string()),
        other => {
            return Err(invalid(
                pool,
                format!(
                    "device {}: attribute {name} has type {}, which ResourceSlices cannot carry",
                    device.name,
                    other.type_name()
                ),
            ));
        }
    }
    Ok(out)
}

fn taint_effect(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::NoExecute => "NoExecute",
        TaintEffect::None => "None",
    }
}

/// The key of the taint put on unhealthy devices under [`UnhealthyDevices::Taint`].
pub(crate) fn unhealthy_taint_key(driver: &DriverName) -> String {
    format!("{driver}/unhealthy")
}

/// Maps one device. The attribute `resource.kubernetes.io/numaNode` is added from
/// `numa_node` when the device does not set it itself and there is room for it.
pub(crate) fn map_device(
    pool: &Pool,
    device: &Device,
    driver: &DriverName,
) -> Result<res::Device, Error> {
    let mut attributes = BTreeMap::new();
    for (name, value) in &device.attributes {
        attributes.insert(
            name.to_string(),
            attribute(pool, device, name.as_str(), value)?,
        );
    }
    let mut capacity = BTreeMap::new();
    for (name, cap) in &device.capacity {
        capacity.insert(
            name.to_string(),
            res::DeviceCapacity {
                value: K8sQuantity(cap.value.to_string()),
                request_policy: None,
            },
        );
    }
    if let Some(numa) = device.numa_node
        && !attributes.contains_key(NUMA_NODE_ATTRIBUTE)
        && attributes.len() + capacity.len() < MAX_ATTRIBUTES_AND_CAPACITIES
    {
        attributes.insert(
            NUMA_NODE_ATTRIBUTE.to_owned(),
            res::DeviceAttribute {
                int: Some(numa),
                ..Default::default()
            },
        );
    }
    let total = attributes.len() + capacity.len();
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(invalid(
            pool,
            format!(
                "device {} has {total} attributes and capacities; at most {MAX_ATTRIBUTES_AND_CAPACITIES} are allowed",
                device.name
            ),
        ));
    }

    if device.consumes_counters.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        return Err(invalid(
            pool,
            format!(
                "device {} consumes from {} counter sets; at most {MAX_CONSUMPTIONS_PER_DEVICE} are allowed",
                device.name,
                device.consumes_counters.len()
            ),
        ));
    }
    let mut consumes = Vec::with_capacity(device.consumes_counters.len());
    for c in &device.consumes_counters {
        if c.counters.len() > MAX_COUNTERS_PER_CONSUMPTION {
            return Err(invalid(
                pool,
                format!(
                    "device {} consumes {} counters from set {}; at most {MAX_COUNTERS_PER_CONSUMPTION} are allowed",
                    device.name,
                    c.counters.len(),
                    c.counter_set
                ),
            ));
        }
        if consumes
            .iter()
            .any(|e: &res::DeviceCounterConsumption| e.counter_set == c.counter_set.as_str())
        {
            return Err(invalid(
                pool,
                format!(
                    "device {} consumes from counter set {} twice",
                    device.name, c.counter_set
                ),
            ));
        }
        consumes.push(res::DeviceCounterConsumption {
            // Compatibility groups (1.37) are not written: older API servers drop them.
            compatibility_groups: None,
            counter_set: c.counter_set.to_string(),
            counters: counters(&c.counters),
        });
    }

    let mut taints: Vec<res::DeviceTaint> = device
        .taints
        .iter()
        .map(|t| res::DeviceTaint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: taint_effect(t.effect).to_owned(),
            time_added: None,
        })
        .collect();
    if device.health.state == HealthState::Unhealthy {
        let key = unhealthy_taint_key(driver);
        if !taints.iter().any(|t| t.key == key) {
            taints.push(res::DeviceTaint {
                key,
                value: None,
                effect: "NoSchedule".to_owned(),
                time_added: None,
            });
        }
    }
    if taints.len() > MAX_TAINTS {
        return Err(invalid(
            pool,
            format!(
                "device {} has {} taints; at most {MAX_TAINTS} are allowed",
                device.name,
                taints.len()
            ),
        ));
    }

    Ok(res::Device {
        name: device.name.to_string(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: (!consumes.is_empty()).then_some(consumes),
        taints: (!taints.is_empty()).then_some(taints),
        allow_multiple_allocations: device.allow_multiple_allocations.then_some(true),
        ..Default::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kubedev_core::{
        CounterConsumption, CounterName, CounterSet, DeviceName, Health, PoolName, QualifiedName,
        Quantity, Taint,
    };

    use super::*;

    fn driver() -> DriverName {
        DriverName::new("gpu.example.com").unwrap()
    }

    fn plain(i: usize) -> Device {
        Device::new(DeviceName::new(format!("dev-{i}")).unwrap())
    }

    fn tainted(i: usize) -> Device {
        let mut d = plain(i);
        d.taints.push(Taint {
            key: "example.com/maintenance".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
        d
    }

    fn pool_of(devices: Vec<Device>) -> Pool {
        Pool::new(PoolName::new("node-a").unwrap(), devices)
    }

    fn sizes(pool: &DesiredPool) -> Vec<usize> {
        pool.slices.iter().map(|s| s.devices.len()).collect()
    }

    fn one_pool(pool: Pool) -> DesiredPool {
        desired_pools(
            &Inventory::new(vec![pool]),
            &driver(),
            UnhealthyDevices::Omit,
        )
        .unwrap()
        .remove(0)
    }

    #[test]
    fn plain_devices_fill_slices_of_128() {
        assert_eq!(
            sizes(&one_pool(pool_of((0..128).map(plain).collect()))),
            vec![128]
        );
        assert_eq!(
            sizes(&one_pool(pool_of((0..129).map(plain).collect()))),
            vec![128, 1]
        );
        assert_eq!(
            sizes(&one_pool(pool_of((0..1000).map(plain).collect()))),
            vec![128, 128, 128, 128, 128, 128, 128, 104]
        );
    }

    #[test]
    fn a_tainted_device_lowers_its_slice_to_64() {
        assert_eq!(
            sizes(&one_pool(pool_of((0..64).map(tainted).collect()))),
            vec![64]
        );
        assert_eq!(
            sizes(&one_pool(pool_of((0..65).map(tainted).collect()))),
            vec![64, 1]
        );
        // 100 plain devices then one tainted: the tainted one cannot join a slice of 100.
        let mut devices: Vec<Device> = (0..100).map(plain).collect();
        devices.push(tainted(100));
        assert_eq!(sizes(&one_pool(pool_of(devices))), vec![100, 1]);
        // A tainted device first: the slice closes at 64 even though the rest are plain.
        let mut devices = vec![tainted(0)];
        devices.extend((1..200).map(plain));
        assert_eq!(sizes(&one_pool(pool_of(devices))), vec![64, 128, 8]);
    }

    #[test]
    fn order_is_kept_across_slices() {
        let pool = one_pool(pool_of((0..300).map(plain).collect()));
        let names: Vec<String> = pool
            .slices
            .iter()
            .flat_map(|s| s.devices.iter().map(|d| d.name.clone()))
            .collect();
        let expected: Vec<String> = (0..300).map(|i| format!("dev-{i}")).collect();
        assert_eq!(names, expected);
    }

    fn counter_pool(sets: usize, consuming_devices: usize) -> Pool {
        let mut pool = pool_of(Vec::new());
        for s in 0..sets {
            pool.shared_counters.push(CounterSet {
                name: CounterName::new(format!("set-{s}")).unwrap(),
                counters: [(
                    CounterName::new("memory").unwrap(),
                    Quantity::parse("40Gi").unwrap(),
                )]
                .into_iter()
                .collect(),
            });
        }
        for i in 0..consuming_devices {
            let mut d = plain(i);
            d.consumes_counters.push(CounterConsumption {
                counter_set: CounterName::new("set-0").unwrap(),
                counters: [(
                    CounterName::new("memory").unwrap(),
                    Quantity::parse("5Gi").unwrap(),
                )]
                .into_iter()
                .collect(),
            });
            pool.devices.push(d);
        }
        pool
    }

    /// `gpus` GPUs as partitionable MIG publishes them: a set of `counters` counters each, the
    /// whole GPU consuming all of them and `parts` partitions consuming one each; then `plain`
    /// devices that consume nothing.
    fn partitioned_gpus(gpus: usize, counters: usize, parts: usize, plain_devices: usize) -> Pool {
        let mut pool = pool_of(Vec::new());
        let all = |n: usize| -> BTreeMap<CounterName, Quantity> {
            (0..n)
                .map(|c| {
                    (
                        CounterName::new(format!("c{c}")).unwrap(),
                        Quantity::parse("1").unwrap(),
                    )
                })
                .collect()
        };
        for g in 0..gpus {
            let set = CounterName::new(format!("gpu-{g}-counters")).unwrap();
            pool.shared_counters.push(CounterSet {
                name: set.clone(),
                counters: all(counters),
            });
            let mut whole = Device::new(DeviceName::new(format!("gpu-{g}")).unwrap());
            whole.consumes_counters.push(CounterConsumption {
                counter_set: set.clone(),
                counters: all(counters),
            });
            pool.devices.push(whole);
            for p in 0..parts {
                let mut d = Device::new(DeviceName::new(format!("gpu-{g}-part-{p}")).unwrap());
                d.consumes_counters.push(CounterConsumption {
                    counter_set: set.clone(),
                    counters: all(1),
                });
                pool.devices.push(d);
            }
        }
        for i in 0..plain_devices {
            pool.devices.push(plain(1000 + i));
        }
        pool
    }

    fn same_slice(pool: Pool) -> Result<DesiredPool, Error> {
        desired_pools_in(
            &Inventory::new(vec![pool]),
            &driver(),
            UnhealthyDevices::Omit,
            CounterLayout::SameSlice,
        )
        .map(|mut p| p.remove(0))
    }

    #[test]
    fn kubernetes_1_34_gets_each_counter_set_with_its_devices() {
        // 8 GPUs of 15 counters (the NVIDIA backend's MIG model), 19 partitions each, then 3
        // plain devices: two GPUs per slice (30 of the 32 counters 1.34 allows).
        let pool = same_slice(partitioned_gpus(8, 15, 19, 3)).unwrap();
        let shape: Vec<(usize, usize)> = pool
            .slices
            .iter()
            .map(|s| (s.shared_counters.len(), s.devices.len()))
            .collect();
        assert_eq!(shape, vec![(2, 40), (2, 40), (2, 40), (2, 40), (0, 3)]);
        for slice in &pool.slices {
            let sets: Vec<&str> = slice
                .shared_counters
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            for d in &slice.devices {
                for c in d.consumes_counters.iter().flatten() {
                    assert!(
                        sets.contains(&c.counter_set.as_str()),
                        "{} consumes {} outside its slice",
                        d.name,
                        c.counter_set
                    );
                }
            }
        }
        // The same pool in the later layout: counter sets in a slice of their own.
        let later = one_pool(partitioned_gpus(8, 15, 19, 3));
        assert!(
            later
                .slices
                .iter()
                .all(|s| s.devices.is_empty() || s.shared_counters.is_empty())
        );
    }

    #[test]
    fn kubernetes_1_34_limits_are_named() {
        // A device joining two sets of 20 counters: 40 counters would have to share a slice.
        let mut pool = partitioned_gpus(2, 20, 0, 0);
        pool.devices.clear();
        let mut joint = plain(0);
        for g in 0..2 {
            joint.consumes_counters.push(CounterConsumption {
                counter_set: CounterName::new(format!("gpu-{g}-counters")).unwrap(),
                counters: [(
                    CounterName::new("c0").unwrap(),
                    Quantity::parse("1").unwrap(),
                )]
                .into(),
            });
        }
        pool.devices.push(joint);
        let err = same_slice(pool).unwrap_err().to_string();
        assert!(
            err.contains("40 counters")
                && err.contains("Kubernetes 1.34 allows")
                && err.contains("gpu-0-counters, gpu-1-counters"),
            "{err}"
        );
        let mut pool = pool_of((0..1).map(plain).collect());
        for i in 0..5 {
            pool.devices[0].taints.push(Taint {
                key: format!("example.com/t{i}"),
                value: String::new(),
                effect: TaintEffect::NoSchedule,
            });
        }
        let err = same_slice(pool.clone()).unwrap_err().to_string();
        assert!(err.contains("5 taints") && err.contains("1.34"), "{err}");
        // The later layout allows 16.
        assert!(
            desired_pools(
                &Inventory::new(vec![pool]),
                &driver(),
                UnhealthyDevices::Omit
            )
            .is_ok()
        );
        // 65 partitions of one GPU cannot share a slice with their counter set.
        let err = same_slice(partitioned_gpus(1, 2, 64, 0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("65 devices"), "{err}");
    }

    #[test]
    fn counter_sets_go_in_slices_of_their_own_eight_at_most() {
        let pool = one_pool(counter_pool(10, 70));
        assert_eq!(sizes(&pool), vec![64, 6, 0, 0]);
        let sets: Vec<usize> = pool
            .slices
            .iter()
            .map(|s| s.shared_counters.len())
            .collect();
        assert_eq!(sets, vec![0, 0, 8, 2]);
        let set = &pool.slices[2].shared_counters[0];
        assert_eq!(set.name, "set-0");
        assert_eq!(set.counters["memory"].value.0, "40Gi");
        let consumed = pool.slices[0].devices[0]
            .consumes_counters
            .as_ref()
            .unwrap();
        assert_eq!(consumed[0].counter_set, "set-0");
        assert_eq!(consumed[0].counters["memory"].value.0, "5Gi");
    }

    #[test]
    fn consumed_counters_per_slice_are_bounded() {
        // 40 devices consuming 2 x 32 counters each: 64 per device, 16 devices per 1024.
        let mut pool = pool_of(Vec::new());
        for s in 0..2 {
            pool.shared_counters.push(CounterSet {
                name: CounterName::new(format!("set-{s}")).unwrap(),
                counters: (0..32)
                    .map(|c| {
                        (
                            CounterName::new(format!("c{c}")).unwrap(),
                            Quantity::parse("1").unwrap(),
                        )
                    })
                    .collect(),
            });
        }
        for i in 0..40 {
            let mut d = plain(i);
            for s in 0..2 {
                d.consumes_counters.push(CounterConsumption {
                    counter_set: CounterName::new(format!("set-{s}")).unwrap(),
                    counters: (0..32)
                        .map(|c| {
                            (
                                CounterName::new(format!("c{c}")).unwrap(),
                                Quantity::parse("1").unwrap(),
                            )
                        })
                        .collect(),
                });
            }
            pool.devices.push(d);
        }
        assert_eq!(sizes(&one_pool(pool)), vec![16, 16, 8, 0]);
    }

    #[test]
    fn an_empty_pool_is_one_empty_slice() {
        let pool = one_pool(pool_of(Vec::new()));
        assert_eq!(pool.slices, vec![DesiredSlice::default()]);
        assert_eq!(pool.name, "node-a");
    }

    #[test]
    fn devices_map_to_the_v1_shape() {
        let mut d = Device::new(DeviceName::new("gpu-0").unwrap())
            .with_attribute(
                QualifiedName::new("model").unwrap(),
                AttributeValue::string("A100").unwrap(),
            )
            .with_attribute(
                QualifiedName::new("cores").unwrap(),
                AttributeValue::Int(108),
            )
            .with_attribute(
                QualifiedName::new("mig").unwrap(),
                AttributeValue::Bool(true),
            )
            .with_attribute(
                QualifiedName::new("example.com/driverVersion").unwrap(),
                AttributeValue::version("550.54.15").unwrap(),
            )
            .with_capacity(
                QualifiedName::new("memory").unwrap(),
                Quantity::parse("40Gi").unwrap(),
            )
            .with_numa_node(1);
        d.allow_multiple_allocations = true;
        d.taints.push(Taint {
            key: "example.com/flaky".into(),
            value: "xid-79".into(),
            effect: TaintEffect::NoExecute,
        });
        let pool = pool_of(vec![d.clone()]);
        let out = map_device(&pool, &d, &driver()).unwrap();
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "gpu-0",
                "attributes": {
                    "cores": {"int": 108},
                    "example.com/driverVersion": {"version": "550.54.15"},
                    "mig": {"bool": true},
                    "model": {"string": "A100"},
                    "numaNode": {"int": 1},
                },
                "capacity": {"memory": {"value": "40Gi"}},
                "taints": [{"key": "example.com/flaky", "value": "xid-79", "effect": "NoExecute"}],
                "allowMultipleAllocations": true,
            })
        );
    }

    #[test]
    fn numa_attribute_set_by_the_device_wins() {
        let d = plain(0)
            .with_attribute(
                QualifiedName::new(NUMA_NODE_ATTRIBUTE).unwrap(),
                AttributeValue::Int(3),
            )
            .with_numa_node(1);
        let out = map_device(&pool_of(vec![]), &d, &driver()).unwrap();
        assert_eq!(out.attributes.unwrap()[NUMA_NODE_ATTRIBUTE].int, Some(3));
    }

    #[test]
    fn numa_attribute_is_skipped_when_there_is_no_room() {
        let mut d = plain(0).with_numa_node(1);
        for i in 0..32 {
            d = d.with_attribute(
                QualifiedName::new(format!("a{i}")).unwrap(),
                AttributeValue::Int(i),
            );
        }
        let out = map_device(&pool_of(vec![]), &d, &driver()).unwrap();
        let attrs = out.attributes.unwrap();
        assert_eq!(attrs.len(), 32);
        assert!(!attrs.contains_key(NUMA_NODE_ATTRIBUTE));
    }

    #[test]
    fn unhealthy_devices_are_omitted_or_tainted() {
        let mut sick = plain(1);
        sick.health = Health::unhealthy("fell off the bus");
        let mut unknown = plain(2);
        unknown.health = Health::unknown("no answer");
        let inventory = Inventory::new(vec![pool_of(vec![plain(0), sick, unknown])]);

        let omitted = desired_pools(&inventory, &driver(), UnhealthyDevices::Omit).unwrap();
        let names: Vec<&str> = omitted[0].slices[0]
            .devices
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, vec!["dev-0", "dev-2"]);

        let tainted = desired_pools(&inventory, &driver(), UnhealthyDevices::Taint).unwrap();
        let devices = &tainted[0].slices[0].devices;
        assert_eq!(devices.len(), 3);
        let taints = devices[1].taints.as_ref().unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, "gpu.example.com/unhealthy");
        assert_eq!(taints[0].effect, "NoSchedule");
        assert!(devices[0].taints.is_none());
        assert!(devices[2].taints.is_none());
    }

    #[test]
    fn limits_are_reported_with_the_device() {
        let mut d = plain(7);
        for i in 0..33 {
            d = d.with_attribute(
                QualifiedName::new(format!("a{i}")).unwrap(),
                AttributeValue::Int(i),
            );
        }
        let err = desired_pools(
            &Inventory::new(vec![pool_of(vec![d])]),
            &driver(),
            UnhealthyDevices::Omit,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool node-a: device dev-7 has 33 attributes and capacities; at most 32 are allowed"
        );

        let mut d = plain(8);
        for i in 0..17 {
            d.taints.push(Taint {
                key: format!("example.com/t{i}"),
                value: String::new(),
                effect: TaintEffect::NoSchedule,
            });
        }
        let err = desired_pools(
            &Inventory::new(vec![pool_of(vec![d])]),
            &driver(),
            UnhealthyDevices::Omit,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("device dev-8 has 17 taints"),
            "{err}"
        );

        let mut pool = counter_pool(3, 1);
        for s in 1..3 {
            pool.devices[0].consumes_counters.push(CounterConsumption {
                counter_set: CounterName::new(format!("set-{s}")).unwrap(),
                counters: [(
                    CounterName::new("memory").unwrap(),
                    Quantity::parse("1").unwrap(),
                )]
                .into_iter()
                .collect(),
            });
        }
        let err = desired_pools(
            &Inventory::new(vec![pool]),
            &driver(),
            UnhealthyDevices::Omit,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("device dev-0 consumes from 3 counter sets"),
            "{err}"
        );
    }

    #[test]
    fn model_errors_are_reported() {
        let err = desired_pools(
            &Inventory::new(vec![pool_of(vec![plain(0), plain(0)])]),
            &driver(),
            UnhealthyDevices::Omit,
        )
        .unwrap_err();
        assert!(err.to_string().contains("dev-0"), "{err}");
    }
}
