//! Tests of the store: generated names, optimistic concurrency and no-op updates, history
//! compaction.

use serde_json::json;

use super::object::NAME_SUFFIX_ALPHABET;
use super::*;

fn store(history: usize) -> Store {
    let release = crate::apiserver::KubeRelease::NEWEST;
    Store::new(
        history,
        Strategy::new(release, release.default_feature_gates()),
    )
}

fn node(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {}})
}

#[test]
fn generate_name_gets_five_random_characters() {
    let store = store(100);
    let obj = store
        .create(
            Resource::Nodes,
            None,
            json!({"metadata": {"generateName": "node-"}}),
            &WriteOptions::default(),
        )
        .expect("create")
        .object;
    let name = meta_str(&obj, "name");
    assert_eq!(name.len(), 10, "{name}");
    assert!(
        name[5..].bytes().all(|b| NAME_SUFFIX_ALPHABET.contains(&b)),
        "{name}"
    );
}

#[test]
fn stale_update_conflicts_and_noop_keeps_version() {
    let store = store(100);
    let created = store
        .create(Resource::Nodes, None, node("n"), &WriteOptions::default())
        .expect("create")
        .object;
    let key = Key::new(None, "n");
    let same = store
        .update(
            Resource::Nodes,
            &key,
            created.clone(),
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("noop")
        .object;
    assert_eq!(
        meta_str(&same, "resourceVersion"),
        meta_str(&created, "resourceVersion")
    );
    let mut changed = created.clone();
    changed["spec"]["unschedulable"] = json!(true);
    store
        .update(
            Resource::Nodes,
            &key,
            changed.clone(),
            Target::Main,
            &WriteOptions::default(),
        )
        .expect("update");
    let err = store
        .update(
            Resource::Nodes,
            &key,
            changed,
            Target::Main,
            &WriteOptions::default(),
        )
        .expect_err("stale");
    assert_eq!((err.code, err.reason), (409, "Conflict"));
}

#[test]
fn history_compaction_expires_old_watches() {
    let store = store(2);
    for i in 0..5 {
        store
            .create(
                Resource::Nodes,
                None,
                node(&format!("n{i}")),
                &WriteOptions::default(),
            )
            .expect("create");
    }
    let err = store
        .watch(Resource::Nodes, WatchStart::After(1))
        .expect_err("too old");
    assert_eq!(err.code, 410);
    let ok = store
        .watch(
            Resource::Nodes,
            WatchStart::After(store.resource_version() - 1),
        )
        .expect("recent");
    assert_eq!(ok.backlog.len(), 1);
}
