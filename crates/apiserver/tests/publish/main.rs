//! The publisher and the claim reader against the API-server emulator, over real HTTP.
//!
//! The tests are grouped by topic: `slices` (what is published), `repair` (keeping it so against
//! edits, conflicts, faults and restarts), `claims` (the claim reader) and `api_versions` (what
//! older or differently configured API servers keep). The helpers they share are here.
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
    d.taints.push(Taint::new(
        "example.com/maintenance",
        TaintEffect::NoSchedule,
    ));
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

mod api_versions;
mod claims;
mod repair;
mod slices;
