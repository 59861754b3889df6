//! The API-server emulator driven through kube-rs, as kubedev's publisher and claim reader use it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, Device, DeviceAllocationResult, DeviceAttribute,
    DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceRequestAllocationResult,
    DeviceTaint, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimStatus,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use kubedev_testkit::apiserver::{ApiServer, Fault, Resource, Verb};
use serde_json::json;
use tokio_stream::wrappers::UnboundedReceiverStream;

const DRIVER: &str = "gpu.kubedev.example.com";
const WAIT: Duration = Duration::from_secs(10);

fn device(i: usize, tainted: bool) -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "model".to_owned(),
        DeviceAttribute {
            string: Some("A100".to_owned()),
            ..Default::default()
        },
    );
    attributes.insert(
        "index".to_owned(),
        DeviceAttribute {
            int: Some(i as i64),
            ..Default::default()
        },
    );
    Device {
        name: format!("gpu-{i}"),
        attributes: Some(attributes),
        taints: tainted.then(|| {
            vec![DeviceTaint {
                key: "kubedev.example.com/unhealthy".to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

fn slice(node: &str, driver: &str, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}-{driver}-")),
            labels: Some(BTreeMap::from([(
                "kubedev.example.com/node".to_owned(),
                node.to_owned(),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn client_from_kubeconfig(server: &ApiServer) -> Client {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).expect("write kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig is usable");
    assert_eq!(config.default_namespace, "default");
    Client::try_from(config).expect("client")
}

#[tokio::test]
async fn create_with_generate_name_get_and_list_with_selectors() {
    let server = ApiServer::start().await.expect("start");
    let client = client_from_kubeconfig(&server).await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    let first = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    let name = first.name_any();
    let prefix = format!("node-1-{DRIVER}-");
    assert!(name.starts_with(&prefix), "{name}");
    let suffix = &name[prefix.len()..];
    assert_eq!(suffix.len(), 5, "{name}");
    assert!(
        suffix
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
        "{name}"
    );
    assert_eq!(first.metadata.generation, Some(1));
    assert!(first.metadata.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(first.metadata.creation_timestamp.is_some());
    let rv1: u64 = first
        .resource_version()
        .expect("rv")
        .parse()
        .expect("numeric rv");

    slices
        .create(
            &PostParams::default(),
            &slice("node-1", "other.example.com", vec![device(0, false)]),
        )
        .await
        .expect("create");
    let third = slices
        .create(
            &PostParams::default(),
            &slice("node-2", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    assert!(
        third
            .resource_version()
            .expect("rv")
            .parse::<u64>()
            .expect("numeric")
            > rv1
    );

    let got = slices.get(&name).await.expect("get");
    assert_eq!(got.spec, first.spec);
    assert_eq!(got.metadata.uid, first.metadata.uid);

    let names = |list: kube::core::ObjectList<ResourceSlice>| {
        let mut v: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
        v.sort();
        v
    };
    let on_node_1 = slices
        .list(&ListParams::default().fields("spec.nodeName=node-1"))
        .await
        .expect("list");
    assert_eq!(on_node_1.items.len(), 2);
    let list_rv: u64 = on_node_1
        .metadata
        .resource_version
        .clone()
        .expect("list rv")
        .parse()
        .expect("numeric");
    assert!(list_rv >= rv1);
    let ours = slices
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER},spec.nodeName=node-1")))
        .await
        .expect("list");
    assert_eq!(names(ours), vec![name.clone()]);
    let by_name = slices
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .expect("list");
    assert_eq!(names(by_name), vec![name.clone()]);
    let not_ours = slices
        .list(&ListParams::default().fields(&format!("spec.driver!={DRIVER}")))
        .await
        .expect("list");
    assert_eq!(not_ours.items.len(), 1);
    let by_label = slices
        .list(&ListParams::default().labels("kubedev.example.com/node=node-2"))
        .await
        .expect("list");
    assert_eq!(names(by_label), vec![third.name_any()]);
    let all = slices.list(&ListParams::default()).await.expect("list");
    assert_eq!(all.items.len(), 3);

    let unsupported = api_error(
        slices
            .list(&ListParams::default().fields("spec.pool.name=node-1"))
            .await,
    );
    assert_eq!(unsupported.code, 400);
    assert!(
        unsupported.message.contains("spec.pool.name"),
        "{}",
        unsupported.message
    );

    let missing = api_error(slices.get("no-such-slice").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));

    let mut duplicate = slice("node-3", DRIVER, vec![device(0, false)]);
    duplicate.metadata.generate_name = None;
    duplicate.metadata.name = Some(name.clone());
    let exists = api_error(slices.create(&PostParams::default(), &duplicate).await);
    assert_eq!(
        (exists.code, exists.reason.as_str()),
        (409, "AlreadyExists")
    );

    // The direct helper builds an equivalent client.
    let direct: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    assert_eq!(
        direct
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        3
    );
    assert_eq!(server.objects(Resource::ResourceSlices).len(), 3);
    server.shutdown().await;
}

#[tokio::test]
async fn replace_with_stale_resource_version_conflicts() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    let name = created.name_any();

    // Writing the same content changes nothing: same resourceVersion, same generation.
    let same = slices
        .replace(&name, &PostParams::default(), &created)
        .await
        .expect("no-op replace");
    assert_eq!(same.resource_version(), created.resource_version());

    let mut changed = created.clone();
    changed.spec.pool.generation = 1;
    changed.spec.devices = Some(vec![device(0, false), device(1, false)]);
    let updated = slices
        .replace(&name, &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_eq!(updated.metadata.generation, Some(2));
    assert_ne!(updated.resource_version(), created.resource_version());

    // A label change alone does not bump the generation.
    let mut labelled = updated.clone();
    labelled
        .labels_mut()
        .insert("extra".to_owned(), "yes".to_owned());
    let labelled = slices
        .replace(&name, &PostParams::default(), &labelled)
        .await
        .expect("replace");
    assert_eq!(labelled.metadata.generation, Some(2));

    let stale = api_error(
        slices
            .replace(&name, &PostParams::default(), &changed)
            .await,
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    assert!(
        stale.message.contains("the object has been modified"),
        "{}",
        stale.message
    );

    // Without a resourceVersion the update is unconditional.
    let mut unconditional = changed.clone();
    unconditional.metadata.resource_version = None;
    unconditional.spec.pool.generation = 2;
    slices
        .replace(&name, &PostParams::default(), &unconditional)
        .await
        .expect("unconditional replace");

    // Immutable fields stay immutable.
    let mut moved = slices.get(&name).await.expect("get");
    moved.spec.node_name = Some("node-2".to_owned());
    moved.spec.pool.name = "node-2".to_owned();
    let invalid = api_error(slices.replace(&name, &PostParams::default(), &moved).await);
    assert_eq!((invalid.code, invalid.reason.as_str()), (422, "Invalid"));
    assert!(
        invalid.message.contains("spec.nodeName: Invalid value"),
        "{}",
        invalid.message
    );
    assert!(
        invalid.message.contains("spec.pool.name"),
        "{}",
        invalid.message
    );

    let gone = api_error(
        slices
            .replace("nope", &PostParams::default(), &{
                let mut s = changed.clone();
                s.metadata.name = Some("nope".to_owned());
                s
            })
            .await,
    );
    assert_eq!(gone.code, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn delete_with_preconditions_and_finalizers() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));
    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("create");
    let name = created.name_any();

    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api_error(slices.delete(&name, &wrong_uid).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("UID in precondition"),
        "{}",
        err.message
    );

    let wrong_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".to_owned()),
        }),
        ..Default::default()
    };
    let err = api_error(slices.delete(&name, &wrong_rv).await);
    assert_eq!(err.code, 409);
    assert!(
        err.message.contains("ResourceVersion in precondition"),
        "{}",
        err.message
    );

    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: created.resource_version(),
        }),
        ..Default::default()
    };
    let deleted = slices.delete(&name, &right).await.expect("delete");
    assert!(
        deleted.is_right(),
        "immediate deletion answers with a Status"
    );
    assert_eq!(api_error(slices.get(&name).await).code, 404);
    assert_eq!(
        api_error(slices.delete(&name, &DeleteParams::default()).await).code,
        404
    );

    // With a finalizer the object stays, marked for deletion, until the finalizer is removed.
    let mut held = slice("node-2", DRIVER, vec![device(0, false)]);
    held.metadata.finalizers = Some(vec!["kubedev.example.com/hold".to_owned()]);
    let held = slices
        .create(&PostParams::default(), &held)
        .await
        .expect("create");
    let pending = slices
        .delete(&held.name_any(), &DeleteParams::default())
        .await
        .expect("delete");
    let pending = pending
        .left()
        .expect("the object comes back while finalizers hold it");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(slices.get(&held.name_any()).await.is_ok());
    slices
        .patch(
            &held.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove finalizer");
    assert_eq!(api_error(slices.get(&held.name_any()).await).code, 404);

    // Collections.
    for node in ["a", "b", "c"] {
        slices
            .create(
                &PostParams::default(),
                &slice(&format!("node-{node}"), DRIVER, vec![device(0, false)]),
            )
            .await
            .expect("create");
    }
    let removed = slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields("spec.nodeName=node-a"),
        )
        .await
        .expect("delete collection");
    assert_eq!(removed.left().expect("list of deleted").items.len(), 1);
    assert_eq!(
        slices
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    server.shutdown().await;
}

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

#[tokio::test]
async fn validation_rejects_oversized_slices_naming_the_field() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));

    let full = slice(
        "node-1",
        DRIVER,
        (0..128).map(|i| device(i, false)).collect(),
    );
    slices
        .create(&PostParams::default(), &full)
        .await
        .expect("128 devices fit");
    let too_many = slice(
        "node-1",
        DRIVER,
        (0..129).map(|i| device(i, false)).collect(),
    );
    let err = api_error(slices.create(&PostParams::default(), &too_many).await);
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message
            .contains("spec.devices: Too many: 129: must have at most 128 items"),
        "{}",
        err.message
    );
    let details = err.details.as_ref().expect("details");
    assert_eq!(details.causes[0].field, "spec.devices");
    assert_eq!(details.kind, "ResourceSlice");

    let tainted_ok = slice("node-2", DRIVER, (0..64).map(|i| device(i, true)).collect());
    slices
        .create(&PostParams::default(), &tainted_ok)
        .await
        .expect("64 tainted devices fit");
    let mut tainted = slice(
        "node-2",
        DRIVER,
        (0..64).map(|i| device(i, false)).collect(),
    );
    tainted
        .spec
        .devices
        .as_mut()
        .expect("devices")
        .push(device(64, true));
    let err = api_error(slices.create(&PostParams::default(), &tainted).await);
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("spec.devices: Too many: 65: must have at most 64 items"),
        "{}",
        err.message
    );

    let mut bad = slice(
        "node-3",
        "Bad_Driver",
        vec![device(0, false), device(0, false)],
    );
    bad.spec.all_nodes = Some(true);
    let err = api_error(slices.create(&PostParams::default(), &bad).await);
    for needle in [
        "spec.driver: Invalid value: \"Bad_Driver\"",
        "spec: Invalid value",
        "spec.devices[1]: Duplicate value: \"gpu-0\"",
    ] {
        assert!(
            err.message.contains(needle),
            "{needle} missing from {}",
            err.message
        );
    }
    assert_eq!(
        server.objects(Resource::ResourceSlices).len(),
        2,
        "rejected slices are not stored"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn fault_injection_failures_latency_and_counts() {
    let server = ApiServer::start().await.expect("start");
    let slices: Api<ResourceSlice> = Api::all(server.client().expect("client"));

    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1,
        Fault::InternalError,
    );
    let err = api_error(
        slices
            .create(
                &PostParams::default(),
                &slice("node-1", DRIVER, vec![device(0, false)]),
            )
            .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert!(server.objects(Resource::ResourceSlices).is_empty());
    let created = slices
        .create(
            &PostParams::default(),
            &slice("node-1", DRIVER, vec![device(0, false)]),
        )
        .await
        .expect("next create works");
    assert_eq!(
        server.request_count(Verb::Create, Resource::ResourceSlices),
        2
    );

    server.fail_next(Verb::Update, Resource::ResourceSlices, 2, Fault::Conflict);
    for _ in 0..2 {
        let err = api_error(
            slices
                .replace(&created.name_any(), &PostParams::default(), &created)
                .await,
        );
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    }
    slices
        .replace(&created.name_any(), &PostParams::default(), &created)
        .await
        .expect("third update works");
    // Faults match their verb and resource only.
    server.fail_next(Verb::Delete, Resource::Nodes, 1, Fault::InternalError);
    slices.get(&created.name_any()).await.expect("unaffected");
    server.clear_faults();

    server.set_latency(Duration::from_millis(300));
    let started = Instant::now();
    slices.get(&created.name_any()).await.expect("get");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "latency applies: {:?}",
        started.elapsed()
    );
    server.set_latency(Duration::ZERO);

    let counts = server.request_counts();
    assert_eq!(
        counts.get(&(Verb::Update, Resource::ResourceSlices)),
        Some(&3)
    );
    assert_eq!(counts.get(&(Verb::Get, Resource::ResourceSlices)), Some(&2));
    server.reset_request_counts();
    assert_eq!(server.request_count(Verb::Get, Resource::ResourceSlices), 0);
    server.shutdown().await;
}

