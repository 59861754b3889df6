//! `numa-pack`: prefer devices on one NUMA node.
//!
//! The request is packed onto as few NUMA nodes as possible: first the smallest node that
//! still has enough free devices for the whole request (so larger nodes stay whole for
//! larger requests), else the node with the most free devices, then the next. Devices whose
//! NUMA node is unknown come after, devices in use or unhealthy last. The NUMA node is the
//! `resource.kubernetes.io/numaNode` attribute (or the driver's `numaNode` / `numa`), or
//! the inventory's NUMA node in the device-plugin path.
#![cfg_attr(target_arch = "wasm32", no_std)]

use kubedev_policy_sdk::{Decision, Input, kubedev_policy, pack_by};

/// The policy.
pub fn numa_pack(input: &Input<'_>) -> Decision {
    if input.candidates().all(|c| c.numa_node().is_none()) {
        return Decision::keep();
    }
    Decision::order(pack_by(input, |c| c.numa_node()))
}

// The NUMA node is part of every candidate record: no attribute is needed.
kubedev_policy!(numa_pack, inputs = "");
