//! The publisher and the claim reader against the API-server emulator, over real HTTP.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use kubedev_apiserver::{
    ApiFeature, ClaimReader, CounterLayout, DeviceStatus, Error, SlicePublisher, UnhealthyDevices,
};
use kubedev_core::{
    ClaimRef, CounterConsumption, CounterName, CounterSet, Device, DeviceName, DeviceRef,
    DriverName, Health, Inventory, Pool, PoolName, Publisher, QualifiedName, Quantity, Taint,
    TaintEffect,
};
use kubedev_testkit::apiserver::{ApiServer, Fault, KubeRelease, Resource, Verb};
use serde_json::{Value, json};
use tokio::time::Instant;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(20);

fn driver() -> DriverName {
    DriverName::new(DRIVER).unwrap()
}

fn plain(i: usize) -> Device {
    Device::new(DeviceName::new(format!("gpu-{i}")).unwrap())
}

fn tainted(i: usize) -> Device {
    let mut d = plain(i);
    d.taints.push(Taint {
        key: "example.com/maintenance".into(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    });
    d
}

fn inventory(devices: Vec<Device>) -> Inventory {
    Inventory::new(vec![Pool::new(PoolName::new(NODE).unwrap(), devices)])
}

async fn server_with_node() -> (ApiServer, String) {
    let server = ApiServer::start().await.unwrap();
    let node = server
        .put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
        )
        .unwrap();
    let uid = node["metadata"]["uid"].as_str().unwrap().to_owned();
    (server, uid)
}

/// A publisher tuned for tests: short delays, no request limit.
fn publisher(server: &ApiServer) -> SlicePublisher {
    SlicePublisher::new(server.client().unwrap(), driver(), NODE)
        .unwrap()
        .with_sync_delay(Duration::from_millis(20))
        .with_backoff(Duration::from_millis(10), Duration::from_millis(200))
        .with_rate_limit(0.0, 1)
}

/// Our slices on the server, in name order.
fn slices(server: &ApiServer) -> Vec<Value> {
    server
        .objects(Resource::ResourceSlices)
        .into_iter()
        .filter(|s| s["spec"]["driver"] == DRIVER)
        .collect()
}

