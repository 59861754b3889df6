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

/// A PCIe root, grouped by its text. Cheaper to group by than the `&str` itself: the host
/// stores an equal value of consecutive devices once, so equal roots nearly always share
/// their bytes and compare without reading them, and the hash mixes one word.
#[derive(Clone, Copy, Debug)]
struct Root<'a>(&'a str);

impl PartialEq for Root<'_> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        a.len() == b.len() && (core::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
    }
}

impl Eq for Root<'_> {}

impl core::hash::Hash for Root<'_> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // The length and the first and last (up to) eight bytes: roots differ at their end.
        let b = self.0.as_bytes();
        let (first, last) = match (b.first_chunk::<8>(), b.last_chunk::<8>()) {
            (Some(f), Some(l)) => (u64::from_le_bytes(*f), u64::from_le_bytes(*l)),
            _ => (b.iter().fold(0u64, |w, &x| (w << 8) | u64::from(x)), 0),
        };
        state.write_u64(first ^ last.rotate_left(23) ^ (b.len() as u64).rotate_left(47));
    }
}

/// The candidate's PCIe root.
fn root_of<'a>(c: &Candidate<'a>, root: &Key) -> Option<Root<'a>> {
    match c.get(root) {
        Some(Value::String(s)) => Some(Root(s)),
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
