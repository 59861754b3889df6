//! `binpack`: prefer partitions of parents that are already in use, to limit fragmentation.
//!
//! A partition (a MIG instance, a vGPU slice) draws from its parent's shared counter set
//! (`consumesCounters` in the ResourceSlice). A parent is *already used* when devices
//! already allocated draw from the same counter set: the host counts them per set (the
//! `set_in_use` field of the input, filled from the allocation's allocated devices by the
//! sandbox's policy session, or by the caller). This policy orders the free candidates by
//!
//! 1. the most-used parent first (so partly used GPUs fill up and empty ones stay whole),
//! 2. then the smallest consumption of the parent's counters (best fit; a whole device,
//!    which takes all of its parent's counters, comes after its partitions),
//! 3. then the input order.
//!
//! Devices that draw from no counter set rank as unused parents with no consumption;
//! devices in use or unhealthy come last.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::vec::Vec;
use core::cmp::Reverse;

use kubedev_policy_sdk::{Candidate, Decision, Input, kubedev_policy};

/// What the policy reads (see `kubedev_policy!`): the shared counter sets only.
pub const INPUTS: &str = "counters";

/// How many allocated devices share the candidate's busiest parent.
fn parent_use(c: &Candidate<'_>) -> u32 {
    c.counter_sets().map(|s| s.in_use()).max().unwrap_or(0)
}

/// Everything the candidate takes from its parents' counters.
fn consumption(c: &Candidate<'_>) -> i128 {
    c.counter_sets().map(|s| s.total()).sum()
}

/// The policy.
pub fn binpack(input: &Input<'_>) -> Decision {
    let mut keyed: Vec<(bool, Reverse<u32>, i128, u32)> = input
        .candidates()
        .map(|c| {
            (
                !c.is_free(),
                Reverse(parent_use(&c)),
                consumption(&c),
                c.index(),
            )
        })
        .collect();
    keyed.sort_unstable();
    Decision::order(keyed.into_iter().map(|k| k.3).collect())
}

kubedev_policy!(binpack, inputs = INPUTS);
