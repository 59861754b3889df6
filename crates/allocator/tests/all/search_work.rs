//! How much a search does: one that cannot succeed is stopped by the check for requests that
//! no choice of devices can satisfy after a few steps, instead of trying every combination, and
//! gives the same answer as the full search would.

use kubedev_allocator::{AllocateOptions, Allocator, Scenario};

/// `devices` GPUs on node-0, half on NUMA node 0 and half on 1, and one claim for `count` of
/// them with a distinct NUMA node each.
fn distinct_numa(devices: usize, count: usize) -> Scenario {
    let list: String = (0..devices)
        .map(|i| {
            format!(
                "    - name: gpu-{i}\n      attributes:\n        numa:\n          int: {}\n",
                i % 2
            )
        })
        .collect();
    let text = format!(
        "node:\n  name: node-0\ndeviceClasses:\n- apiVersion: resource.k8s.io/v1\n  kind: DeviceClass\n  metadata:\n    name: gpu\n  spec:\n    selectors:\n    - cel:\n        expression: device.driver == \"gpu.example.com\"\nresourceSlices:\n- apiVersion: resource.k8s.io/v1\n  kind: ResourceSlice\n  metadata:\n    name: node-0-gpus\n  spec:\n    driver: gpu.example.com\n    nodeName: node-0\n    pool:\n      name: node-0\n      generation: 1\n      resourceSliceCount: 1\n    devices:\n{list}claims:\n- apiVersion: resource.k8s.io/v1\n  kind: ResourceClaim\n  metadata:\n    name: spread\n    namespace: default\n  spec:\n    devices:\n      requests:\n      - name: gpus\n        exactly:\n          deviceClassName: gpu\n          count: {count}\n      constraints:\n      - distinctAttribute: gpu.example.com/numa\n"
    );
    kubedev_inputs::scenario_from_text(&text).unwrap()
}

#[test]
fn a_search_that_cannot_succeed_stops_after_a_few_steps() {
    // Three distinct NUMA nodes among two: every pair of devices is tried before the search
    // gives up, unless the allocator sees that no choice can satisfy the request.
    let s = distinct_numa(16, 3);
    let mut allocator = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    let out = allocator
        .allocate(&s.node, &s.claims, &AllocateOptions::default())
        .unwrap();
    assert!(out.is_none(), "{out:?}");
    let steps = allocator.stats().steps;
    assert!(
        steps <= 20,
        "the search took {steps} steps before giving up on a claim no devices can satisfy"
    );
}

#[test]
fn a_search_that_can_succeed_takes_the_first_fitting_devices_directly() {
    // Two distinct NUMA nodes: the first GPU of each.
    let s = distinct_numa(16, 2);
    let mut allocator = Allocator::new(&s.resource_slices, &s.device_classes, &s.allocated_devices);
    let out = allocator
        .allocate(&s.node, &s.claims, &AllocateOptions::default())
        .unwrap()
        .expect("fits");
    let devices: Vec<&str> = out[0]
        .devices
        .results
        .iter()
        .map(|r| r.device.as_str())
        .collect();
    assert_eq!(devices, ["gpu-0", "gpu-1"]);
    assert!(allocator.stats().steps <= 5, "{:?}", allocator.stats());
}
