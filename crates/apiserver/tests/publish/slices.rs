//! What the publisher writes: chunking, counter sets, generations, the owner reference, large and
//! unhealthy inventories, refused inventories and the sync state.

use super::*;

#[tokio::test]
async fn slices_are_chunked_at_128_and_at_64_with_taints() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();

    for (devices, expected) in [
        ((0..128).map(plain).collect::<Vec<_>>(), vec![128]),
        ((0..129).map(plain).collect(), vec![128, 1]),
        ((0..64).map(tainted).collect(), vec![64]),
        ((0..65).map(tainted).collect(), vec![64, 1]),
        (
            (0..200)
                .map(|i| if i == 130 { tainted(i) } else { plain(i) })
                .collect(),
            vec![128, 64, 8],
        ),
    ] {
        publisher.publish(&inventory(devices)).await.unwrap();
        publisher.wait_synced(WAIT).await.unwrap();
        assert_eq!(layout(&server), expected);
        let all = slices(&server);
        let count = all.len() as i64;
        let generation = all[0]["spec"]["pool"]["generation"].as_i64().unwrap();
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s["spec"]["pool"]["resourceSliceCount"], count);
            assert_eq!(s["spec"]["pool"]["generation"], generation);
            assert_eq!(s["spec"]["pool"]["name"], NODE);
            assert_eq!(s["spec"]["nodeName"], NODE);
            let name = s["metadata"]["name"].as_str().unwrap();
            assert!(
                name.starts_with(&format!("{i:05x}-{DRIVER}-{NODE}-")),
                "slice {i} is named {name}"
            );
        }
    }
    task.stop().await;
}

