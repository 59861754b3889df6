//! Comparing the slices that exist with the slices we want, and deciding what to write. Pure:
//! no I/O, so every rule here is unit-tested.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::convert::{DesiredPool, DesiredSlice};

/// The shortest slice index in a name, in hex digits.
const MIN_INDEX_LEN: usize = 5;
/// The longest `generateName` the API server keeps (it appends five random characters to at
/// most this many).
const MAX_GENERATE_NAME_LEN: usize = 58;

/// Who we are: every slice we own has this driver and node.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) driver: String,
    pub(crate) node: String,
}

/// Hex digits needed for the indexes of `slices` slices (at least five).
pub(crate) fn index_len(slices: usize) -> usize {
    let highest = slices.saturating_sub(1);
    let digits = format!("{highest:x}").len();
    digits.max(MIN_INDEX_LEN)
}

/// The index prefix of a slice name.
pub(crate) fn encode_index(index: usize, len: usize) -> String {
    format!("{index:0len$x}")
}

/// The index a slice name starts with, if it starts with exactly `len` hex digits and a '-'.
pub(crate) fn decode_index(name: &str, len: usize) -> Option<usize> {
    let dash = name.find('-')?;
    if dash != len {
        return None;
    }
    let prefix = &name[..dash];
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    usize::from_str_radix(prefix, 16).ok()
}

/// `<index>-<driver>-<node>-`, lowercased, with anything a DNS subdomain cannot hold replaced
/// by '-', cut to the length the API server keeps.
pub(crate) fn generate_name(index: usize, len: usize, id: &Identity) -> String {
    let raw = format!("{}-{}-{}-", encode_index(index, len), id.driver, id.node);
    let mut name: String = raw
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(MAX_GENERATE_NAME_LEN);
    name
}

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

