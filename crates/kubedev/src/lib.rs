//! The kubedev daemon: configuration and runtime, shared by the `kubedev` binary and its tests.
#![warn(missing_docs)]

pub mod backends;
pub mod cdi;
pub mod cdi_generate;
pub mod checkpoint;
mod claim_status;
pub mod cli;
pub mod cluster;
pub mod config;
mod daemon;
pub mod discover;
pub mod dra_driver;
#[cfg(test)]
mod error_chains;
pub mod failpoint;
pub mod http;
pub mod metadata;
pub mod metrics;
mod policy;
pub mod registry;
pub mod runtime;
pub mod selector;
pub mod static_backend;
mod table;
#[cfg(test)]
mod test_dir;
pub mod who_uses;

pub use daemon::Daemon;
