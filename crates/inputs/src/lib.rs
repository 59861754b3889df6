//! What `kubedev explain`, `kubedev simulate` and the daemon read from files, kept out of the
//! allocator so that it stays pure (no YAML, no I/O):
//!
//! - [`cluster`]: whole clusters as `kubectl get … -o yaml|json` prints them, and which nodes can
//!   take a pod's device claims;
//! - [`read_scenario`] / [`scenario_from_text`]: the scenarios of `kubedev simulate`;
//! - [`yaml`]: how a YAML file that cannot be read is worded (the line and a sentence about the
//!   text).
#![warn(missing_docs)]

pub mod cluster;
mod scenario;
pub mod yaml;

pub use scenario::{ScenarioError, read_scenario, scenario_from_text};
