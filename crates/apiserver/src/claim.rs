//! `ClaimReader`: what a ResourceClaim's allocation says this driver must prepare, and the
//! per-device status the driver reports back.
//!
//! This file holds what a claim's allocation says (the types `ClaimReader::get` returns);
//! `reader` talks to the API server, `allocation` picks this driver's part out of a fetched claim,
//! and `status` is the per-device status the driver writes back.

use std::collections::BTreeMap;

use kubedev_core::{AllocatedDevice, ClaimRef, DeviceConfig, Quantity};

pub(crate) mod allocation;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod client_tests;
mod reader;
mod status;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

pub(crate) use allocation::allocated_claim;
pub use reader::ClaimReader;
pub use status::{ConditionStatus, DeviceCondition, DeviceStatus};

pub use kubedev_core::ConfigSource;

/// One opaque configuration entry for this driver from `status.allocation.devices.config`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OpaqueConfig {
    /// Class or claim.
    pub source: ConfigSource,
    /// Its position in `status.allocation.devices.config`.
    pub index: usize,
    /// The requests it applies to (`request` or `request/subrequest`); empty means all.
    pub requests: Vec<String>,
    /// The driver-defined parameters.
    pub parameters: serde_json::Value,
}

impl OpaqueConfig {
    /// The entry as the preparer gets it.
    pub fn device_config(&self) -> DeviceConfig {
        DeviceConfig::new(self.source, self.index, self.parameters.clone())
    }

    /// Whether this configuration applies to devices allocated for `request` (as written in the
    /// allocation result, `request` or `request/subrequest`). A configuration naming the main
    /// request applies to all its subrequests.
    pub fn applies_to(&self, request: &str) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| r == request || r == base_request(request))
    }
}

pub use kubedev_core::base_request;

/// A toleration copied into an allocation result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceToleration {
    /// The taint key it matches (empty: all keys).
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    pub operator: Option<String>,
    /// The taint value for `Equal`.
    pub value: Option<String>,
    /// The effect it matches (empty: all effects).
    pub effect: Option<String>,
    /// For `NoExecute`: how long the taint is tolerated.
    pub toleration_seconds: Option<i64>,
}

/// One device allocated to the claim for this driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceResult {
    /// The device, the request it satisfies (as written: `request` or `request/subrequest`),
    /// its share ID, and the opaque parameters that apply to it (class first, then claim).
    pub device: AllocatedDevice,
    /// Allocated for administrative access (the device may be in use by others too).
    pub admin_access: bool,
    /// Tolerations of the request at allocation time.
    pub tolerations: Vec<DeviceToleration>,
    /// Capacity consumed from a shared device, by capacity name.
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

/// What a ResourceClaim's allocation holds for this driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AllocatedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// This driver's devices, in the order of the allocation.
    pub results: Vec<DeviceResult>,
    /// This driver's opaque configurations, class ones first, then claim ones.
    pub config: Vec<OpaqueConfig>,
    /// The `resource.kubernetes.io/pod-claim-name` annotation of a claim made from a template:
    /// the name of the pod's claim entry.
    pub pod_claim_name: Option<String>,
    /// The nodes the allocation's node selector names by `metadata.name` (what the scheduler
    /// writes for devices of slices published for one node), in the selector's order; empty
    /// when it has no selector or selects nodes by labels only.
    pub node_names: Vec<String>,
}

impl AllocatedClaim {
    /// The devices as the core model's [`AllocatedDevice`]s, in order.
    pub fn devices(&self) -> Vec<AllocatedDevice> {
        self.results.iter().map(|r| r.device.clone()).collect()
    }

    /// Whether the allocation's node selector names `node` (see
    /// [`AllocatedClaim::node_names`]): the claim's devices are on that node.
    pub fn names_node(&self, node: &str) -> bool {
        self.node_names.iter().any(|n| n == node)
    }
}
