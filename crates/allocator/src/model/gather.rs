//! Building a node's view: the pools relevant for the node (the scheduler's `GatherPools`),
//! each checked for completeness against all of its slices, ordered as the scheduler orders
//! them, and the devices of the usable ones prepared.

use std::collections::HashSet;

use super::pool::prepare_pool;
use super::{InUse, NodeView, PoolState, PoolView};
use crate::api::{Node, ResourceSlice};
use crate::cel::{self, FastMap, Value};
use crate::nodesel::node_matches;
use crate::slice_index::SliceIndex;

/// Some slices of a pool (mostly one or two).
type Slices<'a> = smallvec::SmallVec<[&'a ResourceSlice; 2]>;

/// A pool as gathered for the node: the slices of its newest generation that are relevant
/// for the node.
struct GatheredPool<'a> {
    driver: &'a str,
    name: &'a str,
    generation: i64,
    slices: Slices<'a>,
}

/// A pool checked for completeness: its view, its slices (relevant for the node, and the
/// pool's other slices), whether a device has binding conditions.
struct CheckedPool<'a> {
    pool: PoolView<'a>,
    relevant: Slices<'a>,
    others: Vec<&'a ResourceSlice>,
    binding: bool,
}

/// Gathers the pools relevant for `node` (the scheduler's `GatherPools`) and prepares their
/// devices.
pub(crate) fn build_node_view<'a>(
    node: &Node,
    slices: &'a [ResourceSlice],
    slice_index: Option<&SliceIndex>,
    in_use: &InUse<'a>,
    features: crate::features::Features,
) -> Result<NodeView<'a>, String> {
    let gathered = gather_pools(node, slices, slice_index)?;
    let mut checked: smallvec::SmallVec<[CheckedPool<'a>; 2]> =
        smallvec::SmallVec::with_capacity(gathered.len());
    checked.extend(
        gathered
            .into_iter()
            .filter_map(|p| check_pool(p, slices, slice_index)),
    );
    // Sort by (driver, pool), pools with binding conditions last.
    if checked.len() > 1 {
        checked.sort_by(|a, b| {
            (a.binding, a.pool.driver, a.pool.name).cmp(&(b.binding, b.pool.driver, b.pool.name))
        });
    }
    let total: usize = checked
        .iter()
        .flat_map(|g| g.relevant.iter())
        .map(|s| s.spec.devices.len())
        .sum();
    let mut view = NodeView::with_capacity(checked.len(), total, features.list_type_attributes);
    for g in checked {
        let pi = view.pools.len();
        let usable = g.pool.state == PoolState::Usable;
        view.pools.push(g.pool);
        if !usable {
            continue;
        }
        if let Err(reason) = prepare_pool(
            &mut view,
            pi,
            node,
            &g.relevant,
            &g.others,
            in_use,
            features,
        ) {
            let pool = &mut view.pools[pi];
            view.devices.truncate(pool.devices.start);
            pool.devices = pool.devices.start..pool.devices.start;
            pool.state = PoolState::Invalid(reason);
        }
    }
    Ok(view)
}

/// The slices relevant for `node`, grouped by pool (driver, name) in the order pools are
/// first seen, each pool keeping only its newest generation.
fn gather_pools<'a>(
    node: &Node,
    slices: &'a [ResourceSlice],
    slice_index: Option<&SliceIndex>,
) -> Result<smallvec::SmallVec<[GatheredPool<'a>; 2]>, String> {
    let mut gathered: smallvec::SmallVec<[GatheredPool<'a>; 2]> = smallvec::SmallVec::new();
    // Pools by (driver, name): searched in `gathered` while there are few, then indexed.
    let mut index: FastMap<(&'a str, &'a str), usize> = FastMap::default();
    let indexed: Option<Vec<&'a ResourceSlice>> =
        slice_index.map(|ix| ix.for_node(slices, &node.name));
    let mut from_index = indexed.iter().flatten().copied();
    let mut every = slices.iter();
    let candidates: &mut dyn Iterator<Item = &'a ResourceSlice> = if indexed.is_some() {
        &mut from_index
    } else {
        &mut every
    };
    for slice in candidates {
        if !slice_relevant(node, slice)? {
            continue;
        }
        let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        let generation = slice.spec.pool.generation;
        let found = if gathered.len() <= 8 {
            gathered.iter().position(|p| (p.driver, p.name) == key)
        } else {
            if index.is_empty() {
                index.extend(
                    gathered
                        .iter()
                        .enumerate()
                        .map(|(i, p)| ((p.driver, p.name), i)),
                );
            }
            index.get(&key).copied()
        };
        match found.as_ref() {
            None => {
                if !index.is_empty() {
                    index.insert(key, gathered.len());
                }
                let mut pool_slices = Slices::new();
                pool_slices.reserve(slice.spec.pool.resource_slice_count.clamp(1, 64) as usize);
                pool_slices.push(slice);
                gathered.push(GatheredPool {
                    driver: key.0,
                    name: key.1,
                    generation,
                    slices: pool_slices,
                });
            }
            Some(&i) => {
                let p = &mut gathered[i];
                if generation < p.generation {
                    continue;
                }
                if generation > p.generation {
                    p.generation = generation;
                    p.slices.clear();
                }
                p.slices.push(slice);
            }
        }
    }
    Ok(gathered)
}