fn device_names(slice: &Value) -> Vec<String> {
    slice["spec"]["devices"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Devices per slice, in slice (name) order.
fn layout(server: &ApiServer) -> Vec<usize> {
    slices(server)
        .iter()
        .map(|s| device_names(s).len())
        .collect()
}

fn generations(server: &ApiServer) -> Vec<i64> {
    slices(server)
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect()
}

/// Polls until `check` holds, or fails the test after `WAIT`.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn writes(server: &ApiServer) -> u64 {
    [Verb::Create, Verb::Update, Verb::Delete, Verb::Patch]
        .into_iter()
        .map(|v| server.request_count(v, Resource::ResourceSlices))
        .sum()
}

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
    pool.shared_counters.push(CounterSet {
        name: CounterName::new("gpu-0-memory").unwrap(),
        counters: [(
            CounterName::new("memory").unwrap(),
            Quantity::parse("40Gi").unwrap(),
        )]
        .into_iter()
        .collect(),
    });
    for i in 0..70 {
        let mut d = plain(i);
        d.consumes_counters.push(CounterConsumption {
            counter_set: CounterName::new("gpu-0-memory").unwrap(),
            counters: [(
                CounterName::new("memory").unwrap(),
                Quantity::parse("5Gi").unwrap(),
            )]
            .into_iter()
            .collect(),
        });
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
async fn an_external_edit_is_put_back() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..200).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let expected: Vec<Vec<String>> = slices(&server).iter().map(device_names).collect();

    let mut edited = slices(&server)[1].clone();
    edited["spec"]["devices"] = json!([{"name": "intruder"}]);
    server.put_raw(Resource::ResourceSlices, edited).unwrap();

    eventually("the edited slice to be repaired", || {
        let now = slices(&server);
        now.iter().map(device_names).collect::<Vec<_>>() == expected
            && generations(&server) == vec![2, 2]
    })
    .await;
    // The server holds the repair before the publisher has read its answer.
    eventually("the updates to be counted", || {
        publisher.stats().updates >= 2
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn an_external_delete_is_put_back() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..200).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let name = slices(&server)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    server
        .delete_raw(Resource::ResourceSlices, None, &name)
        .unwrap();

    eventually("the deleted slice to be re-created", || {
        layout(&server) == vec![128, 72] && generations(&server) == vec![2, 2]
    })
    .await;
    eventually("the create to be counted", || {
        publisher.stats().creates == 3
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn drift_is_repaired_after_the_watch_is_dropped() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..10).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    server.drop_watches();
    let name = slices(&server)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    server
        .delete_raw(Resource::ResourceSlices, None, &name)
        .unwrap();
    eventually("the slice to be re-created after the watch resumed", || {
        layout(&server) == vec![10]
    })
    .await;
    task.stop().await;
}

#[tokio::test]
async fn conflicts_and_server_errors_converge() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..300).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();

    server.fail_next(Verb::Update, Resource::ResourceSlices, 2, Fault::Conflict);
    server.fail_next(
        Verb::Update,
        Resource::ResourceSlices,
        2,
        Fault::InternalError,
    );
    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1,
        Fault::ServiceUnavailable,
    );
    server.fail_next(Verb::Get, Resource::ResourceSlices, 1, Fault::InternalError);

    // 400 devices: three slices updated, one created.
    publisher
        .publish(&inventory((0..400).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server), vec![128, 128, 128, 16]);
    assert_eq!(generations(&server), vec![2, 2, 2, 2]);
    let stats = publisher.stats();
    assert!(stats.conflicts >= 2, "{stats:?}");
    assert!(stats.errors >= 3, "{stats:?}");
    assert_eq!(publisher.last_error(), None);
    task.stop().await;
}

#[tokio::test]
async fn a_real_conflict_with_another_writer_converges() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server).with_sync_delay(Duration::from_secs(30));
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory((0..10).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();

    // Another client edits the slice and we publish a change at once: our update carries the
    // old resourceVersion and meets a 409, then must re-read and win.
    let mut edited = slices(&server)[0].clone();
    edited["metadata"]["labels"] = json!({"touched": "yes"});
    server.put_raw(Resource::ResourceSlices, edited).unwrap();
    publisher
        .publish(&inventory((0..11).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    eventually("the change to land", || layout(&server) == vec![11]).await;
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
                d["attributes"]["numaNode"]["int"].clone(),
            );
        }
    }
    assert_eq!(seen.len(), 1000);
    assert_eq!(seen["gpu-7"], json!(1));
    assert_eq!(publisher.stats().creates, 8);
    task.stop().await;
}

