//! Each example policy changes a real allocation the way it promises.

use kubedev_allocator::{SimulateOptions, simulate};
use kubedev_core::{Device, DeviceName};
use kubedev_sandbox::{Candidate, DecisionKind, PolicyInput};
use serde_json::json;

use crate::common::*;

fn numa_gpus(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| {
            device(
                &format!("gpu-{i}"),
                json!({ "resource.kubernetes.io/numaNode": { "int": i % 2 } }),
            )
        })
        .collect()
}

#[test]
fn numa_pack_puts_a_request_on_one_numa_node() {
    let sb = sandbox();
    let policy = plugin(&sb, "numa-pack");
    let s = scenario(numa_gpus(8), vec![], &[], 4);
    // Devices are listed with NUMA nodes interleaved: the default spans both nodes.
    assert_eq!(
        allocate(&s, None).expect("fits"),
        names(&["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    );
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(
        sorted(allocate(&s, Some(&session)).expect("fits")),
        names(&["gpu-0", "gpu-2", "gpu-4", "gpu-6"])
    );
    assert!(session.failure().is_none());
}

#[test]
fn numa_pack_chooses_the_smallest_node_that_fits() {
    let sb = sandbox();
    let policy = plugin(&sb, "numa-pack");
    // NUMA 0 has two free GPUs left (gpu-4, gpu-6), NUMA 1 four.
    let s = scenario(numa_gpus(8), vec![], &["gpu-0", "gpu-2"], 2);
    assert_eq!(
        allocate(&s, None).expect("fits"),
        names(&["gpu-1", "gpu-3"])
    );
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(
        sorted(allocate(&s, Some(&session)).expect("fits")),
        names(&["gpu-4", "gpu-6"]),
        "numa-pack keeps the larger node whole"
    );
}

#[test]
fn numa_pack_reads_the_inventory_numa_node_in_the_device_plugin_path() {
    let sb = sandbox();
    let policy = plugin(&sb, "numa-pack");
    let devices: Vec<Device> = (0..4)
        .map(|i| {
            Device::new(DeviceName::new(format!("dev-{i}")).expect("name")).with_numa_node(i % 2)
        })
        .collect();
    let candidates = devices
        .iter()
        .map(|d| Candidate::inventory(DRIVER, "node-1", d))
        .collect();
    let eval = policy
        .evaluate(&PolicyInput::new("", "nvidia.com/gpu", 2, candidates))
        .expect("evaluate");
    // Both nodes fit two devices: the lower node number wins, its devices first.
    assert_eq!(eval.decision.order[..2], [0, 2]);
    assert_eq!(eval.decision.preferred(2, &[]), Some(vec![0, 2]));
}

#[test]
fn nvlink_pack_keeps_a_request_inside_one_link_group() {
    let sb = sandbox();
    let policy = plugin(&sb, "nvlink-pack");
    let gpus = (0..8)
        .map(|i| {
            device(
                &format!("gpu-{i}"),
                json!({ "linkGroup": { "int": i % 2 } }),
            )
        })
        .collect();
    let s = scenario(gpus, vec![], &[], 4);
    assert_eq!(
        allocate(&s, None).expect("fits"),
        names(&["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    );
    assert_eq!(
        sorted(allocate(&s, Some(&policy)).expect("fits")),
        names(&["gpu-0", "gpu-2", "gpu-4", "gpu-6"])
    );
}

#[test]
fn nvlink_pack_uses_the_smallest_island_that_fits_and_qualified_names() {
    let sb = sandbox();
    let policy = plugin(&sb, "nvlink-pack");
    // Six GPUs on island a, two on island b, the attribute written fully qualified.
    let gpus = (0..8)
        .map(|i| {
            let island = if i < 6 { "a" } else { "b" };
            device(
                &format!("gpu-{i}"),
                json!({ format!("{DRIVER}/linkGroup"): { "string": island } }),
            )
        })
        .collect();
    let s = scenario(gpus, vec![], &[], 2);
    assert_eq!(
        allocate(&s, None).expect("fits"),
        names(&["gpu-0", "gpu-1"])
    );
    assert_eq!(
        sorted(allocate(&s, Some(&policy)).expect("fits")),
        names(&["gpu-6", "gpu-7"])
    );
}

#[test]
fn nvlink_pack_reads_the_nvidia_backends_nvlink_group() {
    let sb = sandbox();
    let policy = plugin(&sb, "nvlink-pack");
    // As the NVIDIA backend publishes them: islands 0 and 1, interleaved in listing order.
    let gpus = (0..8)
        .map(|i| {
            device(
                &format!("gpu-{i}"),
                json!({ "gpu.nvidia.com/nvlinkGroup": { "int": i % 2 } }),
            )
        })
        .collect();
    let s = scenario(gpus, vec![], &[], 4);
    assert_eq!(
        sorted(allocate(&s, Some(&policy)).expect("fits")),
        names(&["gpu-0", "gpu-2", "gpu-4", "gpu-6"])
    );
}

#[test]
fn nvlink_pack_without_link_groups_keeps_the_order_and_says_why() {
    let sb = sandbox();
    let policy = plugin(&sb, "nvlink-pack");
    let s = scenario(numa_gpus(4), vec![], &[], 2);
    let devices = &s.resource_slices[0].spec.devices;
    let candidates = devices
        .iter()
        .map(|d| Candidate::published(DRIVER, "node-1", d))
        .collect();
    let eval = policy
        .evaluate(&PolicyInput::new("default/job", "gpus", 2, candidates))
        .expect("evaluate");
    assert_eq!(eval.decision.kind, DecisionKind::Keep);
    assert_eq!(eval.decision.order, vec![0, 1, 2, 3]);
    assert_eq!(eval.log.len(), 1);
    assert!(
        eval.log[0].contains("no candidate has a linkGroup"),
        "{:?}",
        eval.log
    );
    assert_eq!(allocate(&s, Some(&policy)), allocate(&s, None));
}

fn rooted(name: &str, root: &str) -> serde_json::Value {
    device(
        name,
        json!({ "resource.kubernetes.io/pcieRoot": { "string": root } }),
    )
}

#[test]
fn spread_takes_devices_from_different_pcie_roots() {
    let sb = sandbox();
    let policy = plugin(&sb, "spread");
    let devs = vec![
        rooted("d0", "pci0000:00"),
        rooted("d1", "pci0000:00"),
        rooted("d2", "pci0000:40"),
        rooted("d3", "pci0000:40"),
    ];
    let s = scenario(devs, vec![], &[], 2);
    assert_eq!(allocate(&s, None).expect("fits"), names(&["d0", "d1"]));
    assert_eq!(
        sorted(allocate(&s, Some(&policy)).expect("fits")),
        names(&["d0", "d2"])
    );
}

#[test]
fn spread_avoids_roots_already_in_use() {
    let sb = sandbox();
    let policy = plugin(&sb, "spread");
    let devs = vec![
        rooted("d0", "pci0000:00"),
        rooted("d1", "pci0000:00"),
        rooted("d2", "pci0000:40"),
        rooted("d3", "pci0000:40"),
        rooted("d4", "pci0000:80"),
        rooted("d5", "pci0000:80"),
    ];
    let s = scenario(devs, vec![], &["d0"], 2);
    assert_eq!(allocate(&s, None).expect("fits"), names(&["d1", "d2"]));
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(
        sorted(allocate(&s, Some(&session)).expect("fits")),
        names(&["d2", "d4"])
    );
    // The allocator itself says which candidates are allocated: no session needed.
    assert_eq!(
        sorted(allocate(&s, Some(&policy)).expect("fits")),
        names(&["d2", "d4"])
    );
}

#[test]
fn the_example_policies_declare_what_they_read() {
    let sb = sandbox();
    for (name, want) in [
        ("numa-pack", ""),
        (
            "nvlink-pack",
            "attribute linkGroup\nattribute gpu.nvidia.com/nvlinkGroup",
        ),
        ("spread", "attribute resource.kubernetes.io/pcieRoot"),
        ("binpack", "counters"),
    ] {
        assert_eq!(plugin(&sb, name).input_declaration(), Some(want), "{name}");
    }
}

fn two_partitionable_gpus() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let devices = vec![
        partition("gpu-0", "gpu-0", "40Gi"),
        partition("gpu-0-a", "gpu-0", "20Gi"),
        partition("gpu-0-b", "gpu-0", "20Gi"),
        partition("gpu-1", "gpu-1", "40Gi"),
        partition("gpu-1-a", "gpu-1", "20Gi"),
        partition("gpu-1-b", "gpu-1", "20Gi"),
    ];
    let sets = vec![
        json!({ "name": "gpu-0", "counters": { "memory": { "value": "40Gi" } } }),
        json!({ "name": "gpu-1", "counters": { "memory": { "value": "40Gi" } } }),
    ];
    (devices, sets)
}

#[test]
fn binpack_fills_a_partly_used_gpu_before_touching_a_whole_one() {
    let sb = sandbox();
    let policy = plugin(&sb, "binpack");
    let (devices, sets) = two_partitionable_gpus();
    let s = scenario(devices, sets, &["gpu-1-a"], 1);
    // The default takes the first device listed: all of gpu-0.
    assert_eq!(allocate(&s, None).expect("fits"), names(&["gpu-0"]));
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(session.counter_usage().get(DRIVER, "node-1", "gpu-1"), 1);
    assert_eq!(
        allocate(&s, Some(&session)).expect("fits"),
        names(&["gpu-1-b"])
    );
    // Without the session the policy cannot know gpu-1 is used: it still prefers a
    // partition over a whole GPU, but of the first parent.
    assert_eq!(
        allocate(&s, Some(&policy)).expect("fits"),
        names(&["gpu-0-a"])
    );
}

#[test]
fn binpack_prefers_a_partition_to_a_whole_gpu_on_an_empty_node() {
    let sb = sandbox();
    let policy = plugin(&sb, "binpack");
    let (devices, sets) = two_partitionable_gpus();
    let s = scenario(devices, sets, &[], 1);
    assert_eq!(allocate(&s, None).expect("fits"), names(&["gpu-0"]));
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(
        allocate(&s, Some(&session)).expect("fits"),
        names(&["gpu-0-a"])
    );
}

#[test]
fn a_policy_never_makes_an_invalid_allocation_valid() {
    let sb = sandbox();
    let policy = plugin(&sb, "binpack");
    let (devices, sets) = two_partitionable_gpus();
    // Both parents partly used and 3 devices wanted: only two partitions remain.
    let s = scenario(devices, sets, &["gpu-0-a", "gpu-1-a"], 3);
    assert_eq!(allocate(&s, None), None);
    let session = policy.session(&s.resource_slices, &s.allocated_devices);
    assert_eq!(allocate(&s, Some(&session)), None);
}

#[test]
fn a_fixed_order_policy_reorders_and_rejected_devices_are_left_out() {
    let sb = sandbox();
    // Prefer candidate 2, then 0; reject 1.
    let policy = sb
        .load(
            "fixed",
            &fixed_output_policy(&out_order(&[2, 0], &[(1, "too hot")])),
        )
        .expect("load");
    let s = scenario(numa_gpus(3), vec![], &[], 3);
    assert_eq!(allocate(&s, None).map(|v| v.len()), Some(3));
    assert_eq!(
        allocate(&s, Some(&policy)),
        None,
        "three devices would need the rejected gpu-1"
    );
    let out = simulate(
        &s,
        &SimulateOptions::default()
            .with_policy(&policy)
            .with_explain(true),
    );
    let text = out.to_text();
    assert!(
        text.contains("rejected by policy fixed (gpu.example.com/node-1/gpu-1: too hot)"),
        "{text}"
    );
    let s = scenario(numa_gpus(3), vec![], &[], 2);
    assert_eq!(
        allocate(&s, Some(&policy)).expect("fits"),
        names(&["gpu-2", "gpu-0"])
    );
    let candidates = s.resource_slices[0]
        .spec
        .devices
        .iter()
        .map(|d| Candidate::published(DRIVER, "node-1", d))
        .collect();
    let d = policy
        .evaluate(&PolicyInput::new("default/job", "gpus", 2, candidates))
        .expect("evaluate")
        .decision;
    assert_eq!(d.order, vec![2, 0, 1]);
    assert_eq!(d.accepted(), vec![2, 0]);
    assert_eq!(d.preference(), vec![2, 0, 1]);
    assert_eq!(d.rejections[0].reason, "too hot");
    assert_eq!(d.preferred(2, &[1]), Some(vec![1, 2]));
    assert_eq!(d.preferred(3, &[]), None, "only two accepted candidates");
}

#[test]
fn scores_order_candidates_highest_first() {
    let sb = sandbox();
    let policy = sb
        .load("scores", &fixed_output_policy(&out_scores(&[1, 9, 5])))
        .expect("load");
    let s = scenario(numa_gpus(3), vec![], &[], 2);
    assert_eq!(
        allocate(&s, Some(&policy)).expect("fits"),
        names(&["gpu-1", "gpu-2"])
    );
}
