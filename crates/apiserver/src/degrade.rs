//! What kubedev publishes when the API server drops a field it needs: an inventory adapted so
//! that what the server stores is still safe to allocate from. Pure: no I/O.
//!
//! - **No shared counters** (`DRAPartitionableDevices` off): devices that share a counter set
//!   would look independent, so one scheduler decision could hand out a whole GPU and a MIG
//!   slice of it. For each counter set kubedev keeps at most what can never overlap: the devices
//!   of the set that are prepared for claims now (they exist, so they do not overlap), or else
//!   the one device that takes the whole set (the whole GPU); every other consumer is left out.
//!   A device consuming several sets is kept only where every set keeps it. Devices that consume
//!   no counters (static MIG devices, plain GPUs) are unaffected. For the NVIDIA backend's
//!   partitionable MIG this is "whole GPUs, and the MIG devices that already exist".
//! - **No device taints** (`DRADeviceTaints` off): a tainted device would look usable, so
//!   devices with a `NoSchedule` or `NoExecute` taint are left out (unhealthy devices too,
//!   whatever `UnhealthyDevices` says: `unhealthy::publishes_unhealthy` decides that), and `None`
//!   taints, which only inform, are not written.
//! - **Kubernetes 1.34** knows no `None` taint effect: such taints, which only inform, are not
//!   written there.
//! - **No `allowMultipleAllocations`** (`DRAConsumableCapacity` off): the field is not written;
//!   the scheduler then gives each such device to one claim at a time, which is safe.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use kubedev_core::{Inventory, Pool, TaintEffect};

use crate::features::{ApiCapabilities, ApiFeature, CounterLayout};
use crate::unhealthy::{InUse, UnhealthyDevices, sample, unhealthy_left_out};

/// What is published of `inventory` on a server that keeps what `caps` says: without the
/// unhealthy devices `policy` leaves out ([`crate::unhealthy::publishes_unhealthy`] decides),
/// then adapted; and for each feature it needed and the server lacks, what was published
/// instead. Copies the inventory at most once, and not at all when nothing changes.
pub(crate) fn published<'a>(
    inventory: &'a Inventory,
    policy: UnhealthyDevices,
    caps: &ApiCapabilities,
    in_use: &InUse,
) -> (Cow<'a, Inventory>, BTreeMap<ApiFeature, String>) {
    let taints_kept = caps.keeps(ApiFeature::DeviceTaints);
    let (healthy_enough, left_out) = unhealthy_left_out(inventory, policy, taints_kept, in_use);
    let (adapted, mut notes) = adapt(healthy_enough, caps, in_use);
    if !left_out.for_want_of_taints.is_empty() {
        let mut note = left_out.for_want_of_taints.join("; ");
        if let Some(rest) = notes.remove(&ApiFeature::DeviceTaints) {
            note = format!("{note}; {rest}");
        }
        notes.insert(ApiFeature::DeviceTaints, note);
    }
    (adapted, notes)
}

/// `inventory` adapted to `caps`, and for each feature it needed and the server lacks, what was
/// published instead.
///
/// An inventory that uses nothing the server lacks comes back as it was given, not copied.
pub(crate) fn adapt<'a>(
    inventory: Cow<'a, Inventory>,
    caps: &ApiCapabilities,
    in_use: &InUse,
) -> (Cow<'a, Inventory>, BTreeMap<ApiFeature, String>) {
    let mut notes: BTreeMap<ApiFeature, Vec<String>> = BTreeMap::new();
    if !uses_what_the_server_lacks(&inventory, caps) {
        return (inventory, BTreeMap::new());
    }
    let mut out = inventory.into_owned();
    for pool in &mut out.pools {
        if caps.layout == CounterLayout::SameSlice {
            // Kubernetes 1.34 knows only NoSchedule and NoExecute; a `None` taint only informs.
            for d in &mut pool.devices {
                d.taints.retain(|t| t.effect != TaintEffect::None);
            }
        }
        if !caps.keeps(ApiFeature::PartitionableDevices) {
            without_counters(pool, in_use, &mut notes);
        }
        if !caps.keeps(ApiFeature::DeviceTaints) {
            without_taints(pool, &mut notes);
        }
        if !caps.keeps(ApiFeature::ConsumableCapacity) {
            // The server would drop capacity request policies too; sending them anyway would
            // make every read-back differ from what was written.
            for d in &mut pool.devices {
                for c in d.capacity.values_mut() {
                    c.request_policy = None;
                }
            }
            let shared: Vec<String> = pool
                .devices
                .iter_mut()
                .filter(|d| d.allow_multiple_allocations)
                .map(|d| {
                    d.allow_multiple_allocations = false;
                    d.name.to_string()
                })
                .collect();
            if !shared.is_empty() {
                notes
                    .entry(ApiFeature::ConsumableCapacity)
                    .or_default()
                    .push(format!(
                        "pool {}: {} published for one claim at a time",
                        pool.name,
                        sample(&shared)
                    ));
            }
        }
    }
    let notes = notes
        .into_iter()
        .map(|(feature, parts)| (feature, parts.join("; ")))
        .collect();
    (Cow::Owned(out), notes)
}

