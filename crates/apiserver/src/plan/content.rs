//! What a slice holds: the spec we want for it, a comparable key of its content that
//! ignores the server's own additions and spellings, and the taint times an update keeps.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1 as res;

use super::Identity;
use crate::convert::{DesiredPool, DesiredSlice};

/// The spec of slice `index` of `pool` at `generation`.
pub(crate) fn desired_spec(
    id: &Identity,
    pool: &DesiredPool,
    slice: &DesiredSlice,
    generation: i64,
) -> res::ResourceSliceSpec {
    res::ResourceSliceSpec {
        driver: id.driver.clone(),
        node_name: Some(id.node.clone()),
        pool: res::ResourcePool {
            name: pool.name.clone(),
            generation,
            resource_slice_count: i64::try_from(pool.slices.len()).unwrap_or(i64::MAX),
        },
        devices: (!slice.devices.is_empty()).then(|| slice.devices.clone()),
        shared_counters: (!slice.shared_counters.is_empty()).then(|| slice.shared_counters.clone()),
        ..Default::default()
    }
}

/// Re-spells a quantity canonically, so `1024Mi` and `1Gi` compare equal. Unparsable text is
/// kept as it is (and then differs from ours, which is always canonical).
fn canonical_quantity(q: &mut k8s_openapi::apimachinery::pkg::api::resource::Quantity) {
    if let Ok(parsed) = kubedev_core::Quantity::parse(&q.0) {
        q.0 = parsed.to_string();
    }
}

/// An empty list as no list (the server may keep either).
fn none_if_empty<T>(v: &mut Option<Vec<T>>) {
    if v.as_ref().is_some_and(Vec::is_empty) {
        *v = None;
    }
}

/// An empty map as no map.
fn none_if_empty_map<K, V>(v: &mut Option<BTreeMap<K, V>>) {
    if v.as_ref().is_some_and(BTreeMap::is_empty) {
        *v = None;
    }
}

/// A comparable rendering of a slice's content: everything but the pool generation, with the
/// server's own additions (taint times) and spelling differences (quantities, empty lists)
/// removed. Two specs with equal keys publish the same thing.
pub(crate) fn content_key(spec: &res::ResourceSliceSpec) -> String {
    let mut spec = spec.clone();
    spec.pool.generation = 0;
    none_if_empty(&mut spec.devices);
    none_if_empty(&mut spec.shared_counters);
    for set in spec.shared_counters.iter_mut().flatten() {
        for counter in set.counters.values_mut() {
            canonical_quantity(&mut counter.value);
        }
    }
    for device in spec.devices.iter_mut().flatten() {
        none_if_empty_map(&mut device.attributes);
        none_if_empty_map(&mut device.capacity);
        none_if_empty(&mut device.consumes_counters);
        none_if_empty(&mut device.taints);
        for cap in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            canonical_quantity(&mut cap.value);
        }
        for consumption in device.consumes_counters.iter_mut().flatten() {
            for counter in consumption.counters.values_mut() {
                canonical_quantity(&mut counter.value);
            }
        }
        for taint in device.taints.iter_mut().flatten() {
            taint.time_added = None;
        }
    }
    // Serialising plain data with string keys cannot fail; an empty key would only make the
    // slice look changed and be rewritten.
    serde_json::to_string(&spec).unwrap_or_default()
}

/// Copies `timeAdded` of taints the server already stamped onto the same taints of `desired`,
/// so an update does not reset when a taint appeared.
pub(super) fn keep_taint_times(
    current: &res::ResourceSliceSpec,
    desired: &mut res::ResourceSliceSpec,
) {
    let Some(current_devices) = current.devices.as_ref() else {
        return;
    };
    let by_name: HashMap<&str, &res::Device> = current_devices
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for device in desired.devices.iter_mut().flatten() {
        let Some(old) = by_name.get(device.name.as_str()) else {
            continue;
        };
        let Some(old_taints) = old.taints.as_ref() else {
            continue;
        };
        for taint in device.taints.iter_mut().flatten() {
            if taint.time_added.is_some() {
                continue;
            }
            if let Some(same) = old_taints
                .iter()
                .find(|t| t.key == taint.key && t.value == taint.value && t.effect == taint.effect)
            {
                taint.time_added.clone_from(&same.time_added);
            }
        }
    }
}

/// Slice content the API server stored differently from what we sent (fields it dropped
/// because a feature is off). Keyed by our content key, holding the server's; without it we
/// would rewrite such a slice forever.
pub(crate) type Accepted = HashMap<String, String>;

/// The key `desired` is expected to have on the server.
pub(super) fn expected_key<'a>(desired_key: &'a str, accepted: &'a Accepted) -> &'a str {
    accepted
        .get(desired_key)
        .map_or(desired_key, String::as_str)
}