/// Whether `slice` may serve `node`: by its own node selection, or for per-device node
/// selection by one of its devices'. A slice of counter sets only is no different: one that
/// does not select the node is found with the rest of its pool when the pool's relevant
/// slices are not all there.
#[inline]
fn slice_relevant(node: &Node, slice: &ResourceSlice) -> Result<bool, String> {
    let spec = &slice.spec;
    let node_name = spec.node_name.as_deref().filter(|n| !n.is_empty());
    if let Some(name) = node_name {
        // A node name decides alone (most slices of a cluster name their node).
        return Ok(cel::str_eq(name, &node.name));
    }
    let all = spec.all_nodes.unwrap_or(false);
    if node_name.is_some() || all || spec.node_selector.is_some() {
        return node_matches(node, node_name, all, spec.node_selector.as_ref()).map_err(|e| {
            format!(
                "failed to perform node selection for slice {}: {e}",
                slice.metadata.name
            )
        });
    }
    if spec.per_device_node_selection.unwrap_or(false) {
        for d in &spec.devices {
            let m = node_matches(
                node,
                d.node_name.as_deref(),
                d.all_nodes.unwrap_or(false),
                d.node_selector.as_ref(),
            )
            .map_err(|e| {
                format!(
                    "failed to perform node selection for device {} in slice {}: {e}",
                    d.name, slice.metadata.name
                )
            })?;
            if m {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Checks a gathered pool against its slice count: incomplete when the slices of its
/// generation are not all there, left out (`None`) when a newer generation exists among
/// slices not relevant for the node, usable otherwise (with its relevant slices by name).
fn check_pool<'a>(
    p: GatheredPool<'a>,
    slices: &'a [ResourceSlice],
    slice_index: Option<&SliceIndex>,
) -> Option<CheckedPool<'a>> {
    let wanted = p.slices[0].spec.pool.resource_slice_count;
    let mut others: Vec<&'a ResourceSlice> = Vec::new();
    if p.slices.len() as i64 != wanted {
        let all = generation_slices(&p, slices, slice_index)?;
        if all.len() as i64 != wanted {
            return Some(CheckedPool {
                pool: pool_view(p.driver, p.name, PoolState::Incomplete, Value::Null),
                relevant: Slices::new(),
                others: Vec::new(),
                binding: false,
            });
        }
        let relevant: HashSet<&str> = p.slices.iter().map(|s| s.metadata.name.as_str()).collect();
        others = all
            .into_iter()
            .filter(|s| !relevant.contains(s.metadata.name.as_str()))
            .collect();
    }
    let mut relevant = p.slices;
    relevant.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let binding = relevant.iter().any(|s| {
        s.spec
            .devices
            .iter()
            .any(|d| !d.binding_conditions.is_empty())
    });
    let driver_value = cel::with_interner(|interner| Value::String(interner.str(p.driver)));
    Some(CheckedPool {
        pool: pool_view(p.driver, p.name, PoolState::Usable, driver_value),
        relevant,
        others,
        binding,
    })
}

/// Every slice of the pool's generation, also those not relevant for this node; `None`
/// when some slice of the pool has a newer generation.
fn generation_slices<'a>(
    p: &GatheredPool<'a>,
    slices: &'a [ResourceSlice],
    slice_index: Option<&SliceIndex>,
) -> Option<Vec<&'a ResourceSlice>> {
    let mut all = Vec::new();
    let of_pool: Vec<&'a ResourceSlice> = match slice_index {
        Some(ix) => ix.pool(slices, p.driver, p.name),
        None => slices.iter().collect(),
    };
    for s in of_pool {
        if s.spec.driver != p.driver || s.spec.pool.name != p.name {
            continue;
        }
        if s.spec.pool.generation == p.generation {
            all.push(s);
        } else if s.spec.pool.generation > p.generation {
            return None;
        }
    }
    Some(all)
}

/// A pool's view before its devices are prepared.
fn pool_view<'a>(
    driver: &'a str,
    name: &'a str,
    state: PoolState,
    driver_value: Value,
) -> PoolView<'a> {
    PoolView {
        driver,
        name,
        state,
        devices: 0..0,
        counter_names: Vec::new(),
        available: Vec::new(),
        amounts: Vec::new(),
        overdrawn: false,
        driver_value,
    }
}