#[tokio::test]
async fn unhealthy_devices_are_left_out_or_tainted() {
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
    assert_eq!(device_names(&slices(&server)[0]), vec!["gpu-0"]);
    task.stop().await;

    let server = server_with_node().await.0;
    let publisher = publisher_with(&server, UnhealthyDevices::Taint);
    let task = publisher.start().unwrap();
    publisher
        .publish(&inventory(vec![plain(0), sick]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let all = slices(&server);
    assert_eq!(device_names(&all[0]), vec!["gpu-0", "gpu-1"]);
    assert_eq!(
        all[0]["spec"]["devices"][1]["taints"][0]["key"],
        "gpu.example.com/unhealthy"
    );
    task.stop().await;
}

fn publisher_with(server: &ApiServer, policy: UnhealthyDevices) -> SlicePublisher {
    publisher(server).with_unhealthy_devices(policy)
}

#[tokio::test]
async fn requests_are_rate_limited() {
    let (server, _) = server_with_node().await;
    let publisher = publisher(&server).with_rate_limit(5.0, 1);
    let task = publisher.start().unwrap();
    let start = Instant::now();
    // A node lookup and four creates: five requests at 5/s with no burst take at least 0.8 s.
    publisher
        .publish(&inventory((0..500).map(plain).collect()))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(layout(&server).len(), 4);
    assert!(
        start.elapsed() >= Duration::from_millis(790),
        "{:?}",
        start.elapsed()
    );
    task.stop().await;
}

#[tokio::test]
async fn a_restart_finds_its_slices_and_writes_nothing() {
    let (server, _) = server_with_node().await;
    let devices = inventory((0..300).map(plain).collect());
    {
        let publisher = publisher(&server);
        let task = publisher.start().unwrap();
        publisher.publish(&devices).await.unwrap();
        publisher.wait_synced(WAIT).await.unwrap();
        task.stop().await;
    }
    // Nothing stored changes: the restarted publisher only reads (and asks, with dry runs,
    // what the server keeps).
    let before = server.resource_version();
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher.publish(&devices).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(server.resource_version(), before);
    let stats = publisher.stats();
    assert_eq!((stats.creates, stats.updates, stats.deletes), (0, 0, 0));
    assert_eq!(generations(&server), vec![1, 1, 1]);
    task.stop().await;
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

mod claims {
    use super::*;

    const NS: &str = "team-a";

    fn claim_ref(uid: &str) -> ClaimRef {
        ClaimRef::new(uid.parse().unwrap(), NS, "train")
    }

    async fn server_with_claim(status: Value) -> (ApiServer, String) {
        let server = ApiServer::start().await.unwrap();
        let stored = server
            .put_raw(
                Resource::ResourceClaims,
                json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "train", "namespace": NS},
                    // As the API server stores it, defaults filled in.
                    "spec": {"devices": {"requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com",
                                                    "allocationMode": "ExactCount", "count": 1}}
                    ]}},
                    "status": status,
                }),
            )
            .unwrap();
        let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
        (server, uid)
    }

    fn allocated() -> Value {
        json!({"allocation": {"devices": {
            "results": [
                {"request": "gpu", "driver": "net.example.com", "pool": NODE, "device": "eth-0"},
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}
            ],
            "config": [
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"from": "claim"}}},
                {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"from": "class"}}},
                {"source": "FromClass", "opaque": {"driver": "net.example.com", "parameters": {"from": "other"}}}
            ]
        }}})
    }

    #[tokio::test]
    async fn this_drivers_devices_come_with_their_config_class_first() {
        let (server, uid) = server_with_claim(allocated()).await;
        let reader = ClaimReader::new(server.client().unwrap(), driver());
        let claim = reader.get(&claim_ref(&uid)).await.unwrap();
        let devices = claim.devices();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device.to_string(), "node-a/gpu-3");
        assert_eq!(devices[0].request, "gpu");
        assert_eq!(
            devices[0].config,
            vec![json!({"from": "class"}), json!({"from": "claim"})]
        );
    }

    #[tokio::test]
    async fn a_claim_with_another_uid_is_refused() {
        let (server, uid) = server_with_claim(allocated()).await;
        let reader = ClaimReader::new(server.client().unwrap(), driver());
        let err = reader.get(&claim_ref("not-the-uid")).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("ResourceClaim team-a/train has UID {uid}, expected not-the-uid")
        );
    }

    #[tokio::test]
    async fn an_unallocated_or_missing_claim_is_refused() {
        let (server, uid) = server_with_claim(json!({})).await;
        let reader = ClaimReader::new(server.client().unwrap(), driver());
        let err = reader.get(&claim_ref(&uid)).await.unwrap_err();
        assert!(matches!(err, Error::ClaimNotAllocated { .. }), "{err}");
        let mut other = claim_ref(&uid);
        other.name = "nope".into();
        let err = reader.get(&other).await.unwrap_err();
        assert!(matches!(err, Error::ClaimNotFound { .. }), "{err}");
    }

    #[tokio::test]
    async fn device_status_is_written_through_the_status_subresource() {
        let (server, uid) = server_with_claim(allocated()).await;
        let reader = ClaimReader::new(server.client().unwrap(), driver());
        let device = DeviceRef {
            pool: PoolName::new(NODE).unwrap(),
            device: DeviceName::new("gpu-3").unwrap(),
        };
        server.fail_next(
            Verb::PatchStatus,
            Resource::ResourceClaims,
            1,
            Fault::Conflict,
        );
        reader
            .set_device_status(&claim_ref(&uid), &[DeviceStatus::ready(device, None)])
            .await
            .unwrap();
        let stored = server
            .get(Resource::ResourceClaims, Some(NS), "train")
            .unwrap();
        let entry = &stored["status"]["devices"][0];
        assert_eq!(entry["driver"], DRIVER);
        assert_eq!(entry["device"], "gpu-3");
        assert_eq!(entry["conditions"][0]["type"], "Ready");
        assert_eq!(entry["conditions"][0]["status"], "True");
        assert_eq!(
            server.request_count(Verb::PatchStatus, Resource::ResourceClaims),
            2,
            "one conflict, then success"
        );
        assert_eq!(stored["spec"]["devices"]["requests"][0]["name"], "gpu");
    }
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

