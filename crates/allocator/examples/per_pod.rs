//! The scheduler's pattern, per pod: a fresh allocator over every slice of the cluster, then
//! `Allocate` for a 1-GPU claim on every node; prints the whole-process CPU per pod for clusters
//! of 250, 1,000, 2,500 and 5,000 nodes (8 GPUs each, one slice per node), beside upstream's
//! figures from `../shared/bench-scenarios/README.md`.
//!
//! `cargo run --release -p kubedev-allocator --example per_pod [-- PODS]` (PODS defaults to 5).

use kubedev_allocator::api::{DeviceClass, Node, ResourceClaim, ResourceSlice};
use kubedev_allocator::{AllocateOptions, Allocator};
use serde_json::json;

fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

fn cluster(nodes: usize) -> Vec<ResourceSlice> {
    (0..nodes)
        .map(|n| {
            let devices: Vec<_> = (0..8)
                .map(|g| {
                    json!({"name": format!("gpu-{g}"), "attributes": {
                        "model": {"string": "H100"}, "index": {"int": g},
                        "numa": {"int": g / 4}},
                        "capacity": {"memory": {"value": "80Gi"}}})
                })
                .collect();
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("node-{n}-gpu.example.com")},
                "spec": {"driver": "gpu.example.com", "nodeName": format!("node-{n}"),
                         "pool": {"name": format!("node-{n}"), "generation": 1, "resourceSliceCount": 1},
                         "devices": devices}
            }))
            .expect("a valid slice")
        })
        .collect()
}

fn main() {
    let pods: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let classes: Vec<DeviceClass> = vec![
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}
        }))
        .expect("a valid class"),
    ];
    let claims: Vec<ResourceClaim> = vec![
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
        }))
        .expect("a valid claim"),
    ];
    println!(
        "{:>6} {:>16} {:>14} {:>9} {:>10}",
        "nodes", "kubedev ms/pod", "upstream ms", "ratio", "µs/node"
    );
    for (nodes, upstream_ms) in [(250, 20.0), (1_000, 97.0), (2_500, 240.0), (5_000, 463.0)] {
        let slices = cluster(nodes);
        let names: Vec<Node> = (0..nodes)
            .map(|n| Node {
                name: format!("node-{n}"),
                labels: Default::default(),
                ..Node::default()
            })
            .collect();
        let options = AllocateOptions::default();
        let mut per_pod = Vec::with_capacity(pods);
        for _ in 0..pods {
            let c0 = process_cpu_ns();
            let mut allocator = Allocator::new(&slices, &classes, &[]);
            let mut fit = 0usize;
            for node in &names {
                if let Ok(Some(r)) = allocator.allocate(node, &claims, &options) {
                    fit += 1;
                    drop(std::hint::black_box(r));
                }
            }
            drop(allocator);
            per_pod.push(process_cpu_ns().saturating_sub(c0));
            assert_eq!(fit, nodes, "every node fits the claim");
        }
        per_pod.sort_unstable();
        let ms = per_pod[per_pod.len() / 2] as f64 / 1e6;
        println!(
            "{nodes:>6} {ms:>16.2} {upstream_ms:>14.1} {:>8.1}x {:>10.2}",
            upstream_ms / ms,
            ms * 1000.0 / nodes as f64
        );
    }
}
