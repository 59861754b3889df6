//! Watches: raw watch events and bookmarks, kube-rs watchers recovering after dropped watches
//! and expired resourceVersions, and streaming lists with their initial events.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kubedev_testkit::apiserver::{ApiServer, Resource, Verb};
use serde_json::json;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{DRIVER, WAIT, device, slice};

/// Drives a watcher on its own task, as a controller would, so it keeps reconnecting while the
/// test waits on something else.
fn in_background<S>(stream: S) -> UnboundedReceiverStream<watcher::Event<ResourceSlice>>
where
    S: Stream<Item = watcher::Event<ResourceSlice>> + Send + Unpin + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = stream;
        while let Some(event) = stream.next().await {
            if tx.send(event).is_err() {
                break;
            }
        }
    });
    UnboundedReceiverStream::new(rx)
}

/// Waits for the next event that `pick` accepts.
async fn next_matching<S, T, F>(stream: &mut S, what: &str, mut pick: F) -> T
where
    S: Stream<Item = watcher::Event<ResourceSlice>> + Unpin,
    F: FnMut(watcher::Event<ResourceSlice>) -> Option<T>,
{
    tokio::time::timeout(WAIT, async {
        loop {
            let event = stream.next().await.expect("the watcher stream never ends");
            if let Some(found) = pick(event) {
                return found;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Polls `condition` until it holds.
async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < WAIT, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn raw_watch_streams_added_modified_deleted_and_bookmarks() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    let existing = slices
        .create(
            &PostParams::default(),
            &slice("node-0", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    let list = slices.list(&ListParams::default()).await.expect("list");
    let from = list.metadata.resource_version.expect("rv");

    let mut stream = slices
        .watch(
            &WatchParams::default().fields("spec.nodeName=node-1"),
            &from,
        )
        .await
        .expect("watch")
        .boxed();
    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    slices
        .create(
            &PostParams::default(),
            &slice("node-9", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("other node");
    let mut changed = created.clone();
    changed.spec.pool.generation = 1;
    slices
        .replace(&created.name_any(), &PostParams::default(), &changed)
        .await
        .expect("replace");
    slices
        .delete(&created.name_any(), &DeleteParams::default())
        .await
        .expect("delete");
    // Changing a slice that is not selected produces nothing for this watch.
    slices
        .patch(
            &existing.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("patch");

    let mut kinds = Vec::new();
    let mut bookmark_rv = None;
    tokio::time::timeout(WAIT, async {
        while bookmark_rv.is_none() || kinds.len() < 3 {
            match stream
                .try_next()
                .await
                .expect("watch event")
                .expect("stream open")
            {
                WatchEvent::Added(s) => kinds.push(("ADDED", s.name_any())),
                WatchEvent::Modified(s) => kinds.push(("MODIFIED", s.name_any())),
                WatchEvent::Deleted(s) => kinds.push(("DELETED", s.name_any())),
                WatchEvent::Bookmark(b) if kinds.len() == 3 => {
                    bookmark_rv = Some(b.metadata.resource_version)
                }
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("watch error {e:?}"),
            }
        }
    })
    .await
    .expect("events arrive");
    let n = created.name_any();
    assert_eq!(
        kinds,
        vec![
            ("ADDED", n.clone()),
            ("MODIFIED", n.clone()),
            ("DELETED", n)
        ]
    );
    let bookmark: u64 = bookmark_rv.expect("bookmark").parse().expect("numeric");
    assert!(
        bookmark >= server.resource_version() - 1,
        "bookmarks carry a current resourceVersion"
    );

    // A watch from a compacted resourceVersion answers with a 410 ERROR event.
    server.compact();
    let mut expired = slices
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch opens")
        .boxed();
    match tokio::time::timeout(WAIT, expired.try_next())
        .await
        .expect("event")
        .expect("ok")
    {
        Some(WatchEvent::Error(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn watcher_sees_changes_and_recovers_after_dropped_watches() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    let before = slices
        .create(
            &PostParams::default(),
            &slice("node-0", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");

    let config = watcher::Config::default().fields(&format!("spec.driver={DRIVER}"));
    let mut events = in_background(
        watcher(slices.clone(), config)
            .default_backoff()
            .filter_map(|e| async move { e.ok() })
            .boxed(),
    );
    next_matching(&mut events, "initial list", |e| match e {
        watcher::Event::InitApply(s) if s.name_any() == before.name_any() => Some(()),
        _ => None,
    })
    .await;
    next_matching(&mut events, "InitDone", |e| {
        matches!(e, watcher::Event::InitDone).then_some(())
    })
    .await;

    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    let name = created.name_any();
    next_matching(&mut events, "ADDED", |e| match e {
        watcher::Event::Apply(s) if s.name_any() == name => Some(()),
        _ => None,
    })
    .await;
    let mut changed = created.clone();
    changed.spec.pool.generation = 7;
    slices
        .replace(&name, &PostParams::default(), &changed)
        .await
        .expect("replace");
    next_matching(&mut events, "MODIFIED", |e| match e {
        watcher::Event::Apply(s) if s.spec.pool.generation == 7 => Some(()),
        _ => None,
    })
    .await;

    // Dropped watches: the watcher resumes from its resourceVersion and misses nothing.
    assert_eq!(server.open_watches(), 1);
    let watches_before = server.request_count(Verb::Watch, Resource::ResourceSlices);
    server.drop_watches();
    wait_until("the watcher re-watches", || {
        server.request_count(Verb::Watch, Resource::ResourceSlices) > watches_before
    })
    .await;
    let other = server
        .put_raw(
            Resource::ResourceSlices,
            json!({
                "metadata": {"name": "edited-by-someone-else"},
                "spec": {"driver": DRIVER, "nodeName": "node-5", "pool": {"name": "node-5", "generation": 0, "resourceSliceCount": 1}, "devices": []},
            }),
        )
        .expect("put_raw");
    next_matching(&mut events, "ADDED after a dropped watch", |e| match e {
        watcher::Event::Apply(s) if s.name_any() == "edited-by-someone-else" => Some(()),
        _ => None,
    })
    .await;
    assert!(other.pointer("/metadata/uid").is_some());

    slices
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    next_matching(&mut events, "DELETED", |e| match e {
        watcher::Event::Delete(s) if s.name_any() == name => Some(()),
        _ => None,
    })
    .await;

    // Compaction plus a dropped watch: the resume gets 410 and the watcher lists again.
    let lists_before = server.request_count(Verb::List, Resource::ResourceSlices);
    server.compact();
    server.drop_watches();
    next_matching(&mut events, "re-list after 410", |e| {
        matches!(e, watcher::Event::InitDone).then_some(())
    })
    .await;
    assert!(server.request_count(Verb::List, Resource::ResourceSlices) > lists_before);
    assert!(
        server
            .delete_raw(Resource::ResourceSlices, None, "edited-by-someone-else")
            .is_some()
    );
    next_matching(&mut events, "DELETED by someone else", |e| match e {
        watcher::Event::Delete(s) if s.name_any() == "edited-by-someone-else" => Some(()),
        _ => None,
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_and_their_end() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    for node in ["node-1", "node-2"] {
        slices
            .create(
                &PostParams::default(),
                &slice(node, DRIVER, vec![device(0, false)]),
            )
            .await
            .expect("create");
    }
    let mut events = in_background(
        watcher(slices.clone(), watcher::Config::default().streaming_lists())
            .default_backoff()
            .filter_map(|e| async move { e.ok() })
            .boxed(),
    );
    let mut initial = 0;
    next_matching(&mut events, "initial events end", |e| match e {
        watcher::Event::InitApply(_) => {
            initial += 1;
            None
        }
        watcher::Event::InitDone => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(initial, 2);
    assert_eq!(
        server.request_count(Verb::List, Resource::ResourceSlices),
        0,
        "streaming lists do not list"
    );
    slices
        .create(
            &PostParams::default(),
            &slice("node-3", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    next_matching(&mut events, "ADDED", |e| {
        matches!(e, watcher::Event::Apply(_)).then_some(())
    })
    .await;
    server.shutdown().await;
}
