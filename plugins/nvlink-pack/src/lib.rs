//! `nvlink-pack`: prefer GPU sets joined by NVLink.
//!
//! GPUs that share a value of the `linkGroup` attribute (an integer or a string, in the
//! driver's domain, e.g. `gpu.example.com/linkGroup`) are fully connected by NVLink. kubedev's
//! NVIDIA backend publishes the same thing as `gpu.nvidia.com/nvlinkGroup`, which is read when
//! no candidate has `linkGroup`. The
//! link score of a set of GPUs is the number of pairs in the same link group; this policy
//! orders candidates so the allocator's first choice maximises it: the smallest link group
//! that can hold the whole request, else the largest groups first. GPUs without a link
//! group come after, GPUs in use or unhealthy last. Without any `linkGroup` attribute the
//! default order is kept (and a line is logged).
#![cfg_attr(target_arch = "wasm32", no_std)]

use kubedev_policy_sdk::{Decision, Input, kubedev_policy, log, pack_by};

/// The attribute naming a GPU's NVLink island.
pub const LINK_GROUP: &str = "linkGroup";

/// The NVLink island as kubedev's NVIDIA backend publishes it.
pub const NVIDIA_LINK_GROUP: &str = "gpu.nvidia.com/nvlinkGroup";

/// What the policy reads (see `kubedev_policy!`).
pub const INPUTS: &str = "attribute linkGroup\nattribute gpu.nvidia.com/nvlinkGroup";

/// The policy.
pub fn nvlink_pack(input: &Input<'_>) -> Decision {
    let mut link_group = input.key(LINK_GROUP);
    if !link_group.is_known() {
        link_group = input.key(NVIDIA_LINK_GROUP);
    }
    if !link_group.is_known() {
        log("nvlink-pack: no candidate has a linkGroup attribute; keeping the default order");
        return Decision::keep();
    }
    Decision::order(pack_by(input, |c| c.get(&link_group)))
}

kubedev_policy!(nvlink_pack, inputs = INPUTS);
