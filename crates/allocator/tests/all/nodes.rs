//! One allocator asked about many nodes (the scheduler's pattern: a fresh allocator per pod,
//! then every candidate node) answers exactly as a fresh allocator per node: the slice index it
//! builds from the second node on finds every slice a node may use, node-local, all-nodes,
//! node-selector, per-device node selection, and pools whose slices span nodes.

use kubedev_allocator::api::Node;
use kubedev_allocator::{AllocateOptions, Allocator, Scenario};

fn slice(name: &str, pool: &str, count: usize, placement: &str, devices: &str) -> String {
    format!(
        "- apiVersion: resource.k8s.io/v1\n  kind: ResourceSlice\n  metadata:\n    name: {name}\n  spec:\n    driver: driver-a\n    pool:\n      name: {pool}\n      generation: 1\n      resourceSliceCount: {count}\n{placement}    devices:\n{devices}"
    )
}

fn devices(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("    - name: {prefix}-{i}\n      attributes:\n        kind:\n          string: {prefix}\n"))
        .collect()
}

/// Node `node-<i>` for i < 12; slices of every placement kind.
fn scenario() -> Scenario {
    let mut slices = String::new();
    for i in 0..12 {
        slices += &slice(
            &format!("local-{i}"),
            &format!("pool-{i}"),
            1,
            &format!("    nodeName: node-{i}\n"),
            &devices("gpu", 2),
        );
    }
    slices += &slice(
        "shared",
        "net",
        1,
        "    allNodes: true\n",
        &devices("nic", 1),
    );
    slices += &slice(
        "rack-a",
        "rack",
        1,
        "    nodeSelector:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: rack, operator: In, values: [a]}\n",
        &devices("fpga", 1),
    );
    // A pool of two slices on two nodes: each node sees its own, the pool is complete.
    slices += &slice(
        "span-1",
        "span",
        2,
        "    nodeName: node-1\n",
        &devices("span1", 1),
    );
    slices += &slice(
        "span-2",
        "span",
        2,
        "    nodeName: node-2\n",
        &devices("span2", 1),
    );
    // A pool of two announced slices of which one exists: incomplete wherever it is seen.
    slices += &slice(
        "broken-3",
        "broken",
        2,
        "    nodeName: node-3\n",
        &devices("broken", 1),
    );
    let class = |name: &str, kind: &str| {
        format!(
            "- apiVersion: resource.k8s.io/v1\n  kind: DeviceClass\n  metadata:\n    name: {name}\n  spec:\n    selectors:\n    - cel:\n        expression: device.attributes[\"driver-a\"].kind == \"{kind}\"\n"
        )
    };
    let classes = ["gpu", "nic", "fpga", "span1", "span2", "broken"]
        .iter()
        .map(|k| class(k, k))
        .collect::<String>();
    let claims = ["gpu", "nic", "fpga", "span1", "span2", "broken"]
        .iter()
        .map(|k| format!("- apiVersion: resource.k8s.io/v1\n  kind: ResourceClaim\n  metadata:\n    name: {k}\n  spec:\n    devices:\n      requests:\n      - name: {k}\n        exactly:\n          deviceClassName: {k}\n"))
        .collect::<String>();
    let text = format!(
        "node:\n  name: node-0\ndeviceClasses:\n{classes}resourceSlices:\n{slices}claims:\n{claims}"
    );
    kubedev_inputs::scenario_from_text(&text).unwrap()
}

#[test]
fn one_allocator_over_many_nodes_answers_as_one_per_node() {
    let s = scenario();
    let nodes: Vec<Node> = (0..12)
        .map(|i| Node {
            name: format!("node-{i}"),
            labels: [(
                "rack".to_string(),
                if i % 2 == 0 { "a" } else { "b" }.to_string(),
            )]
            .into_iter()
            .collect(),
            ..Node::default()
        })
        .collect();
    let options = AllocateOptions::default();
    let mut shared = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    let mut answers = Vec::new();
    for node in &nodes {
        for claim in s.claims.chunks(1) {
            let mut fresh =
                Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
            let want = fresh
                .allocate(node, claim, &options)
                .map_err(|e| e.to_string());
            let got = shared
                .allocate(node, claim, &options)
                .map_err(|e| e.to_string());
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "{} {}: one allocator for all nodes differs from a fresh one",
                node.name,
                claim[0].metadata.name
            );
            answers.push((
                node.name.clone(),
                claim[0].metadata.name.clone(),
                want.map(|r| r.is_some()),
            ));
        }
    }
    let answer = |node: &str, claim: &str| {
        answers
            .iter()
            .find(|(n, c, _)| n == node && c == claim)
            .map(|(_, _, a)| a.clone())
            .unwrap()
    };
    // The scenario means something: what a node sees depends on where the slices are.
    assert_eq!(answer("node-5", "gpu"), Ok(true));
    assert_eq!(answer("node-5", "nic"), Ok(true), "all nodes");
    assert_eq!(answer("node-4", "fpga"), Ok(true), "rack a");
    assert_eq!(answer("node-5", "fpga"), Ok(false), "rack b");
    assert_eq!(answer("node-1", "span1"), Ok(true));
    assert_eq!(
        answer("node-1", "span2"),
        Ok(false),
        "the other slice's device is on node-2"
    );
    assert_eq!(answer("node-2", "span2"), Ok(true));
    assert_eq!(answer("node-3", "broken"), Ok(false), "an incomplete pool");
    assert_eq!(answer("node-4", "broken"), Ok(false));
}
