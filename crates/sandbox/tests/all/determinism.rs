//! The same module and input give the same answer and the same fuel, every time and in
//! every sandbox.

use kubedev_allocator::api;
use kubedev_sandbox::{Candidate, PolicyInput};
use serde_json::json;

use crate::common::*;

fn gpus(n: usize) -> Vec<api::Device> {
    (0..n)
        .map(|i| {
            serde_json::from_value(json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "resource.kubernetes.io/numaNode": { "int": i % 8 },
                    "resource.kubernetes.io/pcieRoot": { "string": format!("pci0000:{:02x}", i / 2) },
                    "linkGroup": { "int": i / 4 },
                    "model": { "string": "X100" }
                },
                "capacity": { "memory": { "value": "80Gi" } }
            }))
            .unwrap()
        })
        .collect()
}

#[test]
fn answers_and_fuel_are_the_same_on_every_run_and_in_every_sandbox() {
    let devices = gpus(64);
    let input = || {
        let candidates = devices
            .iter()
            .enumerate()
            .map(|(i, d)| Candidate::published(DRIVER, "node-1", d).with_in_use(i % 7 == 3))
            .collect();
        PolicyInput::new("default/job", "gpus", 8, candidates)
    };
    for name in ["numa-pack", "nvlink-pack", "spread", "binpack"] {
        let first = plugin(&sandbox(), name).evaluate(&input()).unwrap();
        let other_sandbox = plugin(&sandbox(), name);
        for _ in 0..20 {
            let again = other_sandbox.evaluate(&input()).unwrap();
            assert_eq!(again.decision, first.decision, "{name}");
            assert_eq!(again.fuel_used, first.fuel_used, "{name}");
            assert_eq!(again.memory_bytes, first.memory_bytes, "{name}");
        }
        assert!(first.fuel_used > 0);
    }
}

#[test]
fn allocations_with_a_policy_are_repeatable() {
    let sb = sandbox();
    let policy = plugin(&sb, "spread");
    let devs = (0..16)
        .map(|i| {
            device(
                &format!("d{i}"),
                json!({ "resource.kubernetes.io/pcieRoot": { "string": format!("root-{}", i % 5) } }),
            )
        })
        .collect();
    let s = scenario(devs, vec![], &["d3", "d7"], 5);
    let first = allocate(&s, Some(&policy)).unwrap();
    for _ in 0..10 {
        assert_eq!(allocate(&s, Some(&policy)).unwrap(), first);
    }
}

#[test]
fn modules_are_compiled_once_per_content() {
    let sb = sandbox();
    let a = plugin(&sb, "numa-pack");
    let b = sb.load("same-bytes", &plugin_bytes("numa-pack")).unwrap();
    assert_eq!(a.digest(), b.digest());
    assert_eq!(sb.cached_modules(), 1);
    let c = plugin(&sb, "spread");
    assert_eq!(sb.cached_modules(), 2);
    drop((a, b, c));
    assert_eq!(
        sb.cached_modules(),
        0,
        "the cache holds no module nobody uses"
    );
}
