//! How each release's API server treats what a DRA driver writes: the fields of disabled feature
//! gates, the fields its types lack, and its layout rules for shared counters.
//!
//! This module holds the helpers that build stores and slices; the tests are in `gates`,
//! `counters` and `server`.

mod counters;
mod gates;
mod server;

use KubeRelease::{V1_34, V1_35, V1_36, V1_37, V1_38};
use serde_json::{Value, json};

use super::release::{KubeRelease, gate};
use super::resource::Resource;
use super::status::ApiError;
use super::store::{Key, PatchKind, Store, Target, WriteOptions, Written};
use super::strategy::{FieldValidation, Strategy};
use super::{ApiServer, ApiServerError};

fn store_with(release: KubeRelease, overrides: &[(&str, bool)]) -> Store {
    let overrides: Vec<(String, bool)> = overrides
        .iter()
        .map(|(g, on)| ((*g).to_owned(), *on))
        .collect();
    let gates = release.resolve_gates(&overrides).expect("gates resolve");
    Store::new(100, Strategy::new(release, gates))
}

fn store(release: KubeRelease) -> Store {
    store_with(release, &[])
}

fn create(store: &Store, resource: Resource, object: Value) -> Result<Written, ApiError> {
    store.create(resource, None, object, &WriteOptions::default())
}

fn created(store: &Store, resource: Resource, object: Value) -> Value {
    create(store, resource, object)
        .unwrap_or_else(|e| panic!("create refused: {}", e.message))
        .object
}

fn refused(store: &Store, object: Value) -> String {
    match create(store, Resource::ResourceSlices, object) {
        Ok(w) => panic!("accepted: {}", w.object),
        Err(e) => {
            assert_eq!(e.code, 422, "{}", e.message);
            e.message
        }
    }
}

fn slice_spec(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    let map = spec.as_object_mut().expect("spec object");
    map.entry("driver").or_insert(json!("gpu.example.com"));
    map.entry("pool")
        .or_insert(json!({"name": "node-1", "generation": 0, "resourceSliceCount": 2}));
    if !map.contains_key("perDeviceNodeSelection") && !map.contains_key("allNodes") {
        map.entry("nodeName").or_insert(json!("node-1"));
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

fn slice(name: &str, devices: Vec<Value>) -> Value {
    slice_spec(name, json!({"devices": devices}))
}

fn device(name: &str) -> Value {
    json!({"name": name, "attributes": {"model": {"string": "A100"}}})
}

fn counter_set(name: &str, counters: &[&str]) -> Value {
    let counters: serde_json::Map<String, Value> = counters
        .iter()
        .map(|c| ((*c).to_owned(), json!({"value": "80Gi"})))
        .collect();
    json!({"name": name, "counters": counters})
}

fn counters_slice(name: &str) -> Value {
    slice_spec(
        name,
        json!({"sharedCounters": [counter_set("gpu-0", &["memory"])]}),
    )
}

/// 1.34's layout: counters and the devices consuming them in one slice.
fn combined_slice(name: &str, devices: Vec<Value>) -> Value {
    slice_spec(
        name,
        json!({"sharedCounters": [counter_set("gpu-0", &["memory"])], "devices": devices}),
    )
}

fn has(object: &Value, pointer: &str) -> bool {
    object.pointer(pointer).is_some_and(|v| !v.is_null())
}

fn list_slice(attribute: Value) -> Value {
    let mut d = device("gpu-0");
    d["attributes"]["numa"] = attribute;
    slice("s", vec![d])
}