fn none_if_empty<T>(v: &mut Option<Vec<T>>) {
    if v.as_ref().is_some_and(Vec::is_empty) {
        *v = None;
    }
}

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
fn keep_taint_times(current: &res::ResourceSliceSpec, desired: &mut res::ResourceSliceSpec) {
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
fn expected_key<'a>(desired_key: &'a str, accepted: &'a Accepted) -> &'a str {
    accepted
        .get(desired_key)
        .map_or(desired_key, String::as_str)
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
                    && i < pool.slices.len()
                    && !matched.contains_key(&i) =>
            {
                matched.insert(i, slice);
            }
            _ => out.deletes.push(slice.clone()),
        }
    }

    let mut changed = matched.len() != pool.slices.len();
    if !changed {
        for (i, slice) in &matched {
            let want = content_key(&desired_spec(id, pool, &pool.slices[*i], newest));
            if content_key(&slice.spec) != expected_key(&want, accepted) {
                changed = true;
                break;
            }
        }
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn id() -> Identity {
        Identity {
            driver: "gpu.example.com".into(),
            node: "node-a".into(),
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "node-a".into(),
            uid: "uid-node-a".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    fn device(name: &str) -> res::Device {
        res::Device {
            name: name.into(),
            ..Default::default()
        }
    }

    fn pool(slices: &[&[&str]]) -> DesiredPool {
        DesiredPool {
            name: "node-a".into(),
            slices: slices
                .iter()
                .map(|names| DesiredSlice {
                    devices: names.iter().map(|n| device(n)).collect(),
                    shared_counters: Vec::new(),
                })
                .collect(),
        }
    }

    /// Applies a plan the way the API server would, naming created slices `<generateName>xxxxx`.
    fn apply(state: &mut Vec<res::ResourceSlice>, plan: &Plan, counter: &mut u32) {
        for d in &plan.deletes {
            state.retain(|s| s.metadata.name != d.metadata.name);
        }
        for u in &plan.updates {
            let slot = state
                .iter_mut()
                .find(|s| s.metadata.name == u.metadata.name)
                .unwrap();
            *slot = u.clone();
        }
        for c in &plan.creates {
            let mut c = c.clone();
            *counter += 1;
            c.metadata.name = Some(format!(
                "{}{:05}",
                c.metadata.generate_name.as_deref().unwrap(),
                counter
            ));
            state.push(c);
        }
    }

    fn converge(
        state: &mut Vec<res::ResourceSlice>,
        desired: &[DesiredPool],
        counter: &mut u32,
    ) -> Plan {
        let p = plan(&id(), Some(&owner()), desired, state, &Accepted::new());
        apply(state, &p, counter);
        p
    }

    fn generations(state: &[res::ResourceSlice]) -> Vec<i64> {
        state.iter().map(|s| s.spec.pool.generation).collect()
    }

    #[test]
    fn index_prefixes() {
        assert_eq!(index_len(0), 5);
        assert_eq!(index_len(1), 5);
        assert_eq!(index_len(0x100000), 5);
        assert_eq!(index_len(0x100001), 6);
        assert_eq!(encode_index(10, 5), "0000a");
        assert_eq!(
            decode_index("0000a-gpu.example.com-node-a-xyz12", 5),
            Some(10)
        );
        assert_eq!(decode_index("0000A-gpu", 5), None);
        assert_eq!(decode_index("000a-gpu", 5), None);
        assert_eq!(decode_index("node-a-gpu.example.com-x", 5), None);
        assert_eq!(decode_index("nodes", 5), None);
    }

    #[test]
    fn generate_names_start_with_the_index_and_fit() {
        assert_eq!(generate_name(0, 5, &id()), "00000-gpu.example.com-node-a-");
        let long = Identity {
            driver: "a-very-long-driver-name.devices.example.com".into(),
            node: "Worker_Node-With-A-Rather-Long-Name.cluster.internal".into(),
        };
        let name = generate_name(3, 5, &long);
        assert_eq!(name.len(), 58);
        assert!(name.starts_with("00003-a-very-long-driver-name.devices.example.com-worker-"));
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        );
    }

    #[test]
    fn first_publish_creates_every_slice_at_generation_one() {
        let mut state = Vec::new();
        let mut n = 0;
        let p = converge(&mut state, &[pool(&[&["a"], &["b"], &["c"]])], &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (0, 0, 3)
        );
        assert_eq!(generations(&state), vec![1, 1, 1]);
        for (i, s) in state.iter().enumerate() {
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            assert_eq!(s.spec.driver, "gpu.example.com");
            assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
            assert!(
                s.metadata
                    .name
                    .as_deref()
                    .unwrap()
                    .starts_with(&format!("0000{i}-"))
            );
            let owners = s.metadata.owner_references.as_ref().unwrap();
            assert_eq!(owners, &vec![owner()]);
        }
    }

    #[test]
    fn the_same_content_writes_nothing() {
        let mut state = Vec::new();
        let mut n = 0;
        let desired = [pool(&[&["a"], &["b"]])];
        converge(&mut state, &desired, &mut n);
        let p = converge(&mut state, &desired, &mut n);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(generations(&state), vec![1, 1]);
    }

    #[test]
    fn a_change_bumps_the_generation_of_every_slice() {
        let mut state = Vec::new();
        let mut n = 0;
        converge(&mut state, &[pool(&[&["a"], &["b"]])], &mut n);
        let p = converge(&mut state, &[pool(&[&["a"], &["b", "c"]])], &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (0, 2, 0)
        );
        assert_eq!(generations(&state), vec![2, 2]);
        // Names (and so the objects) are kept.
        assert_eq!(n, 2);
    }

    #[test]
    fn a_shrinking_pool_deletes_first_then_updates() {
        let mut state = Vec::new();
        let mut n = 0;
        converge(&mut state, &[pool(&[&["a"], &["b"], &["c"]])], &mut n);
        let p = converge(&mut state, &[pool(&[&["a"]])], &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (2, 1, 0)
        );
        assert_eq!(state.len(), 1);
        assert_eq!(state[0].spec.pool.resource_slice_count, 1);
        assert_eq!(state[0].spec.pool.generation, 2);
    }

    #[test]
    fn a_growing_pool_changes_the_index_length_and_replaces_every_slice() {
        // Hardly practical (a million slices) but the rule must hold: names with a shorter
        // index are obsolete.
        let mut slice = res::ResourceSlice::default();
        slice.metadata.name = Some("0000-gpu.example.com-node-a-abcde".into());
        slice.spec = desired_spec(&id(), &pool(&[&["a"]]), &pool(&[&["a"]]).slices[0], 4);
        let p = plan(&id(), None, &[pool(&[&["a"]])], &[slice], &Accepted::new());
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (1, 0, 1)
        );
        assert_eq!(p.creates[0].spec.pool.generation, 5);
    }

    #[test]
    fn an_external_edit_is_repaired_with_a_new_generation() {
        let mut state = Vec::new();
        let mut n = 0;
        let desired = [pool(&[&["a"], &["b"]])];
        converge(&mut state, &desired, &mut n);
        state[1].spec.devices = Some(vec![device("intruder")]);
        let p = converge(&mut state, &desired, &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (0, 2, 0)
        );
        assert_eq!(generations(&state), vec![2, 2]);
        assert_eq!(state[1].spec.devices.as_ref().unwrap()[0].name, "b");
        assert!(converge(&mut state, &desired, &mut n).is_empty());
    }

    #[test]
    fn an_external_delete_is_repaired() {
        let mut state = Vec::new();
        let mut n = 0;
        let desired = [pool(&[&["a"], &["b"]])];
        converge(&mut state, &desired, &mut n);
        state.remove(0);
        let p = converge(&mut state, &desired, &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (0, 1, 1)
        );
        assert_eq!(generations(&state), vec![2, 2]);
        assert!(converge(&mut state, &desired, &mut n).is_empty());
    }

    #[test]
    fn stale_generations_duplicates_and_foreign_names_are_deleted() {
        let mut state = Vec::new();
        let mut n = 0;
        let desired = [pool(&[&["a"], &["b"]])];
        converge(&mut state, &desired, &mut n);
        let mut stale = state[0].clone();
        stale.metadata.name = Some("00000-gpu.example.com-node-a-stale".into());
        stale.spec.pool.generation = 0;
        let mut duplicate = state[1].clone();
        duplicate.metadata.name = Some("00001-gpu.example.com-node-a-zzzzz".into());
        let mut foreign = state[1].clone();
        foreign.metadata.name = Some("node-a-gpu.example.com-qwert".into());
        let mut beyond = state[1].clone();
        beyond.metadata.name = Some("00007-gpu.example.com-node-a-qwert".into());
        state.extend([stale, duplicate, foreign, beyond]);
        let p = converge(&mut state, &desired, &mut n);
        let mut deleted: Vec<&str> = p
            .deletes
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap())
            .collect();
        deleted.sort();
        assert_eq!(
            deleted,
            vec![
                "00000-gpu.example.com-node-a-stale",
                "00001-gpu.example.com-node-a-zzzzz",
                "00007-gpu.example.com-node-a-qwert",
                "node-a-gpu.example.com-qwert",
            ]
        );
        assert!(p.updates.is_empty() && p.creates.is_empty(), "{p:?}");
    }

    #[test]
    fn slices_of_pools_no_longer_published_are_deleted() {
        let mut state = Vec::new();
        let mut n = 0;
        let mut other = pool(&[&["x"]]);
        other.name = "node-a/extra".into();
        converge(&mut state, &[pool(&[&["a"]]), other], &mut n);
        assert_eq!(state.len(), 2);
        let p = converge(&mut state, &[pool(&[&["a"]])], &mut n);
        assert_eq!(
            (p.deletes.len(), p.updates.len(), p.creates.len()),
            (1, 0, 0)
        );
        assert_eq!(state.len(), 1);
        let p = converge(&mut state, &[], &mut n);
        assert_eq!(p.deletes.len(), 1);
        assert!(state.is_empty());
    }

    #[test]
    fn a_missing_owner_is_added_without_a_new_generation() {
        let desired = [pool(&[&["a"]])];
        let first = plan(&id(), None, &desired, &[], &Accepted::new());
        let mut state = Vec::new();
        let mut n = 0;
        apply(&mut state, &first, &mut n);
        assert!(state[0].metadata.owner_references.is_none());
        let p = converge(&mut state, &desired, &mut n);
        assert_eq!(p.updates.len(), 1);
        assert_eq!(generations(&state), vec![1]);
        assert_eq!(
            state[0].metadata.owner_references.as_ref().unwrap(),
            &vec![owner()]
        );
    }

    #[test]
    fn server_spelling_and_taint_times_are_not_changes() {
        let mut desired = pool(&[&["a"]]);
        desired.slices[0].devices[0].capacity = Some(
            [(
                "memory".to_owned(),
                res::DeviceCapacity {
                    value: Quantity("1Gi".into()),
                    request_policy: None,
                },
            )]
            .into_iter()
            .collect(),
        );
        desired.slices[0].devices[0].taints = Some(vec![res::DeviceTaint {
            key: "example.com/t".into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        }]);
        let desired = [desired];
        let mut state = Vec::new();
        let mut n = 0;
        converge(&mut state, &desired, &mut n);
        // The server stamps the taint and spells the quantity its own way.
        let stamped = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        );
        {
            let dev = &mut state[0].spec.devices.as_mut().unwrap()[0];
            dev.taints.as_mut().unwrap()[0].time_added = Some(stamped.clone());
            dev.capacity
                .as_mut()
                .unwrap()
                .get_mut("memory")
                .unwrap()
                .value = Quantity("1024Mi".into());
            dev.attributes = Some(BTreeMap::new());
        }
        assert!(converge(&mut state, &desired, &mut n).is_empty());

        // A real change keeps the stamp on the unchanged taint.
        let mut changed = desired[0].clone();
        changed.slices[0].devices.push(device("b"));
        let p = converge(&mut state, &[changed], &mut n);
        assert_eq!(p.updates.len(), 1);
        let taint = &state[0].spec.devices.as_ref().unwrap()[0]
            .taints
            .as_ref()
            .unwrap()[0];
        assert_eq!(taint.time_added, Some(stamped));
    }

    #[test]
    fn accepted_server_content_stops_rewrites() {
        let mut desired = pool(&[&["a"]]);
        desired.slices[0].devices[0].taints = Some(vec![res::DeviceTaint {
            key: "example.com/t".into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        }]);
        let desired = [desired];
        let mut state = Vec::new();
        let mut n = 0;
        converge(&mut state, &desired, &mut n);
        // The server dropped the taints (feature off).
        let sent = content_key(&state[0].spec);
        state[0].spec.devices.as_mut().unwrap()[0].taints = None;
        let stored = content_key(&state[0].spec);
        let mut accepted = Accepted::new();
        let p = plan(&id(), Some(&owner()), &desired, &state, &accepted);
        assert_eq!(
            p.updates.len(),
            1,
            "without the record the slice is rewritten"
        );
        accepted.insert(sent, stored);
        let p = plan(&id(), Some(&owner()), &desired, &state, &accepted);
        assert!(p.is_empty(), "{p:?}");
    }
}
