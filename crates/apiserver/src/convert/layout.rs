//! Packing a pool's mapped devices and counter sets into ResourceSlices within the API's limits:
//! the chunking of devices in order (Kubernetes 1.35 and later, counter sets in slices of their
//! own) and the Kubernetes 1.34 layout, where each counter set shares a slice with the devices
//! consuming it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1 as res;
use kubedev_core::Pool;

use super::device::counters;
use super::{
    DesiredPool, DesiredSlice, MAX_CONSUMED_COUNTERS_PER_SLICE, MAX_COUNTER_SETS,
    MAX_COUNTERS_PER_DEVICE_1_34, MAX_DEVICES, MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    MAX_SHARED_COUNTERS_1_34, MAX_TAINTS_1_34, invalid,
};
use crate::error::Error;

/// The Kubernetes 1.34 layout: each counter set in the same slice as every device consuming it.
/// Sets joined by a device that consumes from both stay together; such groups are packed into
/// slices up to 64 devices, [`MAX_SHARED_COUNTERS_1_34`] counters over all sets and
/// [`MAX_CONSUMED_COUNTERS_PER_SLICE`] consumed counters; devices that consume no counters are
/// chunked after them as in the later layout.
pub(super) fn same_slice_layout(
    pool: &Pool,
    devices: Vec<res::Device>,
) -> Result<DesiredPool, Error> {
    check_devices_1_34(pool, &devices)?;
    let (groups, plain) = group_by_counter_sets(pool, devices);
    let mut slices = Vec::new();
    let mut current = DesiredSlice::default();
    let mut current_counters = 0;
    let mut current_consumed = 0;
    for (sets, group_devices) in groups.into_iter().filter(|(s, _)| !s.is_empty()) {
        let (counters_in_sets, consumed) = check_group_1_34(pool, &sets, &group_devices)?;
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

/// Counter sets that share a slice in the Kubernetes 1.34 layout (their indices in the pool)
/// and the devices consuming from them.
type CounterGroup = (Vec<usize>, Vec<res::Device>);

/// Each device within Kubernetes 1.34's limits on taints and consumed counters per device.
fn check_devices_1_34(pool: &Pool, devices: &[res::Device]) -> Result<(), Error> {
    for d in devices {
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
    Ok(())
}

/// The pool's counter sets in groups joined by devices consuming from several (in the order
/// the sets are listed), each with the devices consuming from it: `(set indices, devices)`; and
/// the devices that consume from no set.
fn group_by_counter_sets(
    pool: &Pool,
    devices: Vec<res::Device>,
) -> (Vec<CounterGroup>, Vec<res::Device>) {
    // Groups of sets, in the order the sets are listed; each set's group index.
    let mut group_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut groups: Vec<CounterGroup> = Vec::new();
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
    (groups, plain)
}

/// One group within Kubernetes 1.34's limits for the slice it must share: its counters and
/// devices, and what they consume. Returns `(counters in its sets, counters consumed)`.
fn check_group_1_34(
    pool: &Pool,
    sets: &[usize],
    group_devices: &[res::Device],
) -> Result<(usize, usize), Error> {
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
    Ok((counters_in_sets, consumed))
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
pub(super) fn chunk_devices(devices: Vec<res::Device>) -> Vec<DesiredSlice> {
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
