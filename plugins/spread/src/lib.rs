//! `spread`: spread a request across PCIe roots.
//!
//! Devices under one PCIe root share its bandwidth to the CPU. This policy takes one device
//! from each root in turn — roots with fewer devices already in use first, then roots with
//! more free devices — so the allocator's first choice puts the request on as many roots as
//! possible. The root is the standard `resource.kubernetes.io/pcieRoot` string attribute.
//! Devices without it come after; devices in use come last; unhealthy devices are rejected.
#![cfg_attr(target_arch = "wasm32", no_std)]

use kubedev_policy_sdk::{
    Candidate, Decision, Health, Input, Key, Value, kubedev_policy, spread_by,
};

/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// What the policy reads (see `kubedev_policy!`).
pub const INPUTS: &str = "attribute resource.kubernetes.io/pcieRoot";

/// The candidate's PCIe root.
fn root_of<'a>(c: &Candidate<'a>, root: &Key) -> Option<&'a str> {
    match c.get(root) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// The policy.
pub fn spread(input: &Input<'_>) -> Decision {
    let root = input.key(PCIE_ROOT);
    if !root.is_known() {
        return Decision::keep();
    }
    let mut d = Decision::order(spread_by(input, |c| root_of(c, &root)));
    for c in input.candidates() {
        if c.health() == Health::Unhealthy {
            d = d.reject(c.index(), "device is unhealthy");
        }
    }
    d
}

kubedev_policy!(spread, inputs = INPUTS);
