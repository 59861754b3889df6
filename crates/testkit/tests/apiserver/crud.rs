//! Create (generateName), get and list with label and field selectors, replace with
//! optimistic concurrency, and delete with preconditions and finalizers.

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use serde_json::json;

use super::{DRIVER, api_error, client_from_kubeconfig, device, slice};

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
