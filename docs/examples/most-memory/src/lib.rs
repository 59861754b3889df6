//! `most-memory`: give a request the free devices with the most memory first.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::vec::Vec;
use kubedev_policy_sdk::{Decision, Health, Input, kubedev_policy};

/// The policy: one score per candidate, higher first; unhealthy devices are rejected.
pub fn most_memory(input: &Input<'_>) -> Decision {
    let memory = input.key("memory");
    if !memory.is_known() {
        return Decision::keep(); // no device publishes `memory`: nothing to say
    }
    let scores: Vec<i64> = input
        .candidates()
        .map(|c| match c.capacity_of(&memory) {
            Some(m) if c.is_free() => m.value,
            _ => -1, // in use, unhealthy or without memory: last
        })
        .collect();
    let mut decision = Decision::scores(scores);
    for c in input.candidates().filter(|c| c.health() == Health::Unhealthy) {
        decision = decision.reject(c.index(), "device is unhealthy");
    }
    decision
}

// Ask the host for the `memory` capacity only; name, pool, health and NUMA node always come.
kubedev_policy!(most_memory, inputs = "capacity memory");