fn claim() -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("claim-1".to_owned()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".to_owned(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "gpu.example.com".to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: Some(ResourceClaimStatus {
            reserved_for: None,
            ..Default::default()
        }),
    }
}

fn allocation() -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(vec![DeviceRequestAllocationResult {
                request: "gpu".to_owned(),
                driver: DRIVER.to_owned(),
                pool: "node-1".to_owned(),
                device: "gpu-0".to_owned(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn resource_claim_status_goes_through_the_status_subresource() {
    let server = ApiServer::start().await.expect("start");
    let claims: Api<ResourceClaim> = Api::namespaced(server.client().expect("client"), "team-a");

    let mut with_status = claim();
    with_status.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let created = claims
        .create(&PostParams::default(), &with_status)
        .await
        .expect("create");
    assert!(
        created
            .status
            .as_ref()
            .is_none_or(|s| s.allocation.is_none()),
        "status is dropped on create"
    );
    assert_eq!(created.metadata.namespace.as_deref(), Some("team-a"));
    let exact = created
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref())
        .and_then(|r| r[0].exactly.as_ref())
        .expect("exactly");
    assert_eq!(
        (exact.allocation_mode.as_deref(), exact.count),
        (Some("ExactCount"), Some(1)),
        "defaults are applied"
    );

    // Status changes through the main resource are ignored.
    let mut sneaky = created.clone();
    sneaky.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let unchanged = claims
        .replace("claim-1", &PostParams::default(), &sneaky)
        .await
        .expect("replace");
    assert!(
        unchanged
            .status
            .as_ref()
            .is_none_or(|s| s.allocation.is_none())
    );

    let mut allocated = unchanged.clone();
    allocated.status = Some(ResourceClaimStatus {
        allocation: Some(allocation()),
        ..Default::default()
    });
    let allocated = claims
        .replace_status("claim-1", &PostParams::default(), &allocated)
        .await
        .expect("replace status");
    assert!(
        allocated
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some()
    );
    assert_eq!(
        allocated.metadata.generation, created.metadata.generation,
        "status does not bump the generation"
    );

    // A stale status write conflicts.
    let err = api_error(
        claims
            .replace_status("claim-1", &PostParams::default(), &unchanged)
            .await,
    );
    assert_eq!(err.code, 409);

    // Device conditions for the allocated device, by merge patch on the status.
    let device_status = AllocatedDeviceStatus {
        driver: DRIVER.to_owned(),
        pool: "node-1".to_owned(),
        device: "gpu-0".to_owned(),
        conditions: Some(vec![Condition {
            type_: "Ready".to_owned(),
            status: "True".to_owned(),
            reason: "Prepared".to_owned(),
            message: String::new(),
            last_transition_time: Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time"),
            ),
            observed_generation: None,
        }]),
        ..Default::default()
    };
    let patched = claims
        .patch_status(
            "claim-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": [device_status]}})),
        )
        .await
        .expect("patch status");
    let devices = patched
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .expect("devices");
    assert_eq!(devices[0].device, "gpu-0");

    // A device that is not allocated is refused, naming the field.
    let err = api_error(
        claims
            .patch_status(
                "claim-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"devices": [{"driver": DRIVER, "pool": "node-1", "device": "gpu-9"}]}})),
            )
            .await,
    );
    assert_eq!(err.code, 422);
    assert!(err.message.contains("status.devices[0]"), "{}", err.message);

    // The spec is immutable.
    let mut respec = claims.get("claim-1").await.expect("get");
    respec
        .spec
        .as_mut()
        .and_then(|s| s.devices.as_mut())
        .and_then(|d| d.requests.as_mut())
        .expect("requests")[0]
        .name = "other".to_owned();
    let err = api_error(
        claims
            .replace("claim-1", &PostParams::default(), &respec)
            .await,
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("spec: Invalid value") && err.message.contains("field is immutable"),
        "{}",
        err.message
    );

    // Namespaces separate claims; the cluster-wide list sees them all.
    let other: Api<ResourceClaim> = Api::namespaced(server.client().expect("client"), "team-b");
    other
        .create(&PostParams::default(), &claim())
        .await
        .expect("same name, other namespace");
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    let all: Api<ResourceClaim> = Api::all(server.client().expect("client"));
    assert_eq!(
        all.list(&ListParams::default().fields("metadata.namespace=team-b"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(
        server.request_count(Verb::UpdateStatus, Resource::ResourceClaims),
        2
    );
    assert_eq!(
        server.request_count(Verb::PatchStatus, Resource::ResourceClaims),
        2
    );
    server.shutdown().await;
}

#[tokio::test]
async fn apply_json_patch_device_classes_and_nodes() {
    let server = ApiServer::start().await.expect("start");
    let client = server.client().expect("client");
    let classes: Api<DeviceClass> = Api::all(client.clone());

    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some("gpu.example.com".to_owned()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec::default()),
    };
    let applied = classes
        .patch(
            "gpu.example.com",
            &PatchParams::apply("kubedev-test"),
            &Patch::Apply(&class),
        )
        .await
        .expect("apply creates");
    assert!(applied.metadata.uid.is_some());
    let labelled = classes
        .patch(
            "gpu.example.com",
            &PatchParams::apply("kubedev-test").force(),
            &Patch::Apply(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.example.com", "labels": {"vendor": "example"}},
            })),
        )
        .await
        .expect("apply updates");
    assert_eq!(
        labelled.labels().get("vendor").map(String::as_str),
        Some("example")
    );

    // kube's `Patch::Json` needs a feature kubedev does not enable; send the JSON patch directly.
    let ops = json!([{"op": "replace", "path": "/metadata/labels/vendor", "value": "other"}]);
    let request = axum::http::Request::builder()
        .method("PATCH")
        .uri("/apis/resource.k8s.io/v1/deviceclasses/gpu.example.com")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&ops).expect("json"))
        .expect("request");
    let patched: DeviceClass = client.request(request).await.expect("json patch");
    assert_eq!(
        patched.labels().get("vendor").map(String::as_str),
        Some("other")
    );
    assert_eq!(
        classes
            .list(&ListParams::default().labels("vendor=other"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some("node-1".to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create node");
    assert!(node.metadata.uid.is_some());
    assert_eq!(
        nodes
            .list(&ListParams::default().fields("metadata.name=node-1"))
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    assert_eq!(client_version(&server).await, "1");
    server.shutdown().await;
}

async fn client_version(server: &ApiServer) -> String {
    server
        .client()
        .expect("client")
        .apiserver_version()
        .await
        .expect("version")
        .major
}
