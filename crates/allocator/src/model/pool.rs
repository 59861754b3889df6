//! Preparing the devices of one usable pool for a node: device and counter set names
//! checked, counters flattened and reduced by what allocated devices consume, and each
//! candidate device recorded with its node selection and counter consumption.

use super::counters::CounterSets;
use super::{InUse, NodeDevice, NodeView};
use crate::api::{Device, Node, ResourceSlice};
use crate::cel;
use crate::nodesel::node_matches;

/// The feature a node declares when its kubelet can skip node operations.
const OPTIONAL_NODE_OPERATIONS: &str = "DRAOptionalNodeOperations";

/// Prepares the devices of one usable pool for the node: checks device and counter set
/// names, flattens the counter sets, subtracts what allocated devices consume, and appends
/// the pool's candidate devices to the view. An error makes the pool invalid.
pub(super) fn prepare_pool<'a>(
    view: &mut NodeView<'a>,
    pi: usize,
    node: &Node,
    relevant: &[&'a ResourceSlice],
    others: &[&'a ResourceSlice],
    in_use: &InUse<'a>,
    features: crate::features::Features,
) -> Result<(), String> {
    let (driver, pool_name) = (view.pools[pi].driver, view.pools[pi].name);
    let start = view.devices.len();
    view.pools[pi].devices = start..start;
    // Kubernetes 1.35+ keeps counter sets and devices in separate slices; 1.34 put the sets in
    // the slice of the devices consuming them. A slice may therefore be in both lists.
    let device_slices = || relevant.iter().copied().filter(|s| is_device_slice(s));
    check_device_names(device_slices())?;
    let mut pool = PreparingPool {
        index: pi,
        driver,
        name: pool_name,
        in_use,
        // With the gate on, the node must declare the feature. With it off (when the API
        // server drops the field, so only under skew), the scheduler's stable allocator does
        // not look at the field, and the newer one it runs once an alpha feature such as
        // DRAListTypeAttributes is on refuses such devices (Kubernetes 1.37 and 1.38 alike).
        node_operations: if features.optional_node_operations {
            node.declared_features
                .iter()
                .any(|f| f == OPTIONAL_NODE_OPERATIONS)
        } else {
            !features.list_type_attributes
        },
        copy_node_operations: features.optional_node_operations,
        // The pool's counter sets wherever they are: a slice of counter sets that does not
        // select this node is among the pool's other slices.
        counters: CounterSets::flatten(
            relevant
                .iter()
                .chain(others)
                .copied()
                .filter(|s| !s.spec.shared_counters.is_empty()),
        )?,
    };
    pool.subtract_allocated(relevant, others)?;
    let overdrawn = pool.counters.available.iter().any(|q| q.sign() < 0);

    let consumption_start = view.consumption.len();
    if !pool.counters.sets.is_empty() {
        // Partitions mostly consume two or three counters.
        let devices: usize = device_slices().map(|s| s.spec.devices.len()).sum();
        view.consumption.reserve(2 * devices);
    }
    let result = (|| {
        for s in device_slices() {
            for d in &s.spec.devices {
                let dev = pool.device(node, s, d, &mut view.consumption)?;
                view.devices.push(dev);
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        view.consumption.truncate(consumption_start);
        return Err(e);
    }
    let view_pool = &mut view.pools[pi];
    view_pool.devices = start..view.devices.len();
    view_pool.counter_names = pool.counters.names;
    view_pool.available = pool.counters.available;
    view_pool.amounts = pool.counters.amounts.into_inner().values;
    view_pool.overdrawn = overdrawn;
    Ok(())
}

/// Whether a slice of a pool lists devices the node may allocate (a slice of counter sets
/// only does not).
fn is_device_slice(s: &ResourceSlice) -> bool {
    s.spec.shared_counters.is_empty() || !s.spec.devices.is_empty()
}

/// Fails on a device name that two devices of the pool's slices share.
pub(super) fn check_device_names<'s>(
    device_slices: impl Iterator<Item = &'s ResourceSlice> + Clone,
) -> Result<(), String> {
    let total: usize = device_slices.clone().map(|s| s.spec.devices.len()).sum();
    let names = || {
        device_slices
            .clone()
            .flat_map(|s| s.spec.devices.iter().map(|d| d.name.as_str()))
    };
    if total <= 16 {
        // Few names: comparing each pair is cheaper than hashing.
        let names: smallvec::SmallVec<[&str; 16]> = names().collect();
        for (i, a) in names.iter().enumerate() {
            if names[..i].iter().any(|b| cel::str_eq(a, b)) {
                return Err(format!("duplicate device name {a}"));
            }
        }
        return Ok(());
    }
    // Open addressing over the names' positions; equal hashes are compared as text.
    let size = (total * 2).next_power_of_two();
    let mask = size - 1;
    let mut table: Vec<(u32, u32)> = vec![(u32::MAX, 0); size];
    let mut seen: Vec<&str> = Vec::with_capacity(total);
    for name in names() {
        let h = cel::fast_hash(name);
        let mut at = h as usize & mask;
        loop {
            let (i, short) = table[at];
            if i == u32::MAX {
                table[at] = (seen.len() as u32, h as u32);
                seen.push(name);
                break;
            }
            if short == h as u32 && seen[i as usize] == name {
                return Err(format!("duplicate device name {name}"));
            }
            at = (at + 1) & mask;
        }
    }
    Ok(())
}

/// The pool being prepared: its index in the view, driver and name, the allocated devices,
/// and its flattened counter sets.
struct PreparingPool<'a, 'x> {
    index: usize,
    driver: &'a str,
    name: &'a str,
    in_use: &'x InUse<'a>,
    /// Devices of slices that skip node operations may be allocated on this node.
    node_operations: bool,
    /// Results carry the slice's `skipNodeOperations` (`DRAOptionalNodeOperations` is on).
    copy_node_operations: bool,
    counters: CounterSets<'a>,
}

impl<'a> PreparingPool<'a, '_> {
    /// Whether device `d` of this pool is listed as allocated.
    fn is_allocated(&self, d: &Device) -> bool {
        !self.in_use.devices.is_empty()
            && self
                .in_use
                .devices
                .contains(&(self.driver, self.name, d.name.as_str()))
    }

    /// Whether device `d` of this pool has shares allocated already (an entry of consumed
    /// capacity, even an empty one).
    fn is_shared(&self, d: &Device) -> bool {
        !self.in_use.consumed.is_empty()
            && self
                .in_use
                .consumed
                .contains_key(&(self.driver, self.name, d.name.as_str()))
    }

    /// Validates the consumption of every device of the pool and subtracts what allocated
    /// devices consume (devices with shares allocated count as allocated here, as the
    /// scheduler counts them). Candidates are parsed once, in [`PreparingPool::device`].
    fn subtract_allocated(
        &mut self,
        relevant: &[&'a ResourceSlice],
        others: &[&'a ResourceSlice],
    ) -> Result<(), String> {
        let mut used = Vec::new();
        let slices = relevant
            .iter()
            .map(|s| (*s, is_device_slice(s)))
            .chain(others.iter().map(|s| (*s, false)));
        for (s, candidate_slice) in slices {
            for d in &s.spec.devices {
                let is_allocated = self.is_allocated(d) || self.is_shared(d);
                if candidate_slice && !is_allocated {
                    continue;
                }
                used.clear();
                self.counters.consumption(d, &mut used)?;
                if is_allocated {
                    for &(idx, at) in &used {
                        let q = self.counters.value(at);
                        let available = &mut self.counters.available;
                        let idx = idx as usize;
                        available[idx] = available[idx].checked_sub(&q).ok_or_else(|| {
                            format!("counter arithmetic overflow on device {}", d.name)
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Prepares candidate device `d` of slice `s`: per-device node selection, counter
    /// consumption (appended to `consumption`). Capacities are parsed when first needed.
    fn device(
        &self,
        node: &Node,
        s: &'a ResourceSlice,
        d: &'a Device,
        consumption: &mut Vec<(u32, u32)>,
    ) -> Result<NodeDevice<'a>, String> {
        let per_device = s.spec.per_device_node_selection.unwrap_or(false);
        let node_selected = if per_device {
            node_matches(
                node,
                d.node_name.as_deref(),
                d.all_nodes.unwrap_or(false),
                d.node_selector.as_ref(),
            )
            .map_err(Box::from)
        } else {
            Ok(true)
        };
        let start = consumption.len();
        self.counters.consumption(d, consumption)?;
        let counters = start as u32..consumption.len() as u32;
        Ok(NodeDevice {
            pool: self.index,
            slice: s,
            device: d,
            allocated: self.is_allocated(d),
            node_selected,
            details: std::cell::OnceCell::new(),
            consumption: counters,
            allows_multiple: d.allow_multiple_allocations.unwrap_or(false),
            binds_to_node: d.binds_to_node.unwrap_or(false),
            node_operations_ok: s.spec.skip_node_operations.is_empty() || self.node_operations,
            skip_node_operations: if self.copy_node_operations {
                &s.spec.skip_node_operations
            } else {
                &[]
            },
            shared_before: self.is_shared(d),
            consumed_before: if self.in_use.consumed.is_empty() {
                Box::default()
            } else {
                self.in_use
                    .consumed
                    .get(&(self.driver, self.name, d.name.as_str()))
                    .map(|c| c.as_slice().into())
                    .unwrap_or_default()
            },
        })
    }
}