/// Whether `inventory` uses a field `caps` says the server drops, so that [`adapt`] has
/// something to change.
fn uses_what_the_server_lacks(inventory: &Inventory, caps: &ApiCapabilities) -> bool {
    let lacks = |f| !caps.keeps(f);
    let devices = || inventory.pools.iter().flat_map(|p| p.devices.iter());
    (caps.layout == CounterLayout::SameSlice
        && devices().any(|d| d.taints.iter().any(|t| t.effect == TaintEffect::None)))
        || (lacks(ApiFeature::PartitionableDevices)
            && inventory.pools.iter().any(|p| {
                !p.shared_counters.is_empty()
                    || p.devices.iter().any(|d| !d.consumes_counters.is_empty())
            }))
        || (lacks(ApiFeature::DeviceTaints) && devices().any(|d| !d.taints.is_empty()))
        || (lacks(ApiFeature::ConsumableCapacity)
            && devices().any(|d| {
                d.allow_multiple_allocations
                    || d.capacity.values().any(|c| c.request_policy.is_some())
            }))
}

fn without_counters(
    pool: &mut Pool,
    in_use: &InUse,
    notes: &mut BTreeMap<ApiFeature, Vec<String>>,
) {
    if pool.shared_counters.is_empty()
        && pool.devices.iter().all(|d| d.consumes_counters.is_empty())
    {
        return;
    }
    // For each set: the devices it keeps.
    let mut kept_by_set: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    let mut whole_names = Vec::new();
    let mut in_use_names = Vec::new();
    for set in &pool.shared_counters {
        let consumers: Vec<usize> = pool
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| {
                d.consumes_counters
                    .iter()
                    .any(|c| c.counter_set == set.name)
            })
            .map(|(i, _)| i)
            .collect();
        let busy: BTreeSet<usize> = consumers
            .iter()
            .copied()
            .filter(|&i| in_use(pool.name.as_str(), pool.devices[i].name.as_str()))
            .collect();
        let keep = if !busy.is_empty() {
            in_use_names.extend(busy.iter().map(|&i| pool.devices[i].name.to_string()));
            busy
        } else {
            consumers
                .iter()
                .copied()
                .find(|&i| {
                    pool.devices[i]
                        .consumes_counters
                        .iter()
                        .find(|c| c.counter_set == set.name)
                        .is_some_and(|c| c.counters == set.counters)
                })
                .map(|i| {
                    whole_names.push(pool.devices[i].name.to_string());
                    BTreeSet::from([i])
                })
                .unwrap_or_default()
        };
        kept_by_set.insert(set.name.as_str(), keep);
    }
    let mut left_out = Vec::new();
    let mut keep = vec![true; pool.devices.len()];
    for (i, d) in pool.devices.iter().enumerate() {
        // A reference to a set the pool does not have keeps nothing either.
        let kept = d.consumes_counters.iter().all(|c| {
            kept_by_set
                .get(c.counter_set.as_str())
                .is_some_and(|k| k.contains(&i))
        });
        if !kept {
            keep[i] = false;
            left_out.push(d.name.to_string());
        }
    }
    let mut i = 0;
    pool.devices.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    for d in &mut pool.devices {
        d.consumes_counters.clear();
    }
    pool.shared_counters.clear();
    let mut parts = vec![format!("pool {}:", pool.name)];
    if !whole_names.is_empty() {
        parts.push(format!(
            "published {} that take a whole counter set each",
            sample(&whole_names)
        ));
    }
    if !in_use_names.is_empty() {
        parts.push(format!(
            "kept {} prepared for claims now",
            sample(&in_use_names)
        ));
    }
    parts.push(format!(
        "left out {} that share counters with them",
        sample(&left_out)
    ));
    notes
        .entry(ApiFeature::PartitionableDevices)
        .or_default()
        .push(parts.join(" "));
}

