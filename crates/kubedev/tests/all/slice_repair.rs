//! The ResourceSlices of the `kubedev` binary in DRA mode stay as published when something else
//! deletes or edits them (a kubelet wiping a driver's slices, an operator's mistake), also while
//! two instances run side by side in a rolling update: they are put back within seconds, and
//! the instances never write against each other.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::process::{Env, slices_of, stop};
use kubedev_testkit::apiserver::{Resource, Verb};
use serde_json::{Value, json};

/// How soon a slice someone else deleted or changed must be back.
const REPAIR_WITHIN: Duration = Duration::from_secs(5);

/// The published devices' names, sorted.
fn published(env: &Env) -> Vec<String> {
    let mut names: Vec<String> = slices_of(&env.api)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

/// Waits until the four GPUs are published, at most `within`; returns how long that took.
async fn until_published(env: &Env, what: &str, within: Duration) -> Duration {
    let want = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"];
    let start = Instant::now();
    while published(env) != want {
        assert!(
            start.elapsed() < within,
            "{what}: after {:?} the slices hold {:?}",
            start.elapsed(),
            published(env)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// The slice writes (creates, updates, patches, deletes) the API server has seen since the last
/// reset.
fn writes(env: &Env) -> u64 {
    [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
        .into_iter()
        .map(|v| env.api.request_count(v, Resource::ResourceSlices))
        .sum()
}

fn the_slice(env: &Env) -> Value {
    let slices = slices_of(&env.api);
    assert_eq!(slices.len(), 1, "{slices:?}");
    slices[0].clone()
}

/// Deletes the slice, then replaces its devices with a stranger, each time waiting for the
/// repair; returns the slice writes the repairs took, counted after the writes settled.
async fn delete_then_edit(env: &Env) -> u64 {
    env.api.reset_request_counts();
    let name = the_slice(env)["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    env.api
        .delete_raw(Resource::ResourceSlices, None, &name)
        .unwrap();
    let took = until_published(env, "after a delete", REPAIR_WITHIN).await;
    eprintln!("deleted slice put back after {took:?}");

    let mut edited = the_slice(env);
    edited["spec"]["devices"] = json!([{"name": "stranger"}]);
    env.api.put_raw(Resource::ResourceSlices, edited).unwrap();
    // Wait for the edit to be seen before waiting for the repair.
    let start = Instant::now();
    while published(env) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"] && start.elapsed() < REPAIR_WITHIN
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = until_published(env, "after an edit", REPAIR_WITHIN).await;
    eprintln!("edited slice put back after {took:?}");
    // The test's own writes go around the counted API; let any late writes arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    writes(env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_deleted_or_edited_by_someone_else_is_put_back_promptly() {
    let env = Env::new().await;
    let daemon = env.start("").await;
    until_published(&env, "at start", common::process::WAIT).await;
    let repairs = delete_then_edit(&env).await;
    // One write per repair (a write that meets a conflict is counted again when retried).
    assert!(
        (2..=3).contains(&repairs),
        "two repairs took {repairs} slice writes: {:?}",
        env.api.request_counts()
    );
    stop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rolling_update_two_instances_repair_without_fighting() {
    let env = Env::new().await;
    let old = env.start_pod("", Some("pod-old")).await;
    until_published(&env, "old instance", common::process::WAIT).await;
    let new = env.start_pod("", Some("pod-new")).await;

    // Side by side and agreeing, they leave the slice alone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.api.reset_request_counts();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes(&env), 0, "{:?}", env.api.request_counts());

    // Both see the delete and the edit; the repairs still take a bounded number of writes: at
    // most a create, a delete and an update per instance and repair (both may re-create the
    // deleted slice at once, and one of the two copies then goes).
    let repairs = delete_then_edit(&env).await;
    assert!(
        (2..=12).contains(&repairs),
        "two repairs by two instances took {repairs} slice writes: {:?}",
        env.api.request_counts()
    );

    // The old instance goes; the new one keeps the slice, and repairs it alone.
    stop(old);
    tokio::time::sleep(Duration::from_secs(1)).await;
    until_published(&env, "after the old instance stopped", REPAIR_WITHIN).await;
    let repairs = delete_then_edit(&env).await;
    // One write per repair (a write that meets a conflict is counted again when retried).
    assert!(
        (2..=3).contains(&repairs),
        "two repairs took {repairs} slice writes: {:?}",
        env.api.request_counts()
    );
    stop(new);
}
