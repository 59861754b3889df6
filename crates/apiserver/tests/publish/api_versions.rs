//! What API servers of other releases or feature gates keep: the publisher learns it, publishes
//! what they can hold, reports what it left out, and follows an upgrade without a restart.

use super::*;

/// A GPU as partitionable MIG publishes it: a counter set of two memory slices, the whole GPU
/// consuming both and two halves consuming one each.
fn partitioned_gpu() -> Inventory {
    let slice = |n: &str| (CounterName::new(n).unwrap(), Quantity::parse("1").unwrap());
    let set = CounterName::new("gpu-0-counters").unwrap();
    let consume = |names: &[&str]| {
        CounterConsumption::new(set.clone(), names.iter().map(|n| slice(n)).collect())
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
    pool.shared_counters.push(CounterSet::new(
        set.clone(),
        [slice("s0"), slice("s1")].into_iter().collect(),
    ));
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