fn without_taints(pool: &mut Pool, notes: &mut BTreeMap<ApiFeature, Vec<String>>) {
    let mut left_out = Vec::new();
    pool.devices.retain(|d| {
        let blocking = d
            .taints
            .iter()
            .any(|t| matches!(t.effect, TaintEffect::NoSchedule | TaintEffect::NoExecute));
        if blocking {
            left_out.push(d.name.to_string());
        }
        !blocking
    });
    let mut informational = 0;
    for d in &mut pool.devices {
        informational += d.taints.len();
        d.taints.clear();
    }
    if !left_out.is_empty() {
        notes
            .entry(ApiFeature::DeviceTaints)
            .or_default()
            .push(format!(
                "pool {}: left out {} that are tainted",
                pool.name,
                sample(&left_out)
            ));
    }
    if informational > 0 {
        notes
            .entry(ApiFeature::DeviceTaints)
            .or_default()
            .push(format!(
                "pool {}: {informational} informational taint(s) not written",
                pool.name
            ));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kubedev_core::{
        CounterConsumption, CounterName, CounterSet, Device, DeviceName, Health, PoolName,
        Quantity, Taint,
    };

    use super::*;

    fn counters(n: i64) -> BTreeMap<CounterName, Quantity> {
        (0..n)
            .map(|i| {
                (
                    CounterName::new(format!("slice{i}")).unwrap(),
                    Quantity::parse("1").unwrap(),
                )
            })
            .collect()
    }

    /// A GPU pool as the NVIDIA backend's partitionable MIG builds it: per GPU a set of 7
    /// counters, the whole GPU consuming all, and 1-slice placements consuming one each; and
    /// one static MIG device consuming nothing.
    fn gpus(n: usize) -> Pool {
        let mut devices = Vec::new();
        let mut sets = Vec::new();
        for g in 0..n {
            let set = CounterName::new(format!("gpu-{g}-counters")).unwrap();
            sets.push(CounterSet::new(set.clone(), counters(7)));
            let mut whole = Device::new(DeviceName::new(format!("gpu-{g}")).unwrap());
            whole
                .consumes_counters
                .push(CounterConsumption::new(set.clone(), counters(7)));
            devices.push(whole);
            for p in 0..7 {
                let mut d = Device::new(DeviceName::new(format!("gpu-{g}-mig-1g-{p}")).unwrap());
                d.consumes_counters.push(CounterConsumption::new(
                    set.clone(),
                    [(
                        CounterName::new(format!("slice{p}")).unwrap(),
                        Quantity::parse("1").unwrap(),
                    )]
                    .into(),
                ));
                devices.push(d);
            }
        }
        devices.push(Device::new(DeviceName::new("gpu-9-mig-static").unwrap()));
        let mut pool = Pool::new(PoolName::new("node-a").unwrap(), devices);
        pool.shared_counters = sets;
        pool
    }

    fn adapt_borrowed<'a>(
        inv: &'a Inventory,
        caps: &ApiCapabilities,
        in_use: &InUse,
    ) -> (Cow<'a, Inventory>, BTreeMap<ApiFeature, String>) {
        adapt(Cow::Borrowed(inv), caps, in_use)
    }

    fn names(inv: &Inventory) -> Vec<String> {
        inv.pools[0]
            .devices
            .iter()
            .map(|d| d.name.to_string())
            .collect()
    }

    fn without(features: &[ApiFeature]) -> ApiCapabilities {
        ApiCapabilities {
            unavailable: features.iter().copied().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn everything_kept_changes_nothing() {
        let inv = Inventory::new(vec![gpus(2)]);
        let (out, notes) = adapt_borrowed(&inv, &ApiCapabilities::default(), &|_, _| false);
        assert!(
            matches!(out, Cow::Borrowed(_)),
            "nothing to adapt: not copied"
        );
        assert_eq!(*out, inv);
        assert!(notes.is_empty());
    }

    #[test]
    fn without_counters_only_whole_devices_and_counterless_ones_remain() {
        let inv = Inventory::new(vec![gpus(2)]);
        let (out, notes) = adapt_borrowed(
            &inv,
            &without(&[ApiFeature::PartitionableDevices]),
            &|_, _| false,
        );
        assert_eq!(names(&out), ["gpu-0", "gpu-1", "gpu-9-mig-static"]);
        assert!(out.pools[0].shared_counters.is_empty());
        assert!(
            out.pools[0]
                .devices
                .iter()
                .all(|d| d.consumes_counters.is_empty())
        );
        let note = &notes[&ApiFeature::PartitionableDevices];
        assert!(note.contains("2 devices (gpu-0, gpu-1)"), "{note}");
        assert!(note.contains("left out 14 devices"), "{note}");
    }

    #[test]
    fn without_counters_devices_in_use_keep_their_set_and_the_whole_device_goes() {
        let inv = Inventory::new(vec![gpus(2)]);
        let busy = |_: &str, d: &str| d == "gpu-1-mig-1g-3" || d == "gpu-1-mig-1g-5";
        let (out, notes) =
            adapt_borrowed(&inv, &without(&[ApiFeature::PartitionableDevices]), &busy);
        assert_eq!(
            names(&out),
            [
                "gpu-0",
                "gpu-1-mig-1g-3",
                "gpu-1-mig-1g-5",
                "gpu-9-mig-static"
            ]
        );
        assert!(notes[&ApiFeature::PartitionableDevices].contains("prepared for claims now"));
    }

    #[test]
    fn without_counters_a_set_with_no_whole_device_keeps_none_of_its_consumers() {
        let mut pool = gpus(1);
        pool.devices.retain(|d| d.name.as_str() != "gpu-0");
        let inv = Inventory::new(vec![pool]);
        let (out, _) = adapt_borrowed(
            &inv,
            &without(&[ApiFeature::PartitionableDevices]),
            &|_, _| false,
        );
        assert_eq!(names(&out), ["gpu-9-mig-static"]);
    }

    #[test]
    fn without_taints_tainted_and_unhealthy_devices_are_left_out() {
        let mut a = Device::new(DeviceName::new("a").unwrap());
        a.taints.push(Taint::new(
            "example.com/maintenance",
            TaintEffect::NoSchedule,
        ));
        let mut b = Device::new(DeviceName::new("b").unwrap());
        b.health = Health::unhealthy("Xid 79");
        let mut c = Device::new(DeviceName::new("c").unwrap());
        c.taints
            .push(Taint::new("example.com/info", TaintEffect::None));
        let d = Device::new(DeviceName::new("d").unwrap());
        let inv = Inventory::new(vec![Pool::new(
            PoolName::new("p").unwrap(),
            vec![a, b, c, d],
        )]);
        let caps = without(&[ApiFeature::DeviceTaints]);
        let (out, notes) = published(&inv, UnhealthyDevices::Taint, &caps, &|_, _| false);
        assert_eq!(names(&out), ["c", "d"]);
        assert!(out.pools[0].devices.iter().all(|d| d.taints.is_empty()));
        let note = &notes[&ApiFeature::DeviceTaints];
        assert!(note.contains("1 device (b) that are unhealthy"), "{note}");
        assert!(note.contains("1 device (a) that are tainted"), "{note}");
        // Under `Auto`, leaving the unhealthy device out is what was asked: only the taint is
        // noted.
        let (out, notes) = published(&inv, UnhealthyDevices::Auto, &caps, &|_, _| false);
        assert_eq!(names(&out), ["c", "d"]);
        let note = &notes[&ApiFeature::DeviceTaints];
        assert!(!note.contains("(b)"), "{note}");
    }

    #[test]
    fn without_consumable_capacity_shared_devices_become_exclusive() {
        let mut a = Device::new(DeviceName::new("a").unwrap());
        a.allow_multiple_allocations = true;
        let one = kubedev_core::Quantity::parse("1").unwrap();
        let mut slots = kubedev_core::Capacity::new(kubedev_core::Quantity::parse("4").unwrap());
        slots.request_policy = Some(kubedev_core::RequestPolicy::range(one, one, None, None));
        a.capacity
            .insert(kubedev_core::QualifiedName::new("slots").unwrap(), slots);
        let inv = Inventory::new(vec![Pool::new(PoolName::new("p").unwrap(), vec![a])]);
        let (out, notes) = adapt_borrowed(
            &inv,
            &without(&[ApiFeature::ConsumableCapacity]),
            &|_, _| false,
        );
        let d = &out.pools[0].devices[0];
        assert!(!d.allow_multiple_allocations);
        assert!(
            d.capacity.values().all(|c| c.request_policy.is_none()),
            "the server would drop request policies: they are not sent"
        );
        assert!(notes.contains_key(&ApiFeature::ConsumableCapacity));
        // Not needed, not noted.
        let (_, notes) = adapt_borrowed(
            &Inventory::new(vec![gpus(1)]),
            &without(&[ApiFeature::ConsumableCapacity, ApiFeature::DeviceTaints]),
            &|_, _| false,
        );
        assert!(notes.is_empty());
    }
}
