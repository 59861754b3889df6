//! Shared helpers: the built example policies, hand-written WAT policies, and small
//! allocation scenarios.

use std::path::PathBuf;

use kubedev_allocator::{Scenario, SelectionPolicy, SimulateOptions, simulate};
use kubedev_sandbox::{Limits, Sandbox, WasmPolicy};
use serde_json::{Value, json};

pub(crate) const DRIVER: &str = "gpu.example.com";

pub(crate) fn sandbox() -> Sandbox {
    Sandbox::new(Limits::default()).expect("sandbox")
}

/// Where `cargo xtask build-plugins` puts the example policies.
pub(crate) fn plugin_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("KUBEDEV_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/plugins/wasm")
        });
    dir.join(format!("{name}.wasm"))
}

/// The bytes of a built example policy.
pub(crate) fn plugin_bytes(name: &str) -> Vec<u8> {
    let path = plugin_path(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "example policy {} is missing ({e}): run `cargo xtask build-plugins` first",
            path.display()
        )
    })
}

pub(crate) fn plugin(sandbox: &Sandbox, name: &str) -> WasmPolicy {
    sandbox
        .load(name, &plugin_bytes(name))
        .unwrap_or_else(|e| panic!("load {name}: {e}"))
}

/// Compiles WAT text.
pub(crate) fn wat(text: &str) -> Vec<u8> {
    wat::parse_str(text).unwrap_or_else(|e| panic!("bad test WAT: {e}\n{text}"))
}

/// A module that keeps the contract; `select` runs `body` (params `$ptr`, `$len`, result
/// i64); `extra` adds items (data segments, functions, imports go first via `imports`).
pub(crate) fn wat_policy_with(imports: &str, body: &str, extra: &str) -> Vec<u8> {
    wat(&format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 8192))
  (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
  (func (export "kubedev_alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $len)))
    (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow
        (i32.add (i32.const 1)
          (i32.div_u (i32.sub (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
                     (i32.const 65536)))))))
    (local.get $p))
  (func (export "kubedev_select") (param $ptr i32) (param $len i32) (result i64)
    {body})
  {extra}
)"#
    ))
}

pub(crate) fn wat_policy(body: &str) -> Vec<u8> {
    wat_policy_with("", body, "")
}

/// A module whose `select` always answers `output` (placed at address 1024).
pub(crate) fn fixed_output_policy(output: &[u8]) -> Vec<u8> {
    let escaped: String = output.iter().map(|b| format!("\\{b:02x}")).collect();
    wat_policy_with(
        "",
        &format!(
            "(i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.const {}))",
            output.len()
        ),
        &format!(r#"(data (i32.const 1024) "{escaped}")"#),
    )
}

fn header(kind: u8) -> Vec<u8> {
    let mut v = b"KDPO".to_vec();
    v.extend_from_slice(&1u32.to_le_bytes());
    v.push(kind);
    v
}

fn rejections(v: &mut Vec<u8>, rejected: &[(u32, &str)]) {
    v.extend_from_slice(&(rejected.len() as u32).to_le_bytes());
    for (i, r) in rejected {
        v.extend_from_slice(&i.to_le_bytes());
        v.extend_from_slice(&(r.len() as u32).to_le_bytes());
        v.extend_from_slice(r.as_bytes());
    }
}

/// An output message with an explicit order.
pub(crate) fn out_order(order: &[u32], rejected: &[(u32, &str)]) -> Vec<u8> {
    let mut v = header(1);
    v.extend_from_slice(&(order.len() as u32).to_le_bytes());
    for i in order {
        v.extend_from_slice(&i.to_le_bytes());
    }
    rejections(&mut v, rejected);
    v
}

/// An output message with scores.
pub(crate) fn out_scores(scores: &[i64]) -> Vec<u8> {
    let mut v = header(2);
    v.extend_from_slice(&(scores.len() as u32).to_le_bytes());
    for s in scores {
        v.extend_from_slice(&s.to_le_bytes());
    }
    rejections(&mut v, &[]);
    v
}

/// A GPU device (JSON) with `attributes` given as `name → typed value`.
pub(crate) fn device(name: &str, attributes: Value) -> Value {
    json!({ "name": name, "attributes": attributes })
}

/// A partition drawing `memory` from counter set `set`.
pub(crate) fn partition(name: &str, set: &str, memory: &str) -> Value {
    json!({
        "name": name,
        "consumesCounters": [{ "counterSet": set, "counters": { "memory": { "value": memory } } }],
        "capacity": { "memory": { "value": memory } }
    })
}

/// One node, one driver's pool, one claim asking `count` devices of the driver.
pub(crate) fn scenario(
    devices: Vec<Value>,
    counter_sets: Vec<Value>,
    allocated: &[&str],
    count: usize,
) -> Scenario {
    let mut slices = vec![json!({
        "metadata": { "name": "devices" },
        "spec": {
            "driver": DRIVER,
            "pool": { "name": "node-1", "generation": 1, "resourceSliceCount": if counter_sets.is_empty() { 1 } else { 2 } },
            "nodeName": "node-1",
            "devices": devices
        }
    })];
    if !counter_sets.is_empty() {
        slices.push(json!({
            "metadata": { "name": "counters" },
            "spec": {
                "driver": DRIVER,
                "pool": { "name": "node-1", "generation": 1, "resourceSliceCount": 2 },
                "nodeName": "node-1",
                "sharedCounters": counter_sets
            }
        }));
    }
    let allocated: Vec<String> = allocated
        .iter()
        .map(|d| format!("{DRIVER}/node-1/{d}"))
        .collect();
    let text = json!({
        "node": { "name": "node-1" },
        "deviceClasses": [{
            "metadata": { "name": "gpu" },
            "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == \"{DRIVER}\"") } }] }
        }],
        "resourceSlices": slices,
        "allocatedDevices": allocated,
        "claims": [{
            "metadata": { "name": "job", "namespace": "default" },
            "spec": { "devices": { "requests": [{
                "name": "gpus",
                "exactly": { "deviceClassName": "gpu", "count": count }
            }] } }
        }]
    })
    .to_string();
    kubedev_inputs::scenario_from_text(&text).expect("scenario")
}

/// The devices the claim gets, in allocation order; `None` when it does not fit.
pub(crate) fn allocate(
    scenario: &Scenario,
    policy: Option<&dyn SelectionPolicy>,
) -> Option<Vec<String>> {
    let mut options = SimulateOptions::default();
    if let Some(p) = policy {
        options = options.with_policy(p);
    }
    let out = simulate(scenario, &options);
    assert!(out.error.is_none(), "simulate failed: {:?}", out.error);
    let alloc = out.claims[0].allocation.as_ref()?;
    Some(
        alloc
            .devices
            .results
            .iter()
            .map(|r| r.device.to_string())
            .collect(),
    )
}

/// Sorted, for comparing sets of devices.
pub(crate) fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

pub(crate) fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}
