//! From the core inventory to the ResourceSlice content we want: device mapping and chunking to
//! the API's limits. Pure: no I/O.
//!
//! This file holds the API's limits, the desired-state types and the walk over pools; `device`
//! maps one device (attributes, capacity, counters, taints) and `layout` packs the mapped devices
//! and counter sets into slices.

use k8s_openapi::api::resource::v1 as res;

use kubedev_core::{DriverName, Inventory, Pool};

use crate::error::Error;
use crate::features::CounterLayout;
pub use crate::unhealthy::UnhealthyDevices;
use crate::unhealthy::unhealthy_left_out;

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