/// A GPU as partitionable MIG publishes it: a counter set of two memory slices, the whole GPU
/// consuming both and two halves consuming one each.
fn partitioned_gpu() -> Inventory {
    let slice = |n: &str| (CounterName::new(n).unwrap(), Quantity::parse("1").unwrap());
    let set = CounterName::new("gpu-0-counters").unwrap();
    let consume = |names: &[&str]| CounterConsumption {
        counter_set: set.clone(),
        counters: names.iter().map(|n| slice(n)).collect(),
    };
    let mut whole = plain(0);
    whole.consumes_counters.push(consume(&["s0", "s1"]));
    let mut halves = Vec::new();
    for (i, s) in ["s0", "s1"].into_iter().enumerate() {
        let mut d = Device::new(DeviceName::new(format!("gpu-0-half-{i}")).unwrap());
        d.consumes_counters.push(consume(&[s]));
        halves.push(d);
    }
    let mut pool = Pool::new(PoolName::new(NODE).unwrap(), [vec![whole], halves].concat());
    pool.shared_counters.push(CounterSet {
        name: set.clone(),
        counters: [slice("s0"), slice("s1")].into_iter().collect(),
    });
    Inventory::new(vec![pool])
}

fn stored_devices(server: &ApiServer) -> Vec<String> {
    let mut names: Vec<String> = slices(server).iter().flat_map(device_names).collect();
    names.sort();
    names
}

/// On a 1.35 API server (partitionable devices off by default) only the whole GPU is published
/// and the missing feature is in the report; when the server is upgraded to 1.36 the publisher
/// notices without a restart and publishes the halves with their counters.
#[tokio::test]
async fn an_api_server_upgrade_brings_the_partitions_back() {
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
    let publisher = publisher(&server).with_reprobe_interval(Duration::from_millis(300));
    let status = publisher.api_status();
    let task = publisher.start().unwrap();
    publisher.publish(&partitioned_gpu()).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(stored_devices(&server), ["gpu-0"]);
    assert!(
        slices(&server)
            .iter()
            .all(|s| s["spec"]["sharedCounters"].is_null())
    );
    let report = status.report();
    assert_eq!(report.version.as_ref().map(|v| v.minor), Some(35));
    let degraded = &report.degraded[&ApiFeature::PartitionableDevices];
    assert!(degraded.found.contains("1.35"), "{degraded:?}");
    assert!(
        degraded.action.contains("gpu-0")
            && degraded
                .action
                .contains("left out 2 devices (gpu-0-half-0, gpu-0-half-1)"),
        "{degraded:?}"
    );
    // Taints are off on 1.35 too, but nothing published needs them: not degraded.
    assert!(report.unavailable.contains(&ApiFeature::DeviceTaints));
    assert!(!report.degraded.contains_key(&ApiFeature::DeviceTaints));

    server.restart_as(KubeRelease::V1_36, &[]).unwrap();
    // The device slice is updated before the counter slice is created (the pool counts both,
    // so it is incomplete, and not allocated from, in between): wait for both.
    eventually(
        "the halves and their counters published after the upgrade",
        || {
            stored_devices(&server) == ["gpu-0", "gpu-0-half-0", "gpu-0-half-1"]
                && slices(&server)
                    .iter()
                    .any(|s| s["spec"]["sharedCounters"].is_array())
        },
    )
    .await;
    eventually("an empty report", || {
        let r = status.report();
        r.degraded.is_empty() && r.version.as_ref().map(|v| v.minor) == Some(36)
    })
    .await;
    task.stop().await;
}