#[tokio::test]
async fn counter_sets_are_published_in_slices_of_their_own() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();

    let mut pool = Pool::new(PoolName::new(NODE).unwrap(), Vec::new());
    pool.shared_counters.push(CounterSet::new(
        CounterName::new("gpu-0-memory").unwrap(),
        [(
            CounterName::new("memory").unwrap(),
            Quantity::parse("40Gi").unwrap(),
        )]
        .into_iter()
        .collect(),
    ));
    for i in 0..70 {
        let mut d = plain(i);
        d.consumes_counters.push(CounterConsumption::new(
            CounterName::new("gpu-0-memory").unwrap(),
            [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("5Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        ));
        pool.devices.push(d);
    }
    publisher
        .publish(&Inventory::new(vec![pool]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let all = slices(&server);
    assert_eq!(layout(&server), vec![64, 6, 0]);
    assert!(all[2]["spec"].get("devices").is_none());
    assert_eq!(all[2]["spec"]["sharedCounters"][0]["name"], "gpu-0-memory");
    assert_eq!(
        all[2]["spec"]["sharedCounters"][0]["counters"]["memory"]["value"],
        "40Gi"
    );
    task.stop().await;
}

#[tokio::test]
async fn the_generation_moves_only_when_the_content_does() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();

    let first = inventory((0..300).map(plain).collect());
    publisher.publish(&first).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(generations(&server), vec![1, 1, 1]);
    assert_eq!(publisher.stats().creates, 3);

    // The same inventory again: no write at all.
    let before = writes(&server);
    publisher.publish(&first).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(writes(&server), before);
    assert_eq!(generations(&server), vec![1, 1, 1]);

    // One device's attribute changes: every slice moves to generation 2, in place.
    let mut changed = first.clone();
    changed.pools[0].devices[5] = plain(5).with_attribute(
        QualifiedName::new("firmware").unwrap(),
        kubedev_core::AttributeValue::string("1.2").unwrap(),
    );
    let names_before: Vec<Value> = slices(&server)
        .iter()
        .map(|s| s["metadata"]["name"].clone())
        .collect();
    publisher.publish(&changed).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(generations(&server), vec![2, 2, 2]);
    let names_after: Vec<Value> = slices(&server)
        .iter()
        .map(|s| s["metadata"]["name"].clone())
        .collect();
    assert_eq!(names_before, names_after);
    assert_eq!(
        slices(&server)[0]["spec"]["devices"][5]["attributes"]["firmware"]["string"],
        "1.2"
    );

    // Fewer devices: the third slice is deleted, the others move on.
    publisher
        .publish(&inventory((0..100).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server), vec![100]);
    assert_eq!(generations(&server), vec![3]);
    assert_eq!(slices(&server)[0]["spec"]["pool"]["resourceSliceCount"], 1);

    // An empty inventory removes everything.
    publisher
        .publish(&Inventory::new(Vec::new()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert!(slices(&server).is_empty());
    let stats = publisher.stats();
    assert_eq!((stats.creates, stats.deletes), (3, 3));
    task.stop().await;
}

#[tokio::test]
async fn slices_are_owned_by_the_node() {
    let (server, uid) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..3).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let owners = &slices(&server)[0]["metadata"]["ownerReferences"];
    assert_eq!(
        owners,
        &json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": true}])
    );
    task.stop().await;
}

#[tokio::test]
async fn without_a_node_slices_are_published_without_owner() {
    let server = ApiServer::start().await.unwrap();
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..3).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server), vec![3]);
    assert!(
        slices(&server)[0]["metadata"]
            .get("ownerReferences")
            .is_none()
    );
    task.stop().await;
}

#[tokio::test]
async fn a_thousand_devices_are_published() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    let devices: Vec<Device> = (0..1000)
        .map(|i| {
            plain(i)
                .with_attribute(
                    QualifiedName::new("index").unwrap(),
                    kubedev_core::AttributeValue::Int(i as i64),
                )
                .with_capacity(
                    QualifiedName::new("memory").unwrap(),
                    Quantity::parse("80Gi").unwrap(),
                )
                .with_numa_node((i % 2) as i64)
        })
        .collect();
    publisher.publish(&inventory(devices)).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(
        layout(&server),
        vec![128, 128, 128, 128, 128, 128, 128, 104]
    );
    let mut seen = BTreeMap::new();
    for s in slices(&server) {
        for d in s["spec"]["devices"].as_array().unwrap() {
            seen.insert(
                d["name"].as_str().unwrap().to_owned(),
                d["attributes"]["resource.kubernetes.io/numaNode"]["int"].clone(),
            );
        }
    }
    assert_eq!(seen.len(), 1000);
    assert_eq!(seen["gpu-7"], json!(1));
    assert_eq!(publisher.stats().creates, 8);
    task.stop().await;
}

/// The taints of device `i` of the first slice, as stored, without the `timeAdded` the server
/// stamps on each (checked to be there).
fn taints_of(server: &ApiServer, i: usize) -> Value {
    let mut taints = slices(server)[0]["spec"]["devices"][i]["taints"].clone();
    for t in taints.as_array_mut().into_iter().flatten() {
        let stamped = t.as_object_mut().and_then(|t| t.remove("timeAdded"));
        assert!(stamped.is_some_and(|s| s.is_string()), "{t}");
    }
    taints
}

#[tokio::test]
async fn unhealthy_devices_are_tainted_with_their_reason_and_the_taint_goes_when_they_recover() {
    // The default on a server that keeps device taints (1.36 and later): taint.
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    let mut sick = plain(1);
    sick.health = Health::unhealthy("fell off the bus");
    publisher
        .publish(&inventory(vec![plain(0), sick.clone()]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(device_names(&slices(&server)[0]), vec!["gpu-0", "gpu-1"]);
    assert_eq!(taints_of(&server, 0), Value::Null);
    assert_eq!(
        taints_of(&server, 1),
        json!([{"key": "gpu.example.com/unhealthy", "value": "fell-off-the-bus", "effect": "NoSchedule"}])
    );
    // Unusable for running workloads too: NoExecute, and the new reason.
    let mut gone = plain(1);
    gone.health = Health::unusable("Xid 79: GPU has fallen off the bus");
    publisher
        .publish(&inventory(vec![plain(0), gone]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(
        taints_of(&server, 1),
        json!([{"key": "gpu.example.com/unhealthy", "value": "Xid-79-GPU-has-fallen-off-the-bus", "effect": "NoExecute"}])
    );
    // Healthy again: the taint is gone.
    publisher
        .publish(&inventory(vec![plain(0), plain(1)]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(taints_of(&server, 1), Value::Null);
    task.stop().await;

    // Configured to leave them out.
    let server = server_with_node().await.0;
    let publisher = publisher_with(&server, UnhealthyDevices::Omit);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory(vec![plain(0), sick.clone()]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(device_names(&slices(&server)[0]), vec!["gpu-0"]);
    task.stop().await;
}

/// Where the API server drops device taints (1.35 by default), the default leaves unhealthy
/// devices out without calling it a missing feature; asking for taints there leaves them out
/// too, and says that the feature is missing.
#[tokio::test]
async fn without_device_taints_unhealthy_devices_are_left_out() {
    let mut sick = plain(1);
    sick.health = Health::unhealthy("fell off the bus");
    for (policy, reported) in [
        (UnhealthyDevices::Auto, false),
        (UnhealthyDevices::Taint, true),
    ] {
        let server = ApiServer::builder()
            .kubernetes(KubeRelease::V1_35)
            .start()
            .await
            .unwrap();
        server
            .put_raw(
                Resource::Nodes,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
            )
            .unwrap();
        let publisher = publisher_with(&server, policy);
        let status = publisher.api_status();
        let task = publisher.start().unwrap();
        publisher
            .publish(&inventory(vec![plain(0), sick.clone()]))
            .await
            .unwrap();
        publisher.wait_synced(WAIT).await.unwrap();
        assert_eq!(
            device_names(&slices(&server)[0]),
            vec!["gpu-0"],
            "{policy:?}"
        );
        let report = status.report();
        assert_eq!(
            report.degraded.contains_key(&ApiFeature::DeviceTaints),
            reported,
            "{policy:?}: {report:?}"
        );
        task.stop().await;
    }
}

fn publisher_with(server: &ApiServer, policy: UnhealthyDevices) -> SlicePublisher {
    publisher(server).with_unhealthy_devices(policy)
}

#[tokio::test]
async fn invalid_inventories_are_refused_and_stopped_publishers_say_so() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    let err = publisher
        .publish(&inventory(vec![plain(0), plain(0)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kubedev_core::PublishError::Invalid(_)),
        "{err}"
    );
    assert!(matches!(
        publisher.start(),
        Err(Error::AlreadyStarted { .. })
    ));
    task.stop().await;
    let err = publisher
        .publish(&inventory(vec![plain(0)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kubedev_core::PublishError::Transport(_)),
        "{err}"
    );
}

#[tokio::test]
async fn the_sync_state_says_whether_the_slices_were_written() {
    use kubedev_core::SyncState;
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    assert_eq!(publisher.sync_state(), SyncState::NotStarted);
    let task = publisher.start().unwrap();
    // Every create fails for a while: the state says why.
    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1000,
        Fault::InternalError,
    );
    publisher
        .publish(&inventory((0..4).map(plain).collect()))
        .await
        .unwrap();
    eventually("a failing state", || {
        matches!(publisher.sync_state(), SyncState::Failing(_))
    })
    .await;
    server.clear_faults();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(publisher.sync_state(), SyncState::Synced);
    task.stop().await;
}
