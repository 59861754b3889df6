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

/// A request for two of `devices`, all free.
fn two_of(devices: &[api::Device]) -> PolicyInput<'_> {
    let candidates = devices
        .iter()
        .map(|d| Candidate::published(DRIVER, "node-1", d))
        .collect();
    PolicyInput::new("default/job", "gpus", 2, candidates)
}

/// A policy that counts its calls in the places an instance keeps state — a global, its
/// memory, a table or the memory's size — and answers the counts as the first two of the
/// scores `[count, count, 2, 0]`; a count over 1 changes the order. Every call must see a
/// first call's state, whether it runs on a fresh instance or a reused one.
fn counting_policy(count: &str, extra: &str) -> Vec<u8> {
    // The scores message of `out_scores(&[0, 0, 2, 0])` at 1024: scores from byte 13.
    let template: String = out_scores(&[0, 0, 2, 0])
        .iter()
        .map(|b| format!("\\{b:02x}"))
        .collect();
    wat_policy_with(
        "",
        &format!(
            r#"(i64.store (i32.const 1037) (i64.extend_i32_u {count}))
            (i32.store (i32.const 4096) (i32.add (i32.load (i32.const 4096)) (i32.const 1)))
            (i64.store (i32.const 1045) (i64.extend_i32_u (i32.load (i32.const 4096))))
            (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.const {}))"#,
            out_scores(&[0, 0, 2, 0]).len()
        ),
        &format!(r#"(data (i32.const 1024) "{template}") {extra}"#),
    )
}

#[test]
fn a_policy_keeps_no_state_between_calls() {
    let devices = gpus(4);
    let input = || two_of(&devices);
    let sb = sandbox();
    let first_call = sb
        .load(
            "first-call",
            &fixed_output_policy(&out_scores(&[1, 1, 2, 0])),
        )
        .unwrap()
        .evaluate(&input())
        .unwrap()
        .decision;
    let ways = [
        (
            "a mutable global",
            counting_policy(
                "(global.set $calls (i32.add (global.get $calls) (i32.const 1))) (global.get $calls)",
                "(global $calls (mut i32) (i32.const 0))",
            ),
        ),
        (
            "a table that grows",
            counting_policy(
                "(table.grow $t (ref.null func) (i32.const 1))",
                "(table $t 1 funcref)",
            ),
        ),
        (
            "a memory that grows",
            counting_policy("(memory.grow (i32.const 1))", ""),
        ),
    ];
    for (way, wasm) in ways {
        let policy = sb.load(way, &wasm).unwrap();
        let answers: Vec<_> = (0..5).map(|_| policy.evaluate(&input()).unwrap()).collect();
        for (i, answer) in answers.iter().enumerate() {
            assert_eq!(answer.decision, first_call, "{way}: call {i}");
            assert_eq!(answer.fuel_used, answers[0].fuel_used, "{way}: call {i}");
            assert_eq!(
                answer.memory_bytes, answers[0].memory_bytes,
                "{way}: call {i}"
            );
        }
    }
}

#[test]
fn instances_kept_for_reuse_never_make_a_call_busy() {
    // One instance slot: the instance one policy keeps after a call must give way to the
    // next load and to another policy's call.
    let sb = kubedev_sandbox::Sandbox::new(
        kubedev_sandbox::Limits::default().with_max_concurrent_calls(1),
    )
    .unwrap();
    let devices = gpus(8);
    let input = || two_of(&devices);
    let numa = plugin(&sb, "numa-pack");
    let first = numa.evaluate(&input()).unwrap();
    let spread = plugin(&sb, "spread");
    for _ in 0..3 {
        spread.evaluate(&input()).unwrap();
        assert_eq!(numa.evaluate(&input()).unwrap().decision, first.decision);
    }
}