/// A 1.34 API server with partitionable devices on gets each counter set in the slice of the
/// devices consuming it.
#[tokio::test]
async fn kubernetes_1_34_stores_counters_beside_their_devices() {
    let server = ApiServer::builder()
        .kubernetes(KubeRelease::V1_34)
        .feature_gate("DRAPartitionableDevices", true)
        .start()
        .await
        .unwrap();
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher.publish(&partitioned_gpu()).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    let stored = slices(&server);
    assert_eq!(stored.len(), 1, "{stored:#?}");
    assert_eq!(
        stored[0]["spec"]["sharedCounters"][0]["name"],
        "gpu-0-counters"
    );
    assert_eq!(device_names(&stored[0]).len(), 3);
    let report = publisher.api_status().report();
    assert_eq!(report.layout, CounterLayout::SameSlice);
    assert!(report.degraded.is_empty(), "{report:?}");
    task.stop().await;
}

/// On 1.35 with its default gates a tainted device would look usable and a shared device is
/// exclusive: the tainted one is left out, the shared one published without the field, and
/// both are in the report.
#[tokio::test]
async fn taints_and_shared_devices_on_a_server_without_them() {
    let server = ApiServer::builder()
        .kubernetes(KubeRelease::V1_35)
        .start()
        .await
        .unwrap();
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    let mut shared = plain(2);
    shared.allow_multiple_allocations = true;
    publisher
        .publish(&inventory(vec![plain(0), tainted(1), shared]))
        .await
        .unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(stored_devices(&server), ["gpu-0", "gpu-2"]);
    assert!(
        slices(&server)
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .all(|d| d["allowMultipleAllocations"].is_null() && d["taints"].is_null())
    );
    let report = publisher.api_status().report();
    let taints = &report.degraded[&ApiFeature::DeviceTaints];
    assert!(
        taints.action.contains("left out 1 device (gpu-1)"),
        "{taints:?}"
    );
    assert!(taints.found.contains("DRADeviceTaints"), "{taints:?}");
    let shared = &report.degraded[&ApiFeature::ConsumableCapacity];
    assert!(shared.action.contains("gpu-2"), "{shared:?}");
    task.stop().await;
}

/// An admission webhook that refuses dry runs does not stop publishing: the publisher assumes
/// the release's default gates (1.35: no shared counters, so only the whole GPU) and goes on.
#[tokio::test]
async fn a_server_refusing_dry_runs_gets_its_releases_defaults() {
    let server = ApiServer::builder()
        .kubernetes(KubeRelease::V1_35)
        .start()
        .await
        .unwrap();
    server.fail_next(
        Verb::Create,
        Resource::ResourceSlices,
        1,
        Fault::DryRunUnsupported,
    );
    let publisher = publisher(&server);
    let task = publisher.start().unwrap();
    publisher.publish(&partitioned_gpu()).await.unwrap();
    publisher.wait_synced(WAIT).await.unwrap();
    assert_eq!(stored_devices(&server), ["gpu-0"]);
    let report = publisher.api_status().report();
    let d = &report.degraded[&ApiFeature::PartitionableDevices];
    assert!(d.found.contains("refused a dry run"), "{d:?}");
    task.stop().await;
}
