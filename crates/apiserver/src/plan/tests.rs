use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::naming::encode_index;
use super::*;
use crate::convert::DesiredSlice;

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
