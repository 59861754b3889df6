//! A whole cluster as `kubectl get resourceslices,deviceclasses,devicetaintrules,resourceclaims,nodes,pods -o
//! yaml` prints it, and the question users ask of it: which nodes can take a pod's (or a
//! claim's) device claims, and why every other node cannot.
//!
//! Input is read as the API machinery reads objects: `List` objects or single objects, YAML
//! (several documents) or JSON, fields this allocator does not know ignored (a dump carries
//! `status`, `managedFields` and fields of newer releases). Devices other claims hold
//! (`status.allocation`) are in use as the scheduler counts them: a result with admin access
//! leaves its device to others, and a result with a `shareID` is a share of its device, which
//! takes the capacity it consumed. DeviceTaintRules add their taints to the devices they
//! select, as the scheduler sees them.
//!
//! Reading dumps is `cluster/read.rs` (block-style YAML rewritten as JSON by
//! `cluster/block_yaml.rs`); the question and its answer are `cluster/answer.rs`; both spread
//! their work over the machine's cores with `cluster/par.rs`.

use serde::Serialize;
use serde_json::Value;

use kubedev_allocator::ConsumedCapacity;
use kubedev_allocator::api::{DeviceClass, DeviceTaintRule, Node, ResourceClaim, ResourceSlice};

mod answer;
mod block_yaml;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod block_yaml_tests;
mod par;
mod read;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod yaml_dump_tests;

/// The objects read from one or more dumps.
#[derive(Debug, Default)]
pub struct Cluster {
    /// ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// DeviceClasses.
    pub classes: Vec<DeviceClass>,
    /// DeviceTaintRules: taints the scheduler adds to the devices they select.
    pub taint_rules: Vec<DeviceTaintRule>,
    /// ResourceClaims, with their `status.allocation` results (`driver/pool/device`).
    pub claims: Vec<(ResourceClaim, Vec<String>)>,
    /// The devices the claims' allocations hold as the scheduler counts them allocated
    /// (`driver/pool/device`): results neither with admin access nor with a `shareID`.
    pub in_use: Vec<String>,
    /// The shares the claims' allocations hold (results with a `shareID`), with the capacity
    /// each took.
    pub consumed: Vec<ConsumedCapacity>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Pods, as read.
    pub pods: Vec<Value>,
}

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// The claims of a pod, `namespace/name`.
    Pod(String),
    /// One claim, `namespace/name`.
    Claim(String),
}

/// The answer for one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAnswer {
    /// The node.
    pub node: String,
    /// Whether the claims fit.
    pub fits: bool,
    /// Why not (one line per request), or the error that stopped the allocator.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The answer for the whole cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAnswer {
    /// The claims explained, `namespace/name`.
    pub claims: Vec<String>,
    /// Claims already allocated (they are not allocated again), `namespace/name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub already_allocated: Vec<String>,
    /// Every node, those that fit first.
    pub nodes: Vec<NodeAnswer>,
}

/// Why a dump cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct ClusterError {
    /// The file (or `stdin`), and the object when known.
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

/// Reads a dump into a fresh [`Cluster`] (for tests and callers with one text).
pub fn read_cluster(text: &str, origin: &str) -> Result<Cluster, ClusterError> {
    let mut c = Cluster::default();
    c.add_text(text, origin)?;
    Ok(c)
}
