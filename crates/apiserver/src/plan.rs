//! Comparing the slices that exist with the slices we want, and deciding what to write. Pure:
//! no I/O, so every rule here is unit-tested.

mod content;
mod naming;

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::convert::DesiredPool;
pub(crate) use content::{Accepted, content_key, desired_spec};
use content::{expected_key, keep_taint_times};
use naming::decode_index;
pub(crate) use naming::{generate_name, index_len};

/// Who we are: every slice we own has this driver and node.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) driver: String,
    pub(crate) node: String,
}

fn has_owner(meta: &ObjectMeta, owner: &OwnerReference) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner.uid && o.controller == Some(true))
}

fn with_owner(meta: &mut ObjectMeta, owner: &OwnerReference) {
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    // One controller only: ours replaces any other controller reference to a Node.
    refs.retain(|o| !(o.controller == Some(true) && o.uid != owner.uid));
    if !refs.iter().any(|o| o.uid == owner.uid) {
        refs.push(owner.clone());
    }
}

/// Writes that bring one pool (or all our pools) to the desired state.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Slices to delete, first.
    pub(crate) deletes: Vec<res::ResourceSlice>,
    /// Whole slices to replace (with their current resourceVersion), second.
    pub(crate) updates: Vec<res::ResourceSlice>,
    /// New slices (with `generateName`), last.
    pub(crate) creates: Vec<res::ResourceSlice>,
}

impl Plan {
    pub(crate) fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.updates.is_empty() && self.creates.is_empty()
    }

    fn extend(&mut self, other: Plan) {
        self.deletes.extend(other.deletes);
        self.updates.extend(other.updates);
        self.creates.extend(other.creates);
    }
}

/// Plans every pool: slices of pools no longer wanted are deleted.
///
/// `current` holds our slices as we know them (only those of our driver and node).
pub(crate) fn plan(
    id: &Identity,
    owner: Option<&OwnerReference>,
    desired: &[DesiredPool],
    current: &[res::ResourceSlice],
    accepted: &Accepted,
) -> Plan {
    let mut by_pool: BTreeMap<&str, Vec<&res::ResourceSlice>> = BTreeMap::new();
    for slice in current {
        by_pool
            .entry(slice.spec.pool.name.as_str())
            .or_default()
            .push(slice);
    }
    let wanted: HashSet<&str> = desired.iter().map(|p| p.name.as_str()).collect();
    let mut out = Plan::default();
    for (pool, slices) in &by_pool {
        if !wanted.contains(pool) {
            out.deletes.extend(slices.iter().map(|s| (*s).clone()));
        }
    }
    for pool in desired {
        let slices = by_pool
            .get(pool.name.as_str())
            .map_or(&[][..], Vec::as_slice);
        out.extend(plan_pool(id, owner, pool, slices, accepted));
    }
    out
}

/// Plans one pool.
///
/// Existing slices are matched to desired ones by the index their name starts with; slices of
/// an older generation, with a name that carries no index of the expected length, with an
/// index beyond the pool, or a second slice for one index are obsolete and deleted. If any
/// matched slice differs from what we want, or a slice is missing, the pool's generation goes
/// up by one and every slice is written at the new generation; otherwise nothing is written
/// (apart from adding a missing owner reference, which leaves the generation alone).
pub(crate) fn plan_pool(
    id: &Identity,
    owner: Option<&OwnerReference>,
    pool: &DesiredPool,
    current: &[&res::ResourceSlice],
    accepted: &Accepted,
) -> Plan {
    let mut out = Plan::default();
    let newest = current
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let len = index_len(pool.slices.len());
    let matched = match_by_index(current, newest, len, pool.slices.len(), &mut out.deletes);
    let changed = matched.len() != pool.slices.len()
        || matched_content_differs(id, pool, &matched, newest, accepted);
    let generation = if changed {
        newest.saturating_add(1)
    } else {
        newest
    };

    for (i, desired) in pool.slices.iter().enumerate() {
        let mut spec = desired_spec(id, pool, desired, generation);
        match matched.get(&i) {
            Some(current) => {
                let owner_missing = owner.is_some_and(|o| !has_owner(&current.metadata, o));
                if !changed && !owner_missing {
                    continue;
                }
                let mut slice = (*current).clone();
                keep_taint_times(&current.spec, &mut spec);
                slice.spec = spec;
                if let Some(o) = owner {
                    with_owner(&mut slice.metadata, o);
                }
                out.updates.push(slice);
            }
            None => {
                let metadata = ObjectMeta {
                    generate_name: Some(generate_name(i, len, id)),
                    owner_references: owner.map(|o| vec![o.clone()]),
                    ..Default::default()
                };
                out.creates.push(res::ResourceSlice { metadata, spec });
            }
        }
    }
    out
}

/// Matches the pool's current slices (at the `newest` generation, their names starting with
/// an index of `len` digits below `slices`) to the desired slices by index; the others go to
/// `obsolete`.
fn match_by_index<'s>(
    current: &[&'s res::ResourceSlice],
    newest: i64,
    len: usize,
    slices: usize,
    obsolete: &mut Vec<res::ResourceSlice>,
) -> BTreeMap<usize, &'s res::ResourceSlice> {
    // Stable order: by name, so the same input always gives the same plan.
    let mut sorted: Vec<&res::ResourceSlice> = current.to_vec();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut matched: BTreeMap<usize, &res::ResourceSlice> = BTreeMap::new();
    for slice in sorted {
        let index = slice
            .metadata
            .name
            .as_deref()
            .and_then(|n| decode_index(n, len));
        match index {
            Some(i)
                if slice.spec.pool.generation == newest
                    && i < slices
                    && !matched.contains_key(&i) =>
            {
                matched.insert(i, slice);
            }
            _ => obsolete.push(slice.clone()),
        }
    }
    matched
}

/// True when a matched slice's content is not what we want at generation `newest` (nor
/// what the server is known to store for it).
fn matched_content_differs(
    id: &Identity,
    pool: &DesiredPool,
    matched: &BTreeMap<usize, &res::ResourceSlice>,
    newest: i64,
    accepted: &Accepted,
) -> bool {
    matched.iter().any(|(i, slice)| {
        let want = content_key(&desired_spec(id, pool, &pool.slices[*i], newest));
        content_key(&slice.spec) != expected_key(&want, accepted)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
