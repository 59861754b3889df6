//! From the core inventory to the ResourceSlice content we want: device mapping and chunking to
//! the API's limits. Pure: no I/O.
//!
//! This file holds the API's limits, the desired-state types and the walk over pools; `device`
//! maps one device (attributes, capacity, counters, taints) and `layout` packs the mapped devices
//! and counter sets into slices.

use k8s_openapi::api::resource::v1 as res;
use std::borrow::Cow;

use kubedev_core::{DriverName, HealthState, Inventory, Pool};

use crate::Error;
use crate::features::CounterLayout;

mod device;
mod layout;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use device::{counters, map_device};
use layout::{chunk_devices, same_slice_layout};

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

/// The standard attribute that carries a device's NUMA node (an integer), defined by Kubernetes
/// 1.37 (KEP-6072, GA) beside `resource.kubernetes.io/pcieRoot` and `pciBusID`, so a claim can
/// `matchAttribute` it across drivers (a GPU and a NIC on one node). Any API server keeps it: it
/// is a qualified attribute name like any other, which 1.34–1.36 accept as well.
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// What the publisher does with devices whose health is `Unhealthy`.
///
/// A published unhealthy device carries the taint `<driver>/unhealthy` with the health reason
/// in its value (made a label value: `Xid-79-GPU-has-fallen-off-the-bus`), effect `NoExecute`
/// when the backend says the device is unusable for the workloads already on it
/// ([`kubedev_core::Health::evict`]) and `NoSchedule` otherwise. The taint goes as soon as the
/// device is healthy again. Devices with `Unknown` health are published as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnhealthyDevices {
    /// Taint them where the API server keeps device taints (`DRADeviceTaints` on: by default
    /// from Kubernetes 1.36), leave them out where it does not (the default).
    #[default]
    Auto,
    /// Leave them out of the ResourceSlices, so nothing new is allocated on them (safe on every
    /// cluster, but the cluster does not see why a device went away).
    Omit,
    /// Publish them tainted. Needs `DRADeviceTaints` on the cluster; where it is off the API
    /// server would drop the taint and the device would look usable, so kubedev leaves them
    /// out instead and reports the feature as unavailable.
    Taint,
    /// Publish them tainted while a claim prepared on this node holds them (so the cluster sees
    /// why, and a `NoExecute` taint evicts their pods), and leave them out once none does
    /// (decided at each publish).
    TaintWhileInUse,
}

impl UnhealthyDevices {
    /// What this policy does on a server that keeps device taints (`taints_kept`) or not:
    /// `Auto` becomes `Taint` or `Omit`; the others stay.
    pub fn resolve(self, taints_kept: bool) -> UnhealthyDevices {
        match self {
            UnhealthyDevices::Auto if taints_kept => UnhealthyDevices::Taint,
            UnhealthyDevices::Auto => UnhealthyDevices::Omit,
            other => other,
        }
    }
}

/// Whether an unhealthy device is published (with its taint) under `policy`, on an API server
/// that keeps device taints (`taints_kept`) or not, while a claim on this node holds it (`held`)
/// or not. This is the one place that decides what an unhealthy device becomes: where it is not
/// published, it is left out of the slices. A server that keeps no taints would publish it
/// looking usable, so there it is always left out.
pub(crate) fn publishes_unhealthy(policy: UnhealthyDevices, taints_kept: bool, held: bool) -> bool {
    taints_kept
        && match policy.resolve(taints_kept) {
            UnhealthyDevices::Omit | UnhealthyDevices::Auto => false,
            UnhealthyDevices::Taint => true,
            UnhealthyDevices::TaintWhileInUse => held,
        }
}

/// What publishing an inventory's unhealthy devices left out.
#[derive(Debug, Default)]
pub(crate) struct UnhealthyLeftOut {
    /// Per pool, the unhealthy devices the policy would have published tainted but that were
    /// left out because the API server keeps no taints: `pool <name>: left out <devices> …`.
    pub(crate) for_want_of_taints: Vec<String>,
}

/// `inventory` without the unhealthy devices [`publishes_unhealthy`] leaves out, borrowed when
/// it leaves out none; and what was left out for want of device taints.
pub(crate) fn unhealthy_left_out<'a>(
    inventory: &'a Inventory,
    policy: UnhealthyDevices,
    taints_kept: bool,
    in_use: &crate::degrade::InUse,
) -> (Cow<'a, Inventory>, UnhealthyLeftOut) {
    let published = |pool: &Pool, d: &kubedev_core::Device| {
        d.health.state != HealthState::Unhealthy
            || publishes_unhealthy(
                policy,
                taints_kept,
                in_use(pool.name.as_str(), d.name.as_str()),
            )
    };
    let mut report = UnhealthyLeftOut::default();
    if inventory.devices().all(|(p, d)| published(p, d)) {
        return (Cow::Borrowed(inventory), report);
    }
    let mut out = inventory.clone();
    for pool in &mut out.pools {
        let mut wanted_taints = Vec::new();
        let snapshot = std::mem::take(&mut pool.devices);
        for d in snapshot {
            if published(pool, &d) {
                pool.devices.push(d);
                continue;
            }
            let held = in_use(pool.name.as_str(), d.name.as_str());
            // `Auto` means "leave out where taints are not kept": nothing was overridden.
            if !taints_kept
                && policy != UnhealthyDevices::Auto
                && publishes_unhealthy(policy, true, held)
            {
                wanted_taints.push(d.name.to_string());
            }
        }
        if !wanted_taints.is_empty() {
            report.for_want_of_taints.push(format!(
                "pool {}: left out {} that are unhealthy",
                pool.name,
                crate::degrade::sample(&wanted_taints)
            ));
        }
    }
    (Cow::Owned(out), report)
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

/// Maps and chunks every pool of `inventory` in the 1.35+ layout, leaving out the unhealthy
/// devices `unhealthy` leaves out when no claim holds any device.
pub(crate) fn desired_pools(
    inventory: &Inventory,
    driver: &DriverName,
    unhealthy: UnhealthyDevices,
) -> Result<Vec<DesiredPool>, Error> {
    let (published, _) =
        unhealthy_left_out(inventory, unhealthy.resolve(false), true, &|_, _| false);
    desired_pools_in(&published, driver, CounterLayout::SeparateSlices)
}

/// Maps and chunks every pool of `inventory` with shared counters laid out as `layout` says;
/// every device is published (an unhealthy one with its taint).
pub(crate) fn desired_pools_in(
    inventory: &Inventory,
    driver: &DriverName,
    layout: CounterLayout,
) -> Result<Vec<DesiredPool>, Error> {
    inventory.validate().map_err(|e| Error::InvalidInventory {
        pool: String::new(),
        message: kubedev_core::echo::chain(&e),
    })?;
    inventory
        .pools
        .iter()
        .map(|pool| desired_pool(pool, driver, layout))
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
    layout: CounterLayout,
) -> Result<DesiredPool, Error> {
    let mut devices = Vec::with_capacity(pool.devices.len());
    for device in &pool.devices {
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
